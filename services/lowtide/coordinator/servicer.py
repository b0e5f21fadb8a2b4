"""gRPC servicer of ``lowtide.v1.DisklessCoordinator``: unpack protobuf into ``lowtide.messages.coordinator``
dataclasses, call the shard service, pack the reply. With auth on every call needs CLUSTER_ACTION
on the CLUSTER (KIP-1164: the coordinator API is for brokers, not clients); a whole-call failure is
raised as a LowtideError and mapped to a gRPC status by the server's interceptor.

Thread-safety: stateless apart from its collaborators, which are thread-safe.
"""

from __future__ import annotations

import time

from lowtide.auth.access import AccessControl
from lowtide.auth.acl import AclOperation
from lowtide.coordinator.pipeline import WaiterWait
from lowtide.coordinator.service import ShardService
from lowtide.errors import InvalidRequest, LowtideError, NotCoordinator, RequestTimedOut
from lowtide.messages import coordinator as m
from lowtide.messages.commit_wire import pack_result_rows, unpack_batches
from lowtide.rpc.framed.codec import CALL
from lowtide.rpc.framed.session import FrameDispatcher, parse_request
from lowtide.rpc.steps import Steps
from lowtide_pb import coordinator_pb2 as pb
from lowtide_pb import coordinator_pb2_grpc

# ``tuple.__new__(CommitBatch, values)`` is ``CommitBatch._make(values)`` without its Python-level
# frame and length check (the values are built right here, all 14): one per batch of every file.
_new = tuple.__new__
CommitBatch = m.CommitBatch
# Request metadata of a caller that takes a warm standby's FindBatches answer (and its freshness:
# trailing metadata lowtide-standby-applied-offset, -high-watermark, -lag-ms).
STANDBY_READ = "lowtide-read-standby"


def _err(obj) -> dict:
    return {"error_code": obj.error_code,
            **({"error_message": obj.error_message} if obj.error_message is not None else {})}


class CoordinatorServicer(coordinator_pb2_grpc.DisklessCoordinatorServicer):
    """The seven KIP-1164 operations plus HandOverFile, for one shard."""

    def __init__(self, shard: ShardService, *, access: AccessControl, observe_commit=None,
                 count_commit=None) -> None:
        self.shard = shard
        self.access = access
        self.observe_commit = observe_commit or (lambda _seconds: None)
        # (transport, Kafka error name or "NONE") of every CommitFile answered
        self.count_commit = count_commit or (lambda _transport, _error: None)

    def _authorize(self, context) -> None:
        principal = self.access.authenticate_call(context)
        self.access.require_cluster(principal, AclOperation.CLUSTER_ACTION)

    # ---- mutations -------------------------------------------------------------------------------
    def CreatePartitions(self, request, context):
        self._authorize(context)
        req = m.CreatePartitionsRequest(timeout_ms=request.timeout_ms or m.DEFAULT_TIMEOUT_MS, topics=[
            m.CreatablePartitions(topic_id=t.topic_id, name=t.name, num_partitions=t.num_partitions,
                                  partition_indexes=tuple(t.partition_indexes)) for t in request.topics])
        resp = self.shard.mutate(lambda core: core.create_partitions(req), timeout_ms=req.timeout_ms)
        return pb.DisklessCreatePartitionsResponse(topics=[
            pb.DisklessCreatablePartitionsResult(topic_id=r.topic_id, **_err(r)) for r in resp.topics])

    def DeleteTopics(self, request, context):
        self._authorize(context)
        req = m.DeleteTopicsRequest(topic_ids=[t.topic_id for t in request.topics],
                                    timeout_ms=request.timeout_ms or m.DEFAULT_TIMEOUT_MS)
        resp = self.shard.mutate(lambda core: core.delete_topics(req), timeout_ms=req.timeout_ms)
        return pb.DisklessDeleteTopicsResponse(responses=[
            pb.DisklessDeletableTopicResult(topic_id=r.topic_id, **_err(r)) for r in resp.responses])

    def CommitFile(self, request, context):
        try:
            reply = self._commit_file(request, context)
        except LowtideError as exc:
            self.count_commit("grpc", exc.name)
            raise
        self.count_commit("grpc", "NONE")
        return reply

    def _commit_file(self, request, context):
        self._authorize(context)
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            # gRPC runs a handler even when the call waited past its deadline in the thread pool's
            # queue. The broker has given up on it; applying it now could commit a file the orphan
            # scanner already judged (its grace period counts on no commit outliving its deadline).
            raise RequestTimedOut("the CommitFile call's deadline passed before it was processed")
        started = time.perf_counter()
        req = commit_file_request(request)
        resp = self.shard.mutate(lambda core: core.commit_file(req), timeout_ms=req.timeout_ms)
        self.observe_commit(time.perf_counter() - started)
        return commit_file_reply(resp, packed=bool(request.packed_batches))

    def open_framed_session(self, principal: str, peer: str) -> _FramedSession:
        """A framed listener connection's calls (lowtide.rpc.framed.listener), from ``principal``."""
        return _FramedSession(self, principal, peer)

    def DeleteRecords(self, request, context):
        self._authorize(context)
        req = m.DeleteRecordsRequest(timeout_ms=request.timeout_ms or m.DEFAULT_TIMEOUT_MS, topics=[
            m.DeleteRecordsTopic(topic_id=t.topic_id, partitions=[
                m.DeleteRecordsPartition(partition_index=p.partition_index, offset=p.offset) for p in t.partitions])
            for t in request.topics])
        resp = self.shard.mutate(lambda core: core.delete_records(req), timeout_ms=req.timeout_ms)
        return pb.DisklessDeleteRecordsResponse(topics=[
            pb.DisklessDeleteRecordsTopicResult(topic_id=t.topic_id, partitions=[
                pb.DisklessDeleteRecordsPartitionResult(partition_index=p.partition_index,
                                                        low_watermark=p.low_watermark, **_err(p))
                for p in t.partitions]) for t in resp.topics])

    def HandOverFile(self, request, context):
        self._authorize(context)
        owners = tuple(request.owner_ids)
        index = request.to_owner_index
        if not 0 <= index < len(owners) or owners[index] != self.shard.config.shard:
            raise InvalidRequest(f"owner index {index} of {list(owners)} is not coordinator {self.shard.config.shard}")
        self.shard.mutate(lambda core: core.hand_over_file(object_key=request.object_key, owner_ids=owners,
                                                           to_owner_index=index),
                          timeout_ms=request.timeout_ms or m.DEFAULT_TIMEOUT_MS)
        return pb.DisklessHandOverFileResponse()

    # ---- reads -----------------------------------------------------------------------------------
    def ListOffsets(self, request, context):
        self._authorize(context)
        req = m.ListOffsetsRequest(timeout_ms=request.timeout_ms or m.DEFAULT_TIMEOUT_MS,
                                   isolation_level=request.isolation_level, topics=[
            m.ListOffsetsTopic(topic_id=t.topic_id, partitions=[
                m.ListOffsetsPartition(partition_index=p.partition_index, timestamp=p.timestamp)
                for p in t.partitions]) for t in request.topics])
        resp = self.shard.read_after_barrier(lambda core: core.list_offsets(req), timeout_ms=req.timeout_ms)
        return pb.DisklessListOffsetsResponse(topics=[
            pb.DisklessListOffsetsTopicResponse(topic_id=t.topic_id, partitions=[
                pb.DisklessListOffsetsPartitionResponse(partition_index=p.partition_index, timestamp=p.timestamp,
                                                        offset=p.offset, **_err(p))
                for p in t.partitions]) for t in resp.topics])

    def FindBatches(self, request, context):
        self._authorize(context)
        req = m.FindBatchesRequest(
            fetch_max_bytes=request.fetch_max_bytes, max_batches_per_partition=request.max_batches_per_partition,
            timeout_ms=request.timeout_ms or m.DEFAULT_TIMEOUT_MS, isolation_level=request.isolation_level, topics=[
                m.FindBatchesTopic(topic_id=t.topic_id, partitions=[
                    m.FindBatchesPartition(partition_index=p.partition_index, offset=p.offset,
                                           max_partition_fetch_bytes=p.max_partition_fetch_bytes)
                    for p in t.partitions]) for t in request.topics])
        resp = self._find_batches(req, context)
        return pb.DisklessFindBatchesResponse(topics=[
            pb.DisklessFindBatchesTopicResponse(topic_id=t.topic_id, partitions=[
                pb.DisklessFindBatchesPartitionResponse(
                    partition_index=p.partition_index, error_code=p.error_code, log_start_offset=p.log_start_offset,
                    high_watermark=p.high_watermark, last_stable_offset=p.last_stable_offset,
                    aborted_transactions=[pb.DisklessAbortedTransaction(producer_id=pid, first_offset=first)
                                          for pid, first in p.aborted_transactions],
                    batches=[
                        pb.DisklessFindBatchesBatchInfo(
                            batch_id=b.batch_id, object_key=b.object_key, magic=b.magic, byte_offset=b.byte_offset,
                            byte_size=b.byte_size, base_offset=b.base_offset, last_offset=b.last_offset,
                            log_append_timestamp=b.log_append_timestamp, batch_max_timestamp=b.batch_max_timestamp,
                            timestamp_type=b.timestamp_type) for b in p.batches])
                for p in t.partitions]) for t in resp.topics])

    def _find_batches(self, req: m.FindBatchesRequest, context) -> m.FindBatchesResponse:
        """The leader's answer; or, from a warm standby and only to a caller whose metadata asks
        for one (``lowtide-read-standby: 1``), the standby's, with its freshness in the trailing
        metadata. A broker never asks: it must not take a stale copy for the leader's answer."""
        try:
            return self.shard.read(lambda core: core.find_batches(req))
        except NotCoordinator:
            if not self.shard.config.standby or (STANDBY_READ, "1") not in tuple(context.invocation_metadata() or ()):
                raise
        resp, fresh = self.shard.read_standby(lambda core: core.find_batches(req))
        context.set_trailing_metadata(tuple((f"lowtide-standby-{k.replace('_', '-')}", str(v))
                                            for k, v in fresh.items()))
        return resp

    def DescribeFiles(self, request, context):
        self._authorize(context)
        req = m.DescribeFilesRequest(object_keys=[f.object_key for f in request.files],
                                     timeout_ms=request.timeout_ms or m.DEFAULT_TIMEOUT_MS)
        resp = self.shard.read(lambda core: core.describe_files(req))
        return pb.DisklessDescribeFilesResponse(oldest_file_created_at_ms=resp.oldest_file_created_at_ms, files=[
            pb.DisklessDescribeFileResult(object_key=f.object_key, has_live_batches=f.has_live_batches, known=f.known,
                                          **_err(f)) for f in resp.files])


def commit_file_request(request: pb.DisklessCommitFileRequest) -> m.CommitFileRequest:
    """The shard's request from the protobuf one (gRPC or a framed CALL)."""
    packed = bool(request.packed_batches)
    if packed and request.batches:
        raise InvalidRequest("a CommitFile sets batches or packed_batches, not both")
    # Tuples in CommitBatch's (the protobuf's) field order: ~100 per file. Packed, they are
    # struct.iter_unpack's plain tuples as they come (lowtide.messages.commit_wire): the check
    # unpacks each by position, so a CommitBatch built around each would only cost its making.
    batches = list(unpack_batches(request.packed_batches)) if packed else [
        _new(CommitBatch, (b.magic, b.request_id, b.topic_id, b.partition_index, b.byte_offset, b.size,
                           b.base_offset, b.last_offset, b.batch_max_timestamp, b.timestamp_type, b.producer_id,
                           b.producer_epoch, b.base_sequence, b.last_sequence))
        for b in request.batches]
    return m.CommitFileRequest(
        object_key=request.object_key, object_format=request.object_format, file_size=request.file_size,
        owner_ids=tuple(request.owner_ids), uploader_broker_id=request.uploader_broker_id,
        timeout_ms=request.timeout_ms or m.DEFAULT_TIMEOUT_MS, batches=batches, txn_kinds=request.txn_kinds)


def commit_file_reply(resp: m.CommitFileResponse, *, packed: bool) -> pb.DisklessCommitFileResponse:
    """The protobuf answer, column-wise when the request was (``packed``)."""
    if packed:
        return pb.DisklessCommitFileResponse(
            packed_results=pack_result_rows(resp.batches),
            error_messages=[pb.DisklessIndexedMessage(index=i, message=r[1])
                            for i, r in enumerate(resp.batches) if r[1] is not None])
    reply = pb.DisklessCommitFileResponse()
    add = reply.batches.add  # built in place: a list of messages would be copied into the field
    for code, message, base, append_time, lso, duplicate in resp.batches:
        if message is None:
            add(error_code=code, assigned_base_offset=base, log_append_time=append_time, log_start_offset=lso,
                is_duplicate=duplicate)
        else:
            add(error_code=code, error_message=message, assigned_base_offset=base, log_append_time=append_time,
                log_start_offset=lso, is_duplicate=duplicate)
    return reply


class _FramedSession(FrameDispatcher):
    """A framed listener connection's CALL frames (lowtide.rpc.framed.listener), each checked and
    answered exactly as its gRPC method: only ``CommitFile``, a broker's call on every file
    (docs/design/diskless.md#cost-per-commit). The call is queued for the shard's writer and its
    outcome waited for on the listener's loop (pipeline.WaiterWait), no thread parked meanwhile.
    A commit is not abandoned with its caller (``cancel`` does nothing): once submitted it is
    decided and logged. Thread-safety: the listener's loop only."""

    UNSERVED_KIND = f"a coordinator shard's framed listener serves CALL frames ({CALL}), got kind {{kind}}"

    def __init__(self, servicer: CoordinatorServicer, principal: str, peer: str) -> None:
        super().__init__(principal, peer)
        self.servicer = servicer

    def handle_steps(self, kind: int, payload: bytes) -> Steps[bytes]:
        try:
            answer = yield from super().handle_steps(kind, payload)
        except LowtideError as exc:
            self.servicer.count_commit("framed", exc.name)
            raise
        self.servicer.count_commit("framed", "NONE")
        return answer

    def _commit_file_steps(self, body: bytes) -> Steps[bytes]:
        servicer = self.servicer
        servicer.access.require_cluster(self.principal, AclOperation.CLUSTER_ACTION)
        request = parse_request(pb.DisklessCommitFileRequest.FromString, body, "DisklessCommitFileRequest")
        started = time.perf_counter()
        req = commit_file_request(request)
        waiter = servicer.shard.submit(lambda core: core.commit_file(req))
        limit_ms = min(req.timeout_ms, servicer.shard.config.request_timeout_ms)
        yield WaiterWait(waiter, deadline=time.monotonic() + limit_ms / 1000)
        resp = servicer.shard.outcome(waiter, req.timeout_ms)
        servicer.observe_commit(time.perf_counter() - started)
        return commit_file_reply(resp, packed=bool(request.packed_batches)).SerializeToString()

    FRAMES = {CALL: FrameDispatcher.call_steps}
    CALLS = {"CommitFile": _commit_file_steps}
