"""Clients of a leader's replication listener (lowtide.rpc.framed_listener): the
connection both use (``FramedConnection``), a follower's replication rounds
(``SocketReplicationStream``; ``LoopFramedConnection`` on an event loop), a coordinator's
appends to its metadata partition (``ListenerProducer``) and a broker's CommitFile calls to a
coordinator shard's framed listener (``ListenerCaller``), without gRPC (lowtide.rpc.framed draws
the frames).

Why a coordinator appends here: each committed diskless file is one acks=all append to
``__diskless_metadata-K``, and a unary gRPC Produce costs both ends about half a millisecond of
CPU in grpcio's Python layer alone (docs/design/diskless.md#cost-per-commit).
"""

from __future__ import annotations

import asyncio
import queue
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lowtide.errors import LowtideError, NetworkException, RequestTimedOut, error_or_none
from lowtide.messages import TopicPartition
from lowtide.messages.replica import FetchedPartition, FetchPosition, FetchSessionRound, ProducedPartition
from lowtide.rpc.framed import (
    CALL,
    ERROR,
    HEADER,
    HELLO,
    PRODUCE,
    REQUEST,
    RESPONSE,
    FrameReader,
    check_header,
    decode_error,
    encode_call,
    encode_frame,
    encode_hello,
    frame_header,
    write_frame,
)
from lowtide.rpc.steps import Steps
from lowtide.tls.config import ClientTls
from lowtide_pb import replica_pb2


class ListenerUnreachable(NetworkException):
    """The replication listener could not be connected to: nothing was sent (safe to send the same
    request another way)."""


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


class SocketReplicationStream:
    """``ReplicationStream`` (lowtide.client.replica) over a leader's replication listener:
    ``fetch`` sends one follower fetch and returns the leader's answer on the calling thread, no
    thread hand-off. Errors and thread-safety: ``FramedConnection``'s."""

    def __init__(self, address: str, *, tls: ClientTls | None, metadata: Sequence[tuple[str, str]],
                 connect_timeout_s: float) -> None:
        self._connection = FramedConnection(address, tls=tls, metadata=metadata, connect_timeout_s=connect_timeout_s)

    @property
    def finished(self) -> bool:
        return self._connection.finished

    def fetch(self, positions: Iterable[FetchPosition], *, replica_id: int, max_wait_ms: int, min_bytes: int = 1,
              max_bytes: int = 0, session: FetchSessionRound | None = None) -> list[FetchedPartition]:
        from lowtide.client.replica import _fetch_request, _parse_fetch_response  # one wire format for both

        request = _fetch_request(positions, replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                 max_bytes=max_bytes, session=session)
        return _parse_fetch_response(self._connection.call(REQUEST, request.SerializeToString()))

    def cancel(self) -> None:
        self._connection.cancel()

    def close(self) -> None:
        self._connection.close()


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
        from lowtide.client.replica import _fetch_request, _parse_fetch_response  # one wire format for both

        request = _fetch_request(positions, replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                 max_bytes=max_bytes, session=session)
        answer = yield from self.call_steps(REQUEST, request.SerializeToString(), timeout_s=timeout_s)
        return _parse_fetch_response(answer)

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
    deadline the future is cancelled."""

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


class _ConnectionPool:
    """Pooled ``FramedConnection``s per address: one per request in flight to it, an idle one
    reused; a connection that failed is dropped, never reused. Thread-safety: any thread."""

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


class ListenerProducer(_ConnectionPool):
    """Produce requests to leaders' replication listeners, on pooled connections (one per request
    in flight to an address; an idle one is reused). Same answers and errors as
    ``ReplicaClient.produce``; a connection that failed is dropped, never reused.

    Thread-safety: every method from any thread.
    """

    def produce(self, address: str, partitions: Sequence[tuple[str, int, bytes]], *, acks: int, timeout_ms: int,
                deadline_s: float, expected_end_offsets: Mapping[TopicPartition, int] | None = None,
                coordinator_append: bool = False) -> list[ProducedPartition]:
        request = encode_produce(partitions, acks=acks, timeout_ms=timeout_ms,
                                 expected_end_offsets=expected_end_offsets, coordinator_append=coordinator_append)
        return decode_produced(self._exchange(address, PRODUCE, request, timeout_s=deadline_s))

    def produce_steps(self, address: str, partitions: Sequence[tuple[str, int, bytes]], *,
                      loop: asyncio.AbstractEventLoop, acks: int, timeout_ms: int, deadline_s: float,
                      expected_end_offsets: Mapping[TopicPartition, int] | None = None,
                      coordinator_append: bool = False) -> Steps[list[ProducedPartition]]:
        """``produce`` as steps on ``loop`` (rpc/steps.py), on the loop's own pooled connections
        (``LoopFramedConnection``): a coordinator shard's appends, answered on the loop that
        answers its brokers (coordinator/service.py). Loop's thread only."""
        request = encode_produce(partitions, acks=acks, timeout_ms=timeout_ms,
                                 expected_end_offsets=expected_end_offsets, coordinator_append=coordinator_append)
        idle = self._loop_idle.setdefault(address, [])
        while idle and idle[-1].finished:
            idle.pop()
        if idle:
            connection = idle.pop()
        else:
            try:
                connection = yield from LoopFramedConnection.open_steps(
                    address, loop=loop, tls=self.tls, metadata=self.metadata, connect_timeout_s=self.connect_timeout_s)
            except NetworkException as exc:
                raise ListenerUnreachable(str(exc)) from None
        answer = yield from connection.call_steps(PRODUCE, request, timeout_s=deadline_s)
        if self._closed:
            connection.close()
        else:
            idle.append(connection)
        return decode_produced(answer)

    def close_loop_connections(self) -> None:
        """On the loop's thread: close the connections ``produce_steps`` keeps."""
        for connections in self._loop_idle.values():
            for connection in connections:
                connection.close()
        self._loop_idle.clear()


def encode_produce(partitions: Sequence[tuple[str, int, bytes]], *, acks: int, timeout_ms: int,
                   expected_end_offsets: Mapping[TopicPartition, int] | None = None,
                   coordinator_append: bool = False) -> bytes:
    """A PRODUCE frame's payload: replica.proto's ProduceRequest."""
    expected = expected_end_offsets or {}
    return replica_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=[
        replica_pb2.ProducePartition(topic=t, partition=p, records=records,
                                     expected_log_end_offset=expected.get((t, p)))
        for t, p, records in partitions], coordinator_append=coordinator_append).SerializeToString()


def decode_produced(answer: bytes | bytearray) -> list[ProducedPartition]:
    """The partitions of a PRODUCE frame's answer (replica.proto's ProduceResponse)."""
    response = replica_pb2.ProduceResponse.FromString(bytes(answer))
    return [ProducedPartition(topic=r.topic, partition=r.partition, base_offset=r.base_offset,
                              log_start_offset=r.log_start_offset, error=error_or_none(r.error_code, r.error_message))
            for r in response.partitions]


class ListenerCaller(_ConnectionPool):
    """Calls of a gRPC service's methods as CALL frames to its framed listener (a coordinator
    shard's CommitFile, docs/design/diskless.md#cost-per-commit), on pooled connections: the
    serialized request in, the serialized response out. A refusal raises the error the server
    sent (as the gRPC method's status would), ListenerUnreachable when nothing was sent.

    Thread-safety: every method from any thread.
    """

    def call(self, address: str, method: str, request: bytes, *, timeout_s: float) -> bytes:
        return self._exchange(address, CALL, encode_call(method, request), timeout_s=timeout_s)
