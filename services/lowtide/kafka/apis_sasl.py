"""SASL over the Kafka protocol (KIP-43 handshake, KIP-152 SaslAuthenticate): a Kafka client's
credentials become the lowtide identity every service already checks.

Mechanism PLAIN (RFC 4616), message ``[authzid] NUL username NUL password``::

    username  = the principal's name ("alice" for User:alice; "User:alice" is accepted too)
    password  = a lowtide bearer token of that principal (`lowtide acls`/tokens file/Redis)

The token must map to ``User:<username>`` (a token of someone else is refused: the name is not a
second secret, but a client must not be able to claim one name and act as another). Once
authenticated, the connection carries ``authorization: Bearer <token>``: in-process servicers see
the same metadata a gRPC call carries, and forwarded requests present it to the front door, so
ACL decisions are exactly the gRPC ones.

Only SaslHandshake v1 (tokens in SaslAuthenticate frames) is served; v0's raw token frames are
what clients older than Kafka 1.0 send.
"""

from __future__ import annotations

import datetime
from typing import Any

from lowtide.errors import LowtideError, SaslAuthenticationFailed
from lowtide.kafka.broker import SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY, Api, Call
from lowtide.kafka.protocol import error_code

MECHANISMS = ("PLAIN",)
_ZERO = datetime.timedelta(0)
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE = 33, 34


def parse_plain(auth_bytes: bytes) -> tuple[str, str]:
    """(username, password) of a PLAIN message; SaslAuthenticationFailed when malformed."""
    parts = auth_bytes.split(b"\0")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise SaslAuthenticationFailed("malformed SASL/PLAIN message: expected [authzid] NUL user NUL password")
    authzid, user, password = (p.decode("utf-8", errors="strict") for p in parts)
    if authzid and authzid != user:
        raise SaslAuthenticationFailed(f"SASL/PLAIN authorization id {authzid!r} differs from user {user!r}")
    return user, password


def handshake(call: Call, body: Any) -> Any:
    mechanism = body.mechanism
    if call.conn.authenticated or call.conn.sasl_mechanism is not None:
        code = ILLEGAL_SASL_STATE
    elif mechanism not in MECHANISMS:
        code = UNSUPPORTED_SASL_MECHANISM
    else:
        call.conn.sasl_mechanism = mechanism
        code = 0
    return call.make(call.response, error_code=error_code(code), mechanisms=MECHANISMS)


def authenticate(call: Call, body: Any) -> Any:
    conn = call.conn
    if conn.sasl_mechanism is None or conn.authenticated:
        return _answer(call, ILLEGAL_SASL_STATE, "SaslAuthenticate without a SaslHandshake first")
    login = call.services.sasl_login
    try:
        user, token = parse_plain(bytes(body.auth_bytes))
        metadata = (("authorization", f"Bearer {token}"),)
        if login is not None:
            principal = login(metadata)
            if principal.removeprefix("User:") != user.removeprefix("User:"):
                raise SaslAuthenticationFailed(f"the token given for {user!r} is not that user's")
    except (SaslAuthenticationFailed, UnicodeDecodeError) as err:
        message = err.message if isinstance(err, LowtideError) else "SASL/PLAIN message is not UTF-8"
        # Kafka answers the failure, then closes the connection.
        conn.sasl_mechanism = None
        return _answer(call, SaslAuthenticationFailed.code, f"Authentication failed: {message}")
    conn.metadata = metadata
    conn.authenticated = True
    return _answer(call, 0, None)


def _answer(call: Call, code: int, message: str | None) -> Any:
    return call.make(call.response, error_code=error_code(code), error_message=message, auth_bytes=b"",
                     session_lifetime=_ZERO)


APIS = [
    Api(SASL_HANDSHAKE_KEY, "SaslHandshake", 1, 1, handshake),
    Api(SASL_AUTHENTICATE_KEY, "SaslAuthenticate", 0, 2, authenticate),
]
