"""``DisklessCoordinatorClient``: calls the diskless coordinator shards (KIP-1164) by shard number.

Used by the replicas (CommitFile, FindBatches: they are the brokers of diskless topics) and the
front door (CreatePartitions, DeleteTopics, DeleteRecords, ListOffsets). Where shard K runs is
asked of ``lookup(K)`` (the caller reads the shard registry; this module knows no Redis). A call
answered NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS / UNAVAILABLE is retried against the
address ``lookup`` gives then (``refresh=True``) until the call's deadline: a shard leader moving
is a pause, not an error. The service's messages (``lowtide.messages.coordinator``) in and out;
protobuf stays in this module.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from lowtide.errors import CoordinatorNotAvailable, InvalidRequest, LowtideError, UnknownServerError, error_or_none
from lowtide.messages.commit_wire import PACKED_BATCH, no_result_errors, unpack_results
from lowtide.messages.coordinator import BatchToCommit, CommitResult, FoundBatch, FoundPartition, PartitionAnswer
from lowtide.rpc.channels import ChannelPool, PooledClient, call
from lowtide.rpc.framed.callers import ListenerCaller, ListenerUnreachable
from lowtide_pb import coordinator_pb2 as pb
from lowtide_pb import coordinator_pb2_grpc

# (shard, refresh) -> "host:port" of its leader, or None when none is registered.
ShardLookup = Callable[[int, bool], str | None]
WRITE_AHEAD_MULTI_SEGMENT = 1
RECORD_BATCH_MAGIC = 2
# After a shard's framed listener could not be connected to, how long its calls go over gRPC.
LISTENER_RETRY_S = 30.0
# A result without an error: built from its unpacked row with no Python-level frame (one per batch).
_new_result = partial(tuple.__new__, CommitResult)
def pack_batch_fields(batches: Sequence[BatchToCommit]) -> bytes:
    """CommitFile's ``packed_batches`` (lowtide.messages.commit_wire) of ``batches``: magic 2,
    request id = index. Each row is packed straight from the batch's fields in one list
    comprehension, with no generator and no row tuple in between (~25 % less than the generator
    into ``pack_batches``): one per batch of every file a broker commits."""
    pack = PACKED_BATCH.pack
    try:
        return b"".join([pack(RECORD_BATCH_MAGIC, i, b.topic_id, b.partition, b.byte_offset, b.size, b.base_offset,
                              b.last_offset, b.max_timestamp, b.timestamp_type, b.producer_id, b.producer_epoch,
                              b.base_sequence, b.last_sequence) for i, b in enumerate(batches)])
    except struct.error as exc:
        raise InvalidRequest(f"a batch does not fit CommitFile's packed form: {exc}") from None


class DisklessCoordinatorClient(PooledClient):
    """Calls shard leaders over a ``ChannelPool``; ``metadata`` (bearer token) on every call.
    With ``framed_lookup`` (where a shard's framed listener is; None: it has none), CommitFile goes
    there as a CALL frame on a pooled connection instead (docs/design/diskless.md#cost-per-commit):
    the same request, answer and errors, a fraction of the CPU at both ends. A listener that cannot
    be connected to (nothing sent) is skipped for ``LISTENER_RETRY_S``, its calls made over gRPC.

    Contract: each method calls one shard and returns its answers, raising the whole-call error
    (after retrying the retriable ones until ``timeout_s``). Thread-safety: thread-safe (no
    per-call state; the pools are thread-safe).
    """

    def __init__(self, *, lookup: ShardLookup, channels: ChannelPool | None = None,
                 metadata: Sequence[tuple[str, str]] = (), framed_lookup: ShardLookup | None = None) -> None:
        super().__init__(channels=channels, metadata=metadata)
        self._lookup = lookup
        self._framed_lookup = framed_lookup
        self._caller = ListenerCaller(tls=self.channels.tls, metadata=self.metadata) \
            if framed_lookup is not None else None
        self._unreachable: dict[str, float] = {}  # framed address -> monotonic time to try it again

    def close(self) -> None:
        if self._caller is not None:
            self._caller.close()
        super().close()

    def _retry(self, attempt: Callable[[bool, float], Any], timeout_s: float) -> Any:
        """``attempt(refresh, seconds left)`` until it answers, again (with ``refresh``: re-read
        the shard's address) after a retriable error, with backoff, until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        refresh = False
        delay = 0.05
        while True:
            try:
                return attempt(refresh, max(0.05, deadline - time.monotonic()))
            except LowtideError as exc:
                # A shard that moved or is loading answers retriably; so does a dead address.
                if not exc.retriable or time.monotonic() + delay >= deadline:
                    raise
            refresh = True
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _call_framed(self, shard: int, method: str, request: Any, answer_type: Any, timeout_s: float) -> Any:
        """``_call`` over the shard's framed listener while it has one (gRPC otherwise)."""
        assert self._framed_lookup is not None and self._caller is not None
        framed_lookup, caller = self._framed_lookup, self._caller

        def attempt(refresh: bool, left: float) -> Any:
            address = framed_lookup(shard, refresh)
            if address is None or self._unreachable.get(address, 0.0) > time.monotonic():
                return self._call(shard, method, request, left)
            try:
                return answer_type.FromString(caller.call(address, method, request.SerializeToString(),
                                                          timeout_s=left))
            except ListenerUnreachable:
                self._unreachable[address] = time.monotonic() + LISTENER_RETRY_S
                return self._call(shard, method, request, left)  # nothing was sent: over gRPC

        return self._retry(attempt, timeout_s)

    def _call(self, shard: int, method: str, request: Any, timeout_s: float) -> Any:
        def attempt(refresh: bool, left: float) -> Any:
            address = self._lookup(shard, refresh)
            if address is None:
                raise CoordinatorNotAvailable(f"diskless coordinator shard {shard} has not registered")
            stub = self.channels.stub(address, coordinator_pb2_grpc.DisklessCoordinatorStub)
            return call(getattr(stub, method), request, metadata=self.metadata, timeout=left)

        return self._retry(attempt, timeout_s)

    # ---- topics -------------------------------------------------------------------------------
    def create_partitions(self, shard: int, *, topic_id: bytes, name: str, num_partitions: int,
                          indexes: Sequence[int], timeout_s: float = 30.0) -> None:
        reply = self._call(shard, "CreatePartitions", pb.DisklessCreatePartitionsRequest(topics=[
            pb.DisklessCreatablePartitions(topic_id=topic_id, name=name, num_partitions=num_partitions,
                                           partition_indexes=list(indexes))]), timeout_s)
        error = error_or_none(reply.topics[0].error_code, reply.topics[0].error_message)
        if error is not None:
            raise error

    def delete_topic(self, shard: int, *, topic_id: bytes, timeout_s: float = 30.0) -> LowtideError | None:
        """None when deleted; the shard's error (UNKNOWN_TOPIC_ID: it had none of it) otherwise."""
        reply = self._call(shard, "DeleteTopics", pb.DisklessDeleteTopicsRequest(
            topics=[pb.DisklessDeletableTopicState(topic_id=topic_id)]), timeout_s)
        r = reply.responses[0]
        return error_or_none(r.error_code, r.error_message)

    # ---- produce / fetch ------------------------------------------------------------------------
    def commit_file(self, shard: int, *, object_key: str, file_size: int, owner_ids: Sequence[int],
                    batches: Sequence[BatchToCommit], uploader_broker_id: int,
                    timeout_s: float = 30.0) -> list[CommitResult]:
        """One result per batch, in order. Sent column-wise (``lowtide.messages.commit_wire``)."""
        request = pb.DisklessCommitFileRequest(
            object_key=object_key, object_format=WRITE_AHEAD_MULTI_SEGMENT, file_size=file_size,
            owner_ids=list(owner_ids), uploader_broker_id=uploader_broker_id, timeout_ms=int(timeout_s * 1000),
            packed_batches=pack_batch_fields(batches),
            txn_kinds=bytes([b.txn_kind for b in batches]) if any(b.txn_kind for b in batches) else b"")
        reply = self._call_framed(shard, "CommitFile", request, pb.DisklessCommitFileResponse, timeout_s) \
            if self._caller is not None else self._call(shard, "CommitFile", request, timeout_s)
        packed = reply.packed_results
        if not reply.error_messages and no_result_errors(packed):
            # Every batch accepted (the usual answer): no per-row error check.
            results = [_new_result((None, base, append_time, lso, duplicate == 1))
                       for _code, base, append_time, lso, duplicate in unpack_results(packed)]
        else:
            messages = {m.index: m.message for m in reply.error_messages}
            results = [_new_result((None, base, append_time, lso, duplicate == 1)) if not code else
                       CommitResult(error_or_none(code, messages.get(i, "")), base, append_time, lso, duplicate == 1)
                       for i, (code, base, append_time, lso, duplicate) in enumerate(unpack_results(packed))]
        if len(results) != len(batches):  # e.g. a shard that predates packed_batches saw no batches
            raise UnknownServerError(f"CommitFile answered {len(results)} results for {len(batches)} batches")
        return results

    def find_batches(self, shard: int, positions: Sequence[tuple[bytes, int, int, int]], *, fetch_max_bytes: int,
                     max_batches_per_partition: int = 1000, timeout_s: float = 10.0,
                     isolation_level: int = 0) -> list[FoundPartition]:
        """``positions``: (topic_id, partition, offset, max partition bytes); answers in that order.
        ``isolation_level`` 1 (READ_COMMITTED): batches below the last stable offset only, with the
        aborted transactions overlapping them."""
        topics: dict[bytes, list[pb.DisklessFindBatchesPartition]] = {}
        for topic_id, partition, offset, max_bytes in positions:
            topics.setdefault(topic_id, []).append(pb.DisklessFindBatchesPartition(
                partition_index=partition, offset=offset, max_partition_fetch_bytes=max_bytes))
        reply = self._call(shard, "FindBatches", pb.DisklessFindBatchesRequest(
            fetch_max_bytes=max(1, fetch_max_bytes), max_batches_per_partition=max_batches_per_partition,
            timeout_ms=int(timeout_s * 1000), isolation_level=isolation_level,
            topics=[pb.DisklessFindBatchesTopic(topic_id=t, partitions=ps) for t, ps in topics.items()]), timeout_s)
        out = []
        for t in reply.topics:
            for p in t.partitions:
                out.append(FoundPartition(
                    topic_id=t.topic_id, partition=p.partition_index, error=error_or_none(p.error_code),
                    log_start_offset=p.log_start_offset, high_watermark=p.high_watermark,
                    last_stable_offset=p.last_stable_offset,
                    aborted_transactions=tuple((a.producer_id, a.first_offset) for a in p.aborted_transactions),
                    batches=[FoundBatch(object_key=b.object_key, byte_offset=b.byte_offset, byte_size=b.byte_size,
                                        base_offset=b.base_offset, last_offset=b.last_offset,
                                        log_append_timestamp=b.log_append_timestamp,
                                        max_timestamp=b.batch_max_timestamp, timestamp_type=b.timestamp_type)
                             for b in p.batches]))
        return out

    # ---- offsets ---------------------------------------------------------------------------------
    def delete_records(self, shard: int, items: Sequence[tuple[bytes, int, int]], *,
                       timeout_s: float = 30.0) -> list[PartitionAnswer]:
        """``items``: (topic_id, partition, offset; -1 = high watermark); ``offset`` of an answer = LW."""
        topics: dict[bytes, list[pb.DisklessDeleteRecordsPartition]] = {}
        for topic_id, partition, offset in items:
            topics.setdefault(topic_id, []).append(pb.DisklessDeleteRecordsPartition(
                partition_index=partition, offset=offset))
        reply = self._call(shard, "DeleteRecords", pb.DisklessDeleteRecordsRequest(
            timeout_ms=int(timeout_s * 1000),
            topics=[pb.DisklessDeleteRecordsTopic(topic_id=t, partitions=ps) for t, ps in topics.items()]), timeout_s)
        return [PartitionAnswer(topic_id=t.topic_id, partition=p.partition_index,
                                error=error_or_none(p.error_code, p.error_message), offset=p.low_watermark)
                for t in reply.topics for p in t.partitions]

    def list_offsets(self, shard: int, items: Sequence[tuple[bytes, int, int]], *,
                     timeout_s: float = 10.0, isolation_level: int = 0) -> list[PartitionAnswer]:
        """``items``: (topic_id, partition, timestamp: -1 latest, -2 earliest, -3 max timestamp, >= 0);
        with ``isolation_level`` 1 (READ_COMMITTED) latest is the last stable offset."""
        topics: dict[bytes, list[pb.DisklessListOffsetsPartition]] = {}
        for topic_id, partition, ts in items:
            topics.setdefault(topic_id, []).append(pb.DisklessListOffsetsPartition(partition_index=partition,
                                                                                   timestamp=ts))
        reply = self._call(shard, "ListOffsets", pb.DisklessListOffsetsRequest(
            timeout_ms=int(timeout_s * 1000), isolation_level=isolation_level,
            topics=[pb.DisklessListOffsetsTopic(topic_id=t, partitions=ps) for t, ps in topics.items()]), timeout_s)
        return [PartitionAnswer(topic_id=t.topic_id, partition=p.partition_index,
                                error=error_or_none(p.error_code, p.error_message), offset=p.offset,
                                timestamp=p.timestamp)
                for t in reply.topics for p in t.partitions]
