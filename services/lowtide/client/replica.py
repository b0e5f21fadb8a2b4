"""``ReplicaClient``: the one client of the ``lowtide.v1.Replica`` service.

Used by the producer and consumer (Produce, Fetch to leaders), the share consumer (ShareFetch,
ShareAcknowledge), the front door's fan-out (ListOffsets, DeleteRecords to leaders), the follower
fetcher of a replica (Fetch with its ``replica_id``), the local cluster's tools and the demo
(DescribeLogs). Callers hand it plain
tuples and the service's messages (``lowtide.messages.replica``) and get those dataclasses back:
no caller outside ``rpc``/``client`` and the servicers touches generated protobuf code.

Errors: a whole-call failure raises the ``LowtideError`` it carried (an unreachable broker is
NETWORK_EXCEPTION, a passed deadline REQUEST_TIMED_OUT); per-partition errors come back as the
``error`` field of each result (None when the partition succeeded).
"""

from __future__ import annotations

import queue
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from lowtide.errors import NetworkException, error_or_none
from lowtide.messages import TopicPartition
from lowtide.messages.replica import (
    READ_UNCOMMITTED,
    DeleteRecordsResult,
    EpochEndOffset,
    EpochQuery,
    FetchedPartition,
    FetchPosition,
    FetchSessionRound,
    LogDescription,
    PartitionOffset,
    ProducedPartition,
    ReplicaLogs,
    TxnMarkerRequest,
    TxnMarkerResult,
)
from lowtide.rpc.channels import PooledClient, call
from lowtide.rpc.messages import (
    delete_results_from_proto,
    epoch_or_none,
    fetch_request,
    fetched_from_proto,
    parse_fetch_response,
)
from lowtide.rpc.status import error_from_rpc
from lowtide_pb import common_pb2, replica_pb2, replica_pb2_grpc, transactions_pb2

if TYPE_CHECKING:
    from lowtide.messages.share import ShareFetchAnswer, ShareFetchAsk


class ReplicaClient(PooledClient):
    """Calls Replica RPCs on brokers by address over a shared ``ChannelPool``.

    ``metadata`` (``authorization: Bearer ...``) is sent on every call. Thread-safe: holds no
    per-call state; the pool is thread-safe. ``close()`` closes the pool only if it made it.
    """

    def _stub(self, address: str) -> replica_pb2_grpc.ReplicaStub:
        return self.channels.stub(address, replica_pb2_grpc.ReplicaStub)

    def produce(self, address: str, partitions: Sequence[tuple[str, int, bytes]], *, acks: int, timeout_ms: int,
                deadline_s: float,
                leader_epochs: Mapping[TopicPartition, int] | None = None,
                expected_end_offsets: Mapping[TopicPartition, int] | None = None,
                coordinator_append: bool = False) -> list[ProducedPartition]:
        """Append ``(topic, partition, batches)`` at the leader; ``timeout_ms`` is the leader's
        acks=all wait, ``deadline_s`` the call's own deadline. ``leader_epochs`` (from metadata)
        lets the leader fence a producer whose view of leadership is stale; ``expected_end_offsets``
        make those partitions' appends conditional (replica.proto ``expected_log_end_offset``).
        ``coordinator_append``: a coordinator writing its internal topic (replica.proto), for the
        coordinators only; without it such a write is INVALID_TOPIC_EXCEPTION."""
        epochs = leader_epochs or {}
        expected = expected_end_offsets or {}
        request = replica_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=[
            replica_pb2.ProducePartition(topic=t, partition=p, records=records,
                                         current_leader_epoch=epoch_or_none(epochs.get((t, p), -1)),
                                         expected_log_end_offset=expected.get((t, p)))
            for t, p, records in partitions], coordinator_append=coordinator_append)
        response = call(self._stub(address).Produce, request, metadata=self.metadata, timeout=deadline_s)
        return [ProducedPartition(topic=r.topic, partition=r.partition, base_offset=r.base_offset,
                                  log_start_offset=r.log_start_offset,
                                  error=error_or_none(r.error_code, r.error_message))
                for r in response.partitions]

    def fetch(self, address: str, positions: Iterable[FetchPosition], *, replica_id: int = -1, max_wait_ms: int,
              min_bytes: int = 1, max_bytes: int = 0, deadline_s: float,
              isolation_level: int = READ_UNCOMMITTED,
              session: FetchSessionRound | None = None) -> list[FetchedPartition]:
        """One (long-polled) Fetch; ``replica_id`` >= 0 marks a follower's fetch, which may be a
        round of a fetch ``session`` (KIP-227)."""
        request = fetch_request(positions, replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                 max_bytes=max_bytes, session=session)
        request.isolation_level = isolation_level
        return fetched_from_proto(call(self._stub(address).Fetch, request, metadata=self.metadata, timeout=deadline_s))

    def open_replication(self, address: str) -> ReplicationStream:
        """A follower's Replicate stream to the leader at ``address`` (see ``ReplicationStream``)."""
        return ReplicationStream(self.channels.stub(address, _ReplicationStub).Replicate, metadata=self.metadata)

    def offset_for_leader_epoch(self, address: str, queries: Iterable[EpochQuery], *, replica_id: int = -1,
                                timeout_s: float) -> list[EpochEndOffset]:
        """KIP-101/KIP-279: where each queried leader epoch ends on the leader at ``address``."""
        request = replica_pb2.OffsetForLeaderEpochRequest(replica_id=replica_id, partitions=[
            replica_pb2.EpochQuery(topic=q.topic, partition=q.partition, leader_epoch=q.leader_epoch,
                                   current_leader_epoch=epoch_or_none(q.current_leader_epoch))
            for q in queries])
        response = call(self._stub(address).OffsetForLeaderEpoch, request, metadata=self.metadata,
                        timeout=timeout_s)
        return [EpochEndOffset(topic=r.topic, partition=r.partition, leader_epoch=r.leader_epoch,
                               end_offset=r.end_offset, error=error_or_none(r.error_code, r.error_message))
                for r in response.partitions]

    def list_offsets(self, address: str, queries: Iterable[tuple[str, int, int]], *,
                     timeout_s: float, isolation_level: int = READ_UNCOMMITTED,
                     leader_epochs: Mapping[TopicPartition, int] | None = None) -> list[PartitionOffset]:
        """ListOffsets for ``(topic, partition, timestamp)``: -1 latest (the last stable offset for
        READ_COMMITTED), -2 earliest, -3 max timestamp, >= 0 the first offset at or after that time.
        ``leader_epochs``: the leader epoch the caller knows per partition, which the leader fences on."""
        epochs = leader_epochs or {}
        request = common_pb2.ListOffsetsRequest(isolation_level=isolation_level, partitions=[
            common_pb2.ListOffsetsPartition(topic=t, partition=p, timestamp=ts,
                                            current_leader_epoch=epoch_or_none(epochs.get((t, p), -1)))
            for t, p, ts in queries])
        response = call(self._stub(address).ListOffsets, request, metadata=self.metadata, timeout=timeout_s)
        return [PartitionOffset(topic=r.topic, partition=r.partition, offset=r.offset, timestamp=r.timestamp,
                                leader_epoch=r.leader_epoch, error=error_or_none(r.error_code, r.error_message))
                for r in response.partitions]

    def delete_records(self, address: str, items: Iterable[tuple[str, int, int]], *, timeout_ms: int,
                       deadline_s: float) -> list[DeleteRecordsResult]:
        """KIP-107 DeleteRecords at the leader for ``(topic, partition, offset)``; the leader waits
        up to ``timeout_ms`` for the low watermark, the call up to ``deadline_s``."""
        request = common_pb2.DeleteRecordsRequest(timeout_ms=max(1, timeout_ms), partitions=[
            common_pb2.DeleteRecordsPartition(topic=t, partition=p, offset=o) for t, p, o in items])
        response = call(self._stub(address).DeleteRecords, request, metadata=self.metadata, timeout=deadline_s)
        return delete_results_from_proto(response)

    def write_txn_markers(self, address: str, markers: Iterable[TxnMarkerRequest], *, timeout_ms: int,
                          deadline_s: float) -> list[TxnMarkerResult]:
        """KIP-98 WriteTxnMarkers at the leader at ``address`` (acks=all, ``timeout_ms`` for the HW):
        one result per (marker, partition)."""
        request = transactions_pb2.WriteTxnMarkersRequest(timeout_ms=max(1, timeout_ms), markers=[
            transactions_pb2.TxnMarker(producer_id=m.producer_id, producer_epoch=m.producer_epoch, commit=m.commit,
                                       coordinator_epoch=m.coordinator_epoch,
                                       partitions=[common_pb2.TopicPartition(topic=t, partition=p)
                                                   for t, p in m.partitions])
            for m in markers])
        response = call(self._stub(address).WriteTxnMarkers, request, metadata=self.metadata, timeout=deadline_s)
        return [TxnMarkerResult(topic=r.topic, partition=r.partition, producer_id=m.producer_id,
                                error=error_or_none(r.error_code, r.error_message))
                for m in response.markers for r in m.partitions]

    def share_fetch(self, address: str, ask: ShareFetchAsk, *, deadline_s: float) -> ShareFetchAnswer:
        """KIP-932 ShareFetch (``ask.fetch``) or ShareAcknowledge at the leader at ``address``: the
        share handler's answer, its whole-request error (a share session's) in ``error``."""
        # Imported here: `import lowtide.client` loads no share converters (test_import_rules).
        from lowtide.rpc.convert import share as convert_share
        stub = self._stub(address)
        if ask.fetch:
            response = call(stub.ShareFetch, convert_share.fetch_to_proto(ask), metadata=self.metadata,
                            timeout=deadline_s)
        else:
            response = call(stub.ShareAcknowledge, convert_share.acknowledge_to_proto(ask), metadata=self.metadata,
                            timeout=deadline_s)
        return convert_share.answer_from_proto(response)

    def describe_logs(self, address: str, partitions: Iterable[TopicPartition] = (), *,
                      timeout_s: float = 10.0) -> ReplicaLogs:
        """The replicas hosted at ``address`` (all of them when ``partitions`` is empty)."""
        request = replica_pb2.DescribeLogsRequest(partitions=[
            common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions])
        response = call(self._stub(address).DescribeLogs, request, metadata=self.metadata, timeout=timeout_s)
        return ReplicaLogs(replica_id=response.replica_id, logs=[LogDescription(
            topic=i.topic, partition=i.partition, role=i.role, leader=i.leader, leader_epoch=i.leader_epoch,
            log_start_offset=i.log_start_offset, high_watermark=i.high_watermark, log_end_offset=i.log_end_offset,
            low_watermark=i.low_watermark, size_bytes=i.size_bytes, segments=i.segments, isr=tuple(i.isr),
            dir=i.dir) for i in response.logs])


class _ReplicationStub:
    """``Replica.Replicate`` answered as ``FetchedPartition`` lists whose records are views of the
    received message: a follower writes them to its log without copying them first."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.Replicate = channel.stream_stream(
            "/lowtide.v1.Replica/Replicate", request_serializer=replica_pb2.FetchRequest.SerializeToString,
            response_deserializer=parse_fetch_response, _registered_method=True)


_END_OF_STREAM = object()


class ReplicationStream:
    """A follower's ``Replicate`` stream to one leader: ``fetch`` sends one follower fetch on it
    and returns the leader's answer, exactly as ``ReplicaClient.fetch`` would, without a new call
    per round. The stream has no deadline of its own (it lives as long as the leader leads);
    ``cancel`` (from any thread: a watchdog, a shutdown) makes a waiting ``fetch`` raise.

    Errors: a failed or cancelled stream raises the ``LowtideError`` it carried (NETWORK_EXCEPTION
    when the leader went away); the stream is then finished and the caller opens a new one.

    Thread-safety: one ``fetch`` at a time (one follower thread per leader); ``cancel`` and
    ``close`` from any thread.
    """

    def __init__(self, method: Any, *, metadata: Sequence[tuple[str, str]]) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        # gRPC consumes the request iterator on its own thread; the queue hands requests to it.
        self._responses = method(iter(self._requests.get, _END_OF_STREAM), metadata=list(metadata))
        self.finished = False

    def fetch(self, positions: Iterable[FetchPosition], *, replica_id: int, max_wait_ms: int, min_bytes: int = 1,
              max_bytes: int = 0, session: FetchSessionRound | None = None) -> list[FetchedPartition]:
        if self.finished:
            raise NetworkException("the replication stream is finished; open a new one")
        self._requests.put(fetch_request(positions, replica_id=replica_id, max_wait_ms=max_wait_ms,
                                          min_bytes=min_bytes, max_bytes=max_bytes, session=session))
        try:
            return next(self._responses)  # already FetchedPartitions (parse_fetch_response)
        except StopIteration:
            self.finished = True
            raise NetworkException("the leader ended the replication stream") from None
        except grpc.RpcError as exc:
            self.finished = True
            raise error_from_rpc(exc) from None

    def cancel(self) -> None:
        self._responses.cancel()

    def close(self) -> None:
        self.finished = True
        self._requests.put(_END_OF_STREAM)
        self._responses.cancel()

