"""KIP-848 consumer groups over the Kafka protocol: ConsumerGroupHeartbeat (key 68) and
ConsumerGroupDescribe (key 69), answered by the front door's consumer group coordinator
(``Call.front.consumer_groups``: ``frontdoor/groups/consumer_membership.py`` in process, its remote
twin from a replica's listener), called with ``lowtide.messages.consumer_groups`` types.
Design: docs/design/kip-848-consumer-groups.md.

Every error is the answer's ``error_code`` (with its message), as Kafka answers: the heartbeat
refused, the front door unreachable (COORDINATOR_NOT_AVAILABLE, retriable: the member keeps its
state and heartbeats again), a front door without the coordinator (NOT_COORDINATOR).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from typing import Any

from lowtide.errors import CoordinatorNotAvailable, LowtideError, NetworkException, NotCoordinator, RequestTimedOut
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code, millis
from lowtide.messages.consumer_groups import (
    ConsumerGroupDescription,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    TopicPartitions,
)

CONSUMER_GROUP_HEARTBEAT_KEY, CONSUMER_GROUP_DESCRIBE_KEY = 68, 69
# ConsumerGroupDescribe v1's member_type: 1 = a consumer-protocol member, 0 = a classic-protocol
# member inside the consumer group (KIP-848's online upgrade).
CONSUMER_MEMBER_TYPE, CLASSIC_MEMBER_TYPE = 1, 0


def _consumer_groups(call: Call) -> Any:
    groups = call.front.consumer_groups
    if groups is None:
        raise NotCoordinator("this front door does not coordinate consumer groups")
    return groups


def _whole_call(err: LowtideError) -> LowtideError:
    # A forward that failed is, to the member, no coordinator right now: it retries.
    if isinstance(err, (NetworkException, RequestTimedOut)):
        return CoordinatorNotAvailable(f"the group coordinator is unreachable: {err.message}")
    return err


def consumer_group_heartbeat(call: Call, body: Any) -> Any:
    owned = None if body.topic_partitions is None else tuple(
        TopicPartitions(topic_id=t.topic_id.hex, partitions=tuple(t.partitions)) for t in body.topic_partitions)
    request = ConsumerHeartbeat(
        group_id=body.group_id, member_id=body.member_id, member_epoch=body.member_epoch,
        instance_id=body.instance_id, rack_id=body.rack_id, rebalance_timeout_ms=millis(body.rebalance_timeout),
        subscribed_topic_names=None if body.subscribed_topic_names is None else tuple(body.subscribed_topic_names),
        subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None), server_assignor=body.server_assignor,
        topic_partitions=owned, client_id=call.client_id or "", client_host=client_host(call), version=call.version)
    return answer_heartbeat(call, coordinator=_consumer_groups, request=request)


def client_host(call: Call) -> str:
    """A heartbeating member's client_host as Kafka describes it: "/" and the peer's address."""
    return "/" + call.conn.peer.rsplit(":", 1)[0].removeprefix("kafka:")


def answer_heartbeat(call: Call, *, coordinator: Callable[[Call], Any], request: ConsumerHeartbeat) -> Any:
    """The answer to a ConsumerGroupHeartbeat or ShareGroupHeartbeat: ``request`` heartbeated at
    ``coordinator(call)``; a refusal of the whole call (no coordinator here, the front door
    unreachable) is the answer's error, with the member id and epoch the member sent."""
    try:
        result = coordinator(call).heartbeat(principal=call.principal(), request=request)
    except LowtideError as err:
        result = ConsumerHeartbeatResult(member_id=request.member_id, member_epoch=request.member_epoch,
                                         error=_whole_call(err))
    return make_heartbeat_response(call, result)


def describe_groups(call: Call, *, coordinator: Callable[[Call], Any], group_ids: Any,
                    include_authorized_operations: bool) -> list[ConsumerGroupDescription]:
    """ConsumerGroupDescribe's or ShareGroupDescribe's groups as ``coordinator(call)`` describes
    them; a refusal of the whole call is every group's error."""
    try:
        return list(coordinator(call).describe(principal=call.principal(), group_ids=list(group_ids),
                                               include_authorized_operations=include_authorized_operations))
    except LowtideError as err:
        failed = _whole_call(err)
        return [ConsumerGroupDescription(group_id=g, error=failed) for g in group_ids]


def described_group(call: Call, d: ConsumerGroupDescription, *, members: tuple[Any, ...]) -> Any:
    """One DescribedGroup of a ConsumerGroupDescribe or ShareGroupDescribe answer (the two share
    these fields; their members differ)."""
    return call.make(
        "DescribedGroup", error_code=error_code(0 if d.error is None else d.error.code),
        error_message=None if d.error is None else d.error.message, group_id=d.group_id, group_state=d.state,
        group_epoch=d.group_epoch, assignment_epoch=d.assignment_epoch, assignor_name=d.assignor_name,
        authorized_operations=d.authorized_operations, members=members)


def make_heartbeat_response(call: Call, result: Any) -> Any:
    """A ConsumerGroupHeartbeat or ShareGroupHeartbeat answer (the two have the same fields) from
    the coordinator's heartbeat result."""
    assignment = None
    if result.assignment is not None and result.error is None:
        assignment = call.make("Assignment", topic_partitions=tuple(
            call.make("TopicPartitions", topic_id=uuid.UUID(hex=t.topic_id), partitions=t.partitions)
            for t in result.assignment))
    code = 0 if result.error is None else result.error.code
    return call.make(
        call.response, throttle_time=NO_THROTTLE, error_code=error_code(code),
        error_message=None if result.error is None else result.error.message,
        member_id=result.member_id or None, member_epoch=result.member_epoch,
        heartbeat_interval=datetime.timedelta(milliseconds=result.heartbeat_interval_ms), assignment=assignment)


def consumer_group_describe(call: Call, body: Any) -> Any:
    described = describe_groups(call, coordinator=_consumer_groups, group_ids=body.group_ids,
                                include_authorized_operations=bool(body.include_authorized_operations))

    def assignment(items: tuple[TopicPartitions, ...]) -> Any:
        return call.make("Assignment", topic_partitions=tuple(
            call.make("TopicPartitions", topic_id=uuid.UUID(hex=t.topic_id), topic_name=t.topic,
                      partitions=t.partitions) for t in items))

    return call.make(call.response, throttle_time=NO_THROTTLE, groups=tuple(described_group(call, d, members=tuple(
        call.make(
            "Member", member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
            member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
            subscribed_topic_names=m.subscribed_topic_names, subscribed_topic_regex=m.subscribed_topic_regex,
            assignment=assignment(m.assignment), target_assignment=assignment(m.target_assignment),
            member_type=CLASSIC_MEMBER_TYPE if m.classic else CONSUMER_MEMBER_TYPE) for m in d.members))
        for d in described))


APIS = [
    Api(CONSUMER_GROUP_HEARTBEAT_KEY, "ConsumerGroupHeartbeat", 0, 1, consumer_group_heartbeat),
    Api(CONSUMER_GROUP_DESCRIBE_KEY, "ConsumerGroupDescribe", 0, 1, consumer_group_describe),
]
