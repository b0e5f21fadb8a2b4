"""The replication listener: follower fetch rounds on a plain TCP (or TLS) port of the leader,
beside its gRPC port (docs/design/kip-107-delete-records.md#replication-transport).

A follower opens one connection per leader and keeps it: a HELLO frame with its call metadata
(the token a gRPC call would carry), then one REQUEST (a replica.proto ``FetchRequest``) per round,
each answered by one RESPONSE (a ``FetchResponse``) or one ERROR after which the leader closes the
connection (lowtide.rpc.framed draws the frames). Every round is checked and answered exactly as a
round of the ``Replicate`` stream: the same authentication (token, or with mutual TLS the client
certificate), the same CLUSTER_ACTION check for ``replica_id``, the same parked long poll.

Why a second port: a round on a gRPC stream costs about six times the CPU of a round on a socket
(four thread hand-offs per message inside grpcio), and with small produce requests and diskless
commits every append costs one round per follower. gRPC stays for everything else, including the
``Replicate`` stream, which followers use when a leader advertises no replication port.

The port is advertised in the broker's registration (``BrokerInfo.replication_port``). With TLS
on, the listener speaks TLS with the service's certificate and asks for client certificates as
the gRPC port does.

Thread-safety: one accept thread and one thread per connection (a follower has one connection per
leader, so a cluster of N brokers gives each leader at most N - 1, bounded by ``max_connections``);
``stop()`` from any thread.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable

from lowtide.errors import InvalidRequest, LowtideError, NetworkException, UnknownServerError
from lowtide.replica.metrics import REPLICATION_STREAMS
from lowtide.rpc.framed import ERROR, HELLO, REQUEST, RESPONSE, FrameReader, decode_hello, encode_error, write_frame
from lowtide.tls.config import ServerTls
from lowtide_pb import replica_pb2

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0  # TLS handshake and HELLO: a connection that says nothing is dropped
MAX_CONNECTIONS = 256
TRANSPORT = "socket"  # lowtide_replication_rounds_total{transport}


class ReplicationListener:
    """Serves follower rounds on ``host:port`` (0: a free port, read ``port`` after ``bind``).

    Contract: ``bind()`` opens the port (before the broker registers, so it can advertise it);
    ``start(serve_round, authenticate, draining)`` accepts connections: ``authenticate(metadata,
    certificate_der)`` names the principal once per connection, ``serve_round(request, principal,
    peer=, on_cancel=)`` answers each round, ``draining()`` true ends each connection after its
    current round (followers reconnect to whoever leads next). ``stop()`` closes the port and
    every connection.
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

    def start(self, *, serve_round: Callable[..., replica_pb2.FetchResponse],
              authenticate: Callable[[list[tuple[str, str]], bytes | None], str],
              draining: Callable[[], bool]) -> None:
        if self._sock is None:
            raise RuntimeError("bind() before start()")
        self._serve_round, self._authenticate, self._draining = serve_round, authenticate, draining
        threading.Thread(target=self._accept_loop, name=f"{self.name}-replication-accept", daemon=True).start()

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
            threading.Thread(target=self._serve, args=(conn, peer), name=f"{self.name}-replication-conn",
                             daemon=True).start()

    def _serve(self, raw: socket.socket, peer_addr: tuple) -> None:
        peer = f"ipv4:{peer_addr[0]}:{peer_addr[1]}"
        conn = raw
        follower = -1
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
            conn.settimeout(None)  # rounds park at most their long poll; a silent follower just idles
            while not self._stopped.is_set() and not self._draining():
                frame = reader.read()
                if frame is None:
                    return
                kind, payload = frame
                if kind != REQUEST:
                    raise InvalidRequest(f"expected a REQUEST frame ({REQUEST}), got kind {kind}")
                try:
                    request = replica_pb2.FetchRequest.FromString(payload)
                except Exception as exc:  # upb's DecodeError: refuse, as the gRPC port would
                    raise InvalidRequest(f"malformed FetchRequest: {exc}") from None
                if request.replica_id != follower:
                    if follower >= 0:
                        REPLICATION_STREAMS.labels(str(follower)).dec()
                    follower = request.replica_id
                    if follower >= 0:
                        REPLICATION_STREAMS.labels(str(follower)).inc()
                response = self._serve_round(request, principal, peer=peer, on_cancel=_no_cancel)
                write_frame(conn, RESPONSE, response.SerializeToString())
        except LowtideError as exc:
            _send_error(conn, exc)
        except (OSError, ssl.SSLError, NetworkException):
            pass  # the follower went away (or never finished its handshake): it reconnects
        except Exception as exc:  # a bug: say so to the follower and in the log, keep serving others
            log.exception("replication listener: round from %s failed", peer)
            _send_error(conn, UnknownServerError(f"{type(exc).__name__}: {exc}"))
        finally:
            if follower >= 0:
                REPLICATION_STREAMS.labels(str(follower)).dec()
            with self._lock:
                self._connections.discard(conn)
                self._connections.discard(raw)
            _shutdown(conn)


def _no_cancel(_callback: Callable[[], None]) -> None:
    """A parked round is not released early when its follower goes away: it ends after its long
    poll (at most ``replica.fetch.wait.max.ms``) and the write then fails."""


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
