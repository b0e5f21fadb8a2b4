"""Kafka's AlterPartitionReassignments (45, v0 and v1) and ListPartitionReassignments (46, v0)
mapped onto the front door's PartitionReassigner (lowtide.kafka.apis_partitions, ``Call.front``).

Each request is written with kio's own encoder and read back the way the listener reads it, the
handler's answer is encoded as the frame the client gets and decoded again, so a field kio would
not write (a wrong type, a missing field of that version) fails here. The reassigner behind the
handler is a stand-in that records what it was asked (lowtide.messages types) and answers fixed
outcomes or a whole-call refusal; the real one is exercised by
tests/integration/kafka/test_kafka_reassign_tool.py."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from lowtide.errors import (
    ClusterAuthorizationFailed,
    InvalidReplicationFactor,
    InvalidRequest,
    LowtideError,
    NoReassignmentInProgress,
    UnknownServerError,
)
from lowtide.kafka.apis_partitions import APIS, alter_partition_reassignments, list_partition_reassignments
from lowtide.kafka.broker import Call, KafkaServices, Node
from lowtide.kafka.listener import Connection
from lowtide.kafka.protocol import RequestHead, encode_response, read_request
from lowtide.messages import TopicPartition
from lowtide.messages.admin import OngoingReassignment, ReassignmentOutcome

ALTER, LIST = 45, 46


class RecordingReassigner:
    """The front door's PartitionReassigner as the handlers see it (``Call.front.reassigner``):
    remembers what it was asked, answers ``answer`` (or raises it)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, Any, ...]] = []

    def _answer(self) -> Any:
        if isinstance(self.answer, LowtideError):
            raise self.answer
        return self.answer

    def alter(self, *, principal: str, targets: dict, allow_replication_factor_change: bool = True) -> Any:
        self.calls.append(("alter", principal, dict(targets), allow_replication_factor_change))
        return self._answer()

    def list(self, *, principal: str, partitions: Any = None) -> Any:
        self.calls.append(("list", principal, partitions))
        return self._answer()


def roundtrip(handler, key: int, version: int, body: Any, admin: RecordingReassigner) -> Any:
    """Encode ``body`` as a client would, parse it as the listener does, answer it, and decode the
    answer frame as the client would."""
    request_cls = load_request_schema(key, version)
    head = RequestHead(api_key=key, api_version=version, correlation_id=11)
    payload = io.BytesIO()
    entity_writer(request_cls.__header_schema__)(payload, request_cls.__header_schema__(
        request_api_key=key, request_api_version=version, correlation_id=11, client_id="reassign-test"))
    entity_writer(request_cls)(payload, body)
    request = read_request(payload.getvalue(), head)
    services = KafkaServices(node=Node(node_id=-1, host="127.0.0.1", port=9092),
                             front_door=lambda _metadata: SimpleNamespace(reassigner=admin),
                             authenticate=lambda _metadata: "User:ops")
    answer = handler(Call(conn=Connection(peer="test"), head=head, client_id=request.client_id, services=services),
                     request.body)
    frame = encode_response(head, answer)
    decoded, _ = entity_reader(load_response_schema(key, version))(frame, 4 + 4 + 1)  # size, correlation, tags
    assert decoded == answer
    return decoded


def alter_body(version: int, moves: dict[tuple[str, int], list[int] | None], **extra: Any) -> Any:
    mod = load_request_schema(ALTER, version)
    classes = __import__(mod.__module__, fromlist=["x"])
    topics: dict[str, list[Any]] = {}
    for (topic, partition), replicas in moves.items():
        topics.setdefault(topic, []).append(classes.ReassignablePartition(
            partition_index=partition, replicas=None if replicas is None else tuple(replicas)))
    return mod(topics=tuple(classes.ReassignableTopic(name=t, partitions=tuple(ps)) for t, ps in topics.items()),
               **extra)


def results(*rows: tuple[str, int, LowtideError | None]) -> list[ReassignmentOutcome]:
    return [ReassignmentOutcome(TopicPartition(t, p), error) for t, p, error in rows]


def per_partition(answer: Any) -> dict[tuple[str, int], tuple[int, str | None]]:
    return {(t.name, p.partition_index): (int(p.error_code), p.error_message)
            for t in answer.responses for p in t.partitions}


def test_both_apis_are_served_in_the_versions_kafka_4_clients_use():
    assert {(a.key, a.min_version, a.max_version) for a in APIS if a.key in (ALTER, LIST)} == {(45, 0, 1), (46, 0, 0)}


@pytest.mark.parametrize("version", [0, 1])
def test_a_target_becomes_a_move_and_a_null_replica_list_a_cancel(version):
    admin = RecordingReassigner(results(("orders", 0, None), ("orders", 2, NoReassignmentInProgress(
        "no reassignment of orders-2 is in progress"))))
    answer = roundtrip(alter_partition_reassignments, ALTER, version,
                       alter_body(version, {("orders", 0): [3, 1, 2], ("orders", 2): None}), admin)
    assert admin.calls == [("alter", "User:ops", {TopicPartition("orders", 0): (3, 1, 2),
                                                  TopicPartition("orders", 2): None}, True)]
    assert int(answer.error_code) == 0
    assert per_partition(answer) == {("orders", 0): (0, None),
                                     ("orders", 2): (85, "no reassignment of orders-2 is in progress")}


def test_v1_without_replication_factor_change_asks_the_front_door_to_refuse_one():
    admin = RecordingReassigner(results(("orders", 0, InvalidReplicationFactor("the replication factor would change"))))
    answer = roundtrip(alter_partition_reassignments, ALTER, 1,
                       alter_body(1, {("orders", 0): [0, 1, 2, 3]}, allow_replication_factor_change=False), admin)
    assert admin.calls[0][3] is False
    assert answer.allow_replication_factor_change is False
    assert per_partition(answer) == {("orders", 0): (InvalidReplicationFactor.code,
                                                     "the replication factor would change")}


def test_v0_always_allows_a_replication_factor_change():
    admin = RecordingReassigner(results(("orders", 0, None)))
    roundtrip(alter_partition_reassignments, ALTER, 0, alter_body(0, {("orders", 0): [0, 1, 2, 3]}), admin)
    assert admin.calls[0][3] is True


@pytest.mark.parametrize("version", [0, 1])
def test_a_whole_call_refusal_is_the_top_level_error_with_no_partition_answers(version):
    admin = RecordingReassigner(ClusterAuthorizationFailed("User:bob may not ALTER the cluster"))
    answer = roundtrip(alter_partition_reassignments, ALTER, version,
                       alter_body(version, {("orders", 0): [1, 2, 3]}), admin)
    assert (int(answer.error_code), answer.error_message, answer.responses) == (
        ClusterAuthorizationFailed.code, "User:bob may not ALTER the cluster", ())


def test_a_partition_the_front_door_left_out_is_answered_as_a_failure():
    admin = RecordingReassigner(results(("orders", 0, None)))
    answer = roundtrip(alter_partition_reassignments, ALTER, 1,
                       alter_body(1, {("orders", 0): [1, 2, 3], ("orders", 1): [2, 3, 0]}), admin)
    assert per_partition(answer)[("orders", 1)][0] == UnknownServerError.code


def list_body(topics: dict[str, list[int]] | None) -> Any:
    mod = load_request_schema(LIST, 0)
    classes = __import__(mod.__module__, fromlist=["x"])
    return mod(topics=None if topics is None else tuple(
        classes.ListPartitionReassignmentsTopics(name=t, partition_indexes=tuple(ps)) for t, ps in topics.items()))


ONGOING = [OngoingReassignment(topic="orders", partition=0, replicas=(1, 2, 3, 0), adding_replicas=(3,),
                               removing_replicas=(0,)),
           OngoingReassignment(topic="audit", partition=4, replicas=(2, 1), adding_replicas=(2,))]


def test_null_topics_lists_every_move_with_its_adding_and_removing_replicas():
    admin = RecordingReassigner(ONGOING)
    answer = roundtrip(list_partition_reassignments, LIST, 0, list_body(None), admin)
    assert admin.calls == [("list", "User:ops", None)]
    assert int(answer.error_code) == 0
    assert [(t.name, [(p.partition_index, p.replicas, p.adding_replicas, p.removing_replicas) for p in t.partitions])
            for t in answer.topics] == [("orders", [(0, (1, 2, 3, 0), (3,), (0,))]), ("audit", [(4, (2, 1), (2,), ())])]


def test_named_partitions_are_asked_for_by_name():
    admin = RecordingReassigner([])
    answer = roundtrip(list_partition_reassignments, LIST, 0, list_body({"orders": [0, 3], "audit": [1]}), admin)
    assert admin.calls[0][2] == [TopicPartition("orders", 0), TopicPartition("orders", 3), TopicPartition("audit", 1)]
    assert answer.topics == ()


def test_topics_without_partition_indexes_list_nothing_rather_than_everything():
    admin = RecordingReassigner(ONGOING)
    answer = roundtrip(list_partition_reassignments, LIST, 0, list_body({"orders": []}), admin)
    assert admin.calls == []
    assert answer.topics == ()


def test_a_list_refusal_is_the_top_level_error():
    admin = RecordingReassigner(ClusterAuthorizationFailed("User:bob may not DESCRIBE the cluster"))
    answer = roundtrip(list_partition_reassignments, LIST, 0, list_body(None), admin)
    assert (int(answer.error_code), answer.topics) == (ClusterAuthorizationFailed.code, ())


def test_a_front_door_that_runs_no_reassigner_refuses_both_as_its_admin_service_does():
    answer = roundtrip(alter_partition_reassignments, ALTER, 1, alter_body(1, {("orders", 0): [1, 2, 3]}), None)
    assert (int(answer.error_code), answer.error_message) == (
        InvalidRequest.code, "this front door cannot reassign partitions")
    answer = roundtrip(list_partition_reassignments, LIST, 0, list_body(None), None)
    assert int(answer.error_code) == InvalidRequest.code
