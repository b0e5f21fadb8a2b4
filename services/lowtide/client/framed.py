"""Clients of a leader's replication listener (lowtide.rpc.framed_listener): the
connection both use (``FramedConnection``), a follower's replication rounds
(``SocketReplicationStream``) and a coordinator's appends to its metadata partition
(``ListenerProducer``), without gRPC (lowtide.rpc.framed draws the frames).

Why a coordinator appends here: each committed diskless file is one acks=all append to
``__diskless_metadata-K``, and a unary gRPC Produce costs both ends about half a millisecond of
CPU in grpcio's Python layer alone (docs/design/diskless.md#cost-per-commit).
"""

from __future__ import annotations

import queue
import socket
import ssl
import threading
from collections.abc import Iterable, Mapping, Sequence

from lowtide.errors import NetworkException, RequestTimedOut, error_or_none
from lowtide.messages import TopicPartition
from lowtide.messages.replica import FetchedPartition, FetchPosition, ProducedPartition
from lowtide.rpc.framed import (
    ERROR,
    HELLO,
    PRODUCE,
    REQUEST,
    RESPONSE,
    FrameReader,
    decode_error,
    encode_hello,
    write_frame,
)
from lowtide.tls.config import ClientTls
from lowtide_pb import replica_pb2


class ListenerUnreachable(NetworkException):
    """The replication listener could not be connected to: nothing was sent (safe to send the same
    request another way)."""


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
        if answer_kind == ERROR:
            raise decode_error(answer)
        raise NetworkException(f"the replication listener at {self.address} sent frame kind {answer_kind} "
                               "where an answer was due")

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
              max_bytes: int = 0) -> list[FetchedPartition]:
        from lowtide.client.replica import _fetch_request, _parse_fetch_response  # one wire format for both

        request = _fetch_request(positions, replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                 max_bytes=max_bytes)
        return _parse_fetch_response(self._connection.call(REQUEST, request.SerializeToString()))

    def cancel(self) -> None:
        self._connection.cancel()

    def close(self) -> None:
        self._connection.close()


class ListenerProducer:
    """Produce requests to leaders' replication listeners, on pooled connections (one per request
    in flight to an address; an idle one is reused). Same answers and errors as
    ``ReplicaClient.produce``; a connection that failed is dropped, never reused.

    Thread-safety: every method from any thread.
    """

    def __init__(self, *, tls: ClientTls | None, metadata: Sequence[tuple[str, str]],
                 connect_timeout_s: float = 5.0) -> None:
        self.tls, self.metadata, self.connect_timeout_s = tls, tuple(metadata), connect_timeout_s
        self._lock = threading.Lock()
        self._idle: dict[str, queue.SimpleQueue[FramedConnection]] = {}
        self._closed = False

    def produce(self, address: str, partitions: Sequence[tuple[str, int, bytes]], *, acks: int, timeout_ms: int,
                deadline_s: float, expected_end_offsets: Mapping[TopicPartition, int] | None = None,
                coordinator_append: bool = False) -> list[ProducedPartition]:
        expected = expected_end_offsets or {}
        request = replica_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=[
            replica_pb2.ProducePartition(topic=t, partition=p, records=records,
                                         expected_log_end_offset=expected.get((t, p)))
            for t, p, records in partitions], coordinator_append=coordinator_append)
        try:
            connection = self._take(address)
        except NetworkException as exc:
            raise ListenerUnreachable(str(exc)) from None
        answer = connection.call(PRODUCE, request.SerializeToString(), timeout_s=deadline_s)
        self._give_back(address, connection)
        response = replica_pb2.ProduceResponse.FromString(answer)
        return [ProducedPartition(topic=r.topic, partition=r.partition, base_offset=r.base_offset,
                                  log_start_offset=r.log_start_offset,
                                  error=error_or_none(r.error_code, r.error_message))
                for r in response.partitions]

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
        """Close the idle connections to ``address`` (its broker moved or went away)."""
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
