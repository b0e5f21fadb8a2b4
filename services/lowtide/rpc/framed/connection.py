"""Connections to a framed listener (lowtide.rpc.framed.listener), the client half of the
framed protocol (lowtide.rpc.framed.codec draws the frames): ``FramedConnection`` answers on the
calling thread (blocking sockets), ``LoopFramedConnection`` on an event loop (steps,
lowtide.rpc.steps), and ``ConnectionPool`` keeps both kinds per address for the callers that
share them (lowtide.rpc.framed.callers).

Every connection opens with a HELLO carrying the caller's metadata, then sends one request frame
at a time and reads its answer: a RESPONSE's payload is returned, an ERROR frame raised as the
error it carries (the listener then closes), anything else NETWORK_EXCEPTION.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from lowtide.errors import LowtideError, NetworkException, RequestTimedOut
from lowtide.messages.replica import FetchedPartition, FetchPosition, FetchSessionRound
from lowtide.rpc.framed.codec import (
    ERROR,
    HEADER,
    HELLO,
    REQUEST,
    RESPONSE,
    FrameReader,
    check_header,
    decode_error,
    encode_frame,
    encode_hello,
    frame_header,
    write_frame,
)
from lowtide.rpc.messages import fetch_request, parse_fetch_response
from lowtide.rpc.steps import Steps
from lowtide.tls.config import ClientTls


class ListenerUnreachable(NetworkException):
    """The replication listener could not be connected to: nothing was sent (safe to send the same
    request another way). Raised by the pooled callers (lowtide.rpc.framed.callers)."""


def _refusal(address: str, kind: int, payload: bytes | bytearray) -> LowtideError:
    """The error an answer frame other than RESPONSE stands for: an ERROR frame's own error, any
    other kind NETWORK_EXCEPTION (the listener does not speak this protocol)."""
    if kind == ERROR:
        return decode_error(bytes(payload))
    return NetworkException(f"the replication listener at {address} sent frame kind {kind} where an answer was due")


class FramedConnection:
    """One connection to a replication listener: opened with a HELLO carrying ``metadata``, then
    ``call(kind, payload)`` sends one request frame and returns the answer's payload on the calling
    thread. A refused request raises the error the listener sent (it then closes the connection),
    a broken connection NETWORK_EXCEPTION, a passed ``timeout_s`` REQUEST_TIMED_OUT; after any of
    them ``finished`` is set and the connection is useless.

    Thread-safety: one ``call`` at a time; ``cancel`` and ``close`` from any thread (``cancel``
    shuts the socket down, so a waiting ``call`` raises at once).
    """

    def __init__(self, address: str, *, tls: ClientTls | None, metadata: Sequence[tuple[str, str]],
                 connect_timeout_s: float) -> None:
        host, _, port = address.rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=connect_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.ssl_context().wrap_socket(sock, server_hostname=tls.server_name or host)
            sock.settimeout(None)
            write_frame(sock, HELLO, encode_hello([(k, v) for k, v in metadata]))
        except (OSError, ValueError) as exc:
            raise NetworkException(f"cannot open a connection to the replication listener at {address}: "
                                   f"{exc}") from None
        self._sock = sock
        self._reader = FrameReader(sock)
        self.address = address
        self.finished = False

    def call(self, kind: int, payload: bytes, *, timeout_s: float | None = None) -> bytes:
        if self.finished:
            raise NetworkException("the replication listener connection is finished; open a new one")
        try:
            self._sock.settimeout(timeout_s)
            write_frame(self._sock, kind, payload)
            frame = self._reader.read()
        except TimeoutError:
            self.close()
            raise RequestTimedOut(f"no answer from the replication listener at {self.address} within "
                                  f"{timeout_s:.1f} s") from None
        except (OSError, ssl.SSLError) as exc:
            self.close()
            raise NetworkException(f"replication listener connection to {self.address}: {exc}") from None
        except Exception:
            self.close()
            raise
        if frame is None:
            self.close()
            raise NetworkException(f"the replication listener at {self.address} closed the connection")
        answer_kind, answer = frame
        if answer_kind == RESPONSE:
            return answer
        self.close()
        raise _refusal(self.address, answer_kind, answer)

    def cancel(self) -> None:
        self.finished = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.cancel()
        try:
            self._sock.close()
        except OSError:
            pass


_HEADER_BYTES = HEADER.size
_SCRATCH_BYTES = 64 * 1024


class LoopFramedConnection(asyncio.BufferedProtocol):
    """``FramedConnection`` on an event loop, for callers written as steps (lowtide.rpc.steps):
    ``open_steps`` connects and says HELLO, ``call_steps(kind, payload)`` writes one request and
    yields the connection itself as the ``Wait`` for its answer. Same answers and errors as
    ``FramedConnection.call``; after an error ``finished`` is set and the connection is useless.

    Why (issue 32): a follower thread blocked in ``recv`` has to take the GIL back from the loop
    every time an answer lands, a thread switch per round on each side. Here the answer is read
    by the loop that also serves the Produce it belongs to, into the frame's own buffer (a
    frame that fits the 64 KiB scratch buffer is copied out of it once; a larger one is read
    straight into a buffer of its size).

    Thread-safety: everything on the loop's thread except ``cancel``, which may come from any
    thread (a fetcher stopping).
    """

    def __init__(self, address: str, *, loop: asyncio.AbstractEventLoop) -> None:
        self.address, self._loop = address, loop
        self.finished = False
        self.deadline = 0.0
        self._transport: asyncio.Transport | None = None
        self._scratch = memoryview(bytearray(_SCRATCH_BYTES))
        self._have = 0  # bytes of the scratch buffer in use (a header, maybe a whole frame)
        self._frame: memoryview | None = None  # a large frame's payload being read
        self._frame_kind = 0
        self._got = 0
        self._answer: tuple[int, Any] | None = None
        self._error: LowtideError | None = None
        self._event: Any = None
        self._waiting = False
        self._loop_thread = threading.get_ident()  # made on the loop's thread (open_steps)

    @classmethod
    def open_steps(cls, address: str, *, loop: asyncio.AbstractEventLoop, tls: ClientTls | None,
                   metadata: Sequence[tuple[str, str]], connect_timeout_s: float) -> Steps[LoopFramedConnection]:
        """Connect (TLS when ``tls``) and send the HELLO; on the loop's thread."""
        host, _, port = address.rpartition(":")
        connection = cls(address, loop=loop)
        try:
            context = tls.ssl_context() if tls is not None else None
        except (OSError, ValueError) as exc:
            raise NetworkException(f"cannot open a connection to the replication listener at {address}: "
                                   f"{exc}") from None
        connecting = asyncio.ensure_future(loop.create_connection(
            lambda: connection, host.strip("[]"), int(port), ssl=context,
            server_hostname=(tls.server_name or host) if tls is not None else None), loop=loop)
        wait = FutureWait(connecting, deadline=time.monotonic() + connect_timeout_s)
        yield wait
        if not connecting.done() or connecting.cancelled():
            connecting.cancel()
            raise NetworkException(f"cannot open a connection to the replication listener at {address}: no "
                                   f"answer within {connect_timeout_s:.1f} s")
        error = connecting.exception()
        if error is not None:
            raise NetworkException(f"cannot open a connection to the replication listener at {address}: "
                                   f"{error}") from None
        connection._write(encode_frame(HELLO, encode_hello([(k, v) for k, v in metadata])))
        return connection

    # -- the steps side -----------------------------------------------------------------------------
    def call_steps(self, kind: int, payload: bytes, *, timeout_s: float) -> Steps[Any]:
        """One request, then its answer's payload (bytes, or a bytearray for a large frame)."""
        if self.finished:
            raise NetworkException("the replication listener connection is finished; open a new one")
        self._answer, self._error = None, None
        self.deadline = time.monotonic() + timeout_s
        self._write(frame_header(kind, len(payload)) + payload)
        self._waiting = True
        try:
            yield self
        finally:
            self._waiting = False
        answer, error = self._answer, self._error
        self._answer = self._error = None
        if error is not None:
            self.close()
            raise error
        assert answer is not None
        answer_kind, body = answer
        if answer_kind == RESPONSE:
            return body
        self.close()
        raise _refusal(self.address, answer_kind, body)

    def fetch_steps(self, positions: Iterable[FetchPosition], *, replica_id: int, max_wait_ms: int,
                    min_bytes: int = 1, max_bytes: int = 0, timeout_s: float,
                    session: FetchSessionRound | None = None) -> Steps[list[FetchedPartition]]:
        """One follower round (``SocketReplicationStream.fetch``) as steps."""
        request = fetch_request(positions, replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                 max_bytes=max_bytes, session=session)
        answer = yield from self.call_steps(REQUEST, request.SerializeToString(), timeout_s=timeout_s)
        return parse_fetch_response(answer)

    # The Wait of the call in flight (lowtide.rpc.steps).
    def arm(self, event: Any) -> None:
        self._event = event

    def check(self) -> bool:
        return self._answer is not None or self._error is not None

    def expire(self) -> None:
        self._settle(error=RequestTimedOut(f"no answer from the replication listener at {self.address} within "
                                           "the round's deadline"))

    def disarm(self) -> None:
        self._event = None

    def cancel(self) -> None:
        """From any thread: end the connection; a call in flight raises NETWORK_EXCEPTION."""
        self.finished = True
        try:
            self._loop.call_soon_threadsafe(self.close)
        except RuntimeError:  # the loop is closed: so is the connection
            pass

    def close(self) -> None:
        """Close now (on the loop's thread; from another thread this is ``cancel``)."""
        if threading.get_ident() != self._loop_thread:
            self.cancel()
            return
        self.finished = True
        transport, self._transport = self._transport, None
        if transport is not None:
            try:
                transport.abort()
            except RuntimeError:  # its loop is closed already (the service stopping)
                pass
        self._settle(error=NetworkException(f"the replication listener connection to {self.address} was closed"))

    # -- the protocol side (the loop calls these) --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.finished:  # cancelled while connecting
            transport.abort()
            self._transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.finished = True
        self._transport = None
        self._settle(error=NetworkException(f"replication listener connection to {self.address}: "
                                            f"{exc or 'closed by the listener'}"))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return self._frame[self._got:]
        return self._scratch[self._have:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._got += nbytes
            if self._got == len(self._frame):
                frame, self._frame = self._frame, None
                self._settle(answer=(self._frame_kind, frame.obj))
            return
        self._have += nbytes
        if self._have < _HEADER_BYTES:
            return
        length, kind = HEADER.unpack_from(self._scratch)
        try:
            check_header(length, kind)
        except LowtideError as exc:
            self._settle(error=exc)
            self.close()
            return
        size, body = length - 1, self._have - _HEADER_BYTES
        if body > size:  # a frame nobody asked for: the peer does not speak this protocol
            self._settle(error=NetworkException(f"the replication listener at {self.address} sent an unasked frame"))
            self.close()
        elif body == size:
            self._have = 0
            self._settle(answer=(kind, bytes(self._scratch[_HEADER_BYTES:_HEADER_BYTES + size])))
        elif size <= _SCRATCH_BYTES - _HEADER_BYTES:
            return  # the rest comes into the scratch buffer
        else:
            frame = memoryview(bytearray(size))
            frame[:body] = self._scratch[_HEADER_BYTES:self._have]
            self._frame, self._frame_kind, self._got, self._have = frame, kind, body, 0

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost settles the call

    def _write(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or self.finished:
            raise NetworkException(f"the replication listener connection to {self.address} is closed")
        transport.write(data)

    def _settle(self, *, answer: tuple[int, Any] | None = None, error: LowtideError | None = None) -> None:
        if not self._waiting or self.check():
            return  # nothing in flight (or it already settled): an error surfaces on the next call
        self._answer, self._error = answer, error
        event = self._event
        if event is not None:
            event.set()


class FutureWait:
    """A steps ``Wait`` (lowtide.rpc.steps) for an asyncio future of the driving loop; at its
    deadline the future is cancelled. Thread-safety: the driving loop's thread only."""

    def __init__(self, future: asyncio.Future, *, deadline: float) -> None:
        self.future, self.deadline = future, deadline
        self._callback: Any = None

    def arm(self, event: Any) -> None:
        self._callback = lambda _future: event.set()
        self.future.add_done_callback(self._callback)

    def check(self) -> bool:
        return self.future.done()

    def expire(self) -> None:
        self.future.cancel()

    def disarm(self) -> None:
        if self._callback is not None:
            self.future.remove_done_callback(self._callback)
            self._callback = None


class ConnectionPool:
    """Pooled ``FramedConnection``s per address: one per request in flight to it, an idle one
    reused; a connection that failed is dropped, never reused. The base of the callers that send
    requests to many listeners (lowtide.rpc.framed.callers); ``_loop_idle`` keeps the
    ``LoopFramedConnection``s of callers on an event loop (that loop's thread only).

    Thread-safety: any thread (``_loop_idle``: its loop's thread).
    """

    def __init__(self, *, tls: ClientTls | None, metadata: Sequence[tuple[str, str]],
                 connect_timeout_s: float = 5.0) -> None:
        self.tls, self.metadata, self.connect_timeout_s = tls, tuple(metadata), connect_timeout_s
        self._lock = threading.Lock()
        self._idle: dict[str, queue.SimpleQueue[FramedConnection]] = {}
        # Idle connections of an event loop's callers (ListenerProducer.produce_steps): its thread only.
        self._loop_idle: dict[str, list[LoopFramedConnection]] = {}
        self._closed = False

    def _exchange(self, address: str, kind: int, payload: bytes, *, timeout_s: float) -> bytes:
        """One request on a pooled connection: its answer's payload. ListenerUnreachable when no
        connection could be opened (nothing was sent); else ``FramedConnection.call``'s errors."""
        try:
            connection = self._take(address)
        except NetworkException as exc:
            raise ListenerUnreachable(str(exc)) from None
        answer = connection.call(kind, payload, timeout_s=timeout_s)
        self._give_back(address, connection)
        return answer

    def _take(self, address: str) -> FramedConnection:
        with self._lock:
            idle = self._idle.setdefault(address, queue.SimpleQueue())
        while True:
            try:
                connection = idle.get_nowait()
            except queue.Empty:
                return FramedConnection(address, tls=self.tls, metadata=self.metadata,
                                        connect_timeout_s=self.connect_timeout_s)
            if not connection.finished:
                return connection

    def _give_back(self, address: str, connection: FramedConnection) -> None:
        with self._lock:
            idle = None if self._closed else self._idle.get(address)
        if idle is None:
            connection.close()
        else:
            idle.put(connection)

    def forget(self, address: str) -> None:
        """Close the idle connections to ``address`` (its server moved or went away)."""
        with self._lock:
            idle = self._idle.pop(address, None)
        while idle is not None and not idle.empty():
            idle.get_nowait().close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            addresses = list(self._idle)
        for address in addresses:
            self.forget(address)
