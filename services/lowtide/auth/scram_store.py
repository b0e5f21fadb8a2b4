"""SCRAM credentials in the cluster metadata (etcd), and the server side of a SCRAM login (KIP-84)
for a Kafka listener.

Layout: the ``scram`` section of the cluster metadata (etcd, lowtide.metadata.sections), shared
by every front door and replica; nothing here is a password::

    scram/{user}/{mechanism}   one credential: the user name ("alice" for User:alice) and
                               SCRAM-SHA-256 or SCRAM-SHA-512; the value is
                               {"v":1,"salt":"<base64>","iterations":8192,
                                "stored_key":"<base64>","server_key":"<base64>"}
    scram/decoy                32 random bytes (hex), put once (if absent) by the first login that
                               needs them: unknown users get a salt derived from it, the same on
                               every listener, so the server-first message does not reveal who
                               exists (no user's record is named without a "/")
    tokens/{sha256 hex}        the principal of a session token, under the session's lease
                               (auth/tokens.py)

Reads come from the process's metadata image (no round trip; they keep answering while etcd is
away); a credential the image lacks is looked for once more after catching the image up with etcd
(one created a moment ago through another front door). Changes are etcd transactions:
MetadataStoreUnavailable (retriable REQUEST_TIMED_OUT) when etcd does not answer.

``"v"`` is the document's format version: a reader refuses versions it does not know rather than
guess at them.

A login (``ScramLogin``) reads the credential once, at the client-first message, and checks the
proof against it. On success, with authentication on, it mints a session token for the principal
(tokens.mint_session) that lives as long as the session: the connection then carries
``authorization: Bearer <session token>``, which the in-process servicers and the front door
accept like any other token. A deleted credential cannot start a new login; a session already
running lasts until its end (the client must re-authenticate then, KIP-368), as in Kafka.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from lowtide.auth.scram import MECHANISMS, Mechanism, ScramCredential, ServerExchange, parse_client_first
from lowtide.auth.tokens import end_session, mint_session
from lowtide.errors import RequestTimedOut, SaslAuthenticationFailed, UnknownServerError
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore

SECTION = "scram"
DECOY_RECORD = "decoy"
FORMAT_VERSION = 1
_DELETE_ATTEMPTS = 20
# Kafka's connections.max.reauth.ms is off by default; lowtide's sessions always end (a session token
# must not outlive its use), so a client re-authenticates once an hour on its own (KIP-368).
DEFAULT_SESSION_LIFETIME_MS = 3_600_000
MIN_SESSION_LIFETIME_MS = 1000
# How much longer a session token lives in the store than the session it stands for: a request accepted
# just before the session's end may still be calling the front door with it.
SESSION_TOKEN_GRACE_S = 60.0


def credential_name(mechanism: Mechanism, user: str) -> str:
    """The record name of ``user``'s credential for ``mechanism`` in the ``scram`` section."""
    return f"{user}/{mechanism.name}"


def parse_credential_name(name: str) -> tuple[Mechanism, str] | None:
    """(mechanism, user) of a record name; None for a record that is no credential (the decoy)."""
    user, slash, mechanism = name.rpartition("/")
    found = MECHANISMS.get(mechanism) if slash else None
    return (found, user) if found is not None else None


def encode_credential(credential: ScramCredential) -> str:
    return json.dumps({"v": FORMAT_VERSION, "salt": _b64(credential.salt), "iterations": credential.iterations,
                       "stored_key": _b64(credential.stored_key), "server_key": _b64(credential.server_key)},
                      sort_keys=True, separators=(",", ":"))


def decode_credential(raw: bytes | str) -> ScramCredential:
    text = raw.decode() if isinstance(raw, bytes) else raw
    try:
        doc = json.loads(text)
        if doc.get("v") != FORMAT_VERSION:
            raise ValueError(f"unknown format version {doc.get('v')!r}")
        return ScramCredential(salt=base64.b64decode(doc["salt"], validate=True), iterations=int(doc["iterations"]),
                               stored_key=base64.b64decode(doc["stored_key"], validate=True),
                               server_key=base64.b64decode(doc["server_key"], validate=True))
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise UnknownServerError(f"corrupt SCRAM credential in the metadata store: {exc}") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class CredentialInfo:
    """What DescribeUserScramCredentials shows of a credential: never its keys or salt."""

    mechanism: Mechanism
    iterations: int


class ScramStore:
    """The credentials of every user, per mechanism. Thread-safe (the metadata store is)."""

    def __init__(self, *, metadata: MetadataStore) -> None:
        self._section = section(metadata, SECTION)
        self._decoy: bytes | None = None
        self._lock = threading.Lock()

    def get(self, mechanism: Mechanism, user: str) -> ScramCredential | None:
        entry = self._section.get(credential_name(mechanism, user), fresh=True)
        return None if entry is None else decode_credential(entry.value)

    def put(self, mechanism: Mechanism, user: str, credential: ScramCredential) -> None:
        self._section.put(credential_name(mechanism, user), encode_credential(credential).encode())

    def delete(self, mechanism: Mechanism, user: str) -> bool:
        """True when there was a credential to delete."""
        name = credential_name(mechanism, user)
        for _ in range(_DELETE_ATTEMPTS):
            entry = self._section.get(name, fresh=True)
            if entry is None:
                return False
            if self._section.delete([name], expect={name: entry}):
                return True  # else changed since read: read again
        raise RequestTimedOut(f"the credential kept changing; gave up deleting it after {_DELETE_ATTEMPTS} attempts")

    def apply(self, *, puts: Iterable[tuple[Mechanism, str, ScramCredential]],
              deletes: Iterable[tuple[Mechanism, str]]) -> None:
        """Several changes in one transaction: a user's alterations land together or not at all
        (a credential both put and deleted is deleted)."""
        changes: dict[str, bytes | None] = {}
        for mechanism, user, credential in puts:
            changes[credential_name(mechanism, user)] = encode_credential(credential).encode()
        for mechanism, user in deletes:
            changes[credential_name(mechanism, user)] = None
        if changes:
            self._section.change(changes)

    def describe(self, users: Iterable[str] | None = None) -> dict[str, list[CredentialInfo]]:
        """Users -> their credentials (mechanism order); ``users`` None = every user that has one.
        A named user without any credential is absent from the answer."""
        mechanisms = list(MECHANISMS.values())
        found: dict[tuple[str, str], bytes] = {}
        if users is None:
            for name, entry in self._section.items().items():
                parsed = parse_credential_name(name)
                if parsed is not None:
                    found[(parsed[1], parsed[0].name)] = entry.value
        else:
            for user in users:
                for mechanism in mechanisms:
                    entry = self._section.get(credential_name(mechanism, user))
                    if entry is not None:
                        found[(user, mechanism.name)] = entry.value
        out: dict[str, list[CredentialInfo]] = {}
        for mechanism in mechanisms:  # mechanism order within each user
            for (user, name), raw in sorted(found.items()):
                if name == mechanism.name:
                    out.setdefault(user, []).append(CredentialInfo(mechanism, decode_credential(raw).iterations))
        return dict(sorted(out.items()))

    def decoy_salt(self, mechanism: Mechanism, user: str) -> bytes:
        """The salt shown for a user without a credential: stable per user and the same on every
        listener (a random salt per attempt would tell an unknown user from a known one)."""
        with self._lock:
            if self._decoy is None:
                entry = self._section.get(DECOY_RECORD, fresh=True)
                if entry is None:
                    self._section.put(DECOY_RECORD, secrets.token_hex(32).encode(), expect=None)
                    entry = self._section.get(DECOY_RECORD, fresh=True)  # ours, or the one that won
                if entry is None:  # pragma: no cover - the put or its rival is in the image by now
                    raise UnknownServerError("the SCRAM decoy secret did not reach the metadata image")
                self._decoy = bytes.fromhex(entry.value.decode())
            secret = self._decoy
        return hmac.new(secret, f"{mechanism.name}\0{user}".encode(), hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class ScramSession:
    """A successful login: who, the server-final message, and the session token standing for it
    (None with authentication off: the services ignore identities then)."""

    principal: str
    server_final: bytes
    token: str | None
    lifetime_ms: int

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata that carries this identity to the services."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


class ScramLogin:
    """The server side of SCRAM logins for one Kafka listener.

    ``start(mechanism, client_first)`` -> a ``ServerExchange`` (its ``server_first`` is the answer);
    ``finish(exchange, client_final)`` -> a ``ScramSession``; ``end(session)`` forgets its token.
    Both raise ``SaslAuthenticationFailed`` for anything refused, and MetadataStoreUnavailable
    when a session cannot be minted (etcd away). Thread-safe: an exchange belongs to one
    connection, and the store is shared safely.
    """

    mechanisms: tuple[str, ...] = tuple(MECHANISMS)

    def __init__(self, *, store: ScramStore, metadata: MetadataStore, mint_sessions: bool,
                 session_lifetime_ms: int = DEFAULT_SESSION_LIFETIME_MS) -> None:
        if session_lifetime_ms < MIN_SESSION_LIFETIME_MS:
            raise ValueError(f"a SASL session lasts at least {MIN_SESSION_LIFETIME_MS} ms")
        self._store = store
        self._metadata = metadata
        self._mint = mint_sessions
        self.session_lifetime_ms = session_lifetime_ms

    def start(self, mechanism: str, client_first: bytes) -> ServerExchange:
        mech = MECHANISMS.get(mechanism)
        if mech is None:
            raise SaslAuthenticationFailed(f"Authentication failed: {mechanism!r} is not a SCRAM mechanism")
        first = parse_client_first(client_first)
        credential = self._store.get(mech, first.username)
        decoy = self._store.decoy_salt(mech, first.username) if credential is None else b""
        return ServerExchange(mechanism=mech, client_first=first, credential=credential, decoy_salt=decoy)

    def finish(self, exchange: ServerExchange, client_final: bytes) -> ScramSession:
        server_final = exchange.finish(client_final)
        principal = f"User:{exchange.username}"
        token = None
        if self._mint:
            token = mint_session(self._metadata, principal=principal,
                                 ttl_s=self.session_lifetime_ms / 1000 + SESSION_TOKEN_GRACE_S)
        return ScramSession(principal=principal, server_final=server_final.encode("ascii"), token=token,
                            lifetime_ms=self.session_lifetime_ms if self._mint else 0)

    def end(self, session: ScramSession) -> None:
        if session.token is not None:
            end_session(self._metadata, session.token)


def build_scram_login(metadata: MetadataStore, *, auth_enabled: bool,
                      session_lifetime_ms: int = DEFAULT_SESSION_LIFETIME_MS) -> ScramLogin:
    """The SCRAM login of a server's Kafka listener. With authentication off no session is minted
    and none ends (lifetime 0): the services see User:ANONYMOUS whoever logs in, as over gRPC."""
    return ScramLogin(store=ScramStore(metadata=metadata), metadata=metadata, mint_sessions=auth_enabled,
                      session_lifetime_ms=session_lifetime_ms)
