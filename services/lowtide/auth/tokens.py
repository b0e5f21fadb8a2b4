"""Bearer-token authentication for gRPC calls: ``authorization: Bearer <token>`` -> principal.

Token sources (both optional, checked in this order):

* a tokens file, read once at construction (``reload()`` re-reads it)::

      # token            principal
      s3cr3t-alice       User:alice

* the Redis hash ``lowtide:auth:tokens``: field ``sha256:<hex digest of the token>``, value the
  principal. Only digests are stored, so a Redis dump does not leak usable tokens; write entries
  with ``Authenticator.add_token`` (or ``token_field(token)``).
* session tokens, minted by a Kafka listener for a client that logged in without a token of its
  own (SASL/SCRAM, ``auth/scram_store.py``), so the services and the front door see the same
  ``authorization: Bearer <token>`` a gRPC caller sends::

      lowtide:auth:session:<sha256 hex of the token>   STRING  the principal, with a TTL

  The TTL is the session's lifetime: Redis forgets an expired session by itself, and a listener
  deletes a session at once when its connection closes (``end_session``).

Lookups are by SHA-256 digest and the found digest is compared with ``hmac.compare_digest``, so
timing does not reveal how much of a guessed token was right.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc
import redis as redis_lib

from lowtide.auth.acl import ANONYMOUS_PRINCIPAL, parse_principal
from lowtide.errors import InvalidConfig, InvalidRequest, SaslAuthenticationFailed
from lowtide.tls.principal import PrincipalMapper

TOKENS_KEY = "lowtide:auth:tokens"
SESSION_KEY_PREFIX = "lowtide:auth:session:"
AUTHORIZATION_HEADER = "authorization"
_BEARER = "bearer"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_field(token: str) -> str:
    """The Redis hash field under which ``token`` is stored."""
    return "sha256:" + _digest(token)


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

    Redis answers are cached for ``cache_ttl_s`` (default 1 s) because ``authenticate`` runs on
    every RPC; a revoked token therefore stops working within that time. Thread-safe.
    """

    def __init__(
        self,
        *,
        redis: redis_lib.Redis | None = None,
        tokens_file: str | Path | None = None,
        required: bool,
        cache_ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        certificates: PrincipalMapper | None = None,
        reserved_for_certificates: Callable[[str], bool] = lambda _principal: False,
    ) -> None:
        self._certificates = certificates
        self._reserved = reserved_for_certificates
        self._redis = redis
        self._tokens_file = Path(tokens_file) if tokens_file is not None else None
        self._required = required
        self._cache_ttl_s = cache_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._file_tokens: dict[str, str] = {}
        # digest -> (principal or None for "unknown", expiry); swapped/updated under _lock.
        self._cache: dict[str, tuple[str | None, float]] = {}
        self.reload()

    @property
    def required(self) -> bool:
        return self._required

    def reload(self) -> None:
        """Re-read the tokens file (if any) and forget cached Redis answers."""
        file_tokens = load_tokens_file(self._tokens_file) if self._tokens_file is not None else {}
        with self._lock:
            self._file_tokens = file_tokens
            self._cache = {}

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
        if principal is not None or self._redis is None:
            return principal
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > now:
            return cached[0]
        # Both sources in one round trip: a session token is as frequent as a stored one.
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(TOKENS_KEY, "sha256:" + digest)
            pipe.get(SESSION_KEY_PREFIX + digest)
            stored, session = pipe.execute()
        raw = stored if stored is not None else session
        principal = raw.decode() if isinstance(raw, bytes) else raw
        with self._lock:
            if len(self._cache) > 10000:
                self._cache = {}  # bounded: guessed tokens must not grow memory forever
            self._cache[digest] = (principal, now + self._cache_ttl_s)
        return principal

    def add_token(self, token: str, principal: str) -> None:
        """Register a token in Redis (visible to every server at once, modulo their cache)."""
        if self._redis is None:
            raise InvalidConfig("cannot add a token: this authenticator has no Redis")
        add_token(self._redis, token=token, principal=principal)
        with self._lock:
            self._cache.pop(_digest(token), None)

    @staticmethod
    def _match(tokens: dict[str, str], digest: str) -> str | None:
        # Tokens files are short: compare against every entry without stopping early, each in
        # constant time, so neither the position nor the prefix of a match shows in the timing.
        found = None
        for known, principal in tokens.items():
            if hmac.compare_digest(known, digest):
                found = principal
        return found

def add_token(redis: redis_lib.Redis, *, token: str, principal: str) -> None:
    """Store ``token`` -> ``principal`` in ``lowtide:auth:tokens`` (as a SHA-256 digest)."""
    if not token or token != token.strip() or any(c.isspace() for c in token):
        raise InvalidRequest("a token must be non-empty and contain no whitespace")
    redis.hset(TOKENS_KEY, token_field(token), parse_principal(principal))


def remove_token(redis: redis_lib.Redis, *, token: str) -> bool:
    """Revoke a token stored in Redis; True when it existed."""
    return bool(redis.hdel(TOKENS_KEY, token_field(token)))


def mint_session(redis: redis_lib.Redis, *, principal: str, ttl_s: float) -> str:
    """A new random session token for ``principal`` that authenticates for ``ttl_s`` seconds.
    Only its digest is stored, as for every other token."""
    if ttl_s <= 0:
        raise InvalidRequest("a session needs a positive lifetime")
    token = secrets.token_urlsafe(32)
    redis.set(SESSION_KEY_PREFIX + _digest(token), parse_principal(principal), px=max(1, int(ttl_s * 1000)))
    return token


def end_session(redis: redis_lib.Redis, token: str) -> None:
    """Forget a session token at once (its connection closed, or a new login replaced it)."""
    redis.delete(SESSION_KEY_PREFIX + _digest(token))
