"""SCRAM credentials in Redis, and the server side of a SCRAM login (KIP-84) for a Kafka listener.

Redis layout (shared by every front door and replica; nothing here is a password)::

    lowtide:auth:scram:SCRAM-SHA-256   HASH    field = the user name ("alice" for User:alice)
                                               value = {"v":1,"salt":"<base64>","iterations":8192,
                                                        "stored_key":"<base64>","server_key":"<base64>"}
    lowtide:auth:scram:SCRAM-SHA-512   HASH    the same for SCRAM-SHA-512
    lowtide:auth:scram:decoy           STRING  32 random bytes (hex), set once by the first login
                                               that needs them: unknown users get a salt derived
                                               from it, the same on every listener, so the
                                               server-first message does not reveal who exists
    lowtide:auth:session:<sha256 hex>  STRING  the principal of a session token, with a TTL
                                               (auth/tokens.py)

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

import redis as redis_lib

from lowtide.auth.scram import MECHANISMS, Mechanism, ScramCredential, ServerExchange, parse_client_first
from lowtide.auth.tokens import end_session, mint_session
from lowtide.errors import SaslAuthenticationFailed, UnknownServerError

SCRAM_KEY_PREFIX = "lowtide:auth:scram:"
DECOY_KEY = "lowtide:auth:scram:decoy"
FORMAT_VERSION = 1
# Kafka's connections.max.reauth.ms is off by default; lowtide's sessions always end (a session token
# must not outlive its use), so a client re-authenticates once an hour on its own (KIP-368).
DEFAULT_SESSION_LIFETIME_MS = 3_600_000
MIN_SESSION_LIFETIME_MS = 1000
# How much longer a session token lives in Redis than the session it stands for: a request accepted
# just before the session's end may still be calling the front door with it.
SESSION_TOKEN_GRACE_S = 60.0


def scram_key(mechanism: Mechanism) -> str:
    return SCRAM_KEY_PREFIX + mechanism.name


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
        raise UnknownServerError(f"corrupt SCRAM credential in Redis: {exc}") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class CredentialInfo:
    """What DescribeUserScramCredentials shows of a credential: never its keys or salt."""

    mechanism: Mechanism
    iterations: int


class ScramStore:
    """The credentials of every user, per mechanism. Thread-safe (redis-py clients are)."""

    def __init__(self, *, redis: redis_lib.Redis) -> None:
        self._redis = redis
        self._decoy: bytes | None = None
        self._lock = threading.Lock()

    def get(self, mechanism: Mechanism, user: str) -> ScramCredential | None:
        raw = self._redis.hget(scram_key(mechanism), user)
        return None if raw is None else decode_credential(raw)

    def put(self, mechanism: Mechanism, user: str, credential: ScramCredential) -> None:
        self._redis.hset(scram_key(mechanism), user, encode_credential(credential))

    def delete(self, mechanism: Mechanism, user: str) -> bool:
        """True when there was a credential to delete."""
        return bool(self._redis.hdel(scram_key(mechanism), user))

    def apply(self, *, puts: Iterable[tuple[Mechanism, str, ScramCredential]],
              deletes: Iterable[tuple[Mechanism, str]]) -> None:
        """Several changes in one MULTI/EXEC: a user's alterations land together or not at all."""
        with self._redis.pipeline(transaction=True) as pipe:
            for mechanism, user, credential in puts:
                pipe.hset(scram_key(mechanism), user, encode_credential(credential))
            for mechanism, user in deletes:
                pipe.hdel(scram_key(mechanism), user)
            pipe.execute()

    def describe(self, users: Iterable[str] | None = None) -> dict[str, list[CredentialInfo]]:
        """Users -> their credentials (mechanism order); ``users`` None = every user that has one.
        A named user without any credential is absent from the answer."""
        mechanisms = list(MECHANISMS.values())
        with self._redis.pipeline(transaction=False) as pipe:
            for mechanism in mechanisms:
                if users is None:
                    pipe.hgetall(scram_key(mechanism))
                else:
                    pipe.hmget(scram_key(mechanism), list(users) or ["\0"])
            answers = pipe.execute()
        out: dict[str, list[CredentialInfo]] = {}
        names = None if users is None else list(users)
        for mechanism, answer in zip(mechanisms, answers, strict=True):
            pairs = answer.items() if names is None else zip(names, answer, strict=False)
            for user, raw in pairs:
                if raw is None:
                    continue
                name = user.decode() if isinstance(user, bytes) else user
                out.setdefault(name, []).append(CredentialInfo(mechanism, decode_credential(raw).iterations))
        return dict(sorted(out.items()))

    def decoy_salt(self, mechanism: Mechanism, user: str) -> bytes:
        """The salt shown for a user without a credential: stable per user and the same on every
        listener (a random salt per attempt would tell an unknown user from a known one)."""
        with self._lock:
            if self._decoy is None:
                self._redis.set(DECOY_KEY, secrets.token_hex(32), nx=True)
                raw = self._redis.get(DECOY_KEY)
                self._decoy = bytes.fromhex(raw.decode() if isinstance(raw, bytes) else raw)
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
    Both raise ``SaslAuthenticationFailed`` for anything refused. Thread-safe: an exchange
    belongs to one connection, and the store and Redis client are shared safely.
    """

    mechanisms: tuple[str, ...] = tuple(MECHANISMS)

    def __init__(self, *, store: ScramStore, redis: redis_lib.Redis, mint_sessions: bool,
                 session_lifetime_ms: int = DEFAULT_SESSION_LIFETIME_MS) -> None:
        if session_lifetime_ms < MIN_SESSION_LIFETIME_MS:
            raise ValueError(f"a SASL session lasts at least {MIN_SESSION_LIFETIME_MS} ms")
        self._store = store
        self._redis = redis
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
            token = mint_session(self._redis, principal=principal,
                                 ttl_s=self.session_lifetime_ms / 1000 + SESSION_TOKEN_GRACE_S)
        return ScramSession(principal=principal, server_final=server_final.encode("ascii"), token=token,
                            lifetime_ms=self.session_lifetime_ms if self._mint else 0)

    def end(self, session: ScramSession) -> None:
        if session.token is not None:
            end_session(self._redis, session.token)


def build_scram_login(redis: redis_lib.Redis, *, auth_enabled: bool,
                      session_lifetime_ms: int = DEFAULT_SESSION_LIFETIME_MS) -> ScramLogin:
    """The SCRAM login of a server's Kafka listener. With authentication off no session is minted
    and none ends (lifetime 0): the services see User:ANONYMOUS whoever logs in, as over gRPC."""
    return ScramLogin(store=ScramStore(redis=redis), redis=redis, mint_sessions=auth_enabled,
                      session_lifetime_ms=session_lifetime_ms)
