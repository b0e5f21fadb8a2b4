"""KIP-932 share groups over the Kafka protocol (Kafka 4.1+'s ``KafkaShareConsumer``):

    ShareGroupHeartbeat v1   -> Call.front.share_groups.heartbeat   (the front door's coordinator)
    ShareGroupDescribe v1    -> Call.front.share_groups.describe
    ShareFetch v1-2          -> KafkaServices.share.share_fetch     (this replica, the leader)
    ShareAcknowledge v1-2    -> KafkaServices.share.share_fetch with fetch=False
    DescribeShareGroupOffsets v0-1 -> KafkaServices.share.describe_offsets (this replica reads
                                __share_group_state itself: FindCoordinator sends admins to a replica)
    AlterShareGroupOffsets v0 -> Call.front.share_groups.describe (the group must have no
                                members, else NON_EMPTY_GROUP), then KafkaServices.share.alter_offsets
    DeleteShareGroupOffsets v0 -> the same check, then KafkaServices.share.delete_offsets

Only translation is here: Kafka's messages to ``lowtide.messages`` (the consumer group messages
carry a share heartbeat; ``messages.share`` the fetches) and back. The records a ShareFetch answers
with are the bytes the log read. A listener with no replica (a front door's) answers every
partition NOT_LEADER_OR_FOLLOWER. Design: docs/design/kip-932-share-groups.md.

Kafka's clients ask for no ``share.version`` feature in ApiVersions: advertising these four APIs is
what tells them share groups are served.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from typing import Any

from lowtide.errors import (
    CoordinatorNotAvailable,
    GroupIdNotFound,
    LowtideError,
    NonEmptyGroup,
    NotCoordinator,
    NotLeaderOrFollower,
)
from lowtide.kafka.apis_consumer_groups import (
    _whole_call,
    answer_heartbeat,
    client_host,
    describe_groups,
    described_group,
)
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code, millis
from lowtide.messages.consumer_groups import ConsumerHeartbeat
from lowtide.messages.share import (
    ShareAckBatch,
    ShareFetchAnswer,
    ShareFetchAsk,
    ShareGroupOffsets,
    SharePartitionAnswer,
    SharePartitionAsk,
)

SHARE_GROUP_HEARTBEAT_KEY, SHARE_GROUP_DESCRIBE_KEY, SHARE_FETCH_KEY, SHARE_ACKNOWLEDGE_KEY = 76, 77, 78, 79
DESCRIBE_SHARE_GROUP_OFFSETS_KEY, ALTER_SHARE_GROUP_OFFSETS_KEY, DELETE_SHARE_GROUP_OFFSETS_KEY = 90, 91, 92
# ShareGroupDescribe's member_type is not in v1; members are share members.


def _find_share_groups(call: Call) -> Any:
    groups = call.front.share_groups
    if groups is None:
        raise NotCoordinator("this front door does not coordinate share groups")
    return groups


def share_group_heartbeat(call: Call, body: Any) -> Any:
    request = ConsumerHeartbeat(
        group_id=body.group_id, member_id=body.member_id, member_epoch=body.member_epoch, rack_id=body.rack_id,
        subscribed_topic_names=None if body.subscribed_topic_names is None else tuple(body.subscribed_topic_names),
        client_id=call.client_id or "", client_host=client_host(call), version=call.version)
    return answer_heartbeat(call, coordinator=_find_share_groups, request=request)


def share_group_describe(call: Call, body: Any) -> Any:
    described = describe_groups(call, coordinator=_find_share_groups, group_ids=body.group_ids,
                                include_authorized_operations=bool(body.include_authorized_operations))
    return call.make(call.response, throttle_time=NO_THROTTLE, groups=tuple(described_group(call, d, members=tuple(
        call.make(
            "Member", member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
            client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
            assignment=call.make("Assignment", topic_partitions=tuple(call.make(
                "TopicPartitions", topic_id=uuid.UUID(hex=t.topic_id), topic_name=t.topic, partitions=t.partitions)
                for t in m.assignment))) for m in d.members)) for d in described))


def _read_acks(batches: Any) -> tuple[ShareAckBatch, ...]:
    return tuple(ShareAckBatch(first=b.first_offset, last=b.last_offset,
                               types=tuple(int(t) for t in b.acknowledge_types)) for b in batches)


def _build_answer(call: Call, answer: ShareFetchAnswer, *, fetch: bool) -> Any:
    top = answer.error
    by_topic: dict[str, list[Any]] = {}
    for p in answer.partitions:
        leader = call.make("LeaderIdAndEpoch", leader_id=p.leader_id, leader_epoch=p.leader_epoch)
        if fetch:
            entity = call.make(
                "PartitionData", partition_index=p.partition, error_code=error_code(p.error.code if p.error else 0),
                error_message=p.error.message if p.error else None,
                acknowledge_error_code=p.acknowledge_error.code if p.acknowledge_error else 0,
                acknowledge_error_message=p.acknowledge_error.message if p.acknowledge_error else None,
                current_leader=leader, records=bytes(p.records), acquired_records=tuple(call.make(
                    "AcquiredRecords", first_offset=a.first, last_offset=a.last, delivery_count=a.delivery_count)
                    for a in p.acquired))
        else:
            error = p.acknowledge_error or p.error
            entity = call.make("PartitionData", partition_index=p.partition,
                               error_code=error_code(error.code if error else 0),
                               error_message=error.message if error else None, current_leader=leader)
        by_topic.setdefault(p.topic_id, []).append(entity)
    topic_entity = "ShareFetchableTopicResponse" if fetch else "ShareAcknowledgeTopicResponse"
    return call.make(
        call.response, throttle_time=NO_THROTTLE, error_code=error_code(top.code if top else 0),
        error_message=top.message if top else None,
        acquisition_lock_timeout=datetime.timedelta(milliseconds=answer.lock_timeout_ms),
        responses=tuple(call.make(topic_entity, topic_id=uuid.UUID(hex=t), partitions=tuple(parts))
                        for t, parts in by_topic.items()), node_endpoints=())


def _serve_share_fetch(call: Call, ask: ShareFetchAsk) -> ShareFetchAnswer:
    handler = call.services.share
    if handler is None:
        error = NotLeaderOrFollower("no partitions are hosted here")
        return ShareFetchAnswer(partitions=tuple(SharePartitionAnswer(topic_id=p.topic_id, partition=p.partition,
                                                                      error=error) for p in ask.partitions))
    return handler.share_fetch(call.principal(), ask)


def share_fetch(call: Call, body: Any) -> Any:
    ask = ShareFetchAsk(
        group_id=body.group_id or "", member_id=body.member_id or "", session_epoch=body.share_session_epoch,
        partitions=tuple(SharePartitionAsk(topic_id=t.topic_id.hex, partition=p.partition_index,
                                           acknowledgements=_read_acks(p.acknowledgement_batches))
                         for t in body.topics for p in t.partitions),
        forgotten=tuple((t.topic_id.hex, p) for t in body.forgotten_topics_data for p in t.partitions),
        max_wait_ms=millis(body.max_wait), min_bytes=int(body.min_bytes), max_bytes=int(body.max_bytes),
        max_records=int(body.max_records) if int(body.max_records) > 0 else 500)
    return _build_answer(call, _serve_share_fetch(call, ask), fetch=True)


def share_acknowledge(call: Call, body: Any) -> Any:
    ask = ShareFetchAsk(
        group_id=body.group_id or "", member_id=body.member_id or "", session_epoch=body.share_session_epoch,
        partitions=tuple(SharePartitionAsk(topic_id=t.topic_id.hex, partition=p.partition_index,
                                           acknowledgements=_read_acks(p.acknowledgement_batches))
                         for t in body.topics for p in t.partitions), fetch=False)
    return _build_answer(call, _serve_share_fetch(call, ask), fetch=False)


def _topic_uuid(topic_id: str) -> uuid.UUID:
    # A topic answered without an id (the handler knew none) carries the zero id on the wire.
    return uuid.UUID(hex=topic_id) if topic_id else uuid.UUID(int=0)


def _offsets_topics(call: Call, partitions: Any, *, topic_entity: str, partition_entity: str,
                    fields: Callable[[Any], dict[str, Any]] = lambda p: {}) -> tuple[Any, ...]:
    """Describe/AlterShareGroupOffsets' per-topic answers: each partition's answer (its error and
    ``fields(p)``) under its topic, the topics in the order their first partition came."""
    by_topic: dict[str, list[Any]] = {}
    ids: dict[str, str] = {}
    for p in partitions:
        ids[p.topic] = p.topic_id
        by_topic.setdefault(p.topic, []).append(call.make(
            partition_entity, partition_index=p.partition, **fields(p),
            error_code=error_code(p.error.code if p.error else 0), error_message=p.error.message if p.error else None))
    return tuple(call.make(topic_entity, topic_name=t, topic_id=_topic_uuid(ids[t]), partitions=tuple(parts))
                 for t, parts in by_topic.items())


def describe_share_group_offsets(call: Call, body: Any) -> Any:
    handler = call.services.share
    groups = []
    for g in body.groups:
        topics = None if g.topics is None else {t.topic_name: tuple(t.partitions) for t in g.topics}
        if handler is None:
            error: LowtideError | None = CoordinatorNotAvailable("share group offsets are read at a replica")
            described = ShareGroupOffsets(group_id=g.group_id, error=error)
        else:
            described = handler.describe_offsets(call.principal(), g.group_id, topics)
        error = described.error
        groups.append(call.make(
            "DescribeShareGroupOffsetsResponseGroup", group_id=g.group_id,
            error_code=error_code(error.code if error else 0), error_message=error.message if error else None,
            topics=_offsets_topics(
                call, described.partitions, topic_entity="DescribeShareGroupOffsetsResponseTopic",
                partition_entity="DescribeShareGroupOffsetsResponsePartition",
                fields=lambda p: {"start_offset": p.start_offset, "leader_epoch": p.leader_epoch, "lag": p.lag})))
    return call.make(call.response, throttle_time=NO_THROTTLE, groups=tuple(groups))


def _check_empty(call: Call, group_id: str, what: str) -> None:
    """NON_EMPTY_GROUP unless the share group has no members (or does not exist)."""
    [group] = _find_share_groups(call).describe(principal=call.principal(), group_ids=[group_id])
    if group.error is None and group.members:
        raise NonEmptyGroup(f"share group {group_id!r} has {len(group.members)} members: its offsets "
                            f"can be {what} only while it is empty")
    if group.error is not None and not isinstance(group.error, GroupIdNotFound):
        raise group.error


def alter_share_group_offsets(call: Call, body: Any) -> Any:
    handler = call.services.share
    targets: dict[str, dict[int, int]] = {}
    for t in body.topics:
        for p in t.partitions:
            targets.setdefault(t.topic_name, {})[p.partition_index] = p.start_offset
    try:
        if handler is None:
            raise CoordinatorNotAvailable("share group offsets are written at a replica")
        _check_empty(call, body.group_id, "reset")
        altered = handler.alter_offsets(call.principal(), body.group_id, targets)
    except LowtideError as err:
        altered = ShareGroupOffsets(group_id=body.group_id, error=_whole_call(err))
    top = altered.error
    return call.make(
        call.response, throttle_time=NO_THROTTLE, error_code=error_code(top.code if top else 0),
        error_message=top.message if top else None,
        responses=_offsets_topics(call, altered.partitions, topic_entity="AlterShareGroupOffsetsResponseTopic",
                                  partition_entity="AlterShareGroupOffsetsResponsePartition"))


def delete_share_group_offsets(call: Call, body: Any) -> Any:
    handler = call.services.share
    top: LowtideError | None = None
    deleted: list[tuple[str, str, LowtideError | None]] = []
    try:
        if handler is None:
            raise CoordinatorNotAvailable("share group offsets are deleted at a replica")
        _check_empty(call, body.group_id, "deleted")
        deleted = handler.delete_offsets(call.principal(), body.group_id, [t.topic_name for t in body.topics])
    except LowtideError as err:
        top = _whole_call(err)
    return call.make(
        call.response, throttle_time=NO_THROTTLE, error_code=error_code(top.code if top else 0),
        error_message=top.message if top else None,
        responses=tuple(call.make("DeleteShareGroupOffsetsResponseTopic", topic_name=t,
                                  topic_id=_topic_uuid(i),
                                  error_code=error_code(e.code if e else 0), error_message=e.message if e else None)
                        for t, i, e in deleted))


APIS = [
    Api(SHARE_GROUP_HEARTBEAT_KEY, "ShareGroupHeartbeat", 1, 1, share_group_heartbeat),
    Api(SHARE_GROUP_DESCRIBE_KEY, "ShareGroupDescribe", 1, 1, share_group_describe),
    Api(SHARE_FETCH_KEY, "ShareFetch", 1, 2, share_fetch),
    Api(SHARE_ACKNOWLEDGE_KEY, "ShareAcknowledge", 1, 2, share_acknowledge),
    Api(DESCRIBE_SHARE_GROUP_OFFSETS_KEY, "DescribeShareGroupOffsets", 0, 1, describe_share_group_offsets),
    Api(ALTER_SHARE_GROUP_OFFSETS_KEY, "AlterShareGroupOffsets", 0, 0, alter_share_group_offsets),
    Api(DELETE_SHARE_GROUP_OFFSETS_KEY, "DeleteShareGroupOffsets", 0, 0, delete_share_group_offsets),
]
