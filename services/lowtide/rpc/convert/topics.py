"""Protobuf <-> ``lowtide.messages`` for the front door's topic and cluster administration: topics
(CreateTopics, DeleteTopics, ListTopics, Metadata), partitions (CreatePartitions, ElectLeaders,
AlterPartitionReassignments, ListPartitionReassignments), configs (AlterConfigs) and the front
door's ListOffsets and DeleteRecords.

``AdminServicer`` reads requests with the ``*_from_proto`` functions and answers with the
``*_to_proto`` ones; ``lowtide.client.frontdoor.topics`` does the reverse. A per-item error travels
as (error_code, error_message) and comes back as the ``LowtideError`` of that code
(``lowtide.errors.error_or_none``). DeleteRecords' answers are ``lowtide.rpc.messages``'
(``delete_results_to_proto`` / ``delete_results_from_proto``): one wire shape for every door.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from lowtide.errors import error_or_none
from lowtide.messages import TopicPartition
from lowtide.messages.admin import (
    BrokerView,
    ClusterView,
    ConfigChange,
    ConfigOp,
    ConfigOutcome,
    DeleteRequestItem,
    ElectionOutcome,
    ElectionType,
    OffsetQuery,
    OngoingReassignment,
    PartitionsRequest,
    PartitionView,
    ReassignmentOutcome,
    TopicOutcome,
    TopicRequest,
    TopicView,
)
from lowtide.messages.replica import PartitionOffset
from lowtide.rpc.convert import error_fields, error_kwargs
from lowtide_pb import admin_pb2, common_pb2

_PartitionResult = TypeVar("_PartitionResult", admin_pb2.ElectionResult, admin_pb2.ReassignmentResult)
_PartitionOutcome = TypeVar("_PartitionOutcome", ElectionOutcome, ReassignmentOutcome)


# -- topics ----------------------------------------------------------------------------------
def topic_requests_to_proto(requests: Iterable[TopicRequest], *, validate_only: bool) -> admin_pb2.CreateTopicsRequest:
    return admin_pb2.CreateTopicsRequest(validate_only=validate_only, topics=[
        admin_pb2.TopicSpec(name=t.name, partitions=t.partitions, replication_factor=t.replication_factor,
                            config=t.config, diskless=t.diskless,
                            assignments=[admin_pb2.ManualAssignment(partition=p, broker_ids=list(brokers))
                                         for p, brokers in t.assignments])
        for t in requests])


def topic_requests_from_proto(request: admin_pb2.CreateTopicsRequest) -> list[TopicRequest]:
    return [TopicRequest(name=t.name, partitions=t.partitions, replication_factor=t.replication_factor,
                         config=dict(t.config), diskless=t.diskless,
                         assignments=tuple((a.partition, tuple(a.broker_ids)) for a in t.assignments))
            for t in request.topics]


def topic_outcomes_to_proto(outcomes: Iterable[TopicOutcome]) -> list[admin_pb2.TopicResult]:
    """CreateTopics', DeleteTopics' and CreatePartitions' per-topic answers."""
    return [admin_pb2.TopicResult(name=o.name, **error_kwargs(o.error))
            for o in outcomes]


def topic_outcomes_from_proto(results: Iterable[admin_pb2.TopicResult]) -> list[TopicOutcome]:
    return [TopicOutcome(name=r.name, error=error_or_none(r.error_code, r.error_message)) for r in results]


def partitions_requests_to_proto(requests: Iterable[PartitionsRequest], *,
                                 validate_only: bool) -> admin_pb2.CreatePartitionsRequest:
    return admin_pb2.CreatePartitionsRequest(validate_only=validate_only, topics=[
        admin_pb2.CreatePartitionsTopic(name=r.name, count=r.count, assignments=[
            admin_pb2.PartitionAssignment(broker_ids=list(a)) for a in r.assignments])
        for r in requests])


def partitions_requests_from_proto(request: admin_pb2.CreatePartitionsRequest) -> list[PartitionsRequest]:
    return [PartitionsRequest(name=t.name, count=t.count, assignments=tuple(tuple(a.broker_ids) for a in t.assignments))
            for t in request.topics]


# -- Metadata --------------------------------------------------------------------------------
def cluster_view_to_proto(view: ClusterView) -> admin_pb2.MetadataResponse:
    topics = []
    for t in view.topics:
        if t.error is not None:
            code, message = error_fields(t.error)
            topics.append(admin_pb2.TopicMetadata(name=t.name, error_code=code, error_message=message))
            continue
        topics.append(admin_pb2.TopicMetadata(
            name=t.name, replication_factor=t.replication_factor, config=t.config, diskless=t.diskless,
            topic_id=t.topic_id, diskless_shards=list(t.diskless_shards), partitions=[
                admin_pb2.PartitionMetadata(partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                                            replicas=list(p.replicas), isr=list(p.isr),
                                            adding_replicas=list(p.adding_replicas),
                                            removing_replicas=list(p.removing_replicas))
                for p in t.partitions]))
    return admin_pb2.MetadataResponse(
        cluster_id=view.cluster_id, revision=view.revision, topics=topics, brokers=[
            admin_pb2.BrokerInfo(id=b.id, host=b.host, port=b.port, rack=b.rack, live=b.live,
                                 kafka_port=b.kafka_port, kafka_listeners=b.kafka_listeners)
            for b in view.brokers])


def cluster_view_from_proto(response: admin_pb2.MetadataResponse) -> ClusterView:
    topics = []
    for t in response.topics:
        error = error_or_none(t.error_code, t.error_message)
        if error is not None:
            topics.append(TopicView(name=t.name, error=error))
            continue
        topics.append(TopicView(
            name=t.name, topic_id=t.topic_id, replication_factor=t.replication_factor, config=dict(t.config),
            diskless=t.diskless, diskless_shards=tuple(t.diskless_shards), partitions=tuple(
                PartitionView(partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                              replicas=tuple(p.replicas), isr=tuple(p.isr), adding_replicas=tuple(p.adding_replicas),
                              removing_replicas=tuple(p.removing_replicas))
                for p in t.partitions)))
    return ClusterView(
        cluster_id=response.cluster_id, revision=response.revision, topics=tuple(topics), brokers=tuple(
            BrokerView(id=b.id, host=b.host, port=b.port, rack=b.rack, live=b.live, kafka_port=b.kafka_port,
                       kafka_listeners=dict(b.kafka_listeners))
            for b in response.brokers))


# -- partitions: elections and reassignments ------------------------------------------------
def topic_partitions_to_proto(partitions: Iterable[TopicPartition] | None) -> list[common_pb2.TopicPartition]:
    """None ("every partition") is the empty list on the wire."""
    return [common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions or ()]


def topic_partitions_from_proto(partitions: Iterable[common_pb2.TopicPartition]) -> list[TopicPartition] | None:
    """The empty list on the wire is None: every partition."""
    return [TopicPartition(p.topic, p.partition) for p in partitions] or None


def election_request_to_proto(*, election_type: ElectionType,
                              partitions: Sequence[TopicPartition] | None) -> admin_pb2.ElectLeadersRequest:
    return admin_pb2.ElectLeadersRequest(election_type=int(election_type),
                                         partitions=topic_partitions_to_proto(partitions))


def partition_outcomes_to_proto(outcomes: Iterable[ElectionOutcome | ReassignmentOutcome],
                                result_type: type[_PartitionResult]) -> list[_PartitionResult]:
    """A per-partition (partition, error) answer as ``result_type`` (ElectionResult or
    ReassignmentResult: the same topic, partition and error fields)."""
    return [result_type(topic=o.partition.topic, partition=o.partition.partition, **error_kwargs(o.error))
            for o in outcomes]


def partition_outcomes_from_proto(results: Iterable[admin_pb2.ElectionResult | admin_pb2.ReassignmentResult],
                                  outcome_type: type[_PartitionOutcome]) -> list[_PartitionOutcome]:
    return [outcome_type(TopicPartition(r.topic, r.partition), error_or_none(r.error_code, r.error_message))
            for r in results]


def election_outcomes_to_proto(outcomes: Iterable[ElectionOutcome]) -> list[admin_pb2.ElectionResult]:
    return partition_outcomes_to_proto(outcomes, admin_pb2.ElectionResult)


def election_outcomes_from_proto(results: Iterable[admin_pb2.ElectionResult]) -> list[ElectionOutcome]:
    return partition_outcomes_from_proto(results, ElectionOutcome)


def reassignments_to_proto(targets: Mapping[TopicPartition, Sequence[int] | None], *,
                           allow_replication_factor_change: bool) -> admin_pb2.AlterPartitionReassignmentsRequest:
    """``targets``: partition -> its target replicas, or None to cancel its move."""
    return admin_pb2.AlterPartitionReassignmentsRequest(
        disallow_replication_factor_change=not allow_replication_factor_change, partitions=[
            admin_pb2.PartitionReassignment(topic=topic, partition=partition, replicas=list(target or ()),
                                            cancel=target is None)
            for (topic, partition), target in targets.items()])


def reassignment_targets_from_proto(
        request: admin_pb2.AlterPartitionReassignmentsRequest) -> dict[TopicPartition, tuple[int, ...] | None]:
    return {TopicPartition(p.topic, p.partition): None if p.cancel else tuple(p.replicas) for p in request.partitions}


def reassignment_outcomes_to_proto(outcomes: Iterable[ReassignmentOutcome]) -> list[admin_pb2.ReassignmentResult]:
    return partition_outcomes_to_proto(outcomes, admin_pb2.ReassignmentResult)


def reassignment_outcomes_from_proto(results: Iterable[admin_pb2.ReassignmentResult]) -> list[ReassignmentOutcome]:
    return partition_outcomes_from_proto(results, ReassignmentOutcome)


def ongoing_to_proto(moves: Iterable[OngoingReassignment]) -> list[admin_pb2.OngoingReassignment]:
    return [admin_pb2.OngoingReassignment(topic=m.topic, partition=m.partition, replicas=list(m.replicas),
                                          adding_replicas=list(m.adding_replicas),
                                          removing_replicas=list(m.removing_replicas)) for m in moves]


def ongoing_from_proto(moves: Iterable[admin_pb2.OngoingReassignment]) -> list[OngoingReassignment]:
    return [OngoingReassignment(topic=m.topic, partition=m.partition, replicas=tuple(m.replicas),
                                adding_replicas=tuple(m.adding_replicas), removing_replicas=tuple(m.removing_replicas))
            for m in moves]


# -- configs ---------------------------------------------------------------------------------
def config_changes_to_proto(changes: Iterable[ConfigChange], *, validate_only: bool) -> admin_pb2.AlterConfigsRequest:
    return admin_pb2.AlterConfigsRequest(validate_only=validate_only, resources=[
        admin_pb2.AlterConfigsResource(topic=c.topic, replace=c.replace, ops=[
            admin_pb2.ConfigOp(key=o.key, op=int(o.op), value=o.value) for o in c.ops])  # None: value unset
        for c in changes])


def config_changes_from_proto(request: admin_pb2.AlterConfigsRequest) -> list[ConfigChange]:
    # ``op`` stays the number sent: one that is no ConfigOpType is refused when applied, per topic.
    return [ConfigChange(topic=r.topic, replace=r.replace, ops=tuple(
        ConfigOp(key=o.key, op=o.op, value=o.value if o.HasField("value") else None) for o in r.ops))
        for r in request.resources]


def config_outcomes_to_proto(outcomes: Iterable[ConfigOutcome]) -> list[admin_pb2.AlterConfigsResult]:
    return [admin_pb2.AlterConfigsResult(topic=o.topic, **error_kwargs(o.error),
                                         config=o.config) for o in outcomes]


def config_outcomes_from_proto(results: Iterable[admin_pb2.AlterConfigsResult]) -> list[ConfigOutcome]:
    return [ConfigOutcome(topic=r.topic, error=error_or_none(r.error_code, r.error_message), config=dict(r.config))
            for r in results]


# -- ListOffsets and DeleteRecords (the front door asks the leaders) -------------------------
def offset_queries_to_proto(queries: Iterable[OffsetQuery], *, isolation_level: int) -> common_pb2.ListOffsetsRequest:
    return common_pb2.ListOffsetsRequest(isolation_level=isolation_level, partitions=[
        common_pb2.ListOffsetsPartition(topic=q.topic, partition=q.partition, timestamp=q.timestamp,
                                        # proto3 optional: unset is "unchecked", the -1 of OffsetQuery
                                        current_leader_epoch=q.current_leader_epoch if q.current_leader_epoch >= 0
                                        else None)
        for q in queries])


def offset_queries_from_proto(request: common_pb2.ListOffsetsRequest) -> list[OffsetQuery]:
    return [OffsetQuery(topic=p.topic, partition=p.partition, timestamp=p.timestamp,
                        current_leader_epoch=p.current_leader_epoch if p.HasField("current_leader_epoch") else -1)
            for p in request.partitions]


def offsets_to_proto(answers: Iterable[PartitionOffset]) -> list[common_pb2.ListOffsetsResult]:
    return [common_pb2.ListOffsetsResult(topic=a.topic, partition=a.partition, **error_kwargs(a.error),
                                         offset=a.offset, timestamp=a.timestamp, leader_epoch=a.leader_epoch)
            for a in answers]


def offsets_from_proto(response: common_pb2.ListOffsetsResponse) -> list[PartitionOffset]:
    return [PartitionOffset(topic=r.topic, partition=r.partition, offset=r.offset, timestamp=r.timestamp,
                            leader_epoch=r.leader_epoch, error=error_or_none(r.error_code, r.error_message))
            for r in response.partitions]


def delete_request_to_proto(items: Iterable[DeleteRequestItem], *, timeout_ms: int) -> common_pb2.DeleteRecordsRequest:
    return common_pb2.DeleteRecordsRequest(timeout_ms=timeout_ms, partitions=[
        common_pb2.DeleteRecordsPartition(topic=i.topic, partition=i.partition, offset=i.offset) for i in items])


def delete_items_from_proto(request: common_pb2.DeleteRecordsRequest) -> list[DeleteRequestItem]:
    return [DeleteRequestItem(topic=p.topic, partition=p.partition, offset=p.offset) for p in request.partitions]
