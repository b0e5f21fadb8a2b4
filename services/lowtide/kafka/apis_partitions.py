"""Kafka's partition-management APIs over the front door: CreatePartitions (37).

``kafka-topics --alter --partitions N`` (and AdminClient.createPartitions) send CreatePartitions
to the controller, which is any broker here: the request becomes the front door's
Admin.CreatePartitions (frontdoor/partitions.py), with the same checks and Kafka's messages.
A null ``assignments`` is Kafka's "place them for me".
"""

from __future__ import annotations

from typing import Any

from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code
from lowtide_pb import admin_pb2

CREATE_PARTITIONS_KEY = 37


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


APIS = [
    Api(CREATE_PARTITIONS_KEY, "CreatePartitions", 0, 3, create_partitions),
]
