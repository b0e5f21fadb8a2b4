"""The front door's group coordinator and group membership, over the Admin gRPC service: the
remote twins of ``lowtide.frontdoor.groups.groups.GroupCoordinator`` and
``lowtide.frontdoor.groups.membership.GroupMembership`` (package doc).

Same methods, same answers, same raised errors as the domain objects, as far as the Kafka
listener can tell: an error the servicer answers for the whole call (a Heartbeat or LeaveGroup
refused, an OffsetDelete of a group that does not exist) is raised here, as the domain raises
it; a JoinGroup or SyncGroup the membership refused outright comes back as the result's error,
which is how the listener answers either. ``principal`` is ignored: the front door authenticates
the call's metadata itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lowtide.client.frontdoor.part import RemotePart
from lowtide.errors import InvalidRequest, LowtideError
from lowtide.messages.admin import (
    CommittedOffset,
    GroupListing,
    GroupOutcome,
    JoinRequest,
    JoinResult,
    LeaveOutcome,
    LeavingMember,
    OffsetCommit,
    PartitionOutcome,
    SyncResult,
)
from lowtide.messages.consumer_groups import ConsumerGroupDescription, ConsumerHeartbeat, ConsumerHeartbeatResult
from lowtide.rpc.convert import consumer_groups as convert_consumer
from lowtide.rpc.convert import groups as convert
from lowtide_pb import admin_pb2

# A SyncGroup waits for the leader's assignment, up to the rebalance timeout (Kafka's default
# max.poll.interval.ms is 300 s): its call gets that long and a margin, not the admin deadline.
SYNC_TIMEOUT_S = 330.0
JOIN_MARGIN_S = 30.0


class RemoteGroups(RemotePart):
    """``GroupCoordinator`` at the front door (committed offsets, listing, describing, deleting)."""

    def commit_offsets(self, *, principal: str, group_id: str, commits: Sequence[OffsetCommit],
                       generation_id: int = -1, member_id: str = "", group_instance_id: str = "",
                       txn_producer: tuple[int, int] | None = None) -> list[tuple[OffsetCommit, LowtideError | None]]:
        if txn_producer is not None:
            # A transactional commit goes through the transaction coordinator (RemoteTransactions).
            raise InvalidRequest("a transactional offset commit is TxnOffsetCommit, not OffsetCommit")
        response = self._call(self._stub.OffsetCommit, convert.offset_commit_request(
            group_id=group_id, commits=commits, generation_id=generation_id, member_id=member_id,
            group_instance_id=group_instance_id))
        return convert.commit_results_from_proto(commits, response.partitions)

    def fetch_offsets(self, *, principal: str, group_id: str, partitions: Sequence[tuple[str, int]] = (),
                      require_stable: bool = False, member_id: str | None = None,
                      member_epoch: int = -1) -> list[CommittedOffset]:
        response = self._call(self._stub.OffsetFetch, convert.offset_fetch_request(
            group_id=group_id, partitions=partitions, require_stable=require_stable, member_id=member_id,
            member_epoch=member_epoch))
        return [convert.committed_from_proto(r) for r in response.partitions]

    def list_group_listings(self, *, principal: str) -> list[GroupListing]:
        return convert.listings_from_proto(self._call(self._stub.ListGroups, admin_pb2.ListGroupsRequest()))

    def describe_groups(self, *, principal: str, group_ids: Sequence[str]) -> list[GroupOutcome]:
        response = self._call(self._stub.DescribeGroups, admin_pb2.DescribeGroupsRequest(group_ids=list(group_ids)))
        return [convert.description_from_proto(d) for d in response.groups]

    def delete_groups(self, *, principal: str, group_ids: Sequence[str]) -> list[GroupOutcome]:
        response = self._call(self._stub.DeleteGroups, admin_pb2.DeleteGroupsRequest(group_ids=list(group_ids)))
        return convert.group_results_from_proto(response.groups)

    def delete_offsets(self, *, principal: str, group_id: str,
                       partitions: Sequence[tuple[str, int]]) -> list[PartitionOutcome]:
        outcomes = convert.offset_delete_outcomes(self._call(
            self._stub.OffsetDelete, convert.offset_delete_request(group_id=group_id, partitions=partitions)))
        if isinstance(outcomes, LowtideError):
            raise outcomes
        return outcomes


class RemoteMembership(RemotePart):
    """``GroupMembership`` at the front door (the classic group protocol)."""

    def join_group(self, *, principal: str, request: JoinRequest) -> JoinResult:
        # The join waits for the rebalance, up to the member's rebalance (or session) timeout.
        timeout_s = max(request.rebalance_timeout_ms, request.session_timeout_ms) / 1000 + JOIN_MARGIN_S
        return convert.join_result_from_proto(self._call(
            self._stub.JoinGroup, convert.join_request_to_proto(request), timeout_s=timeout_s))

    def sync_group(self, *, principal: str, group_id: str, generation_id: int, member_id: str,
                   group_instance_id: str = "", protocol_type: str = "", protocol_name: str = "",
                   assignments: Mapping[str, bytes] | None = None) -> SyncResult:
        return convert.sync_result_from_proto(self._call(self._stub.SyncGroup, convert.sync_request(
            group_id=group_id, generation_id=generation_id, member_id=member_id, group_instance_id=group_instance_id,
            protocol_type=protocol_type, protocol_name=protocol_name, assignments=assignments),
            timeout_s=SYNC_TIMEOUT_S))

    def heartbeat(self, *, principal: str, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str = "") -> None:
        error = convert.whole_call_error(self._call(self._stub.Heartbeat, convert.heartbeat_request(
            group_id=group_id, generation_id=generation_id, member_id=member_id,
            group_instance_id=group_instance_id)))
        if error is not None:
            raise error

    def leave_group(self, *, principal: str, group_id: str, members: Sequence[LeavingMember]) -> list[LeaveOutcome]:
        response = self._call(self._stub.LeaveGroup, convert.leave_request(group_id=group_id, members=members))
        error = convert.whole_call_error(response)
        if error is not None:
            raise error
        return convert.leave_outcomes_from_proto(response)


class RemoteConsumerGroups(RemotePart):
    """``ConsumerGroups`` at the front door (KIP-848 consumer groups)."""

    def heartbeat(self, *, principal: str, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        return convert_consumer.heartbeat_result_from_proto(self._call(
            self._stub.ConsumerGroupHeartbeat, convert_consumer.heartbeat_to_proto(request)))

    def describe(self, *, principal: str, group_ids: Sequence[str],
                 include_authorized_operations: bool = False) -> list[ConsumerGroupDescription]:
        return convert_consumer.descriptions_from_proto(self._call(
            self._stub.ConsumerGroupDescribe, admin_pb2.ConsumerGroupDescribeRequest(
                group_ids=list(group_ids), include_authorized_operations=include_authorized_operations)))


class RemoteShareGroups(RemotePart):
    """``ShareGroups`` at the front door (KIP-932 share groups; the consumer group messages carry them)."""

    def heartbeat(self, *, principal: str, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        return convert_consumer.heartbeat_result_from_proto(self._call(
            self._stub.ShareGroupHeartbeat, convert_consumer.heartbeat_to_proto(request)))

    def describe(self, *, principal: str, group_ids: Sequence[str],
                 include_authorized_operations: bool = False) -> list[ConsumerGroupDescription]:
        return convert_consumer.descriptions_from_proto(self._call(
            self._stub.ShareGroupDescribe, admin_pb2.ConsumerGroupDescribeRequest(
                group_ids=list(group_ids), include_authorized_operations=include_authorized_operations)))
