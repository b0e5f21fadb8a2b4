"""The hand-written Produce response (lowtide.kafka.produce_codec) against kio's writer, byte for
byte, for every version the listener serves."""

from __future__ import annotations

import datetime
import io

import pytest
from kio.schema.errors import ErrorCode

from lowtide.kafka.produce_codec import MAX_VERSION, MIN_VERSION, PartitionAnswer, encode_produce_response
from lowtide.kafka.protocol import _writer, response_type

ANSWERS = [
    ("orders", [PartitionAnswer(0, 0, 12_345, -1, 0, None),
                PartitionAnswer(7, 6, -1, -1, -1, "this broker is not the leader: ünïcode")]),
    ("t" * 200, [PartitionAnswer(2 ** 31 - 1, 0, 2 ** 62, 1_764_000_000_123, 2 ** 40, None)]),
    ("empty-topic", []),
]


def kio_bytes(version: int, topics, throttle_ms: int) -> bytes:
    response = response_type(0, version)
    module = __import__(response.__module__, fromlist=["_"])
    fields = set(module.PartitionProduceResponse.__dataclass_fields__)
    values = []
    for name, partitions in topics:
        parts = []
        for p in partitions:
            given = dict(index=p.index, error_code=ErrorCode(p.error_code), base_offset=p.base_offset,
                         log_append_time=None if p.log_append_time_ms < 0 else datetime.datetime.fromtimestamp(
                             p.log_append_time_ms / 1000, datetime.UTC),
                         log_start_offset=p.log_start_offset, record_errors=(), error_message=p.error_message)
            parts.append(module.PartitionProduceResponse(**{k: v for k, v in given.items() if k in fields}))
        values.append(module.TopicProduceResponse(name=name, partition_responses=tuple(parts)))
    given = dict(responses=tuple(values), throttle_time=datetime.timedelta(milliseconds=throttle_ms))
    body = response(**{k: v for k, v in given.items() if k in response.__dataclass_fields__})
    buf = io.BytesIO()
    _writer(response)(buf, body)
    return buf.getvalue()


@pytest.mark.parametrize("version", range(MIN_VERSION, MAX_VERSION + 1))
def test_every_served_version_encodes_exactly_as_kios_writer(version):
    assert encode_produce_response(version, ANSWERS, throttle_time_ms=250) == kio_bytes(version, ANSWERS, 250)
    assert encode_produce_response(version, []) == kio_bytes(version, [], 0)


def test_a_v12_answer_for_one_partition_is_these_bytes():
    body = encode_produce_response(12, [("kp", [PartitionAnswer(1, 0, 5, -1, 0, None)])])
    assert body.hex(" ") == ("02 03 6b 70 02 00 00 00 01 00 00 00 00 00 00 00 00 00 05 ff ff ff ff ff ff ff ff "
                             "00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00")


def test_a_version_outside_3_to_12_is_refused():
    with pytest.raises(ValueError, match="v13"):
        encode_produce_response(13, [])
