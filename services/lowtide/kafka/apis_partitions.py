"""Kafka's partition-management APIs over the front door: CreatePartitions (37), ElectLeaders (43).

``kafka-topics --alter --partitions N`` (and AdminClient.createPartitions) send CreatePartitions
to the controller, which is any broker here: the request becomes the front door's
Admin.CreatePartitions (frontdoor/partitions.py), with the same checks and Kafka's messages.
A null ``assignments`` is Kafka's "place them for me".

``kafka-leader-election`` sends ElectLeaders: the front door's Admin.ElectLeaders
(frontdoor/elections.py). A null partition list is "all partitions"; a whole-call refusal
(CLUSTER_AUTHORIZATION_FAILED) is the top-level error of v1+ and every asked partition's error in v0.
"""

from __future__ import annotations

from typing import Any

from lowtide.errors import LowtideError
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code
from lowtide_pb import admin_pb2, common_pb2

CREATE_PARTITIONS_KEY, ELECT_LEADERS_KEY = 37, 43


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


APIS = [
    Api(CREATE_PARTITIONS_KEY, "CreatePartitions", 0, 3, create_partitions),
    Api(ELECT_LEADERS_KEY, "ElectLeaders", 0, 2, elect_leaders),
]
