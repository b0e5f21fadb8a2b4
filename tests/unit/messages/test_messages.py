"""The shared message types: TopicPartition next to the plain tuples the code builds, and the one
DeleteRecords answer on the wire (lowtide/rpc/messages.py)."""

from __future__ import annotations

import json

from lowtide.errors import OffsetOutOfRange, UnknownServerError
from lowtide.messages import TopicPartition
from lowtide.messages.replica import DeleteRecordsResult
from lowtide.rpc.messages import delete_results_from_proto, delete_results_to_proto
from lowtide_pb import common_pb2


def test_a_topic_partition_is_interchangeable_with_the_plain_tuple():
    tp = TopicPartition("orders", 3)
    assert tp == ("orders", 3) and hash(tp) == hash(("orders", 3))
    assert (tp.topic, tp.partition) == ("orders", 3)
    topic, partition = tp
    assert (topic, partition) == ("orders", 3)
    # Either form finds the other's dict entry, and sorting mixes them as tuples.
    assert {("orders", 3): 7}[tp] == 7 and {tp: 7}[("orders", 3)] == 7
    assert sorted([TopicPartition("b", 0), ("a", 1)]) == [("a", 1), ("b", 0)]
    # JSON (Redis values, CLI output) encodes it as the tuple's two-element list.
    assert json.dumps({"tp": tp}) == json.dumps({"tp": ("orders", 3)}) == '{"tp": ["orders", 3]}'


def test_delete_records_results_keep_their_shape_through_the_wire():
    results = [DeleteRecordsResult("t", 0, low_watermark=0),
               DeleteRecordsResult("t", 1, low_watermark=42),
               DeleteRecordsResult("t", 2, error=OffsetOutOfRange("offset 9 is above the high watermark 5"))]
    wire = common_pb2.DeleteRecordsResponse(partitions=delete_results_to_proto(results))
    back = delete_results_from_proto(common_pb2.DeleteRecordsResponse.FromString(wire.SerializeToString()))

    assert [(r.topic, r.partition, r.low_watermark) for r in back] == [("t", 0, 0), ("t", 1, 42), ("t", 2, -1)]
    assert back[0].error is None and back[1].error is None
    assert isinstance(back[2].error, OffsetOutOfRange) and back[2].error.message == results[2].error.message


def test_a_failed_partition_travels_with_low_watermark_minus_one():
    # Whatever a failed result carries, the wire says -1 (as the replica and front door always did).
    [wire] = delete_results_to_proto([DeleteRecordsResult("t", 0, low_watermark=5, error=UnknownServerError("x"))])
    assert (wire.low_watermark, wire.error_code, wire.error_message) == (-1, UnknownServerError.code, "x")
