"""Kafka's partition-management APIs over the front door: CreatePartitions (37), ElectLeaders (43),
AlterPartitionReassignments (45), ListPartitionReassignments (46).

``kafka-topics --alter --partitions N`` (and AdminClient.createPartitions) send CreatePartitions
to the controller, which is any broker here: the request goes to the front door's PartitionCreator
(frontdoor/admin/partitions.py; ``Call.front``: in process, or over its Admin service from a
replica), with the same checks and Kafka's messages.
A null ``assignments`` is Kafka's "place them for me".

``kafka-leader-election`` sends ElectLeaders: the front door's LeaderElections
(frontdoor/controller/elections.py). A null partition list is "all partitions"; a whole-call refusal
(CLUSTER_AUTHORIZATION_FAILED) is the top-level error of v1+ and every asked partition's error in v0.

``kafka-reassign-partitions`` sends AlterPartitionReassignments (null replicas: cancel that
partition's move) and ListPartitionReassignments (null topics: every move): the front door's
PartitionReassigner (frontdoor/controller/reassignments.py). Both have a top-level error in every
version, so a whole-call refusal (CLUSTER_AUTHORIZATION_FAILED: ALTER / DESCRIBE on the CLUSTER)
goes there with no per-partition answers, as Kafka's ``getErrorResponse`` does.
"""

from __future__ import annotations

from typing import Any

from lowtide.errors import InvalidRequest, LowtideError
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code
from lowtide.messages import TopicPartition
from lowtide.messages.admin import ElectionType, PartitionsRequest

CREATE_PARTITIONS_KEY, ELECT_LEADERS_KEY = 37, 43
ALTER_PARTITION_REASSIGNMENTS_KEY, LIST_PARTITION_REASSIGNMENTS_KEY = 45, 46


def _part(part: Any, what: str) -> Any:
    """A front door part this front door may not run (in process: None), refused as its Admin
    service refuses it."""
    if part is None:
        raise InvalidRequest(f"this front door cannot {what}")
    return part


def _error(error: LowtideError | None) -> tuple[int, str | None]:
    return (0, None) if error is None else (error.code, error.message)


def create_partitions(call: Call, body: Any) -> Any:
    requests = [PartitionsRequest(name=t.name, count=t.count,
                                  assignments=tuple(tuple(a.broker_ids) for a in (t.assignments or ())))
                for t in body.topics]
    partitions = _part(call.front.partitions, "add partitions")
    outcomes = partitions.create_partitions(principal=call.principal(), requests=requests,
                                            validate_only=bool(body.validate_only))
    results = {o.name: o for o in outcomes}
    out = []
    for t in body.topics:
        r = results.get(t.name)
        code, message = _error(r.error) if r else (-1, None)
        out.append(call.make("CreatePartitionsTopicResult", name=t.name, error_code=error_code(code),
                             error_message=message))
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(out))


def elect_leaders(call: Call, body: Any) -> Any:
    asked = [(t.topic, p) for t in (body.topic_partitions or ()) for p in t.partitions]
    try:
        elections = _part(call.front.elections, "elect leaders")
        election_type = ElectionType.of(int(getattr(body, "election_type", 0)))  # v0 has no type: preferred
        outcomes = elections.elect(principal=call.principal(), election_type=election_type,
                                   partitions=[TopicPartition(t, p) for t, p in asked] or None)  # none: all
    except LowtideError as err:
        if call.version >= 1:
            return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(err.code),
                             replica_election_results=())
        results = [(t, p, err.code, err.message) for t, p in asked]
    else:
        results = [(o.partition.topic, o.partition.partition, *_error(o.error)) for o in outcomes]
    by_topic: dict[str, list[Any]] = {}
    for topic, partition, code, message in results:
        by_topic.setdefault(topic, []).append(call.make(
            "PartitionResult", partition_id=partition, error_code=error_code(code),
            error_message=(message or None) if code else None))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0),
                     replica_election_results=tuple(
                         call.make("ReplicaElectionResult", topic=t, partition_result=tuple(ps))
                         for t, ps in by_topic.items()))


def reassignment_targets(body: Any) -> dict[TopicPartition, tuple[int, ...] | None]:
    """Kafka's AlterPartitionReassignments as the reassigner's targets: a null ``replicas`` is a
    cancel (None); a partition named twice, its last target."""
    return {TopicPartition(t.name, p.partition_index): None if p.replicas is None else tuple(p.replicas)
            for t in body.topics for p in t.partitions}


def alter_partition_reassignments(call: Call, body: Any) -> Any:
    asked = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
    # v0 has no allow_replication_factor_change and means true (Kafka's default).
    allow = bool(getattr(body, "allow_replication_factor_change", True))
    try:
        reassigner = _part(call.front.reassigner, "reassign partitions")
        outcomes = reassigner.alter(principal=call.principal(), targets=reassignment_targets(body),
                                    allow_replication_factor_change=allow)
    except LowtideError as err:
        return call.make(call.response, throttle_time=NO_THROTTLE, allow_replication_factor_change=allow,
                         error_code=error_code(err.code), error_message=err.message or None, responses=())
    results = {(o.partition.topic, o.partition.partition): o for o in outcomes}
    by_topic: dict[str, list[Any]] = {}
    for topic, partition in asked:
        r = results.get((topic, partition))
        # A partition the front door left out is a bug there; Kafka's clients treat a missing
        # answer as a failure too, so say so rather than report success.
        code, message = _error(r.error) if r else (-1, "no answer for this partition")
        by_topic.setdefault(topic, []).append(call.make(
            "ReassignablePartitionResponse", partition_index=partition, error_code=error_code(code),
            error_message=(message or None) if code else None))
    return call.make(call.response, throttle_time=NO_THROTTLE, allow_replication_factor_change=allow,
                     error_code=error_code(0), error_message=None, responses=tuple(
                         call.make("ReassignableTopicResponse", name=t, partitions=tuple(ps))
                         for t, ps in by_topic.items()))


def listed_partitions(body: Any) -> list[TopicPartition] | None:
    """Null ``topics`` is every move (None); a topic with no partition indexes asks for none of
    its partitions, as in Kafka."""
    if body.topics is None:
        return None
    return [TopicPartition(t.name, p) for t in body.topics for p in t.partition_indexes]


def list_partition_reassignments(call: Call, body: Any) -> Any:
    partitions = listed_partitions(body)
    if partitions == []:
        # Asked for nothing: answered here, as before any front door was asked (its Admin RPC
        # reads an empty list as "everything").
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), error_message=None,
                         topics=())
    try:
        reassigner = _part(call.front.reassigner, "reassign partitions")
        moves = reassigner.list(principal=call.principal(), partitions=partitions)
    except LowtideError as err:
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(err.code),
                         error_message=err.message or None, topics=())
    by_topic: dict[str, list[Any]] = {}
    for r in moves:
        by_topic.setdefault(r.topic, []).append(call.make(
            "OngoingPartitionReassignment", partition_index=r.partition, replicas=tuple(r.replicas),
            adding_replicas=tuple(r.adding_replicas), removing_replicas=tuple(r.removing_replicas)))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), error_message=None,
                     topics=tuple(call.make("OngoingTopicReassignment", name=t, partitions=tuple(ps))
                                  for t, ps in by_topic.items()))


APIS = [
    Api(CREATE_PARTITIONS_KEY, "CreatePartitions", 0, 3, create_partitions),
    Api(ELECT_LEADERS_KEY, "ElectLeaders", 0, 2, elect_leaders),
    Api(ALTER_PARTITION_REASSIGNMENTS_KEY, "AlterPartitionReassignments", 0, 1, alter_partition_reassignments),
    Api(LIST_PARTITION_REASSIGNMENTS_KEY, "ListPartitionReassignments", 0, 0, list_partition_reassignments),
]
