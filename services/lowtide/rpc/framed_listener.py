"""The replication listener: a plain TCP (or TLS) port beside a replica's gRPC port, carrying
follower fetch rounds and coordinator appends as frames (lowtide.rpc.framed draws them;
docs/design/kip-107-delete-records.md#replication-and-the-low-watermark).

A peer opens a connection and keeps it: a HELLO frame with its call metadata (the token a gRPC call
would carry), then one request frame at a time (REQUEST: a follower fetch; PRODUCE: an append),
each answered by one RESPONSE, or by one ERROR after which the listener closes the connection.
The listener authenticates once per connection (the token, or with mutual TLS the client
certificate) and hands every request to the handler (the replica's servicer:
``ReplicaServicer.open_framed_session``), which checks and answers it exactly as its gRPC method.

Why a second port: a round on a gRPC stream costs about six times the CPU of a round on a socket
(four thread hand-offs per message inside grpcio), and with small produce requests and diskless
commits every append costs one round per follower and, for a coordinator, one unary Produce.

With TLS on, the listener speaks TLS with the service's certificate and asks for client
certificates as the gRPC port does.

Thread-safety: one accept thread and one thread per connection (a follower has one connection per
leader, a coordinator one per append in flight; at most ``max_connections``); ``stop()`` from any
thread.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any, Protocol

from lowtide.errors import InvalidRequest, LowtideError, NetworkException, UnknownServerError
from lowtide.rpc.framed import (
    ERROR,
    HELLO,
    PRODUCE,
    REQUEST,
    RESPONSE,
    FrameReader,
    decode_hello,
    encode_error,
    write_frame,
)
from lowtide.tls.config import ServerTls

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0  # TLS handshake and HELLO: a connection that says nothing is dropped
MAX_CONNECTIONS = 256


class FramedSession(Protocol):
    """One connection's requests, as the handler answers them (``open_framed_session``)."""

    def handle(self, kind: int, payload: bytes) -> bytes:
        """The RESPONSE payload for one REQUEST or PRODUCE frame; raises a LowtideError to refuse."""

    def close(self) -> None:
        """The connection ended."""


class FramedListener:
    """Serves framed requests on ``host:port`` (0: a free port, read ``port`` after ``bind``).

    Contract: ``bind()`` opens the port (before the broker registers, so it can advertise it);
    ``start(open_session, authenticate, draining)`` accepts connections: ``authenticate(metadata,
    certificate_der)`` names the principal once per connection, ``open_session(principal, peer)``
    gives the ``FramedSession`` answering its requests, ``draining()`` true ends each connection
    after its current request (peers reconnect to whoever leads next). ``stop()`` closes the port
    and every connection.
    """

    def __init__(self, *, host: str, port: int, tls: ServerTls | None, name: str,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.host, self.port, self.tls, self.name = host, port, tls, name
        self.max_connections = max_connections
        self._sock: socket.socket | None = None
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._stopped = threading.Event()

    def bind(self) -> int:
        sock = socket.create_server((self.host, self.port), reuse_port=False, backlog=64)
        self._sock = sock
        self.port = sock.getsockname()[1]
        if self.tls is not None:
            self._context = self.tls.ssl_context()
        return self.port

    def start(self, *, open_session: Callable[[str, str], FramedSession],
              authenticate: Callable[[list[tuple[str, str]], bytes | None], str],
              draining: Callable[[], bool]) -> None:
        if self._sock is None:
            raise RuntimeError("bind() before start()")
        self._open_session, self._authenticate, self._draining = open_session, authenticate, draining
        threading.Thread(target=self._accept_loop, name=f"{self.name}-listener-accept", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn)

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stopped.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                continue
            with self._lock:
                if len(self._connections) >= self.max_connections:
                    log.warning("replication listener: %d connections open; refusing %s", len(self._connections),
                                peer)
                    conn.close()
                    continue
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn, peer), name=f"{self.name}-listener-conn",
                             daemon=True).start()

    def _serve(self, raw: socket.socket, peer_addr: tuple) -> None:
        peer = f"ipv4:{peer_addr[0]}:{peer_addr[1]}"
        conn = raw
        session: Any = None
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            raw.settimeout(HANDSHAKE_TIMEOUT_S)
            if self._context is not None:
                conn = self._context.wrap_socket(raw, server_side=True)
                with self._lock:
                    self._connections.discard(raw)
                    self._connections.add(conn)
            reader = FrameReader(conn)
            frame = reader.read()
            if frame is None:
                return
            kind, payload = frame
            if kind != HELLO:
                raise InvalidRequest(f"the first frame must be HELLO ({HELLO}), got kind {kind}")
            certificate = conn.getpeercert(binary_form=True) if isinstance(conn, ssl.SSLSocket) else None
            principal = self._authenticate(decode_hello(payload), certificate)
            session = self._open_session(principal, peer)
            conn.settimeout(None)  # requests park at most their long poll; a silent peer just idles
            while not self._stopped.is_set() and not self._draining():
                frame = reader.read()
                if frame is None:
                    return
                kind, payload = frame
                if kind not in (REQUEST, PRODUCE):
                    raise InvalidRequest(f"expected a REQUEST ({REQUEST}) or PRODUCE ({PRODUCE}) frame, "
                                         f"got kind {kind}")
                write_frame(conn, RESPONSE, session.handle(kind, payload))
        except LowtideError as exc:
            _send_error(conn, exc)
        except (OSError, ssl.SSLError, NetworkException):
            pass  # the peer went away (or never finished its handshake): it reconnects
        except Exception as exc:  # a bug: say so to the peer and in the log, keep serving others
            log.exception("replication listener: a request from %s failed", peer)
            _send_error(conn, UnknownServerError(f"{type(exc).__name__}: {exc}"))
        finally:
            if session is not None:
                session.close()
            with self._lock:
                self._connections.discard(conn)
                self._connections.discard(raw)
            _shutdown(conn)


def _send_error(conn: socket.socket, error: LowtideError) -> None:
    try:
        write_frame(conn, ERROR, encode_error(error))
    except OSError:
        pass


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        conn.close()
    except OSError:
        pass
