"""Kafka's partition-management APIs over the front door: CreatePartitions (37), ElectLeaders (43),
AlterPartitionReassignments (45), ListPartitionReassignments (46).

``kafka-topics --alter --partitions N`` (and AdminClient.createPartitions) send CreatePartitions
to the controller, which is any broker here: the request becomes the front door's
Admin.CreatePartitions (frontdoor/admin/partitions.py), with the same checks and Kafka's messages.
A null ``assignments`` is Kafka's "place them for me".

``kafka-leader-election`` sends ElectLeaders: the front door's Admin.ElectLeaders
(frontdoor/controller/elections.py). A null partition list is "all partitions"; a whole-call refusal
(CLUSTER_AUTHORIZATION_FAILED) is the top-level error of v1+ and every asked partition's error in v0.

``kafka-reassign-partitions`` sends AlterPartitionReassignments (null replicas: cancel that
partition's move) and ListPartitionReassignments (null topics: every move): the front door's
Admin RPCs of the same names (frontdoor/controller/reassignments.py). Both have a top-level error in every
version, so a whole-call refusal (CLUSTER_AUTHORIZATION_FAILED: ALTER / DESCRIBE on the CLUSTER)
goes there with no per-partition answers, as Kafka's ``getErrorResponse`` does.
"""

from __future__ import annotations

from typing import Any

from lowtide.errors import LowtideError
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code
from lowtide_pb import admin_pb2, common_pb2

CREATE_PARTITIONS_KEY, ELECT_LEADERS_KEY = 37, 43
ALTER_PARTITION_REASSIGNMENTS_KEY, LIST_PARTITION_REASSIGNMENTS_KEY = 45, 46


def create_partitions(call: Call, body: Any) -> Any:
    request = admin_pb2.CreatePartitionsRequest(validate_only=bool(body.validate_only))
    for t in body.topics:
        request.topics.add(name=t.name, count=t.count, assignments=[
            admin_pb2.PartitionAssignment(broker_ids=list(a.broker_ids)) for a in (t.assignments or ())])
    answer = call.admin("CreatePartitions", request)
    results = {r.name: r for r in answer.topics}
    out = []
    for t in body.topics:
        r = results.get(t.name)
        code = r.error_code if r else -1
        out.append(call.make("CreatePartitionsTopicResult", name=t.name, error_code=error_code(code),
                             error_message=(r.error_message or None) if r and code else None))
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(out))


def elect_leaders(call: Call, body: Any) -> Any:
    asked = [(t.topic, p) for t in (body.topic_partitions or ()) for p in t.partitions]
    request = admin_pb2.ElectLeadersRequest(
        election_type=int(getattr(body, "election_type", 0)),  # v0 has no type: preferred
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in asked])
    try:
        answer = call.admin("ElectLeaders", request)
    except LowtideError as err:
        if call.version >= 1:
            return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(err.code),
                             replica_election_results=())
        results = [(t, p, err.code, err.message) for t, p in asked]
    else:
        results = [(r.topic, r.partition, r.error_code, r.error_message) for r in answer.results]
    by_topic: dict[str, list[Any]] = {}
    for topic, partition, code, message in results:
        by_topic.setdefault(topic, []).append(call.make(
            "PartitionResult", partition_id=partition, error_code=error_code(code),
            error_message=(message or None) if code else None))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0),
                     replica_election_results=tuple(
                         call.make("ReplicaElectionResult", topic=t, partition_result=tuple(ps))
                         for t, ps in by_topic.items()))


def reassignments_request(body: Any) -> admin_pb2.AlterPartitionReassignmentsRequest:
    """Kafka's AlterPartitionReassignments as the Admin request: a null ``replicas`` is a cancel;
    v0 has no ``allow_replication_factor_change`` and means true (Kafka's default)."""
    return admin_pb2.AlterPartitionReassignmentsRequest(
        disallow_replication_factor_change=not getattr(body, "allow_replication_factor_change", True),
        partitions=[admin_pb2.PartitionReassignment(topic=t.name, partition=p.partition_index,
                                                    replicas=list(p.replicas or ()), cancel=p.replicas is None)
                    for t in body.topics for p in t.partitions])


def alter_partition_reassignments(call: Call, body: Any) -> Any:
    asked = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
    allow = bool(getattr(body, "allow_replication_factor_change", True))
    try:
        answer = call.admin("AlterPartitionReassignments", reassignments_request(body))
    except LowtideError as err:
        return call.make(call.response, throttle_time=NO_THROTTLE, allow_replication_factor_change=allow,
                         error_code=error_code(err.code), error_message=err.message or None, responses=())
    results = {(r.topic, r.partition): r for r in answer.results}
    by_topic: dict[str, list[Any]] = {}
    for topic, partition in asked:
        r = results.get((topic, partition))
        # A partition the front door left out is a bug there; Kafka's clients treat a missing
        # answer as a failure too, so say so rather than report success.
        code, message = (r.error_code, r.error_message) if r else (-1, "no answer for this partition")
        by_topic.setdefault(topic, []).append(call.make(
            "ReassignablePartitionResponse", partition_index=partition, error_code=error_code(code),
            error_message=(message or None) if code else None))
    return call.make(call.response, throttle_time=NO_THROTTLE, allow_replication_factor_change=allow,
                     error_code=error_code(0), error_message=None, responses=tuple(
                         call.make("ReassignableTopicResponse", name=t, partitions=tuple(ps))
                         for t, ps in by_topic.items()))


def list_reassignments_request(body: Any) -> admin_pb2.ListPartitionReassignmentsRequest:
    """Null ``topics`` is every move (an empty Admin list); a topic with no partition indexes
    asks for none of its partitions, as in Kafka."""
    return admin_pb2.ListPartitionReassignmentsRequest(partitions=[
        common_pb2.TopicPartition(topic=t.name, partition=p)
        for t in (body.topics or ()) for p in t.partition_indexes])


def list_partition_reassignments(call: Call, body: Any) -> Any:
    if body.topics is not None and not any(t.partition_indexes for t in body.topics):
        # Asked for nothing: the Admin RPC would read an empty list as "everything".
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), error_message=None,
                         topics=())
    try:
        answer = call.admin("ListPartitionReassignments", list_reassignments_request(body))
    except LowtideError as err:
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(err.code),
                         error_message=err.message or None, topics=())
    by_topic: dict[str, list[Any]] = {}
    for r in answer.reassignments:
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
