"""The front door's topic and cluster administration over gRPC: the remote twins of
``FrontDoor.topics`` (``TopicAdmin``), ``.deleter`` (``RecordsDeleter``), ``.configs``
(``TopicConfigAdmin``), ``.partitions`` (``PartitionCreator``), ``.elections``
(``LeaderElections``) and ``.reassigner`` (``PartitionReassigner``).

Same methods, arguments and answers as the in-process objects; ``principal`` is accepted and
ignored (the front door authenticates the call metadata). A whole-call refusal the in-process
method raises (CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST from a front door that does not run
that part) comes back from the servicer as a failed call, raised here as the same LowtideError.
Conversions: ``lowtide.rpc.convert.topics``, the servicer's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from lowtide.client.frontdoor.part import RemotePart
from lowtide.messages import TopicPartition
from lowtide.messages.admin import (
    ClusterView,
    ConfigChange,
    ConfigOutcome,
    DeleteRequestItem,
    ElectionOutcome,
    ElectionType,
    OffsetQuery,
    OngoingReassignment,
    PartitionsRequest,
    ReassignmentOutcome,
    TopicOutcome,
    TopicRequest,
)
from lowtide.messages.replica import DeleteRecordsResult, PartitionOffset
from lowtide.rpc.convert import topics as convert
from lowtide.rpc.messages import delete_results_from_proto
from lowtide_pb import admin_pb2

# DeleteRecords waits up to the request's timeout at the leaders: the call's deadline is that plus
# a margin (at least 1 s of waiting), so the front door answers before the caller gives up.
DELETE_RECORDS_MARGIN_S = 5.0


def delete_records_deadline_s(timeout_ms: int) -> float:
    return max(timeout_ms, 1000) / 1000 + DELETE_RECORDS_MARGIN_S


class RemoteTopics(RemotePart):
    """``TopicAdmin``: CreateTopics, DeleteTopics, ListTopics, Metadata, ListOffsets."""

    def create_topics(self, *, principal: str, requests: Sequence[TopicRequest],
                      validate_only: bool = False) -> list[TopicOutcome]:
        answer = self._call(self._stub.CreateTopics,
                            convert.topic_requests_to_proto(requests, validate_only=validate_only))
        return convert.topic_outcomes_from_proto(answer.topics)

    def delete_topics(self, *, principal: str, names: Sequence[str]) -> list[TopicOutcome]:
        answer = self._call(self._stub.DeleteTopics, admin_pb2.DeleteTopicsRequest(names=list(names)))
        return convert.topic_outcomes_from_proto(answer.topics)

    def list_topics(self, *, principal: str, include_internal: bool = False) -> list[str]:
        answer = self._call(self._stub.ListTopics, admin_pb2.ListTopicsRequest(include_internal=include_internal))
        return list(answer.names)

    def describe_cluster(self, *, principal: str, topics: Sequence[str] = ()) -> ClusterView:
        answer = self._call(self._stub.Metadata, admin_pb2.MetadataRequest(topics=list(topics)))
        return convert.cluster_view_from_proto(answer)

    def list_offsets(self, *, principal: str, queries: Sequence[OffsetQuery],
                     isolation_level: int = 0) -> list[PartitionOffset]:
        answer = self._call(self._stub.ListOffsets,
                            convert.offset_queries_to_proto(queries, isolation_level=isolation_level))
        return convert.offsets_from_proto(answer)


class RemoteRecordsDeleter(RemotePart):
    """``RecordsDeleter``: KIP-107 DeleteRecords at the partitions' leaders."""

    def delete_records(self, *, principal: str, items: Sequence[DeleteRequestItem],
                       timeout_ms: int) -> list[DeleteRecordsResult]:
        answer = self._call(self._stub.DeleteRecords, convert.delete_request_to_proto(items, timeout_ms=timeout_ms),
                            timeout_s=delete_records_deadline_s(timeout_ms))
        return delete_results_from_proto(answer)


class RemoteConfigs(RemotePart):
    """``TopicConfigAdmin``: AlterConfigs on topics and the dynamic broker configs."""

    def alter_configs(self, *, principal: str, changes: Sequence[ConfigChange],
                      validate_only: bool = False) -> list[ConfigOutcome]:
        answer = self._call(self._stub.AlterConfigs,
                            convert.config_changes_to_proto(changes, validate_only=validate_only))
        return convert.config_outcomes_from_proto(answer.results)


class RemotePartitions(RemotePart):
    """``PartitionCreator``: CreatePartitions."""

    def create_partitions(self, *, principal: str, requests: Sequence[PartitionsRequest],
                          validate_only: bool = False) -> list[TopicOutcome]:
        answer = self._call(self._stub.CreatePartitions,
                            convert.partitions_requests_to_proto(requests, validate_only=validate_only))
        return convert.topic_outcomes_from_proto(answer.topics)


class RemoteElections(RemotePart):
    """``LeaderElections``: ElectLeaders (None: every partition)."""

    def elect(self, *, principal: str, election_type: ElectionType,
              partitions: Sequence[TopicPartition] | None) -> list[ElectionOutcome]:
        if partitions is not None and not partitions:
            # On the wire no partitions means every partition; asked for none, none is elected.
            return []
        answer = self._call(self._stub.ElectLeaders,
                            convert.election_request_to_proto(election_type=election_type, partitions=partitions))
        return convert.election_outcomes_from_proto(answer.results)


class RemoteReassigner(RemotePart):
    """``PartitionReassigner``: AlterPartitionReassignments, ListPartitionReassignments."""

    def alter(self, *, principal: str, targets: Mapping[TopicPartition, Sequence[int] | None],
              allow_replication_factor_change: bool = True) -> list[ReassignmentOutcome]:
        answer = self._call(self._stub.AlterPartitionReassignments, convert.reassignments_to_proto(
            targets, allow_replication_factor_change=allow_replication_factor_change))
        return convert.reassignment_outcomes_from_proto(answer.results)

    def list(self, *, principal: str,
             partitions: Iterable[TopicPartition] | None = None) -> list[OngoingReassignment]:
        partitions = None if partitions is None else tuple(partitions)
        if partitions == ():
            return []  # on the wire no partitions means every one: asked for none, none is listed
        answer = self._call(self._stub.ListPartitionReassignments, admin_pb2.ListPartitionReassignmentsRequest(
            partitions=convert.topic_partitions_to_proto(partitions)))
        return convert.ongoing_from_proto(answer.reassignments)
