"""The ``lowtide.v1.Admin`` servicer: unpack the request, call the domain, build the reply.

The only front-door module (with ``replicas``) that touches generated protobuf code. Every call
first authenticates the caller from its invocation metadata (``authorization: Bearer <token>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from lowtide.auth.acl import ANONYMOUS_PRINCIPAL, Authorizer
from lowtide.auth.tokens import Authenticator
from lowtide.errors import InvalidRequest, LowtideError, NotCoordinator
from lowtide.frontdoor.admin.acls import AclAdmin
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.admin.config_admin import TopicConfigAdmin
from lowtide.frontdoor.admin.delete_records import RecordsDeleter
from lowtide.frontdoor.admin.partitions import PartitionCreator
from lowtide.frontdoor.admin.scram import ScramAdmin
from lowtide.frontdoor.controller.elections import LeaderElections
from lowtide.frontdoor.controller.reassignments import PartitionReassigner
from lowtide.frontdoor.groups.consumer_membership import ConsumerGroups
from lowtide.frontdoor.groups.groups import GroupCoordinator
from lowtide.frontdoor.groups.membership import GroupMembership
from lowtide.frontdoor.transactions.transactions import TransactionCoordinator
from lowtide.messages.admin import (
    ElectionType,
    JoinResult,
    SyncResult,
)
from lowtide.messages.consumer_groups import ConsumerHeartbeatResult
from lowtide.rpc.convert import acls as acls_convert
from lowtide.rpc.convert import consumer_groups as convert_consumer
from lowtide.rpc.convert import groups as convert_groups
from lowtide.rpc.convert import scram as scram_convert
from lowtide.rpc.convert import topics
from lowtide.rpc.convert import transactions as convert_txn
from lowtide.rpc.messages import delete_results_to_proto
from lowtide.share.groups import ShareGroups
from lowtide.share.state import ACKNOWLEDGED, ARCHIVED
from lowtide_pb import admin_pb2, admin_pb2_grpc, common_pb2, transactions_pb2


def _client_host(request_host: str, context: grpc.ServicerContext) -> str:
    """The member's host as Kafka shows it ("/1.2.3.4"): the request's, else the caller's address."""
    if request_host:
        return request_host
    peer = context.peer() or ""  # "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000"
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    return "/" + rest.rpartition(":")[0].strip("[]")


@dataclass
class FrontDoor:
    """The domain objects one front door process serves with."""

    authenticator: Authenticator
    authorizer: Authorizer
    topics: TopicAdmin
    deleter: RecordsDeleter
    groups: GroupCoordinator
    acls: AclAdmin
    transactions: TransactionCoordinator | None = field(default=None)
    members: GroupMembership | None = field(default=None)
    consumer_groups: ConsumerGroups | None = field(default=None)
    share_groups: ShareGroups | None = field(default=None)
    scram: ScramAdmin | None = field(default=None)
    configs: TopicConfigAdmin | None = field(default=None)
    partitions: PartitionCreator | None = field(default=None)
    elections: LeaderElections | None = field(default=None)
    reassigner: PartitionReassigner | None = field(default=None)

    def principal_of(self, metadata) -> str:
        """The caller's principal from its call metadata (a gRPC call's, or a Kafka connection's
        identity). With authorization off a stale token is not an error: nothing is checked."""
        try:
            return self.authenticator.authenticate(metadata)
        except LowtideError:
            if self.authorizer.enabled:
                raise
            return ANONYMOUS_PRINCIPAL


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """Thin gRPC adapter over ``FrontDoor``. Thread-safe: holds no per-call state."""

    def __init__(self, front: FrontDoor) -> None:
        self._front = front

    def _principal(self, context: grpc.ServicerContext) -> str:
        try:
            return self._front.authenticator.authenticate_context(context)
        except LowtideError:
            if self._front.authorizer.enabled:
                raise
            return ANONYMOUS_PRINCIPAL  # nothing is checked anyway; do not fail on a stale token

    # -- topics (conversions: lowtide.rpc.convert.topics) -------------------------------------
    def CreateTopics(self, request, context):  # noqa: N802 - gRPC method names
        outcomes = self._front.topics.create_topics(principal=self._principal(context),
                                                    validate_only=request.validate_only,
                                                    requests=topics.topic_requests_from_proto(request))
        return admin_pb2.CreateTopicsResponse(topics=topics.topic_outcomes_to_proto(outcomes))

    def CreatePartitions(self, request, context):  # noqa: N802
        if self._front.partitions is None:
            raise InvalidRequest("this front door cannot add partitions")
        outcomes = self._front.partitions.create_partitions(
            principal=self._principal(context), validate_only=request.validate_only,
            requests=topics.partitions_requests_from_proto(request))
        return admin_pb2.CreatePartitionsResponse(topics=topics.topic_outcomes_to_proto(outcomes))

    def ElectLeaders(self, request, context):  # noqa: N802
        if self._front.elections is None:
            raise InvalidRequest("this front door cannot elect leaders")
        election_type = ElectionType.of(request.election_type)
        outcomes = self._front.elections.elect(principal=self._principal(context), election_type=election_type,
                                               partitions=topics.topic_partitions_from_proto(request.partitions))
        return admin_pb2.ElectLeadersResponse(results=topics.election_outcomes_to_proto(outcomes))

    def AlterPartitionReassignments(self, request, context):  # noqa: N802
        if self._front.reassigner is None:
            raise InvalidRequest("this front door cannot reassign partitions")
        outcomes = self._front.reassigner.alter(
            principal=self._principal(context), targets=topics.reassignment_targets_from_proto(request),
            allow_replication_factor_change=not request.disallow_replication_factor_change)
        return admin_pb2.AlterPartitionReassignmentsResponse(results=topics.reassignment_outcomes_to_proto(outcomes))

    def ListPartitionReassignments(self, request, context):  # noqa: N802
        if self._front.reassigner is None:
            raise InvalidRequest("this front door cannot reassign partitions")
        moves = self._front.reassigner.list(principal=self._principal(context),
                                            partitions=topics.topic_partitions_from_proto(request.partitions))
        return admin_pb2.ListPartitionReassignmentsResponse(reassignments=topics.ongoing_to_proto(moves))

    def DeleteTopics(self, request, context):  # noqa: N802
        outcomes = self._front.topics.delete_topics(principal=self._principal(context), names=list(request.names))
        return admin_pb2.DeleteTopicsResponse(topics=topics.topic_outcomes_to_proto(outcomes))

    def ListTopics(self, request, context):  # noqa: N802
        return admin_pb2.ListTopicsResponse(names=self._front.topics.list_topics(
            principal=self._principal(context), include_internal=request.include_internal))

    def Metadata(self, request, context):  # noqa: N802
        view = self._front.topics.describe_cluster(principal=self._principal(context), topics=list(request.topics))
        return topics.cluster_view_to_proto(view)

    def AlterConfigs(self, request, context):  # noqa: N802
        if self._front.configs is None:
            raise InvalidRequest("this front door does not alter configs")
        outcomes = self._front.configs.alter_configs(principal=self._principal(context),
                                                     validate_only=request.validate_only,
                                                     changes=topics.config_changes_from_proto(request))
        return admin_pb2.AlterConfigsResponse(results=topics.config_outcomes_to_proto(outcomes))

    # -- offsets and deletion ----------------------------------------------------------------
    def ListOffsets(self, request, context):  # noqa: N802
        answers = self._front.topics.list_offsets(principal=self._principal(context),
                                                  queries=topics.offset_queries_from_proto(request),
                                                  isolation_level=request.isolation_level)
        return common_pb2.ListOffsetsResponse(partitions=topics.offsets_to_proto(answers))

    def DeleteRecords(self, request, context):  # noqa: N802
        answers = self._front.deleter.delete_records(principal=self._principal(context),
                                                     timeout_ms=request.timeout_ms,
                                                     items=topics.delete_items_from_proto(request))
        return common_pb2.DeleteRecordsResponse(partitions=delete_results_to_proto(answers))

    # -- groups (frontdoor/groups/groups.py; converted by lowtide.rpc.convert.groups) -------------
    def OffsetCommit(self, request, context):  # noqa: N802
        results = self._front.groups.commit_offsets(principal=self._principal(context),
                                                    **convert_groups.offset_commit_args(request))
        return admin_pb2.OffsetCommitResponse(partitions=convert_groups.commit_results_to_proto(results))

    def OffsetFetch(self, request, context):  # noqa: N802
        offsets = self._front.groups.fetch_offsets(principal=self._principal(context),
                                                   **convert_groups.offset_fetch_args(request))
        return admin_pb2.OffsetFetchResponse(group_id=request.group_id,
                                             partitions=[convert_groups.committed_to_proto(c) for c in offsets])

    def ListGroups(self, request, context):  # noqa: N802
        return convert_groups.listings_to_proto(self._front.groups.list_group_listings(
            principal=self._principal(context)))

    def DescribeGroups(self, request, context):  # noqa: N802
        outcomes = self._front.groups.describe_groups(principal=self._principal(context),
                                                      group_ids=list(request.group_ids))
        return admin_pb2.DescribeGroupsResponse(groups=[convert_groups.description_to_proto(o) for o in outcomes])

    def DeleteGroups(self, request, context):  # noqa: N802
        outcomes = self._front.groups.delete_groups(principal=self._principal(context),
                                                    group_ids=list(request.group_ids))
        return admin_pb2.DeleteGroupsResponse(groups=convert_groups.group_results_to_proto(outcomes))

    def OffsetDelete(self, request, context):  # noqa: N802
        try:
            outcomes = self._front.groups.delete_offsets(
                principal=self._principal(context), group_id=request.group_id,
                partitions=[(p.topic, p.partition) for p in request.partitions])
        except LowtideError as err:
            return convert_groups.offset_delete_response(err)
        return convert_groups.offset_delete_response(outcomes)

    # -- group membership (frontdoor/groups/membership.py): Kafka answers errors, so do these -----
    def _members(self) -> GroupMembership:
        if self._front.members is None:
            raise NotCoordinator("this front door does not coordinate group membership")
        return self._front.members

    def JoinGroup(self, request, context):  # noqa: N802
        try:
            result = self._members().join_group(principal=self._principal(context),
                                                request=convert_groups.join_request_from_proto(
                                                    request, client_host=_client_host(request.client_host, context)))
        except LowtideError as err:
            result = JoinResult(member_id=request.member_id, error=err)
        return convert_groups.join_result_to_proto(result)

    def SyncGroup(self, request, context):  # noqa: N802
        try:
            result = self._members().sync_group(principal=self._principal(context), **convert_groups.sync_args(request))
        except LowtideError as err:
            result = SyncResult(error=err)
        return convert_groups.sync_result_to_proto(result)

    def Heartbeat(self, request, context):  # noqa: N802
        try:
            self._members().heartbeat(principal=self._principal(context), **convert_groups.heartbeat_args(request))
        except LowtideError as err:
            return admin_pb2.HeartbeatResponse(error_code=err.code, error_message=err.message)
        return admin_pb2.HeartbeatResponse()

    def LeaveGroup(self, request, context):  # noqa: N802
        try:
            outcomes = self._members().leave_group(principal=self._principal(context), group_id=request.group_id,
                                                   members=convert_groups.leaving_from_proto(request))
        except LowtideError as err:
            return admin_pb2.LeaveGroupResponse(error_code=err.code, error_message=err.message)
        return convert_groups.leave_outcomes_to_proto(outcomes)

    # -- KIP-848 consumer groups (frontdoor/groups/consumer_membership.py) ---------------------
    def _consumer_groups(self) -> ConsumerGroups:
        if self._front.consumer_groups is None:
            raise NotCoordinator("this front door does not coordinate consumer groups")
        return self._front.consumer_groups

    def ConsumerGroupHeartbeat(self, request, context):  # noqa: N802
        heartbeat = convert_consumer.heartbeat_from_proto(request, client_host=_client_host(request.client_host,
                                                                                             context))
        try:
            result = self._consumer_groups().heartbeat(principal=self._principal(context), request=heartbeat)
        except LowtideError as err:
            result = ConsumerHeartbeatResult(member_id=request.member_id, member_epoch=request.member_epoch, error=err)
        return convert_consumer.heartbeat_result_to_proto(result)

    def ConsumerGroupDescribe(self, request, context):  # noqa: N802
        return convert_consumer.descriptions_to_proto(self._consumer_groups().describe(
            principal=self._principal(context), group_ids=list(request.group_ids),
            include_authorized_operations=request.include_authorized_operations))

    # -- KIP-932 share groups (share/groups.py; the consumer group messages carry them) --------
    def _share_groups(self) -> ShareGroups:
        if self._front.share_groups is None:
            raise NotCoordinator("this front door does not coordinate share groups")
        return self._front.share_groups

    def ShareGroupHeartbeat(self, request, context):  # noqa: N802
        heartbeat = convert_consumer.heartbeat_from_proto(request, client_host=_client_host(request.client_host,
                                                                                             context))
        try:
            result = self._share_groups().heartbeat(principal=self._principal(context), request=heartbeat)
        except LowtideError as err:
            result = ConsumerHeartbeatResult(member_id=request.member_id, member_epoch=request.member_epoch, error=err)
        return convert_consumer.heartbeat_result_to_proto(result)

    def ShareGroupDescribe(self, request, context):  # noqa: N802
        return convert_consumer.descriptions_to_proto(self._share_groups().describe(
            principal=self._principal(context), group_ids=list(request.group_ids),
            include_authorized_operations=request.include_authorized_operations))

    def ShareGroupStartOffsets(self, request, context):  # noqa: N802
        try:
            found = self._share_groups().start_offsets(principal=self._principal(context), group_id=request.group_id)
        except LowtideError as err:
            return admin_pb2.ShareGroupStartOffsetsResponse(error_code=err.code, error_message=err.message)
        return admin_pb2.ShareGroupStartOffsetsResponse(partitions=[admin_pb2.ShareStartOffset(
            topic=topic, partition=partition, start_offset=s.start_offset, leader_epoch=s.leader_epoch,
            finished=[admin_pb2.ShareFinishedRange(first=b.first, last=b.last) for b in s.batches
                      if b.state in (ACKNOWLEDGED, ARCHIVED)]) for topic, partition, s in found])

    def ShareGroupResetOffsets(self, request, context):  # noqa: N802
        targets = {(p.topic, p.partition): p.start_offset for p in request.partitions}
        try:
            results = self._share_groups().reset_start_offsets(principal=self._principal(context),
                                                               group_id=request.group_id, targets=targets)
        except LowtideError as err:
            return admin_pb2.ShareGroupResetOffsetsResponse(error_code=err.code, error_message=err.message)
        return admin_pb2.ShareGroupResetOffsetsResponse(partitions=[admin_pb2.ShareResetResult(
            topic=topic, partition=partition, start_offset=targets[(topic, partition)],
            error_code=error.code if error else 0, error_message=error.message if error else "")
            for (topic, partition), error in results.items()])

    def ShareGroupDeleteOffsets(self, request, context):  # noqa: N802
        try:
            results = self._share_groups().delete_start_offsets(principal=self._principal(context),
                                                                group_id=request.group_id, topics=list(request.topics))
        except LowtideError as err:
            return admin_pb2.ShareGroupDeleteOffsetsResponse(error_code=err.code, error_message=err.message)
        return admin_pb2.ShareGroupDeleteOffsetsResponse(topics=[admin_pb2.ShareDeleteTopicResult(
            topic=topic, error_code=error.code if error else 0, error_message=error.message if error else "")
            for topic, error in results.items()])

    # -- ACLs (frontdoor/admin/acls.py; converters: rpc/convert/acls.py) ----------------------
    def CreateAcls(self, request, context):  # noqa: N802
        principal = self._principal(context)
        results: list[LowtideError | None] = []
        valid, positions = [], []
        for i, msg in enumerate(request.acls):
            try:
                valid.append(acls_convert.binding_from_proto(msg))
                positions.append(i)
                results.append(None)
            except LowtideError as err:
                results.append(err)
        for i, error in zip(positions, self._front.acls.create_acls(principal=principal, bindings=valid),
                            strict=True):
            results[i] = error
        return acls_convert.create_response(results)

    def DescribeAcls(self, request, context):  # noqa: N802
        return acls_convert.describe_response(self._front.acls.describe_acls(
            principal=self._principal(context), acl_filter=acls_convert.describe_filter(request)))

    def DeleteAcls(self, request, context):  # noqa: N802
        deleted = self._front.acls.delete_acls(principal=self._principal(context),
                                               filters=[acls_convert.filter_from_proto(f) for f in request.filters])
        return acls_convert.delete_response(deleted)

    # -- transactions (frontdoor/transactions/transactions.py; lowtide.rpc.convert.transactions) --
    def InitProducerId(self, request, context):  # noqa: N802
        try:
            answer: tuple[int, int] | LowtideError = self._front.transactions.init_producer_id(
                principal=self._principal(context), **convert_txn.init_producer_id_args(request))
        except LowtideError as err:
            answer = err
        return convert_txn.init_producer_id_response(answer)

    def AddPartitionsToTxn(self, request, context):  # noqa: N802
        results = self._front.transactions.add_partitions(principal=self._principal(context),
                                                          **convert_txn.add_partitions_args(request))
        return transactions_pb2.AddPartitionsToTxnResponse(partitions=convert_txn.partition_results_to_proto(results))

    def EndTxn(self, request, context):  # noqa: N802
        try:
            answer = self._front.transactions.end_txn(principal=self._principal(context),
                                                      **convert_txn.end_txn_args(request))
        except LowtideError as err:
            answer = err
        return convert_txn.end_txn_response(answer)

    def AddOffsetsToTxn(self, request, context):  # noqa: N802
        try:
            self._front.transactions.add_offsets(principal=self._principal(context),
                                                 **convert_txn.add_offsets_args(request))
        except LowtideError as err:
            return transactions_pb2.AddOffsetsToTxnResponse(error_code=err.code, error_message=err.message)
        return transactions_pb2.AddOffsetsToTxnResponse()

    def TxnOffsetCommit(self, request, context):  # noqa: N802
        # check_offsets_in_txn, then the groups' commit: one domain method, the Kafka listener's too.
        return convert_txn.commit_results_to_proto(self._front.transactions.commit_offsets(
            principal=self._principal(context), groups=self._front.groups,
            **convert_txn.txn_offset_commit_args(request)))

    def ListTransactions(self, request, context):  # noqa: N802
        return convert_txn.listings_to_proto(self._front.transactions.list_transactions(
            principal=self._principal(context), **convert_txn.list_args(request)))

    def DescribeTransactions(self, request, context):  # noqa: N802
        described = self._front.transactions.describe_transactions(
            principal=self._principal(context), transactional_ids=list(request.transactional_ids))
        return transactions_pb2.DescribeTransactionsResponse(
            transactions=[convert_txn.description_to_proto(d) for d in described])

    def WhoAmI(self, request, context):  # noqa: N802
        return admin_pb2.WhoAmIResponse(principal=self._principal(context),
                                        authorization_enabled=self._front.authorizer.enabled)

    # -- SCRAM credentials (frontdoor/admin/scram.py) ------------------------------------------
    def _scram(self) -> ScramAdmin:
        if self._front.scram is None:
            raise InvalidRequest("this front door keeps no SCRAM credentials")
        return self._front.scram

    def DescribeUserScramCredentials(self, request, context):  # noqa: N802
        return scram_convert.describe_response(
            self._scram().describe(principal=self._principal(context), users=list(request.users)))

    def AlterUserScramCredentials(self, request, context):  # noqa: N802
        deletions, upsertions = scram_convert.alter_items(request)
        return scram_convert.alter_response(self._scram().alter(
            principal=self._principal(context), deletions=deletions, upsertions=upsertions))
