"""KIP-932 share fetching (``lowtide.messages.share``) to protobuf and back: the replica's servicer
unpacks ShareFetch/ShareAcknowledge and packs the share handler's answer with it, the
``ReplicaClient`` does the reverse. Records stay the bytes the log read (never decoded here)."""

from __future__ import annotations

from lowtide.errors import error_or_none
from lowtide.messages.share import (
    AcquiredRange,
    ShareAckBatch,
    ShareFetchAnswer,
    ShareFetchAsk,
    SharePartitionAnswer,
    SharePartitionAsk,
)
from lowtide.rpc.convert import error_kwargs
from lowtide_pb import replica_pb2

# ShareFetch's defaults where the request leaves a field at proto3's zero (ShareFetchAsk's).
DEFAULT_MAX_BYTES = 50 << 20
DEFAULT_MAX_RECORDS = 500


def _partitions_to_proto(partitions: tuple[SharePartitionAsk, ...]) -> list[replica_pb2.ShareFetchPartition]:
    return [replica_pb2.ShareFetchPartition(topic_id=p.topic_id, partition=p.partition, acknowledgements=[
        replica_pb2.ShareAcknowledgementBatch(first_offset=b.first, last_offset=b.last,
                                              acknowledge_types=list(b.types)) for b in p.acknowledgements])
        for p in partitions]


def _partitions_from_proto(partitions) -> tuple[SharePartitionAsk, ...]:
    return tuple(SharePartitionAsk(topic_id=p.topic_id, partition=p.partition, acknowledgements=tuple(
        ShareAckBatch(first=b.first_offset, last=b.last_offset, types=tuple(b.acknowledge_types))
        for b in p.acknowledgements)) for p in partitions)


def fetch_to_proto(ask: ShareFetchAsk) -> replica_pb2.ShareFetchRequest:
    return replica_pb2.ShareFetchRequest(
        group_id=ask.group_id, member_id=ask.member_id, share_session_epoch=ask.session_epoch,
        max_wait_ms=ask.max_wait_ms, min_bytes=ask.min_bytes, max_bytes=ask.max_bytes, max_records=ask.max_records,
        partitions=_partitions_to_proto(ask.partitions),
        forgotten=[replica_pb2.ShareTopicIdPartition(topic_id=t, partition=p) for t, p in ask.forgotten])


def fetch_from_proto(m: replica_pb2.ShareFetchRequest) -> ShareFetchAsk:
    return ShareFetchAsk(
        group_id=m.group_id, member_id=m.member_id, session_epoch=m.share_session_epoch,
        partitions=_partitions_from_proto(m.partitions),
        forgotten=tuple((f.topic_id, f.partition) for f in m.forgotten), max_wait_ms=m.max_wait_ms,
        min_bytes=m.min_bytes, max_bytes=m.max_bytes or DEFAULT_MAX_BYTES,
        max_records=m.max_records if m.max_records > 0 else DEFAULT_MAX_RECORDS)


def acknowledge_to_proto(ask: ShareFetchAsk) -> replica_pb2.ShareAcknowledgeRequest:
    return replica_pb2.ShareAcknowledgeRequest(group_id=ask.group_id, member_id=ask.member_id,
                                               share_session_epoch=ask.session_epoch,
                                               partitions=_partitions_to_proto(ask.partitions))


def acknowledge_from_proto(m: replica_pb2.ShareAcknowledgeRequest) -> ShareFetchAsk:
    return ShareFetchAsk(group_id=m.group_id, member_id=m.member_id, session_epoch=m.share_session_epoch,
                         partitions=_partitions_from_proto(m.partitions), fetch=False)


def answer_to_proto(answer: ShareFetchAnswer) -> replica_pb2.ShareFetchResponse:
    partitions = []
    for p in answer.partitions:
        ack = {} if p.acknowledge_error is None else {"acknowledge_error_code": p.acknowledge_error.code,
                                                      "acknowledge_error_message": p.acknowledge_error.message}
        partitions.append(replica_pb2.ShareFetchResult(
            topic_id=p.topic_id, partition=p.partition, records=p.records, leader_id=p.leader_id,
            leader_epoch=p.leader_epoch, acquired_records=[
                replica_pb2.AcquiredRecords(first_offset=a.first, last_offset=a.last, delivery_count=a.delivery_count)
                for a in p.acquired], **error_kwargs(p.error), **ack))
    return replica_pb2.ShareFetchResponse(partitions=partitions, acquisition_lock_timeout_ms=answer.lock_timeout_ms,
                                          **error_kwargs(answer.error))


def answer_from_proto(m: replica_pb2.ShareFetchResponse) -> ShareFetchAnswer:
    return ShareFetchAnswer(
        error=error_or_none(m.error_code, m.error_message), lock_timeout_ms=m.acquisition_lock_timeout_ms,
        partitions=tuple(SharePartitionAnswer(
            topic_id=p.topic_id, partition=p.partition, error=error_or_none(p.error_code, p.error_message),
            acknowledge_error=error_or_none(p.acknowledge_error_code, p.acknowledge_error_message),
            records=p.records, leader_id=p.leader_id, leader_epoch=p.leader_epoch,
            acquired=tuple(AcquiredRange(a.first_offset, a.last_offset, a.delivery_count)
                           for a in p.acquired_records)) for p in m.partitions))
