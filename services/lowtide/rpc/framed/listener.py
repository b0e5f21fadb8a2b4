"""The replication listener: a plain TCP (or TLS) port beside a replica's gRPC port, carrying
follower fetch rounds and coordinator appends as frames (lowtide.rpc.framed.codec draws them;
docs/design/kip-107-delete-records.md#replication-and-the-low-watermark). A coordinator shard
serves its brokers' CommitFile calls on one too (CALL frames; docs/design/diskless.md#cost-per-commit).

A peer opens a connection and keeps it: a HELLO frame with its call metadata (the token a gRPC call
would carry), then one request frame at a time (REQUEST: a follower fetch; PRODUCE: an append;
CALL: a method of the server's gRPC service), each answered by one RESPONSE, or by one ERROR
after which the listener closes the connection.
The listener authenticates once per connection (the token, or with mutual TLS the client
certificate) and hands every request to the connection's session (``FramedSession``,
lowtide.rpc.framed.session; the replica's servicer: ``ReplicaServicer.open_framed_session``, a
coordinator shard's: ``CoordinatorServicer.open_framed_session``), which checks and answers it
exactly as its gRPC method. Every frame of this plumbing (HELLO, RESPONSE, ERROR) is the
listener's; a session holds only its server's handlers.

Why a second port: a round on a gRPC stream costs about six times the CPU of a round on a socket
(four thread hand-offs per message inside grpcio), and with small produce requests and diskless
commits every append costs one round per follower and, for a coordinator, one unary Produce.

With TLS on, the listener speaks TLS with the service's certificate and asks for client
certificates as the gRPC port does.

Threads (issue 32): connections are served on an asyncio event loop, the Kafka listener's when
the service has one (``start(loop=...)``), else one of the listener's own. A request is a handler
written as steps (rpc/steps.py): a follower round that parks, or an acks=all append waiting
for the HW, yields its wait instead of holding a thread, and is resumed on the loop by what it
waits for. On the Kafka listener's loop, a producer's append, the follower rounds it wakes and the
HW move that answers it run on one thread, with no hand-off between threads in between (each cost
more CPU than the append on a 2-core VM). What may block (authenticating a HELLO, a diskless read)
runs on a small pool. A peer that goes away mid-request (EOF, a reset) is told to its session at
once (``FramedSession.cancel``), so a parked round is released then, not after its long poll.

Thread-safety: ``bind``/``start``/``stop`` from any thread; everything else on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lowtide.errors import InvalidRequest, LowtideError, NetworkException, UnknownServerError
from lowtide.rpc.framed.codec import (
    CALL,
    ERROR,
    HELLO,
    PRODUCE,
    REQUEST,
    RESPONSE,
    decode_hello,
    encode_error,
    encode_frame,
    frame_header,
    read_frame_async,
)
from lowtide.rpc.framed.session import FramedSession
from lowtide.rpc.steps import drive_to_future
from lowtide.tls.config import ServerTls

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0  # TLS handshake and HELLO: a connection that says nothing is dropped
MAX_CONNECTIONS = 256
BLOCKING_WORKERS = 8  # HELLO authentication, diskless reads
WRITE_SLICE_BYTES = 256 * 1024


class FramedListener:
    """Serves framed requests on ``host:port`` (0: a free port, read ``port`` after ``bind``).

    Contract: ``bind()`` opens the port (before the broker registers, so it can advertise it);
    ``start(open_session, authenticate, draining, loop)`` accepts connections on ``loop`` (None: a
    loop of its own): ``authenticate(metadata, certificate_der)`` names the principal once per
    connection, ``open_session(principal, peer)`` gives the ``FramedSession`` answering its
    requests (a server's ``FrameDispatcher``, lowtide.rpc.framed.session), ``draining()`` true
    ends each connection after its current request (peers reconnect to whoever leads next).
    ``stop()`` closes the port and every connection.

    Thread-safety: ``bind``/``start``/``stop`` from any thread; everything else on the loop.
    """

    def __init__(self, *, host: str, port: int, tls: ServerTls | None, name: str,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.host, self.port, self.tls, self.name = host, port, tls, name
        self.max_connections = max_connections
        self._sock: socket.socket | None = None
        self._context: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        # Each open connection's writer and its _serve task (None outside a task), both ended by stop().
        self._connections: dict[asyncio.StreamWriter, asyncio.Task | None] = {}
        self._pool = ThreadPoolExecutor(max_workers=BLOCKING_WORKERS, thread_name_prefix=f"{name}-framed")
        self._stopped = threading.Event()

    def bind(self) -> int:
        sock = socket.create_server((self.host, self.port), reuse_port=False, backlog=64)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        if self.tls is not None:
            self._context = self.tls.ssl_context()
        return self.port

    def start(self, *, open_session: Callable[[str, str], FramedSession],
              authenticate: Callable[[list[tuple[str, str]], bytes | None], str],
              draining: Callable[[], bool], loop: asyncio.AbstractEventLoop | None = None) -> None:
        if self._sock is None:
            raise RuntimeError("bind() before start()")
        self._open_session, self._authenticate, self._draining = open_session, authenticate, draining
        if loop is None:
            loop = asyncio.new_event_loop()
            self._own_loop = threading.Thread(target=loop.run_forever, name=f"{self.name}-framed-listener",
                                              daemon=True)
            self._own_loop.start()
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=10)

    async def _listen(self) -> None:
        tls = {"ssl": self._context, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S} if self._context else {}
        loop = asyncio.get_running_loop()

        def connection() -> _ConnectionProtocol:  # what asyncio.start_server builds, told of the peer's going
            return _ConnectionProtocol(asyncio.StreamReader(limit=1 << 16, loop=loop), self._serve, loop=loop)

        self._server = await loop.create_server(connection, sock=self._sock, **tls)

    def stop(self) -> None:
        self._stopped.set()
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer, handler in list(self._connections.items()):
                writer.close()
                if handler is not None:  # one parked in a request its session cannot release
                    handler.cancel()

        try:
            asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=2)
        except Exception:  # the loop stopped first (its Kafka listener): the port closes with the process
            log.debug("replication listener: could not close on its loop", exc_info=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._own_loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            self._own_loop.join(timeout=2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_addr = writer.get_extra_info("peername") or ("?", 0)
        peer = f"ipv4:{peer_addr[0]}:{peer_addr[1]}"
        if len(self._connections) >= self.max_connections:
            log.warning("replication listener: %d connections open; refusing %s", len(self._connections), peer)
            writer.close()
            return
        self._connections[writer] = asyncio.current_task()
        session: Any = None
        loop = asyncio.get_running_loop()
        try:
            raw = writer.get_extra_info("socket")
            if raw is not None:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            frame = await asyncio.wait_for(read_frame_async(reader), HANDSHAKE_TIMEOUT_S)
            if frame is None:
                return
            kind, payload = frame
            if kind != HELLO:
                raise InvalidRequest(f"the first frame must be HELLO ({HELLO}), got kind {kind}")
            tls = writer.get_extra_info("ssl_object")
            certificate = tls.getpeercert(binary_form=True) if tls is not None else None
            metadata = decode_hello(payload)
            principal = await loop.run_in_executor(self._pool, self._authenticate, metadata, certificate)
            session = self._open_session(principal, peer)
            protocol = writer.transport.get_protocol()
            if isinstance(protocol, _ConnectionProtocol):
                protocol.on_peer_gone = session.cancel
            # Requests park at most their long poll; a silent peer just idles.
            while not self._stopped.is_set() and not self._draining():
                frame = await read_frame_async(reader)
                if frame is None:
                    return
                kind, payload = frame
                if kind not in (REQUEST, PRODUCE, CALL):
                    raise InvalidRequest(f"expected a REQUEST ({REQUEST}), PRODUCE ({PRODUCE}) or CALL ({CALL}) "
                                         f"frame, got kind {kind}")
                answer = await drive_to_future(session.handle_steps(kind, payload), loop=loop, executor=self._pool)
                await _write_frame(writer, RESPONSE, answer)
                del answer, payload  # not kept while the connection waits for its next request
        except LowtideError as exc:
            await _send_error(writer, exc)
        except (TimeoutError, OSError, ssl.SSLError, NetworkException, asyncio.IncompleteReadError):
            pass  # the peer went away (or never finished its handshake): it reconnects
        except Exception as exc:  # a bug: say so to the peer and in the log, keep serving others
            log.exception("replication listener: a request from %s failed", peer)
            await _send_error(writer, UnknownServerError(f"{type(exc).__name__}: {exc}"))
        finally:
            if session is not None:
                session.close()
            self._connections.pop(writer, None)
            writer.close()


class _ConnectionProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, which also tells the connection's session when the peer goes.

    Why: while a request is in flight nothing reads the socket (one request at a time), so
    without this a follower's parked round outlived its connection by its whole long poll (up to
    fetch.max.wait.ms), holding a connection slot and its wake-ups. EOF counts as going: the
    framed protocol's peers keep their connection until they are done with it."""

    def __init__(self, reader: asyncio.StreamReader, connected: Callable[..., Any], *,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(reader, connected, loop=loop)
        self.on_peer_gone: Callable[[], None] | None = None

    def eof_received(self) -> bool | None:
        self._tell_peer_gone()
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._tell_peer_gone()
        super().connection_lost(exc)

    def _tell_peer_gone(self) -> None:
        callback, self.on_peer_gone = self.on_peer_gone, None
        if callback is not None:
            try:
                callback()
            except Exception:  # a bug in a session: logged, the connection still closes
                log.exception("replication listener: releasing a departed peer's request failed")


async def _write_frame(writer: asyncio.StreamWriter, kind: int, payload: bytes) -> None:
    """One frame. A large payload goes in slices, each written once the transport drained the one
    before: Python 3.11's transport copies what the socket does not take at once into its own
    buffer, and moves that buffer's rest down after every send (an 8 MiB catch-up answer to a slow
    follower: another 8 MiB held, and megabytes moved per send)."""
    if len(payload) < WRITE_SLICE_BYTES:
        writer.write(frame_header(kind, len(payload)) + payload)
    else:
        writer.write(frame_header(kind, len(payload)))
        view = memoryview(payload)
        for start in range(0, len(payload), WRITE_SLICE_BYTES):
            writer.write(view[start:start + WRITE_SLICE_BYTES])
            await writer.drain()
    await writer.drain()


async def _send_error(writer: asyncio.StreamWriter, error: LowtideError) -> None:
    try:
        writer.write(encode_frame(ERROR, encode_error(error)))
        await writer.drain()
    except (OSError, ssl.SSLError, RuntimeError):
        pass

