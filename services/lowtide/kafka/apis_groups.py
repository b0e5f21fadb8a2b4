"""Consumer groups over the Kafka protocol: the classic group protocol and committed offsets, answered
by the front door's group membership and group coordinator (``Call.front.members`` and
``Call.front.groups``: JoinGroup/SyncGroup/Heartbeat/LeaveGroup, OffsetCommit, OffsetFetch,
ListGroups, DescribeGroups, DeleteGroups, OffsetDelete), called with ``lowtide.messages`` types.

Every broker answers FindCoordinator with a live broker and forwards these requests to the front
door, so the coordinator a client talks to never moves the group's state: it is the front door's.
A JoinGroup waits for the rebalance, up to the member's rebalance timeout, so its forward gets that
long (plus a margin) instead of the usual admin deadline (``lowtide.client.frontdoor.groups``).

An error the membership raises (a refused principal, a front door that runs no membership: that
is NOT_COORDINATOR, as its servicer answers) is the answer's error code, as the front door's
servicer answers it; so is a forward that failed.
"""

from __future__ import annotations

from typing import Any

from lowtide.errors import CoordinatorNotAvailable, LowtideError, NetworkException, NotCoordinator, RequestTimedOut
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code, millis
from lowtide.messages.admin import JoinRequest, JoinResult, LeavingMember, OffsetCommit, Protocol, SyncResult

OFFSET_COMMIT_KEY, OFFSET_FETCH_KEY, JOIN_GROUP_KEY, HEARTBEAT_KEY, LEAVE_GROUP_KEY = 8, 9, 11, 12, 13
SYNC_GROUP_KEY, DESCRIBE_GROUPS_KEY, LIST_GROUPS_KEY, DELETE_GROUPS_KEY, OFFSET_DELETE_KEY = 14, 15, 16, 42, 47
_NO_OPERATIONS = -(2**31)


def _code(error: LowtideError | None) -> int:
    return 0 if error is None else error.code


# -- membership ------------------------------------------------------------------------------
def _members(call: Call) -> Any:
    """The front door's GroupMembership (or its remote twin); a front door without one is not
    the coordinator, as its servicer answers."""
    members = call.front.members
    if members is None:
        raise NotCoordinator("this front door does not coordinate group membership")
    return members


def join_group(call: Call, body: Any) -> Any:
    session_ms = millis(body.session_timeout)
    rebalance_ms = millis(getattr(body, "rebalance_timeout", session_ms))
    try:
        result = _members(call).join_group(principal=call.principal(), request=JoinRequest(
            group_id=body.group_id, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
            member_id=body.member_id, group_instance_id=getattr(body, "group_instance_id", None) or "",
            protocol_type=body.protocol_type, require_known_member_id=call.version >= 4,
            client_id=call.client_id or "", client_host=call.conn.peer.rsplit(":", 1)[0].removeprefix("kafka:"),
            reason=getattr(body, "reason", None) or "",
            protocols=tuple(Protocol(name=p.name, metadata=p.metadata) for p in body.protocols)))
    except LowtideError as err:
        result = JoinResult(member_id=body.member_id, error=err)
    failed = result.error is not None
    return call.make(
        call.response, throttle_time=NO_THROTTLE, error_code=error_code(_code(result.error)),
        generation_id=result.generation_id if not failed else -1,
        protocol_type=result.protocol_type or None, protocol_name=result.protocol_name or (None if call.version >= 7
                                                                                            else ""),
        leader=result.leader, skip_assignment=False, member_id=result.member_id,
        members=tuple(call.make("JoinGroupResponseMember", member_id=m.member_id,
                                group_instance_id=m.group_instance_id or None, metadata=m.metadata)
                      for m in result.members))


def sync_group(call: Call, body: Any) -> Any:
    try:
        result = _members(call).sync_group(
            principal=call.principal(), group_id=body.group_id, generation_id=body.generation_id,
            member_id=body.member_id, group_instance_id=getattr(body, "group_instance_id", None) or "",
            protocol_type=getattr(body, "protocol_type", None) or "",
            protocol_name=getattr(body, "protocol_name", None) or "",
            assignments={a.member_id: a.assignment for a in body.assignments})
    except LowtideError as err:
        result = SyncResult(error=err)
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(_code(result.error)),
                     protocol_type=result.protocol_type or None, protocol_name=result.protocol_name or None,
                     assignment=result.assignment)


def heartbeat(call: Call, body: Any) -> Any:
    try:
        _members(call).heartbeat(principal=call.principal(), group_id=body.group_id,
                                 generation_id=body.generation_id, member_id=body.member_id,
                                 group_instance_id=getattr(body, "group_instance_id", None) or "")
        code = 0
    except LowtideError as err:
        code = err.code
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(code))


def leave_group(call: Call, body: Any) -> Any:
    if hasattr(body, "members"):
        members = [LeavingMember(member_id=m.member_id, group_instance_id=m.group_instance_id or "",
                                 reason=getattr(m, "reason", None) or "") for m in body.members]
    else:
        members = [LeavingMember(member_id=body.member_id)]
    try:
        outcomes = _members(call).leave_group(principal=call.principal(), group_id=body.group_id, members=members)
        code = 0
    except LowtideError as err:
        outcomes, code = [], err.code
    if not hasattr(body, "members") and not code and outcomes:
        code = _code(outcomes[0].error)  # v0-v2 name one member and carry one error
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(code), members=tuple(
        call.make("MemberResponse", member_id=o.member_id, group_instance_id=o.group_instance_id or None,
                  error_code=error_code(_code(o.error))) for o in outcomes))


# -- offsets ---------------------------------------------------------------------------------
def offset_commit(call: Call, body: Any) -> Any:
    generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
    commits = [OffsetCommit(topic=t.name, partition=p.partition_index, offset=p.committed_offset,
                            metadata=p.committed_metadata or "",
                            leader_epoch=getattr(p, "committed_leader_epoch", -1))
               for t in body.topics for p in t.partitions]
    try:
        results = {(c.topic, c.partition): _code(e) for c, e in call.front.groups.commit_offsets(
            principal=call.principal(), group_id=body.group_id, commits=commits,
            generation_id=generation if generation >= 0 else -1, member_id=getattr(body, "member_id", "") or "",
            group_instance_id=getattr(body, "group_instance_id", None) or "")}
    except LowtideError as err:
        # Every partition gets the error: the generic whole-call answer has no partitions, which
        # a Java consumer reads as a commit that succeeded.
        code = CoordinatorNotAvailable.code if isinstance(err, (NetworkException, RequestTimedOut)) else err.code
        results = {(c.topic, c.partition): code for c in commits}
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(
        call.make("OffsetCommitResponseTopic", name=t.name, partitions=tuple(
            call.make("OffsetCommitResponsePartition", partition_index=p.partition_index,
                      error_code=error_code(results.get((t.name, p.partition_index), -1)))
            for p in t.partitions)) for t in body.topics))


def _fetch_group(call: Call, group_id: str, topics, *, require_stable: bool, member_id: str | None = None,
                 member_epoch: int = -1) -> tuple[int, dict[str, list]]:
    """(group error, topic -> [(partition, offset, metadata, error)]) of one group."""
    partitions = [] if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    member = {} if member_id is None and member_epoch < 0 else {"member_id": member_id, "member_epoch": member_epoch}
    try:
        offsets = call.front.groups.fetch_offsets(principal=call.principal(), group_id=group_id,
                                                  partitions=partitions, require_stable=require_stable, **member)
    except LowtideError as err:  # a whole-group failure (authorization, bad id) is that group's error
        return err.code, {}
    out: dict[str, list] = {}
    for c in offsets:
        out.setdefault(c.topic, []).append((c.partition, c.offset, c.metadata, _code(c.error), c.leader_epoch))
    return 0, out


def offset_fetch(call: Call, body: Any) -> Any:
    # v7+ (KIP-447): a read_committed consumer asks for stable offsets only.
    stable = bool(getattr(body, "require_stable", False))
    if hasattr(body, "groups"):  # v8+: several groups per request
        groups = []
        for g in body.groups:
            # v9 (KIP-848): a consumer group member's id and epoch, checked by the coordinator.
            code, topics = _fetch_group(call, g.group_id, g.topics, require_stable=stable,
                                        member_id=getattr(g, "member_id", None),
                                        member_epoch=getattr(g, "member_epoch", -1))
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
    try:
        outcomes = call.front.groups.delete_offsets(
            principal=call.principal(), group_id=body.group_id,
            partitions=[(t.name, p.partition_index) for t in body.topics for p in t.partitions])
        group_code = 0
    except LowtideError as err:  # the whole group refused (no such group, members, authorization)
        outcomes, group_code = [], err.code
    results = {(o.topic, o.partition): _code(o.error) for o in outcomes}
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(group_code), topics=tuple(
        call.make("OffsetDeleteResponseTopic", name=t.name, partitions=tuple(
            call.make("OffsetDeleteResponsePartition", partition_index=p.partition_index,
                      error_code=error_code(results.get((t.name, p.partition_index), 0 if group_code else -1)))
            for p in t.partitions)) for t in body.topics))


# -- listing ---------------------------------------------------------------------------------
def list_groups(call: Call, body: Any) -> Any:
    listings = call.front.groups.list_group_listings(principal=call.principal())
    states = {s.lower() for s in getattr(body, "states_filter", ())}
    types = {t.lower() for t in getattr(body, "types_filter", ())}
    listed = [g for g in listings if (not states or g.state.lower() in states)
              and (not types or g.group_type.lower() in types)]
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), groups=tuple(
        call.make("ListedGroup", group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state,
                  group_type=g.group_type) for g in listed))


def describe_groups(call: Call, body: Any) -> Any:
    outcomes = call.front.groups.describe_groups(principal=call.principal(), group_ids=list(body.groups))
    described = []
    for o in outcomes:
        g = o.group if o.error is None else None  # None: no members in memory (Empty), or failed (Dead)
        described.append(call.make(
            "DescribedGroup", error_code=error_code(_code(o.error)), group_id=o.group_id,
            group_state=(g.state if g is not None else "") or ("Dead" if o.error is not None else "Empty"),
            protocol_type=g.protocol_type if g is not None else "", protocol_data=g.protocol if g is not None else "",
            authorized_operations=_NO_OPERATIONS, members=tuple(
                call.make("DescribedGroupMember", member_id=m.member_id, group_instance_id=m.group_instance_id or None,
                          client_id=m.client_id, client_host=m.client_host, member_metadata=m.metadata,
                          member_assignment=m.assignment) for m in (g.members if g is not None else ()))))
    return call.make(call.response, throttle_time=NO_THROTTLE, groups=tuple(described))


def delete_groups(call: Call, body: Any) -> Any:
    outcomes = call.front.groups.delete_groups(principal=call.principal(), group_ids=list(body.groups_names))
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(
        call.make("DeletableGroupResult", group_id=o.group_id, error_code=error_code(_code(o.error)))
        for o in outcomes))


APIS = [
    Api(OFFSET_COMMIT_KEY, "OffsetCommit", 2, 9, offset_commit),
    # v9 (KIP-848) adds the member id and epoch of a consumer group member, checked against the
    # consumer group (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID).
    Api(OFFSET_FETCH_KEY, "OffsetFetch", 1, 9, offset_fetch),
    Api(JOIN_GROUP_KEY, "JoinGroup", 0, 9, join_group),
    Api(HEARTBEAT_KEY, "Heartbeat", 0, 4, heartbeat),
    Api(LEAVE_GROUP_KEY, "LeaveGroup", 0, 5, leave_group),
    Api(SYNC_GROUP_KEY, "SyncGroup", 0, 5, sync_group),
    Api(DESCRIBE_GROUPS_KEY, "DescribeGroups", 0, 5, describe_groups),
    Api(LIST_GROUPS_KEY, "ListGroups", 0, 5, list_groups),
    Api(DELETE_GROUPS_KEY, "DeleteGroups", 0, 2, delete_groups),
    Api(OFFSET_DELETE_KEY, "OffsetDelete", 0, 0, offset_delete),
]
