"""The identity of a connection on an ``SSL`` Kafka listener: its client certificate's principal.

Kafka's ``SslAuthenticator`` makes the principal of an SSL connection from the client certificate's
subject with ``ssl.principal.mapping.rules`` (``User:ANONYMOUS`` without a certificate). Here the
rules are the process's ``--tls-principal-mapping-rules`` (tls/principal.py), so the certificate
``CN=alice,O=lowtide`` is ``User:alice`` on a Kafka connection exactly as on a gRPC call.

Carrying the identity: the services behind a Kafka connection (in-process servicers, and the front
door a replica forwards to over gRPC) read an identity from call metadata. As a SCRAM login does
(auth/scram_store.py), a certificate login with authentication on mints a session token for the
principal (``mint``: auth/tokens.mint_session, handed in by the server, as lowtide.kafka does not
import lowtide.auth): the connection carries ``authorization: Bearer <token>``,
which every service accepts like any token and which ends with the connection. The token is
checked once against this process's own authenticator, so a principal the services would refuse
(a lowtide service identity when mutual TLS is on: those authenticate with certificates on gRPC
only) is refused at the first request with a clear message, not at some later forwarded call. An
SSL connection has no re-authentication (KIP-368 is SASL's): the session is renewed from the
same certificate when it ends (``renew``) and the old token forgotten.

With authentication off nothing is minted: the principal is recorded for logs only, the services
see ``User:ANONYMOUS`` as over gRPC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from lowtide.errors import SaslAuthenticationFailed
from lowtide.kafka.listener import Connection
from lowtide.tls.principal import PrincipalMapper

log = logging.getLogger(__name__)

SSL_MECHANISM = "SSL"  # what Connection.login_mechanism says for a certificate login
# How much longer a session token lives than its session (as SCRAM's, auth/scram_store.py): a
# request accepted just before the session's end may still be calling the front door with it.
SESSION_TOKEN_GRACE_S = 60.0
Mint = Callable[[str, float], str]  # (principal, ttl_s) -> a new session token
End = Callable[[str], None]  # forget a session token


class CertificateLogin:
    """Makes a TLS connection's client certificate its identity (``login``). Thread-safe: a
    connection's requests are handled one at a time, and the metadata store is shared safely."""

    def __init__(self, *, mapper: PrincipalMapper, mint: Mint | None, end: End | None, session_lifetime_ms: int,
                 verify: Callable[[tuple[tuple[str, str], ...]], str] | None = None) -> None:
        if (mint is None) != (end is None):
            raise ValueError("session tokens are minted and ended together")
        self.mapper = mapper
        self._mint, self._end_token = mint, end
        self._lifetime_ms = session_lifetime_ms
        self._verify = verify

    def login(self, conn: Connection) -> None:
        """The connection becomes its certificate's principal; SaslAuthenticationFailed when it
        sent none, no mapping rule matches, or the services would refuse that principal."""
        if conn.peer_certificate is None:
            raise SaslAuthenticationFailed(
                f"no client certificate on {conn.listener} listener: with authentication on, an SSL listener "
                "needs ssl.client.auth=required (--kafka-ssl-client-auth) or clients use SASL_SSL")
        principal = self.mapper.principal_of_der(conn.peer_certificate)
        if self._mint is None or self._end_token is None:  # authentication off
            conn.principal, conn.login_mechanism, conn.authenticated = principal, SSL_MECHANISM, True
            return
        token = self._mint(principal, self._lifetime_ms / 1000 + SESSION_TOKEN_GRACE_S)
        metadata = (("authorization", f"Bearer {token}"),)
        if self._verify is not None:
            try:
                self._verify(metadata)
            except SaslAuthenticationFailed as err:
                self._end_token(token)
                raise SaslAuthenticationFailed(f"client certificate of {principal} refused: {err.message}") from None
        previous = conn.session
        conn.metadata, conn.principal, conn.login_mechanism = metadata, principal, SSL_MECHANISM
        conn.session, conn.session_deadline = token, time.monotonic() + self._lifetime_ms / 1000
        conn.authenticated = True
        if isinstance(previous, str):
            self._end_token(previous)  # one request at a time: nothing still uses it
        else:
            conn.on_close(lambda: self._end(conn))
        log.debug("kafka %s is %s (client certificate)", conn.peer, principal)

    def renew(self, conn: Connection) -> None:
        """A new session from the same certificate (the old one ended)."""
        self.login(conn)

    def _end(self, conn: Connection) -> None:
        token, conn.session = conn.session, None
        if isinstance(token, str) and self._end_token is not None:
            try:
                self._end_token(token)
            except Exception:  # the metadata store away: the token expires with its lease
                log.warning("could not end the session of %s; its token expires on its own", conn.peer)
