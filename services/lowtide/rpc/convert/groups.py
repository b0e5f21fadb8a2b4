"""Consumer groups on the Admin service (protos/lowtide/v1/admin.proto) <-> ``lowtide.messages.admin``:
committed offsets and groups (the front door's ``GroupCoordinator``: OffsetCommit, OffsetFetch,
OffsetDelete, ListGroups, DescribeGroups, DeleteGroups) and the classic group membership
(``GroupMembership``: JoinGroup, SyncGroup, Heartbeat, LeaveGroup).

The front door's servicer reads requests and writes answers with these; the remote twins
(``lowtide.client.frontdoor.groups``) write requests and read answers. A per-item error travels as
(error_code, error_message) and comes back as the ``LowtideError`` of that code.

What does not travel: a described group's generation, leader and subscribed topics (DescribeGroups
has no field for them: they come back as -1, "" and None), and an answer's commit time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lowtide.errors import LowtideError, error_or_none
from lowtide.messages.admin import (
    CommittedOffset,
    GroupListing,
    GroupOutcome,
    GroupSnapshot,
    JoinedMember,
    JoinRequest,
    JoinResult,
    LeaveOutcome,
    LeavingMember,
    MemberSnapshot,
    OffsetCommit,
    PartitionOutcome,
    Protocol,
    SyncResult,
)
from lowtide.rpc.convert import error_fields, error_kwargs
from lowtide_pb import admin_pb2, common_pb2


def _optional(value: int) -> int | None:
    # proto3 ``optional``: -1 (not known) leaves the field unset.
    return value if value >= 0 else None


# -- OffsetCommit ---------------------------------------------------------------------------------
def commit_to_proto(c: OffsetCommit) -> admin_pb2.OffsetCommitPartition:
    return admin_pb2.OffsetCommitPartition(topic=c.topic, partition=c.partition, offset=c.offset,
                                           metadata=c.metadata, leader_epoch=_optional(c.leader_epoch))


def commit_from_proto(p) -> OffsetCommit:
    """An ``OffsetCommitPartition`` (or transactions.proto's ``TxnOffsetCommitPartition``, the same fields)."""
    return OffsetCommit(topic=p.topic, partition=p.partition, offset=p.offset, metadata=p.metadata,
                        leader_epoch=p.leader_epoch if p.HasField("leader_epoch") else -1)


def offset_commit_request(*, group_id: str, commits: Sequence[OffsetCommit], generation_id: int = -1,
                          member_id: str = "", group_instance_id: str = "") -> admin_pb2.OffsetCommitRequest:
    return admin_pb2.OffsetCommitRequest(group_id=group_id, partitions=[commit_to_proto(c) for c in commits],
                                         generation_id=_optional(generation_id), member_id=member_id,
                                         group_instance_id=group_instance_id)


def offset_commit_args(request: admin_pb2.OffsetCommitRequest) -> dict:
    """``GroupCoordinator.commit_offsets``' keyword arguments (all but the principal)."""
    return {"group_id": request.group_id, "commits": [commit_from_proto(p) for p in request.partitions],
            "generation_id": request.generation_id if request.HasField("generation_id") else -1,
            "member_id": request.member_id, "group_instance_id": request.group_instance_id}


def commit_results_to_proto(results: Sequence[tuple[OffsetCommit, LowtideError | None]]
                            ) -> list[admin_pb2.OffsetCommitResult]:
    return [admin_pb2.OffsetCommitResult(topic=c.topic, partition=c.partition, **error_kwargs(e)) for c, e in results]


def commit_results_from_proto(commits: Sequence[OffsetCommit], partitions
                              ) -> list[tuple[OffsetCommit, LowtideError | None]]:
    """The answer to ``commits`` (its results, in the same order, as the servicer gives them); a
    commit the answer lacks gets UNKNOWN_SERVER_ERROR."""
    errors = {(r.topic, r.partition): error_or_none(r.error_code, r.error_message) for r in partitions}
    return [(c, errors[(c.topic, c.partition)]) if (c.topic, c.partition) in errors
            else (c, LowtideError(f"no answer for {c.topic}-{c.partition}")) for c in commits]


# -- OffsetFetch ----------------------------------------------------------------------------------
def offset_fetch_request(*, group_id: str, partitions: Sequence[tuple[str, int]] = (),
                         require_stable: bool = False, member_id: str | None = None,
                         member_epoch: int = -1) -> admin_pb2.OffsetFetchRequest:
    member = {} if member_id is None else {"member_id": member_id}
    return admin_pb2.OffsetFetchRequest(group_id=group_id, require_stable=require_stable, partitions=[
        common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions], member_epoch=member_epoch, **member)


def offset_fetch_args(request: admin_pb2.OffsetFetchRequest) -> dict:
    return {"group_id": request.group_id, "partitions": [(p.topic, p.partition) for p in request.partitions],
            "require_stable": request.require_stable,
            "member_id": request.member_id if request.HasField("member_id") else None,
            "member_epoch": request.member_epoch if request.HasField("member_epoch") else -1}


def committed_to_proto(c: CommittedOffset) -> admin_pb2.OffsetFetchResult:
    code, message = error_fields(c.error)
    return admin_pb2.OffsetFetchResult(topic=c.topic, partition=c.partition, offset=c.offset, metadata=c.metadata,
                                       error_code=code, error_message=message, leader_epoch=c.leader_epoch)


def committed_from_proto(r: admin_pb2.OffsetFetchResult) -> CommittedOffset:
    return CommittedOffset(topic=r.topic, partition=r.partition, offset=r.offset, metadata=r.metadata,
                           error=error_or_none(r.error_code, r.error_message), leader_epoch=r.leader_epoch)


# -- OffsetDelete ---------------------------------------------------------------------------------
def offset_delete_request(*, group_id: str, partitions: Sequence[tuple[str, int]]) -> admin_pb2.OffsetDeleteRequest:
    return admin_pb2.OffsetDeleteRequest(group_id=group_id, partitions=[
        common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions])


def offset_delete_response(outcomes: Sequence[PartitionOutcome] | LowtideError) -> admin_pb2.OffsetDeleteResponse:
    """The answer: per partition, or the error that refused the whole group (raised by the domain)."""
    if isinstance(outcomes, LowtideError):
        return admin_pb2.OffsetDeleteResponse(error_code=outcomes.code, error_message=outcomes.message)
    return admin_pb2.OffsetDeleteResponse(partitions=[
        admin_pb2.OffsetCommitResult(topic=o.topic, partition=o.partition, **error_kwargs(o.error)) for o in outcomes])


def offset_delete_outcomes(response: admin_pb2.OffsetDeleteResponse) -> list[PartitionOutcome] | LowtideError:
    error = error_or_none(response.error_code, response.error_message)
    if error is not None:
        return error
    return [PartitionOutcome(topic=r.topic, partition=r.partition, error=error_or_none(r.error_code, r.error_message))
            for r in response.partitions]


# -- ListGroups, DescribeGroups, DeleteGroups -----------------------------------------------------
def listings_to_proto(listings: Sequence[GroupListing]) -> admin_pb2.ListGroupsResponse:
    return admin_pb2.ListGroupsResponse(group_ids=[g.group_id for g in listings], groups=[
        admin_pb2.GroupListing(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state,
                               group_type=g.group_type) for g in listings])


def listings_from_proto(response: admin_pb2.ListGroupsResponse) -> list[GroupListing]:
    return [GroupListing(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state,
                         group_type=g.group_type or "classic") for g in response.groups]


def description_to_proto(o: GroupOutcome) -> admin_pb2.GroupDescription:
    """A described group: no members in memory (``group`` None) is an Empty group with no protocol."""
    code, message = error_fields(o.error)
    description = admin_pb2.GroupDescription(group_id=o.group_id, error_code=code, error_message=message,
                                              offsets=[committed_to_proto(c) for c in o.offsets])
    if o.error is None:
        g = o.group
        description.state = g.state if g is not None else "Empty"
        if g is not None:
            description.protocol_type, description.protocol = g.protocol_type, g.protocol
            description.members.extend(admin_pb2.GroupMemberDescription(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, metadata=m.metadata, assignment=m.assignment) for m in g.members)
    return description


def description_from_proto(d: admin_pb2.GroupDescription) -> GroupOutcome:
    error = error_or_none(d.error_code, d.error_message)
    offsets = tuple(committed_from_proto(r) for r in d.offsets)
    if error is not None:
        return GroupOutcome(group_id=d.group_id, error=error, offsets=offsets)
    if d.state == "Empty" and not d.protocol_type and not d.protocol and not d.members:
        return GroupOutcome(group_id=d.group_id, offsets=offsets)  # no members in memory
    return GroupOutcome(group_id=d.group_id, offsets=offsets, group=GroupSnapshot(
        group_id=d.group_id, state=d.state, protocol_type=d.protocol_type, protocol=d.protocol, generation_id=-1,
        leader="", subscribed_topics=None, members=tuple(
            MemberSnapshot(member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                           client_host=m.client_host, metadata=m.metadata, assignment=m.assignment)
            for m in d.members)))


def group_results_to_proto(outcomes: Sequence[GroupOutcome]) -> list[admin_pb2.GroupResult]:
    return [admin_pb2.GroupResult(group_id=o.group_id, **error_kwargs(o.error)) for o in outcomes]


def group_results_from_proto(results: Sequence[admin_pb2.GroupResult]) -> list[GroupOutcome]:
    return [GroupOutcome(group_id=r.group_id, error=error_or_none(r.error_code, r.error_message)) for r in results]


# -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup --------------------------------------------------
def join_request_to_proto(r: JoinRequest) -> admin_pb2.JoinGroupRequest:
    return admin_pb2.JoinGroupRequest(
        group_id=r.group_id, session_timeout_ms=r.session_timeout_ms, rebalance_timeout_ms=r.rebalance_timeout_ms,
        member_id=r.member_id, group_instance_id=r.group_instance_id, protocol_type=r.protocol_type,
        protocols=[admin_pb2.GroupProtocol(name=p.name, metadata=p.metadata) for p in r.protocols],
        require_known_member_id=r.require_known_member_id, client_id=r.client_id, client_host=r.client_host,
        reason=r.reason)


def join_request_from_proto(r: admin_pb2.JoinGroupRequest, *, client_host: str | None = None) -> JoinRequest:
    """``client_host``: the host to record instead of the request's (the servicer's, from the caller)."""
    return JoinRequest(
        group_id=r.group_id, session_timeout_ms=r.session_timeout_ms, rebalance_timeout_ms=r.rebalance_timeout_ms,
        member_id=r.member_id, group_instance_id=r.group_instance_id, protocol_type=r.protocol_type,
        protocols=tuple(Protocol(name=p.name, metadata=p.metadata) for p in r.protocols),
        require_known_member_id=r.require_known_member_id, client_id=r.client_id,
        client_host=r.client_host if client_host is None else client_host, reason=r.reason)


def join_result_to_proto(result: JoinResult) -> admin_pb2.JoinGroupResponse:
    code, message = error_fields(result.error)
    return admin_pb2.JoinGroupResponse(
        error_code=code, error_message=message, generation_id=result.generation_id,
        protocol_type=result.protocol_type, protocol_name=result.protocol_name, leader=result.leader,
        member_id=result.member_id, members=[
            admin_pb2.JoinGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                      metadata=m.metadata) for m in result.members])


def join_result_from_proto(r: admin_pb2.JoinGroupResponse) -> JoinResult:
    return JoinResult(member_id=r.member_id, generation_id=r.generation_id, protocol_type=r.protocol_type,
                      protocol_name=r.protocol_name, leader=r.leader, members=tuple(
                          JoinedMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                       metadata=m.metadata) for m in r.members),
                      error=error_or_none(r.error_code, r.error_message))


def sync_request(*, group_id: str, generation_id: int, member_id: str, group_instance_id: str = "",
                 protocol_type: str = "", protocol_name: str = "",
                 assignments: Mapping[str, bytes] | None = None) -> admin_pb2.SyncGroupRequest:
    return admin_pb2.SyncGroupRequest(
        group_id=group_id, generation_id=generation_id, member_id=member_id, group_instance_id=group_instance_id,
        protocol_type=protocol_type, protocol_name=protocol_name, assignments=[
            admin_pb2.SyncGroupAssignment(member_id=m, assignment=a) for m, a in (assignments or {}).items()])


def sync_args(r: admin_pb2.SyncGroupRequest) -> dict:
    """``GroupMembership.sync_group``'s keyword arguments (all but the principal)."""
    return {"group_id": r.group_id, "generation_id": r.generation_id, "member_id": r.member_id,
            "group_instance_id": r.group_instance_id, "protocol_type": r.protocol_type,
            "protocol_name": r.protocol_name, "assignments": {a.member_id: a.assignment for a in r.assignments}}


def sync_result_to_proto(result: SyncResult) -> admin_pb2.SyncGroupResponse:
    code, message = error_fields(result.error)
    return admin_pb2.SyncGroupResponse(error_code=code, error_message=message, protocol_type=result.protocol_type,
                                       protocol_name=result.protocol_name, assignment=result.assignment)


def sync_result_from_proto(r: admin_pb2.SyncGroupResponse) -> SyncResult:
    return SyncResult(protocol_type=r.protocol_type, protocol_name=r.protocol_name, assignment=r.assignment,
                      error=error_or_none(r.error_code, r.error_message))


def heartbeat_request(*, group_id: str, generation_id: int, member_id: str,
                      group_instance_id: str = "") -> admin_pb2.HeartbeatRequest:
    return admin_pb2.HeartbeatRequest(group_id=group_id, generation_id=generation_id, member_id=member_id,
                                      group_instance_id=group_instance_id)


def heartbeat_args(r: admin_pb2.HeartbeatRequest) -> dict:
    return {"group_id": r.group_id, "generation_id": r.generation_id, "member_id": r.member_id,
            "group_instance_id": r.group_instance_id}


def leave_request(*, group_id: str, members: Sequence[LeavingMember]) -> admin_pb2.LeaveGroupRequest:
    return admin_pb2.LeaveGroupRequest(group_id=group_id, members=[
        admin_pb2.LeaveGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id, reason=m.reason)
        for m in members])


def leaving_from_proto(r: admin_pb2.LeaveGroupRequest) -> list[LeavingMember]:
    return [LeavingMember(member_id=m.member_id, group_instance_id=m.group_instance_id, reason=m.reason)
            for m in r.members]


def leave_outcomes_to_proto(outcomes: Sequence[LeaveOutcome]) -> admin_pb2.LeaveGroupResponse:
    return admin_pb2.LeaveGroupResponse(members=[
        admin_pb2.LeaveGroupMemberResult(member_id=o.member_id, group_instance_id=o.group_instance_id,
                                         **error_kwargs(o.error))
        for o in outcomes])


def leave_outcomes_from_proto(r: admin_pb2.LeaveGroupResponse) -> list[LeaveOutcome]:
    return [LeaveOutcome(member_id=m.member_id, group_instance_id=m.group_instance_id,
                         error=error_or_none(m.error_code, m.error_message)) for m in r.members]


def whole_call_error(r) -> LowtideError | None:
    """The error of an answer that carries one for the whole call (a Heartbeat, a LeaveGroup, a
    JoinGroup or SyncGroup the membership refused outright), None when it has none."""
    return error_or_none(r.error_code, r.error_message)
