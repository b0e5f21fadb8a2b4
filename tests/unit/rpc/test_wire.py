"""lowtide.rpc.wire: lifting a bytes field out of a protobuf message without copying it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.record import encode_uvarint
from lowtide.rpc.wire import WireFormatError, read_uvarint, split_bytes_field
from lowtide_pb import replica_pb2, transactions_pb2


def _split_produce(raw: bytes) -> tuple[replica_pb2.ProduceRequest, list[memoryview]]:
    stripped, views = split_bytes_field(raw, repeated_field=3, bytes_field=3)
    return replica_pb2.ProduceRequest.FromString(stripped), views


def test_uvarints_encode_and_read_back_byte_exactly() -> None:
    assert encode_uvarint(0) == b"\x00"
    assert encode_uvarint(127) == b"\x7f"
    assert encode_uvarint(300) == b"\xac\x02"
    assert read_uvarint(memoryview(b"\xac\x02\x99"), 0, 3) == (300, 2)
    # int32 -1 on the wire: ten bytes, the 64-bit two's complement
    minus_one = b"\xff" * 9 + b"\x01"
    assert read_uvarint(memoryview(minus_one), 0, 10) == ((1 << 64) - 1, 10)


def test_a_hand_built_message_loses_exactly_its_records_field() -> None:
    # ProduceRequest{acks=1, partitions=[{topic="t", partition=2, records=b"abc"}]}
    element = b"\x0a\x01t" + b"\x10\x02" + b"\x1a\x03abc"
    raw = b"\x08\x01" + b"\x1a" + bytes([len(element)]) + element
    stripped, views = split_bytes_field(raw, repeated_field=3, bytes_field=3)
    assert stripped == b"\x08\x01" + b"\x1a\x05" + b"\x0a\x01t\x10\x02"
    assert [bytes(v) for v in views] == [b"abc"]


def test_views_share_the_received_buffer_instead_of_copying_it() -> None:
    records = bytes(range(256)) * 4096
    raw = replica_pb2.ProduceRequest(acks=-1, partitions=[
        replica_pb2.ProducePartition(topic="t", partition=0, records=records)]).SerializeToString()
    _, views = split_bytes_field(raw, repeated_field=3, bytes_field=3)
    assert views[0].obj is raw
    assert views[0] == records


def test_every_other_field_survives_including_negative_int32_and_optional_fields() -> None:
    original = replica_pb2.ProduceRequest(acks=-1, timeout_ms=30000, partitions=[
        replica_pb2.ProducePartition(topic="a", partition=0, records=b"x" * 70000, current_leader_epoch=7),
        replica_pb2.ProducePartition(topic="b", partition=-5),
        replica_pb2.ProducePartition(topic="c", partition=3, records=b"yz")])
    message, views = _split_produce(original.SerializeToString())
    assert (message.acks, message.timeout_ms) == (-1, 30000)
    assert [(p.topic, p.partition) for p in message.partitions] == [("a", 0), ("b", -5), ("c", 3)]
    assert message.partitions[0].HasField("current_leader_epoch")
    assert not message.partitions[1].HasField("current_leader_epoch")
    assert all(p.records == b"" for p in message.partitions)
    assert [bytes(v) for v in views] == [b"x" * 70000, b"", b"yz"]


def test_a_repeated_records_field_keeps_the_last_occurrence_as_protobuf_does() -> None:
    element = b"\x1a\x02ab" + b"\x0a\x01t" + b"\x1a\x02cd"
    raw = b"\x1a" + bytes([len(element)]) + element
    message, views = _split_produce(raw)
    assert replica_pb2.ProduceRequest.FromString(raw).partitions[0].records == b"cd"
    assert bytes(views[0]) == b"cd"
    assert message.partitions[0].topic == "t"


def test_fetch_responses_keep_nested_messages_around_the_records() -> None:
    original = replica_pb2.FetchResponse(partitions=[replica_pb2.FetchResult(
        topic="t", partition=1, high_watermark=10, log_start_offset=2, records=b"r" * 1000, last_stable_offset=9,
        aborted_transactions=[transactions_pb2.AbortedTransaction(producer_id=4, first_offset=5)])])
    stripped, views = split_bytes_field(original.SerializeToString(), repeated_field=1, bytes_field=9)
    result = replica_pb2.FetchResponse.FromString(stripped).partitions[0]
    assert (result.topic, result.high_watermark, result.last_stable_offset) == ("t", 10, 9)
    assert [(a.producer_id, a.first_offset) for a in result.aborted_transactions] == [(4, 5)]
    assert bytes(views[0]) == b"r" * 1000


@pytest.mark.parametrize("raw", [
    b"\x1a\x05\x0a\x01",          # element longer than the message
    b"\x1a\x03\x1a\x09ab",        # records longer than its element
    b"\x08",                      # varint cut off
    b"\x08" + b"\xff" * 11,       # varint over ten bytes
    b"\x0b",                      # a group (wire type 3)
    b"\x1a\x02\x0d\x00",          # fixed32 cut off inside an element
])
def test_malformed_messages_are_refused(raw: bytes) -> None:
    with pytest.raises(WireFormatError):
        split_bytes_field(raw, repeated_field=3, bytes_field=3)


_partitions = st.lists(st.builds(
    lambda topic, partition, records, epoch: replica_pb2.ProducePartition(
        topic=topic, partition=partition, records=records, current_leader_epoch=epoch),
    st.text(max_size=8), st.integers(-(2**31), 2**31 - 1), st.binary(max_size=300),
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))), max_size=5)


@settings(max_examples=200, deadline=None)
@given(acks=st.integers(-1, 1), timeout_ms=st.integers(0, 2**31 - 1), partitions=_partitions)
def test_splitting_then_parsing_equals_parsing_the_original(acks: int, timeout_ms: int, partitions: list) -> None:
    original = replica_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=partitions)
    message, views = _split_produce(original.SerializeToString())
    for p, view in zip(message.partitions, views, strict=True):
        p.records = bytes(view)
    assert message == original
