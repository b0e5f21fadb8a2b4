"""lowtide.rpc.convert.topics: each message survives the trip to its protobuf and back (the
servicer reads what the remote parts write, and the reverse), errors by type and message; and one
encoded request is pinned byte for byte, so a field renumbered in admin.proto shows here."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from lowtide.errors import (
    ElectionNotNeeded,
    InvalidConfig,
    InvalidRequest,
    LowtideError,
    NoReassignmentInProgress,
    NotLeaderOrFollower,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from lowtide.messages import TopicPartition
from lowtide.messages.admin import (
    BrokerView,
    ClusterView,
    ConfigChange,
    ConfigOp,
    ConfigOpType,
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
from lowtide.rpc.convert import topics as convert
from lowtide_pb import admin_pb2, common_pb2


def plain(value: Any) -> Any:
    """Errors do not compare equal by value: (type, message) stands for each."""
    if isinstance(value, LowtideError):
        return type(value).__name__, value.message
    if dataclasses.is_dataclass(value):
        return type(value).__name__, tuple(plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def wire(message):
    """The message as the other end parses it."""
    return type(message).FromString(message.SerializeToString())


def test_topic_requests_and_outcomes_survive_the_trip():
    requests = [TopicRequest(name="orders", partitions=3, replication_factor=2, config={"retention.ms": "1"}),
                TopicRequest(name="lake", partitions=1, replication_factor=0, diskless=True),
                TopicRequest(name="placed", partitions=-1, replication_factor=-1,
                             assignments=((0, (1, 2)), (1, (2, 0))))]
    request = wire(convert.topic_requests_to_proto(requests, validate_only=True))
    assert request.validate_only is True
    assert convert.topic_requests_from_proto(request) == requests
    outcomes = [TopicOutcome(name="orders"), TopicOutcome(name="lake", error=TopicAlreadyExists("lake exists"))]
    back = convert.topic_outcomes_from_proto(wire(admin_pb2.CreateTopicsResponse(
        topics=convert.topic_outcomes_to_proto(outcomes))).topics)
    assert plain(back) == plain(outcomes)


def test_a_create_topics_request_is_encoded_byte_for_byte():
    request = convert.topic_requests_to_proto(
        [TopicRequest(name="t", partitions=2, replication_factor=1, config={"k": "v"},
                      assignments=((0, (1,)),))], validate_only=True)
    assert request.SerializeToString().hex() == (
        "0a14"            # topics[0], 20 bytes:
        "0a0174"          #   name "t"
        "1002" "1801"     #   partitions 2, replication_factor 1
        "22060a016b120176"  # config {"k": "v"}
        "3203120101"      #   assignments[0]: partition 0 (the default: not sent), broker_ids [1] packed
        "1001")           # validate_only


def test_new_partitions_survive_the_trip():
    requests = [PartitionsRequest(name="orders", count=4, assignments=((1, 2), (2, 0))),
                PartitionsRequest(name="audit", count=2)]
    request = wire(convert.partitions_requests_to_proto(requests, validate_only=False))
    assert request.validate_only is False
    assert convert.partitions_requests_from_proto(request) == requests


def test_a_cluster_view_survives_the_trip_with_its_revision_and_unknown_topics():
    view = ClusterView(
        cluster_id="c-1", revision=42,
        brokers=(BrokerView(id=0, host="10.0.0.1", port=7000, rack="a", live=True, kafka_port=9092,
                            kafka_listeners={"SSL": "k0:9093"}), BrokerView(id=1, host="10.0.0.2", port=7001)),
        topics=(TopicView(name="orders", topic_id="5e1f", replication_factor=3, config={"cleanup.policy": "compact"},
                          partitions=(PartitionView(partition=0, leader=1, leader_epoch=4, replicas=(1, 2, 0),
                                                    isr=(1, 2), adding_replicas=(0,), removing_replicas=(2,)),
                                      PartitionView(partition=1, leader=-1, leader_epoch=0))),
                TopicView(name="lake", diskless=True),
                TopicView(name="missing", error=UnknownTopicOrPartition("topic 'missing' does not exist"))))
    assert plain(convert.cluster_view_from_proto(wire(convert.cluster_view_to_proto(view)))) == plain(view)


def test_elections_survive_the_trip_and_no_partitions_is_every_partition():
    asked = [TopicPartition("orders", 0), TopicPartition("audit", 3)]
    request = wire(convert.election_request_to_proto(election_type=ElectionType.UNCLEAN, partitions=asked))
    assert ElectionType.of(request.election_type) is ElectionType.UNCLEAN
    assert convert.topic_partitions_from_proto(request.partitions) == asked
    every = wire(convert.election_request_to_proto(election_type=ElectionType.PREFERRED, partitions=None))
    assert convert.topic_partitions_from_proto(every.partitions) is None
    outcomes = [ElectionOutcome(TopicPartition("orders", 0)),
                ElectionOutcome(TopicPartition("audit", 3), ElectionNotNeeded("audit-3: already leads"))]
    back = convert.election_outcomes_from_proto(wire(admin_pb2.ElectLeadersResponse(
        results=convert.election_outcomes_to_proto(outcomes))).results)
    assert plain(back) == plain(outcomes)
    assert all(type(o.partition) is TopicPartition for o in back)


def test_reassignments_survive_the_trip_a_cancel_as_none():
    targets = {TopicPartition("orders", 0): (3, 1, 2), TopicPartition("orders", 2): None}
    for allow in (True, False):
        request = wire(convert.reassignments_to_proto(targets, allow_replication_factor_change=allow))
        assert request.disallow_replication_factor_change is not allow
        assert convert.reassignment_targets_from_proto(request) == targets
    outcomes = [ReassignmentOutcome(TopicPartition("orders", 0)),
                ReassignmentOutcome(TopicPartition("orders", 2), NoReassignmentInProgress("none in progress"))]
    back = convert.reassignment_outcomes_from_proto(wire(admin_pb2.AlterPartitionReassignmentsResponse(
        results=convert.reassignment_outcomes_to_proto(outcomes))).results)
    assert plain(back) == plain(outcomes)
    moves = [OngoingReassignment(topic="orders", partition=0, replicas=(1, 2, 3, 0), adding_replicas=(3,),
                                 removing_replicas=(0,)),
             OngoingReassignment(topic="audit", partition=1, replicas=(2,))]
    assert convert.ongoing_from_proto(wire(admin_pb2.ListPartitionReassignmentsResponse(
        reassignments=convert.ongoing_to_proto(moves))).reassignments) == moves


def test_config_changes_survive_the_trip_an_unknown_op_and_a_missing_value_included():
    changes = [ConfigChange(topic="orders", ops=(
                   ConfigOp(key="retention.ms", op=ConfigOpType.DELETE),
                   ConfigOp(key="cleanup.policy", op=ConfigOpType.APPEND, value="compact"),
                   ConfigOp(key="x", op=9, value=""))),
               ConfigChange(topic="broker:0", ops=(), replace=True)]
    request = wire(convert.config_changes_to_proto(changes, validate_only=True))
    assert request.validate_only is True
    back = convert.config_changes_from_proto(request)
    assert back == changes
    assert back[0].ops[0].value is None and back[0].ops[2].value == ""
    outcomes = [ConfigOutcome(topic="orders", config={"cleanup.policy": "compact"}),
                ConfigOutcome(topic="broker:9", error=InvalidConfig("no such broker"))]
    assert plain(convert.config_outcomes_from_proto(wire(admin_pb2.AlterConfigsResponse(
        results=convert.config_outcomes_to_proto(outcomes))).results)) == plain(outcomes)


def test_offset_queries_and_answers_survive_the_trip_an_unchecked_epoch_unset():
    queries = [OffsetQuery(topic="orders", partition=0, timestamp=-1),
               OffsetQuery(topic="orders", partition=1, timestamp=1700000000000, current_leader_epoch=0)]
    request = wire(convert.offset_queries_to_proto(queries, isolation_level=1))
    assert request.isolation_level == 1
    assert [p.HasField("current_leader_epoch") for p in request.partitions] == [False, True]
    assert convert.offset_queries_from_proto(request) == queries
    answers = [PartitionOffset(topic="orders", partition=0, offset=12, timestamp=-1, leader_epoch=3),
               PartitionOffset(topic="orders", partition=1, error=NotLeaderOrFollower("not the leader"))]
    assert plain(convert.offsets_from_proto(wire(common_pb2.ListOffsetsResponse(
        partitions=convert.offsets_to_proto(answers))))) == plain(answers)


def test_delete_records_requests_survive_the_trip():
    items = [DeleteRequestItem(topic="orders", partition=0, offset=5), DeleteRequestItem("audit", 2, -1)]
    request = wire(convert.delete_request_to_proto(items, timeout_ms=1500))
    assert request.timeout_ms == 1500
    assert convert.delete_items_from_proto(request) == items


def test_an_unknown_election_type_is_invalid_request_as_the_admin_service_answers():
    with pytest.raises(InvalidRequest, match=r"^election_type must be 0 \(preferred\) or 1 \(unclean\), got 2$"):
        ElectionType.of(2)
