"""lowtide.v1.Replica servicer: unpack, call the ReplicaManager, build the reply."""

from __future__ import annotations

from lowtide.client.replica import EpochQuery, FetchPosition
from lowtide.errors import LowtideError
from lowtide.replica.manager import ReplicaManager
from lowtide.replica.partition import LEADER
from lowtide_pb import common_pb2, replica_pb2, replica_pb2_grpc

DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024


def _epoch(message) -> int:
    """A request's ``optional current_leader_epoch``; -1 (unchecked) when unset."""
    return message.current_leader_epoch if message.HasField("current_leader_epoch") else -1


def _err(result) -> tuple[int, str]:
    return (result.code, result.message) if isinstance(result, LowtideError) else (0, "")


class ReplicaServicer(replica_pb2_grpc.ReplicaServicer):
    """The ``lowtide.v1.Replica`` gRPC service over a ReplicaManager: protobuf in and out only.

    Thread-safety: stateless; gRPC calls it from many threads and the manager is thread-safe.
    """

    def __init__(self, manager: ReplicaManager) -> None:
        self.manager = manager

    def Produce(self, request, context):
        items = [(p.topic, p.partition, p.records) for p in request.partitions]
        results = self.manager.produce(items, acks=request.acks, timeout_ms=request.timeout_ms or 30000)
        out = []
        for topic, partition, info in results:
            code, msg = _err(info)
            r = replica_pb2.ProduceResult(topic=topic, partition=partition, error_code=code, error_message=msg)
            if not code:
                r.base_offset = info.base_offset
                r.log_append_time_ms = -1
                r.log_start_offset = self.manager.get_partition(topic, partition).log.log_start_offset
            else:
                r.base_offset = -1
            out.append(r)
        return replica_pb2.ProduceResponse(partitions=out)

    def Fetch(self, request, context):
        items = [FetchPosition(topic=p.topic, partition=p.partition, fetch_offset=p.fetch_offset,
                           log_start_offset=p.log_start_offset,
                           max_bytes=p.partition_max_bytes or DEFAULT_PARTITION_MAX_BYTES,
                           current_leader_epoch=_epoch(p))
                 for p in request.partitions]
        outcomes = self.manager.fetch(items, replica_id=request.replica_id, max_wait_ms=request.max_wait_ms,
                                      min_bytes=request.min_bytes, max_bytes=request.max_bytes)
        return replica_pb2.FetchResponse(partitions=[
            replica_pb2.FetchResult(topic=o.topic, partition=o.partition,
                                    error_code=o.error.code if o.error else 0,
                                    error_message=o.error.message if o.error else "",
                                    high_watermark=o.high_watermark, log_start_offset=o.log_start_offset,
                                    log_end_offset=o.log_end_offset, leader_epoch=o.leader_epoch,
                                    records=o.records)
            for o in outcomes])

    def ListOffsets(self, request, context):
        out = []
        for q in request.partitions:
            r = common_pb2.ListOffsetsResult(topic=q.topic, partition=q.partition, offset=-1, timestamp=-1)
            try:
                offset, ts, epoch = self.manager.list_offset(q.topic, q.partition, q.timestamp)
                r.offset, r.timestamp, r.leader_epoch = offset, ts, epoch
            except LowtideError as err:
                r.error_code, r.error_message = err.code, err.message
            out.append(r)
        return common_pb2.ListOffsetsResponse(partitions=out)

    def DeleteRecords(self, request, context):
        items = [(p.topic, p.partition, p.offset) for p in request.partitions]
        results = self.manager.delete_records(items, timeout_ms=request.timeout_ms or 30000)
        out = []
        for topic, partition, res in results:
            code, msg = _err(res)
            out.append(common_pb2.DeleteRecordsResult(topic=topic, partition=partition, error_code=code,
                                                      error_message=msg, low_watermark=-1 if code else res))
        return common_pb2.DeleteRecordsResponse(partitions=out)

    def OffsetForLeaderEpoch(self, request, context):
        queries = [EpochQuery(topic=q.topic, partition=q.partition, leader_epoch=q.leader_epoch,
                              current_leader_epoch=_epoch(q)) for q in request.partitions]
        answers = self.manager.offset_for_leader_epoch(queries)
        return replica_pb2.OffsetForLeaderEpochResponse(partitions=[
            replica_pb2.EpochEndOffset(topic=a.topic, partition=a.partition,
                                       error_code=a.error.code if a.error else 0,
                                       error_message=a.error.message if a.error else "",
                                       leader_epoch=a.leader_epoch, end_offset=a.end_offset)
            for a in answers])

    def DescribeLogs(self, request, context):
        wanted = {(p.topic, p.partition) for p in request.partitions}
        live = self.manager.live_brokers
        logs = []
        for p in sorted(self.manager.partitions(), key=lambda p: p.key):
            if wanted and p.key not in wanted:
                continue
            plog = p.log
            logs.append(replica_pb2.LogInfo(
                topic=p.topic, partition=p.partition, role=p.role, leader_epoch=p.leader_epoch,
                leader=p.leader_id, log_start_offset=plog.log_start_offset, high_watermark=plog.high_watermark,
                log_end_offset=plog.log_end_offset,
                low_watermark=p.low_watermark(live) if p.role == LEADER else -1,
                size_bytes=plog.size_bytes, segments=plog.num_segments, isr=sorted(p.isr), dir=str(plog.dir)))
        return replica_pb2.DescribeLogsResponse(replica_id=self.manager.broker_id, logs=logs)
