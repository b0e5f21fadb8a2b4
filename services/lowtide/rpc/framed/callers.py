"""The framed protocol's callers, each a server talking to another server's framed listener
(lowtide.rpc.framed.listener) on the connections of lowtide.rpc.framed.connection:

* ``SocketReplicationStream``: a follower's replication rounds to its leader (REQUEST frames;
  replica/fetcher.py, off an event loop; on one it uses ``LoopFramedConnection.fetch_steps``);
* ``ListenerProducer``: a coordinator's appends to its metadata partition on the partition
  leader's replication listener (PRODUCE frames; coordinator/metadata_log.py);
* ``ListenerCaller``: a broker's CommitFile calls to a coordinator shard's framed listener (CALL
  frames; client/diskless.py's ``DisklessClient``).

Why here and not in lowtide.client: these are server-to-server calls, none of them something a
user of the Python client makes; the public client keeps the gRPC calls.

Why a coordinator appends here: each committed diskless file is one acks=all append to
``__diskless_metadata-K``, and a unary gRPC Produce costs both ends about half a millisecond of
CPU in grpcio's Python layer alone (docs/design/diskless.md#cost-per-commit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from lowtide.errors import NetworkException, error_or_none
from lowtide.messages import TopicPartition
from lowtide.messages.replica import FetchedPartition, FetchPosition, FetchSessionRound, ProducedPartition
from lowtide.rpc.framed.codec import CALL, PRODUCE, REQUEST, encode_call
from lowtide.rpc.framed.connection import ConnectionPool, FramedConnection, ListenerUnreachable, LoopFramedConnection
from lowtide.rpc.messages import fetch_request, parse_fetch_response
from lowtide.rpc.steps import Steps
from lowtide.tls.config import ClientTls
from lowtide_pb import replica_pb2

__all__ = ["ListenerCaller", "ListenerProducer", "ListenerUnreachable", "SocketReplicationStream",
           "decode_produced", "encode_produce"]


class SocketReplicationStream:
    """``ReplicationStream`` (lowtide.client.replica) over a leader's replication listener, the
    transport a follower's fetcher uses off an event loop (replica/fetcher.py):
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
        request = fetch_request(positions, replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                 max_bytes=max_bytes, session=session)
        return parse_fetch_response(self._connection.call(REQUEST, request.SerializeToString()))

    def cancel(self) -> None:
        self._connection.cancel()

    def close(self) -> None:
        self._connection.close()


class ListenerProducer(ConnectionPool):
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


class ListenerCaller(ConnectionPool):
    """Calls of a gRPC service's methods as CALL frames to its framed listener (a coordinator
    shard's CommitFile, docs/design/diskless.md#cost-per-commit), on pooled connections: the
    serialized request in, the serialized response out. A refusal raises the error the server
    sent (as the gRPC method's status would), ListenerUnreachable when nothing was sent.

    Thread-safety: every method from any thread.
    """

    def call(self, address: str, method: str, request: bytes, *, timeout_s: float) -> bytes:
        return self._exchange(address, CALL, encode_call(method, request), timeout_s=timeout_s)
