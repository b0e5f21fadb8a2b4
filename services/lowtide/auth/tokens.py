"""Bearer-token authentication for gRPC calls: ``authorization: Bearer <token>`` -> principal.

Token sources (both optional, checked in this order):

* a tokens file, read once at construction (``reload()`` re-reads it)::

      # token            principal
      s3cr3t-alice       User:alice

* the ``tokens`` section of the cluster metadata (etcd, lowtide.metadata.sections)::

      tokens/{sha256 hex of the token}   the principal (UTF-8)

  Only digests are stored, so a dump of the store does not leak usable tokens; write records
  with ``add_token`` (or ``Authenticator.add_token``).
* session tokens, minted by a Kafka listener for a client that logged in without a token of its
  own (SASL/SCRAM, ``auth/scram_store.py``; certificates, kafka/tls_identity.py), so the services
  and the front door see the same ``authorization: Bearer <token>`` a gRPC caller sends. A
  session's record is the same ``tokens/{digest}``, put under an etcd lease of the session's
  lifetime (whole seconds, at least 2): etcd forgets an expired session by itself, and a listener
  ends a session at once when its connection closes (``end_session``: it deletes the record and
  revokes the lease, whose id the session token carries after its last ``.``).

Lookups read the process's metadata image (no round trip on the request path; they keep
answering while etcd is away). A digest the image lacks is looked up once more after catching the
image up with etcd (a token added a moment ago through another process), and then remembered as
unknown for ``cache_ttl_s``, so guessed tokens cost no round trip each. The tokens file is
compared entry by entry with ``hmac.compare_digest``, so timing does not reveal how much of a
guessed token was right.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc

from lowtide.auth.acl import ANONYMOUS_PRINCIPAL, parse_principal
from lowtide.errors import (
    InvalidConfig,
    InvalidRequest,
    MetadataStoreUnavailable,
    RequestTimedOut,
    SaslAuthenticationFailed,
)
from lowtide.metadata.sections import Section, section
from lowtide.metadata.store import MetadataStore
from lowtide.tls.principal import PrincipalMapper

log = logging.getLogger(__name__)

SECTION = "tokens"
AUTHORIZATION_HEADER = "authorization"
_BEARER = "bearer"
_REMOVE_ATTEMPTS = 20


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_name(token: str) -> str:
    """The record name (in the ``tokens`` section) under which ``token`` is stored: its digest."""
    return _digest(token)


def tokens_section(metadata: MetadataStore) -> Section:
    return section(metadata, SECTION)


def load_tokens_file(path: str | Path) -> dict[str, str]:
    """Parse a tokens file into {sha256 hex digest: principal}; errors name the path and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidConfig(f"cannot read tokens file {str(path)!r}: {exc.strerror or exc}") from None
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"{path}:{lineno}"
        if len(parts) != 2:
            raise InvalidConfig(f"{where}: expected 'TOKEN User:name', got {len(parts)} fields")
        token, principal = parts
        try:
            parse_principal(principal)
        except InvalidRequest as exc:
            raise InvalidConfig(f"{where}: {exc.message}") from None
        digest = _digest(token)
        if out.get(digest, principal) != principal:
            raise InvalidConfig(f"{where}: token already maps to {out[digest]}, not {principal}")
        out[digest] = principal
    return out


class Authenticator:
    """Turns a call's gRPC invocation metadata into a principal, or refuses it.

    Contract of ``authenticate``: no ``authorization`` entry -> ``User:ANONYMOUS`` when not
    ``required``, else SaslAuthenticationFailed; a malformed header or unknown token ->
    SaslAuthenticationFailed always (a wrong credential is never downgraded to anonymous).

    Mutual TLS (``certificates`` set): ``authenticate_context`` also reads the client
    certificate's principal (tls/principal.py). A call with a token is the token's principal, one
    without is the certificate's; and a token whose principal ``reserved_for_certificates`` names
    (the brokers' and services' own) is refused, so a stolen token alone no longer makes a broker
    (docs/design/tls.md).

    Tokens are read from the metadata image (module doc): a token revoked anywhere stops working
    as soon as the watch delivers the change. An unknown token is remembered as unknown for
    ``cache_ttl_s`` (default 1 s). Thread-safe.
    """

    def __init__(
        self,
        *,
        metadata: MetadataStore | None = None,
        tokens_file: str | Path | None = None,
        required: bool,
        cache_ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        certificates: PrincipalMapper | None = None,
        reserved_for_certificates: Callable[[str], bool] = lambda _principal: False,
    ) -> None:
        self._certificates = certificates
        self._reserved = reserved_for_certificates
        self._metadata = metadata
        self._tokens = tokens_section(metadata) if metadata is not None else None
        self._tokens_file = Path(tokens_file) if tokens_file is not None else None
        self._required = required
        self._cache_ttl_s = cache_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._file_tokens: dict[str, str] = {}
        # digest -> until when it is known to be unknown (no new look-up in etcd); under _lock.
        self._misses: dict[str, float] = {}
        self.reload()

    @property
    def required(self) -> bool:
        return self._required

    def reload(self) -> None:
        """Re-read the tokens file (if any) and forget the tokens remembered as unknown."""
        file_tokens = load_tokens_file(self._tokens_file) if self._tokens_file is not None else {}
        with self._lock:
            self._file_tokens = file_tokens
            self._misses = {}

    def authenticate_context(self, context: grpc.ServicerContext) -> str:
        """The caller of a gRPC call: its bearer token, else (mutual TLS) its certificate."""
        certificate = None
        if self._certificates is not None:
            pems = context.auth_context().get("x509_pem_cert")
            if pems:
                certificate = self._certificates.principal_of_pem(pems[0])
        return self.authenticate(context.invocation_metadata(), certificate_principal=certificate)

    def authenticate_peer(self, metadata: Iterable[tuple[str, str | bytes]] | None,
                          certificate_der: bytes | None) -> str:
        """The caller on a plain socket (the replication listener): its bearer token in
        ``metadata``, else (mutual TLS) its certificate (DER, from the TLS handshake)."""
        certificate = None
        if self._certificates is not None and certificate_der:
            certificate = self._certificates.principal_of_der(certificate_der)
        return self.authenticate(metadata, certificate_principal=certificate)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None, *,
                     certificate_principal: str | None = None) -> str:
        """The caller's principal from gRPC invocation metadata (see class contract)."""
        values = [v for k, v in (metadata or ()) if k.lower() == AUTHORIZATION_HEADER]
        if not values:
            if certificate_principal is not None:
                return certificate_principal
            if self._required:
                raise SaslAuthenticationFailed("authentication required: send 'authorization: Bearer <token>'")
            return ANONYMOUS_PRINCIPAL
        if len(values) > 1:
            raise SaslAuthenticationFailed("more than one authorization header")
        value = values[0].decode() if isinstance(values[0], bytes) else values[0]
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != _BEARER or not token:
            raise SaslAuthenticationFailed("authorization header must be 'Bearer <token>'")
        principal = self.lookup(token)
        if principal is None:
            raise SaslAuthenticationFailed("unknown or revoked token")
        if self._certificates is not None and self._reserved(principal):
            raise SaslAuthenticationFailed(f"{principal} authenticates with its certificate when mutual TLS is on, "
                                           "not with a token")
        return principal

    def lookup(self, token: str) -> str | None:
        """The principal a token maps to, or None if no source knows it."""
        digest = _digest(token)
        principal = self._match(self._file_tokens, digest)
        if principal is not None or self._tokens is None:
            return principal
        entry = self._tokens.get(digest)  # the image: no round trip
        if entry is None:
            now = self._clock()
            if self._misses.get(digest, float("-inf")) > now:
                return None
            # Perhaps added a moment ago through another process: catch the image up once.
            entry = self._tokens.get(digest, fresh=True)
            if entry is None:
                with self._lock:
                    if len(self._misses) > 10000:
                        self._misses = {}  # bounded: guessed tokens must not grow memory forever
                    self._misses[digest] = now + self._cache_ttl_s
                return None
        return entry.value.decode()

    def add_token(self, token: str, principal: str) -> None:
        """Register a token in the metadata store (every server sees it once its watch did)."""
        if self._metadata is None:
            raise InvalidConfig("cannot add a token: this authenticator has no metadata store")
        add_token(self._metadata, token=token, principal=principal)
        with self._lock:
            self._misses.pop(_digest(token), None)

    @staticmethod
    def _match(tokens: dict[str, str], digest: str) -> str | None:
        # Tokens files are short: compare against every entry without stopping early, each in
        # constant time, so neither the position nor the prefix of a match shows in the timing.
        found = None
        for known, principal in tokens.items():
            if hmac.compare_digest(known, digest):
                found = principal
        return found

def add_token(metadata: MetadataStore, *, token: str, principal: str) -> None:
    """Store ``token`` -> ``principal`` in the ``tokens`` section (as its SHA-256 digest).
    MetadataStoreUnavailable when etcd does not answer."""
    if not token or token != token.strip() or any(c.isspace() for c in token):
        raise InvalidRequest("a token must be non-empty and contain no whitespace")
    tokens_section(metadata).put(token_name(token), parse_principal(principal).encode())


def remove_token(metadata: MetadataStore, *, token: str) -> bool:
    """Revoke a stored token; True when it existed."""
    tokens, name = tokens_section(metadata), token_name(token)
    for _ in range(_REMOVE_ATTEMPTS):
        entry = tokens.get(name, fresh=True)
        if entry is None:
            return False
        if tokens.delete([name], expect={name: entry}):
            return True
    raise RequestTimedOut(f"the token kept changing; gave up revoking it after {_REMOVE_ATTEMPTS} attempts")


def mint_session(metadata: MetadataStore, *, principal: str, ttl_s: float) -> str:
    """A new random session token for ``principal`` that authenticates for ``ttl_s`` seconds
    (rounded up to whole seconds, at least 2: an etcd lease). Only its digest is stored, as for
    every other token; the token ends with ``.{lease id, hex}`` so ``end_session`` can revoke it."""
    if ttl_s <= 0:
        raise InvalidRequest("a session needs a positive lifetime")
    principal = parse_principal(principal)
    tokens = tokens_section(metadata)
    lease = tokens.grant_lease(max(1, math.ceil(ttl_s * 1000)))
    token = f"{secrets.token_urlsafe(32)}.{lease:x}"
    try:
        tokens.put(token_name(token), principal.encode(), lease=lease)
    except BaseException:
        _revoke_quietly(tokens, lease)
        raise
    return token


def end_session(metadata: MetadataStore, token: str) -> None:
    """Forget a session token at once (its connection closed, or a new login replaced it). With
    etcd away it logs and returns: the session then ends with its lease."""
    tokens = tokens_section(metadata)
    try:
        tokens.delete([token_name(token)])
    except MetadataStoreUnavailable as exc:
        log.warning("could not end a session now; it ends with its lease: %s", exc)
        return
    lease = session_lease(token)
    if lease:
        _revoke_quietly(tokens, lease)


def session_lease(token: str) -> int:
    """The lease id a session token carries (0 when it carries none)."""
    _, dot, suffix = token.rpartition(".")
    try:
        return int(suffix, 16) if dot else 0
    except ValueError:
        return 0


def _revoke_quietly(tokens: Section, lease: int) -> None:
    try:
        tokens.revoke_lease(lease)
    except MetadataStoreUnavailable as exc:
        log.warning("could not revoke lease %x now; it expires by itself: %s", lease, exc)
