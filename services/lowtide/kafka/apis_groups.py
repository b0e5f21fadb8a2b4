"""Consumer groups over the Kafka protocol: the classic group protocol and committed offsets, answered
by the front door's group coordinator (Admin JoinGroup/SyncGroup/Heartbeat/LeaveGroup, OffsetCommit,
OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete).

Every broker answers FindCoordinator with a live broker and forwards these requests to the front
door, so the coordinator a client talks to never moves the group's state: it is the front door's.
A JoinGroup waits for the rebalance, up to the member's rebalance timeout, so its forward gets that
long (plus a margin) instead of the usual admin deadline.
"""

from __future__ import annotations

from typing import Any

from lowtide.errors import CoordinatorNotAvailable, LowtideError, NetworkException, RequestTimedOut
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code, millis
from lowtide_pb import admin_pb2, common_pb2

OFFSET_COMMIT_KEY, OFFSET_FETCH_KEY, JOIN_GROUP_KEY, HEARTBEAT_KEY, LEAVE_GROUP_KEY = 8, 9, 11, 12, 13
SYNC_GROUP_KEY, DESCRIBE_GROUPS_KEY, LIST_GROUPS_KEY, DELETE_GROUPS_KEY, OFFSET_DELETE_KEY = 14, 15, 16, 42, 47
_NO_OPERATIONS = -(2**31)


# -- membership ------------------------------------------------------------------------------
def join_group(call: Call, body: Any) -> Any:
    session_ms = millis(body.session_timeout)
    rebalance_ms = millis(getattr(body, "rebalance_timeout", session_ms))
    request = admin_pb2.JoinGroupRequest(
        group_id=body.group_id, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
        member_id=body.member_id, group_instance_id=getattr(body, "group_instance_id", None) or "",
        protocol_type=body.protocol_type, require_known_member_id=call.version >= 4,
        client_id=call.client_id or "", client_host=call.conn.peer.rsplit(":", 1)[0].removeprefix("kafka:"),
        reason=getattr(body, "reason", None) or "",
        protocols=[admin_pb2.GroupProtocol(name=p.name, metadata=p.metadata) for p in body.protocols])
    answer = call.admin("JoinGroup", request, timeout_s=max(rebalance_ms, session_ms) / 1000 + 30)
    return call.make(
        call.response, throttle_time=NO_THROTTLE, error_code=error_code(answer.error_code),
        generation_id=answer.generation_id if not answer.error_code else -1,
        protocol_type=answer.protocol_type or None, protocol_name=answer.protocol_name or (None if call.version >= 7
                                                                                            else ""),
        leader=answer.leader, skip_assignment=False, member_id=answer.member_id,
        members=tuple(call.make("JoinGroupResponseMember", member_id=m.member_id,
                                group_instance_id=m.group_instance_id or None, metadata=m.metadata)
                      for m in answer.members))


def sync_group(call: Call, body: Any) -> Any:
    answer = call.admin("SyncGroup", admin_pb2.SyncGroupRequest(
        group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id,
        group_instance_id=getattr(body, "group_instance_id", None) or "",
        protocol_type=getattr(body, "protocol_type", None) or "", protocol_name=getattr(body, "protocol_name", None)
        or "", assignments=[admin_pb2.SyncGroupAssignment(member_id=a.member_id, assignment=a.assignment)
                            for a in body.assignments]), timeout_s=330)
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(answer.error_code),
                     protocol_type=answer.protocol_type or None, protocol_name=answer.protocol_name or None,
                     assignment=answer.assignment)


def heartbeat(call: Call, body: Any) -> Any:
    answer = call.admin("Heartbeat", admin_pb2.HeartbeatRequest(
        group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id,
        group_instance_id=getattr(body, "group_instance_id", None) or ""))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(answer.error_code))


def leave_group(call: Call, body: Any) -> Any:
    if hasattr(body, "members"):
        members = [admin_pb2.LeaveGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id or "",
                                              reason=getattr(m, "reason", None) or "") for m in body.members]
    else:
        members = [admin_pb2.LeaveGroupMember(member_id=body.member_id)]
    answer = call.admin("LeaveGroup", admin_pb2.LeaveGroupRequest(group_id=body.group_id, members=members))
    code = answer.error_code
    if not hasattr(body, "members") and not code and answer.members:
        code = answer.members[0].error_code  # v0-v2 name one member and carry one error
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(code), members=tuple(
        call.make("MemberResponse", member_id=m.member_id, group_instance_id=m.group_instance_id or None,
                  error_code=error_code(m.error_code)) for m in answer.members))


# -- offsets ---------------------------------------------------------------------------------
def offset_commit(call: Call, body: Any) -> Any:
    generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
    request = admin_pb2.OffsetCommitRequest(
        group_id=body.group_id, member_id=getattr(body, "member_id", "") or "",
        group_instance_id=getattr(body, "group_instance_id", None) or "",
        partitions=[admin_pb2.OffsetCommitPartition(topic=t.name, partition=p.partition_index,
                                                    offset=p.committed_offset, metadata=p.committed_metadata or "",
                                                    leader_epoch=getattr(p, "committed_leader_epoch", -1))
                    for t in body.topics for p in t.partitions])
    if generation >= 0:
        request.generation_id = generation
    try:
        results = {(r.topic, r.partition): r.error_code for r in call.admin("OffsetCommit", request).partitions}
    except LowtideError as err:
        # Every partition gets the error: the generic whole-call answer has no partitions, which
        # a Java consumer reads as a commit that succeeded.
        code = CoordinatorNotAvailable.code if isinstance(err, (NetworkException, RequestTimedOut)) else err.code
        results = {(p.topic, p.partition): code for p in request.partitions}
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(
        call.make("OffsetCommitResponseTopic", name=t.name, partitions=tuple(
            call.make("OffsetCommitResponsePartition", partition_index=p.partition_index,
                      error_code=error_code(results.get((t.name, p.partition_index), -1)))
            for p in t.partitions)) for t in body.topics))


def _fetch_group(call: Call, group_id: str, topics, *, require_stable: bool) -> tuple[int, dict[str, list]]:
    """(group error, topic -> [(partition, offset, metadata, error)]) of one group."""
    request = admin_pb2.OffsetFetchRequest(group_id=group_id, require_stable=require_stable)
    if topics is not None:
        for t in topics:
            for p in t.partition_indexes:
                request.partitions.add(topic=t.name, partition=p)
    try:
        answer = call.admin("OffsetFetch", request)
    except LowtideError as err:  # a whole-group failure (authorization, bad id) is that group's error
        return err.code, {}
    out: dict[str, list] = {}
    for r in answer.partitions:
        out.setdefault(r.topic, []).append((r.partition, r.offset, r.metadata, r.error_code, r.leader_epoch))
    return 0, out


def offset_fetch(call: Call, body: Any) -> Any:
    # v7+ (KIP-447): a read_committed consumer asks for stable offsets only.
    stable = bool(getattr(body, "require_stable", False))
    if hasattr(body, "groups"):  # v8+: several groups per request
        groups = []
        for g in body.groups:
            code, topics = _fetch_group(call, g.group_id, g.topics, require_stable=stable)
            groups.append(call.make("OffsetFetchResponseGroup", group_id=g.group_id, error_code=error_code(code),
                                    topics=_fetched_topics(call, topics, "OffsetFetchResponseTopics",
                                                           "OffsetFetchResponsePartitions")))
        return call.make(call.response, throttle_time=NO_THROTTLE, groups=tuple(groups))
    code, topics = _fetch_group(call, body.group_id, body.topics, require_stable=stable)
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(code),
                     topics=_fetched_topics(call, topics, "OffsetFetchResponseTopic", "OffsetFetchResponsePartition"))


def _fetched_topics(call: Call, topics: dict[str, list], topic_type: str, partition_type: str) -> tuple:
    return tuple(call.make(topic_type, name=name, partitions=tuple(
        call.make(partition_type, partition_index=p, committed_offset=off, committed_leader_epoch=epoch,
                  metadata=meta, error_code=error_code(code)) for p, off, meta, code, epoch in sorted(parts)))
        for name, parts in sorted(topics.items()))


def offset_delete(call: Call, body: Any) -> Any:
    answer = call.admin("OffsetDelete", admin_pb2.OffsetDeleteRequest(group_id=body.group_id, partitions=[
        common_pb2.TopicPartition(topic=t.name, partition=p.partition_index)
        for t in body.topics for p in t.partitions]))
    results = {(r.topic, r.partition): r.error_code for r in answer.partitions}
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(answer.error_code), topics=tuple(
        call.make("OffsetDeleteResponseTopic", name=t.name, partitions=tuple(
            call.make("OffsetDeleteResponsePartition", partition_index=p.partition_index,
                      error_code=error_code(results.get((t.name, p.partition_index), 0 if answer.error_code else -1)))
            for p in t.partitions)) for t in body.topics))


# -- listing ---------------------------------------------------------------------------------
def list_groups(call: Call, body: Any) -> Any:
    answer = call.admin("ListGroups", admin_pb2.ListGroupsRequest())
    states = {s.lower() for s in getattr(body, "states_filter", ())}
    types = {t.lower() for t in getattr(body, "types_filter", ())}
    listed = [g for g in answer.groups if (not states or g.state.lower() in states)
              and (not types or "classic" in types)]
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), groups=tuple(
        call.make("ListedGroup", group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state,
                  group_type="classic") for g in listed))


def describe_groups(call: Call, body: Any) -> Any:
    answer = call.admin("DescribeGroups", admin_pb2.DescribeGroupsRequest(group_ids=list(body.groups)))
    return call.make(call.response, throttle_time=NO_THROTTLE, groups=tuple(
        call.make("DescribedGroup", error_code=error_code(g.error_code), group_id=g.group_id,
                  group_state=g.state or ("Dead" if g.error_code else "Empty"), protocol_type=g.protocol_type,
                  protocol_data=g.protocol, authorized_operations=_NO_OPERATIONS, members=tuple(
                      call.make("DescribedGroupMember", member_id=m.member_id,
                                group_instance_id=m.group_instance_id or None, client_id=m.client_id,
                                client_host=m.client_host, member_metadata=m.metadata,
                                member_assignment=m.assignment) for m in g.members))
        for g in answer.groups))


def delete_groups(call: Call, body: Any) -> Any:
    answer = call.admin("DeleteGroups", admin_pb2.DeleteGroupsRequest(group_ids=list(body.groups_names)))
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(
        call.make("DeletableGroupResult", group_id=r.group_id, error_code=error_code(r.error_code))
        for r in answer.groups))


APIS = [
    Api(OFFSET_COMMIT_KEY, "OffsetCommit", 2, 9, offset_commit),
    Api(OFFSET_FETCH_KEY, "OffsetFetch", 1, 8, offset_fetch),
    Api(JOIN_GROUP_KEY, "JoinGroup", 0, 9, join_group),
    Api(HEARTBEAT_KEY, "Heartbeat", 0, 4, heartbeat),
    Api(LEAVE_GROUP_KEY, "LeaveGroup", 0, 5, leave_group),
    Api(SYNC_GROUP_KEY, "SyncGroup", 0, 5, sync_group),
    Api(DESCRIBE_GROUPS_KEY, "DescribeGroups", 0, 5, describe_groups),
    Api(LIST_GROUPS_KEY, "ListGroups", 0, 5, list_groups),
    Api(DELETE_GROUPS_KEY, "DeleteGroups", 0, 2, delete_groups),
    Api(OFFSET_DELETE_KEY, "OffsetDelete", 0, 0, offset_delete),
]
