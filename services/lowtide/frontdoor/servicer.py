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
from lowtide.frontdoor.groups.groups import GroupCoordinator
from lowtide.frontdoor.groups.membership import GroupMembership
from lowtide.frontdoor.transactions.transactions import TransactionCoordinator
from lowtide.messages.admin import (
    CommittedOffset,
    ElectionType,
    GroupOutcome,
    JoinRequest,
    LeavingMember,
    OffsetCommit,
    Protocol,
)
from lowtide.rpc.convert import acls as acls_convert
from lowtide.rpc.convert import scram as scram_convert
from lowtide.rpc.convert import topics
from lowtide.rpc.messages import delete_results_to_proto
from lowtide_pb import admin_pb2, admin_pb2_grpc, common_pb2, transactions_pb2


def _code(error: LowtideError | None) -> tuple[int, str]:
    return (0, "") if error is None else (error.code, error.message)


def _offset_result(c: CommittedOffset) -> admin_pb2.OffsetFetchResult:
    code, message = _code(c.error)
    return admin_pb2.OffsetFetchResult(topic=c.topic, partition=c.partition, offset=c.offset, metadata=c.metadata,
                                       error_code=code, error_message=message, leader_epoch=c.leader_epoch)


def _group_description(o: GroupOutcome) -> admin_pb2.GroupDescription:
    code, message = _code(o.error)
    description = admin_pb2.GroupDescription(group_id=o.group_id, error_code=code, error_message=message,
                                              offsets=[_offset_result(c) for c in o.offsets])
    if o.error is None:
        g = o.group
        description.state = g.state if g is not None else "Empty"
        if g is not None:
            description.protocol_type, description.protocol = g.protocol_type, g.protocol
            description.members.extend(admin_pb2.GroupMemberDescription(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, metadata=m.metadata, assignment=m.assignment) for m in g.members)
    return description


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

    # -- groups ------------------------------------------------------------------------------
    def OffsetCommit(self, request, context):  # noqa: N802
        results = self._front.groups.commit_offsets(
            principal=self._principal(context), group_id=request.group_id,
            commits=[OffsetCommit(topic=p.topic, partition=p.partition, offset=p.offset, metadata=p.metadata,
                                 leader_epoch=p.leader_epoch if p.HasField("leader_epoch") else -1)
                     for p in request.partitions],
            generation_id=request.generation_id if request.HasField("generation_id") else -1,
            member_id=request.member_id, group_instance_id=request.group_instance_id)
        return admin_pb2.OffsetCommitResponse(partitions=[
            admin_pb2.OffsetCommitResult(topic=c.topic, partition=c.partition, error_code=_code(e)[0],
                                         error_message=_code(e)[1]) for c, e in results])

    def OffsetFetch(self, request, context):  # noqa: N802
        offsets = self._front.groups.fetch_offsets(
            principal=self._principal(context), group_id=request.group_id,
            partitions=[(p.topic, p.partition) for p in request.partitions], require_stable=request.require_stable)
        return admin_pb2.OffsetFetchResponse(group_id=request.group_id,
                                             partitions=[_offset_result(c) for c in offsets])

    def ListGroups(self, request, context):  # noqa: N802
        listings = self._front.groups.list_group_listings(principal=self._principal(context))
        return admin_pb2.ListGroupsResponse(group_ids=[g.group_id for g in listings], groups=[
            admin_pb2.GroupListing(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state)
            for g in listings])

    def DescribeGroups(self, request, context):  # noqa: N802
        outcomes = self._front.groups.describe_groups(principal=self._principal(context),
                                                      group_ids=list(request.group_ids))
        return admin_pb2.DescribeGroupsResponse(groups=[_group_description(o) for o in outcomes])

    def DeleteGroups(self, request, context):  # noqa: N802
        outcomes = self._front.groups.delete_groups(principal=self._principal(context),
                                                    group_ids=list(request.group_ids))
        return admin_pb2.DeleteGroupsResponse(groups=[
            admin_pb2.GroupResult(group_id=o.group_id, error_code=_code(o.error)[0], error_message=_code(o.error)[1])
            for o in outcomes])

    def OffsetDelete(self, request, context):  # noqa: N802
        try:
            outcomes = self._front.groups.delete_offsets(
                principal=self._principal(context), group_id=request.group_id,
                partitions=[(p.topic, p.partition) for p in request.partitions])
        except LowtideError as err:
            return admin_pb2.OffsetDeleteResponse(error_code=err.code, error_message=err.message)
        return admin_pb2.OffsetDeleteResponse(partitions=[
            admin_pb2.OffsetCommitResult(topic=o.topic, partition=o.partition, error_code=_code(o.error)[0],
                                         error_message=_code(o.error)[1]) for o in outcomes])

    # -- group membership (frontdoor/groups/membership.py): Kafka answers errors, so do these -----
    def _members(self) -> GroupMembership:
        if self._front.members is None:
            raise NotCoordinator("this front door does not coordinate group membership")
        return self._front.members

    def JoinGroup(self, request, context):  # noqa: N802
        try:
            result = self._members().join_group(principal=self._principal(context), request=JoinRequest(
                group_id=request.group_id, session_timeout_ms=request.session_timeout_ms,
                rebalance_timeout_ms=request.rebalance_timeout_ms, member_id=request.member_id,
                group_instance_id=request.group_instance_id, protocol_type=request.protocol_type,
                protocols=tuple(Protocol(name=p.name, metadata=p.metadata) for p in request.protocols),
                require_known_member_id=request.require_known_member_id, client_id=request.client_id,
                client_host=_client_host(request.client_host, context), reason=request.reason))
        except LowtideError as err:
            return admin_pb2.JoinGroupResponse(error_code=err.code, error_message=err.message, generation_id=-1,
                                               member_id=request.member_id)
        code, message = _code(result.error)
        return admin_pb2.JoinGroupResponse(
            error_code=code, error_message=message, generation_id=result.generation_id,
            protocol_type=result.protocol_type, protocol_name=result.protocol_name, leader=result.leader,
            member_id=result.member_id, members=[
                admin_pb2.JoinGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                          metadata=m.metadata) for m in result.members])

    def SyncGroup(self, request, context):  # noqa: N802
        try:
            result = self._members().sync_group(
                principal=self._principal(context), group_id=request.group_id, generation_id=request.generation_id,
                member_id=request.member_id, group_instance_id=request.group_instance_id,
                protocol_type=request.protocol_type, protocol_name=request.protocol_name,
                assignments={a.member_id: a.assignment for a in request.assignments})
        except LowtideError as err:
            return admin_pb2.SyncGroupResponse(error_code=err.code, error_message=err.message)
        code, message = _code(result.error)
        return admin_pb2.SyncGroupResponse(error_code=code, error_message=message, protocol_type=result.protocol_type,
                                           protocol_name=result.protocol_name, assignment=result.assignment)

    def Heartbeat(self, request, context):  # noqa: N802
        try:
            self._members().heartbeat(principal=self._principal(context), group_id=request.group_id,
                                      generation_id=request.generation_id, member_id=request.member_id,
                                      group_instance_id=request.group_instance_id)
        except LowtideError as err:
            return admin_pb2.HeartbeatResponse(error_code=err.code, error_message=err.message)
        return admin_pb2.HeartbeatResponse()

    def LeaveGroup(self, request, context):  # noqa: N802
        try:
            outcomes = self._members().leave_group(
                principal=self._principal(context), group_id=request.group_id,
                members=[LeavingMember(member_id=m.member_id, group_instance_id=m.group_instance_id, reason=m.reason)
                         for m in request.members])
        except LowtideError as err:
            return admin_pb2.LeaveGroupResponse(error_code=err.code, error_message=err.message)
        return admin_pb2.LeaveGroupResponse(members=[
            admin_pb2.LeaveGroupMemberResult(member_id=o.member_id, group_instance_id=o.group_instance_id,
                                             error_code=_code(o.error)[0], error_message=_code(o.error)[1])
            for o in outcomes])

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

    # -- transactions (frontdoor/transactions/transactions.py) ---------------------------------
    def InitProducerId(self, request, context):  # noqa: N802
        try:
            pid, epoch = self._front.transactions.init_producer_id(
                principal=self._principal(context), transactional_id=request.transactional_id,
                timeout_ms=request.transaction_timeout_ms)
        except LowtideError as err:
            return transactions_pb2.InitProducerIdResponse(error_code=err.code, error_message=err.message,
                                                           producer_id=-1, producer_epoch=-1)
        return transactions_pb2.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    def AddPartitionsToTxn(self, request, context):  # noqa: N802
        results = self._front.transactions.add_partitions(
            principal=self._principal(context), transactional_id=request.transactional_id,
            producer_id=request.producer_id, producer_epoch=request.producer_epoch,
            partitions=[(p.topic, p.partition) for p in request.partitions])
        return transactions_pb2.AddPartitionsToTxnResponse(partitions=[
            transactions_pb2.TxnPartitionResult(topic=t, partition=p, error_code=_code(e)[0],
                                                error_message=_code(e)[1]) for t, p, e in results])

    def EndTxn(self, request, context):  # noqa: N802
        try:
            self._front.transactions.end_txn(principal=self._principal(context),
                                             transactional_id=request.transactional_id,
                                             producer_id=request.producer_id, producer_epoch=request.producer_epoch,
                                             commit=request.commit)
        except LowtideError as err:
            return transactions_pb2.EndTxnResponse(error_code=err.code, error_message=err.message)
        return transactions_pb2.EndTxnResponse()

    def AddOffsetsToTxn(self, request, context):  # noqa: N802
        try:
            self._front.transactions.add_offsets(
                principal=self._principal(context), transactional_id=request.transactional_id,
                producer_id=request.producer_id, producer_epoch=request.producer_epoch, group_id=request.group_id)
        except LowtideError as err:
            return transactions_pb2.AddOffsetsToTxnResponse(error_code=err.code, error_message=err.message)
        return transactions_pb2.AddOffsetsToTxnResponse()

    def TxnOffsetCommit(self, request, context):  # noqa: N802
        principal = self._principal(context)
        commits = [OffsetCommit(topic=p.topic, partition=p.partition, offset=p.offset, metadata=p.metadata,
                                 leader_epoch=p.leader_epoch if p.HasField("leader_epoch") else -1)
                   for p in request.partitions]
        try:
            self._front.transactions.check_offsets_in_txn(
                principal=principal, transactional_id=request.transactional_id, producer_id=request.producer_id,
                producer_epoch=request.producer_epoch, group_id=request.group_id)
            results = self._front.groups.commit_offsets(
                principal=principal, group_id=request.group_id, commits=commits,
                generation_id=request.generation_id if request.HasField("generation_id") else -1,
                member_id=request.member_id, group_instance_id=request.group_instance_id,
                txn_producer=(request.producer_id, request.producer_epoch))
        except LowtideError as err:
            results = [(c, err) for c in commits]
        return transactions_pb2.TxnOffsetCommitResponse(partitions=[
            transactions_pb2.TxnPartitionResult(topic=c.topic, partition=c.partition, error_code=_code(e)[0],
                                                error_message=_code(e)[1]) for c, e in results])

    def ListTransactions(self, request, context):  # noqa: N802
        found = self._front.transactions.list_transactions(
            principal=self._principal(context), states=list(request.state_filters),
            producer_ids=list(request.producer_id_filters), running_longer_than_ms=request.duration_filter_ms)
        return transactions_pb2.ListTransactionsResponse(transactions=[
            transactions_pb2.TransactionListing(transactional_id=st.transactional_id, producer_id=st.producer_id,
                                                state=st.state) for st in found])

    def DescribeTransactions(self, request, context):  # noqa: N802
        described = self._front.transactions.describe_transactions(
            principal=self._principal(context), transactional_ids=list(request.transactional_ids))
        out = []
        for transactional_id, st, err in described:
            code, message = _code(err)
            d = transactions_pb2.TransactionDescription(transactional_id=transactional_id, error_code=code,
                                                        error_message=message, producer_id=-1, producer_epoch=-1,
                                                        start_ms=-1)
            if st is not None:
                d.state, d.timeout_ms, d.start_ms = st.state, st.timeout_ms, st.start_ms
                d.producer_id, d.producer_epoch = st.producer_id, st.producer_epoch
                d.partitions.extend(common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(st.partitions))
            out.append(d)
        return transactions_pb2.DescribeTransactionsResponse(transactions=out)

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
