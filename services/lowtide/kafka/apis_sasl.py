"""SASL over the Kafka protocol (KIP-43 handshake, KIP-152 SaslAuthenticate, KIP-84 SCRAM, KIP-368
re-authentication): a Kafka client's credentials become the lowtide identity every service checks.

A login is one SaslHandshake (v1: the mechanism) then SaslAuthenticate rounds carrying the
mechanism's messages::

    PLAIN (RFC 4616), one round:   [authzid] NUL username NUL password  ->  ""
        username = the principal's name ("alice" for User:alice; "User:alice" is accepted too)
        password = a lowtide bearer token of that principal (tokens file / metadata store)
    SCRAM-SHA-256 / -512 (RFC 5802, 7677), two rounds (messages drawn in lowtide/auth/scram.py):
        client-first  ->  server-first        (sasl_state = the exchange, nonce and salt)
        client-final  ->  server-final        (the client checks the server knew its key too)

Identity afterwards: PLAIN's token must map to ``User:<username>`` (the name is not a second
secret, but a client must not claim one name and act as another) and the connection carries
``authorization: Bearer <token>``. A SCRAM user has no token of its own: the login mints a session
token for the principal (auth/scram_store.py) and the connection carries that. Either way the
in-process servicers see the metadata a gRPC call carries and forwarded requests present it to
the front door, so ACL decisions are exactly the gRPC ones.

Sessions: SaslAuthenticate v1+ answers ``session_lifetime_ms``. PLAIN answers 0 (no re-auth): its
token is checked on every call, so revoking the token ends the connection's rights at once. SCRAM
answers the session's lifetime (``--kafka-connections-max-reauth-ms``, 1 h by default) because its
session token must end: clients re-authenticate before then on the same connection (a new
handshake; same mechanism and principal, else refused), and a connection that has not is closed
at its next request, as Kafka does. A re-login with a deleted credential fails, so a deleted
credential stops working within one session lifetime.

Listeners: SASL is served on ``SASL_SSL`` and ``SASL_PLAINTEXT`` listeners and on the plain
``--kafka-listener`` (which requires it when authentication is on); an ``SSL`` listener answers a
SaslHandshake ILLEGAL_SASL_STATE, as Kafka does: its identity is the client certificate.

Refusals: SASL_AUTHENTICATION_FAILED (58) with a message, then the connection is closed (Kafka
does the same); a refused connection never carries an identity. Only SaslHandshake v1 is served;
v0's raw token frames are what clients older than Kafka 1.0 send.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any

from lowtide.errors import IllegalSaslState, LowtideError, SaslAuthenticationFailed, UnsupportedSaslMechanism
from lowtide.kafka.broker import SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY, Api, Call, KafkaServices
from lowtide.kafka.listener import Connection
from lowtide.kafka.protocol import error_code

PLAIN = "PLAIN"


def offered_mechanisms(services: KafkaServices) -> tuple[str, ...]:
    return (PLAIN, *services.scram.mechanisms) if services.scram is not None else (PLAIN,)


def parse_plain(auth_bytes: bytes) -> tuple[str, str]:
    """(username, password) of a PLAIN message; SaslAuthenticationFailed when malformed."""
    parts = auth_bytes.split(b"\0")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise SaslAuthenticationFailed("malformed SASL/PLAIN message: expected [authzid] NUL user NUL password")
    authzid, user, password = (p.decode("utf-8", errors="strict") for p in parts)
    if authzid and authzid != user:
        raise SaslAuthenticationFailed(f"SASL/PLAIN authorization id {authzid!r} differs from user {user!r}")
    return user, password


@dataclass(frozen=True, slots=True)
class _Login:
    principal: str
    metadata: tuple[tuple[str, str], ...]
    lifetime_ms: int
    server_bytes: bytes = b""
    session: Any = None  # a SCRAM session, ended when replaced or when the connection closes


def handshake(call: Call, body: Any) -> Any:
    conn, mechanism = call.conn, body.mechanism
    offered = offered_mechanisms(call.services)
    if conn.protocol == "SSL":
        code = IllegalSaslState.code  # an SSL listener's identity is the client certificate (Kafka: the same)
    elif conn.sasl_mechanism is not None:
        code = IllegalSaslState.code  # a handshake in the middle of an exchange
    elif mechanism not in offered:
        code = UnsupportedSaslMechanism.code
    elif conn.authenticated and mechanism != conn.login_mechanism:
        code = IllegalSaslState.code  # KIP-368: a re-authentication keeps the mechanism
    else:
        conn.sasl_mechanism, conn.sasl_state = mechanism, None
        code = 0
    return call.make(call.response, error_code=error_code(code), mechanisms=offered)


def authenticate(call: Call, body: Any) -> Any:
    conn = call.conn
    mechanism = conn.sasl_mechanism
    if mechanism is None:
        return _answer(call, IllegalSaslState.code, "SaslAuthenticate without a SaslHandshake first")
    message = bytes(body.auth_bytes)
    try:
        if mechanism == PLAIN:
            login = _plain(call, message)
        else:
            scram = call.services.scram
            assert scram is not None  # the handshake offered this mechanism
            if conn.sasl_state is None:  # round 1: client-first -> server-first
                exchange = scram.start(mechanism, message)
                conn.sasl_state = exchange
                return _answer(call, 0, None, auth_bytes=exchange.server_first.encode("utf-8"))
            exchange, conn.sasl_state = conn.sasl_state, None  # round 2: client-final -> server-final
            session = scram.finish(exchange, message)
            login = _Login(principal=session.principal, metadata=session.metadata, lifetime_ms=session.lifetime_ms,
                           server_bytes=session.server_final, session=session)
        _take(call, mechanism, login)
    except (SaslAuthenticationFailed, UnicodeDecodeError) as err:
        text = err.message if isinstance(err, LowtideError) else f"SASL/{mechanism} message is not UTF-8"
        return _refuse(call, text)
    return _answer(call, 0, None, auth_bytes=login.server_bytes, lifetime_ms=login.lifetime_ms)


def _plain(call: Call, message: bytes) -> _Login:
    user, token = parse_plain(message)
    metadata = (("authorization", f"Bearer {token}"),)
    principal = "User:" + user.removeprefix("User:")
    login = call.services.sasl_login
    if login is not None:
        if login(metadata).removeprefix("User:") != user.removeprefix("User:"):
            raise SaslAuthenticationFailed(f"the token given for {user!r} is not that user's")
    return _Login(principal=principal, metadata=metadata, lifetime_ms=0)


def _take(call: Call, mechanism: str, login: _Login) -> None:
    """The connection becomes ``login``'s (a re-authentication must keep the principal)."""
    conn = call.conn
    if conn.authenticated and conn.principal != login.principal:
        _end(call.services, login.session)
        raise SaslAuthenticationFailed(
            f"re-authentication may not change the principal ({conn.principal} to {login.principal})")
    previous = conn.session
    conn.metadata, conn.principal, conn.login_mechanism = login.metadata, login.principal, mechanism
    conn.session = login.session
    conn.session_deadline = time.monotonic() + login.lifetime_ms / 1000 if login.lifetime_ms else None
    conn.authenticated, conn.sasl_mechanism = True, None
    if previous is not None:
        _end(call.services, previous)  # the new login's session replaces it
    elif login.session is not None:
        services = call.services
        conn.on_close(lambda: _end_current(services, conn))


def _end(services: KafkaServices, session: Any) -> None:
    if session is not None and services.scram is not None:
        services.scram.end(session)


def _end_current(services: KafkaServices, conn: Connection) -> None:
    session, conn.session = conn.session, None
    _end(services, session)


def _refuse(call: Call, message: str) -> Any:
    """Answer SASL_AUTHENTICATION_FAILED, then close (Kafka closes a connection whose login
    failed). Nothing of the identity survives, even on a failed re-authentication."""
    conn = call.conn
    conn.sasl_mechanism, conn.sasl_state = None, None
    conn.authenticated, conn.metadata, conn.session_deadline = False, (), None
    conn.close()  # the answer below is still written; the listener then stops reading
    if not message.startswith("Authentication failed"):
        message = f"Authentication failed: {message}"
    return _answer(call, SaslAuthenticationFailed.code, message)


def _answer(call: Call, code: int, message: str | None, *, auth_bytes: bytes = b"", lifetime_ms: int = 0) -> Any:
    return call.make(call.response, error_code=error_code(code), error_message=message, auth_bytes=auth_bytes,
                     session_lifetime=datetime.timedelta(milliseconds=lifetime_ms))


APIS = [
    Api(SASL_HANDSHAKE_KEY, "SaslHandshake", 1, 1, handshake),
    Api(SASL_AUTHENTICATE_KEY, "SaslAuthenticate", 0, 2, authenticate),
]
