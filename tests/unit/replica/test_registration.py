"""lowtide.replica.registration: Produce requests read with one copy of their batches."""

from __future__ import annotations

from lowtide.record import OwnedBatches, encode_batch
from lowtide.replica.registration import parse_produce_request
from lowtide_pb import replica_pb2


def test_a_produce_request_reads_as_the_message_with_each_partitions_batches_handed_over() -> None:
    batches = encode_batch([b"v"] * 4)
    raw = replica_pb2.ProduceRequest(acks=-1, timeout_ms=500, partitions=[
        replica_pb2.ProducePartition(topic="t", partition=1, records=batches, current_leader_epoch=3),
        replica_pb2.ProducePartition(topic="u", partition=0)]).SerializeToString()
    request = parse_produce_request(raw)
    assert (request.acks, request.timeout_ms) == (-1, 500)
    first, second = request.partitions
    assert (first.topic, first.partition, first.current_leader_epoch) == ("t", 1, 3)
    assert first.HasField("current_leader_epoch") and not second.HasField("current_leader_epoch")
    assert isinstance(first.records, OwnedBatches) and first.records == batches
    assert second.records == b""
