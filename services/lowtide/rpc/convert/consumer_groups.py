"""KIP-848 consumer group messages (``lowtide.messages.consumer_groups``) to protobuf and back: the
front door's servicer uses one direction, its remote twin (``client/frontdoor/groups.py``) the
other. A field Kafka lets a member leave out (null: unchanged) travels with a ``has_`` flag."""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.errors import error_or_none
from lowtide.messages.consumer_groups import (
    ConsumerGroupDescription,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    ConsumerMemberDescription,
    TopicPartitions,
)
from lowtide.rpc.convert import error_kwargs
from lowtide_pb import admin_pb2


def _tps_to_proto(items: Sequence[TopicPartitions]) -> list[admin_pb2.ConsumerTopicPartitions]:
    return [admin_pb2.ConsumerTopicPartitions(topic_id=t.topic_id, partitions=list(t.partitions), topic=t.topic)
            for t in items]


def _tps_from_proto(items) -> tuple[TopicPartitions, ...]:
    return tuple(TopicPartitions(topic_id=t.topic_id, partitions=tuple(t.partitions), topic=t.topic) for t in items)


def _opt(msg, name: str) -> str | None:
    return getattr(msg, name) if msg.HasField(name) else None


def heartbeat_to_proto(r: ConsumerHeartbeat) -> admin_pb2.ConsumerGroupHeartbeatRequest:
    optional = {k: v for k, v in (("instance_id", r.instance_id), ("rack_id", r.rack_id),
                                  ("subscribed_topic_regex", r.subscribed_topic_regex),
                                  ("server_assignor", r.server_assignor)) if v is not None}
    return admin_pb2.ConsumerGroupHeartbeatRequest(
        group_id=r.group_id, member_id=r.member_id, member_epoch=r.member_epoch,
        rebalance_timeout_ms=r.rebalance_timeout_ms,
        has_subscribed_topic_names=r.subscribed_topic_names is not None,
        subscribed_topic_names=list(r.subscribed_topic_names or ()),
        has_topic_partitions=r.topic_partitions is not None, topic_partitions=_tps_to_proto(r.topic_partitions or ()),
        client_id=r.client_id, client_host=r.client_host, version=r.version, **optional)


def heartbeat_from_proto(m: admin_pb2.ConsumerGroupHeartbeatRequest, *, client_host: str) -> ConsumerHeartbeat:
    return ConsumerHeartbeat(
        group_id=m.group_id, member_id=m.member_id, member_epoch=m.member_epoch, instance_id=_opt(m, "instance_id"),
        rack_id=_opt(m, "rack_id"), rebalance_timeout_ms=m.rebalance_timeout_ms,
        subscribed_topic_names=tuple(m.subscribed_topic_names) if m.has_subscribed_topic_names else None,
        subscribed_topic_regex=_opt(m, "subscribed_topic_regex"), server_assignor=_opt(m, "server_assignor"),
        topic_partitions=_tps_from_proto(m.topic_partitions) if m.has_topic_partitions else None,
        client_id=m.client_id, client_host=m.client_host or client_host, version=m.version)


def heartbeat_result_to_proto(r: ConsumerHeartbeatResult) -> admin_pb2.ConsumerGroupHeartbeatResponse:
    return admin_pb2.ConsumerGroupHeartbeatResponse(
        member_id=r.member_id, member_epoch=r.member_epoch, heartbeat_interval_ms=r.heartbeat_interval_ms,
        has_assignment=r.assignment is not None, assignment=_tps_to_proto(r.assignment or ()), **error_kwargs(r.error))


def heartbeat_result_from_proto(m: admin_pb2.ConsumerGroupHeartbeatResponse) -> ConsumerHeartbeatResult:
    return ConsumerHeartbeatResult(
        member_id=m.member_id, member_epoch=m.member_epoch, heartbeat_interval_ms=m.heartbeat_interval_ms,
        assignment=_tps_from_proto(m.assignment) if m.has_assignment else None,
        error=error_or_none(m.error_code, m.error_message))


def descriptions_to_proto(items: Sequence[ConsumerGroupDescription]) -> admin_pb2.ConsumerGroupDescribeResponse:
    groups = []
    for d in items:
        members = []
        for m in d.members:
            optional = {k: v for k, v in (("instance_id", m.instance_id), ("rack_id", m.rack_id),
                                          ("subscribed_topic_regex", m.subscribed_topic_regex)) if v is not None}
            members.append(admin_pb2.ConsumerMemberDescription(
                member_id=m.member_id, member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
                subscribed_topic_names=list(m.subscribed_topic_names), assignment=_tps_to_proto(m.assignment),
                target_assignment=_tps_to_proto(m.target_assignment), classic=m.classic, **optional))
        groups.append(admin_pb2.ConsumerGroupDescription(
            group_id=d.group_id, state=d.state, group_epoch=d.group_epoch, assignment_epoch=d.assignment_epoch,
            assignor_name=d.assignor_name, members=members, authorized_operations=d.authorized_operations,
            **error_kwargs(d.error)))
    return admin_pb2.ConsumerGroupDescribeResponse(groups=groups)


def descriptions_from_proto(m: admin_pb2.ConsumerGroupDescribeResponse) -> list[ConsumerGroupDescription]:
    return [ConsumerGroupDescription(
        group_id=d.group_id, error=error_or_none(d.error_code, d.error_message), state=d.state,
        group_epoch=d.group_epoch, assignment_epoch=d.assignment_epoch, assignor_name=d.assignor_name,
        authorized_operations=d.authorized_operations, members=tuple(ConsumerMemberDescription(
            member_id=x.member_id, instance_id=_opt(x, "instance_id"), rack_id=_opt(x, "rack_id"),
            member_epoch=x.member_epoch, client_id=x.client_id, client_host=x.client_host,
            subscribed_topic_names=tuple(x.subscribed_topic_names),
            subscribed_topic_regex=_opt(x, "subscribed_topic_regex"), assignment=_tps_from_proto(x.assignment),
            target_assignment=_tps_from_proto(x.target_assignment), classic=x.classic) for x in d.members))
        for d in m.groups]
