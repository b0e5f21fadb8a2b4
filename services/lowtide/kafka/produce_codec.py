"""The Produce response body, encoded by hand: the one Kafka answer sent once per produced batch.

Why not kio's entity writer (lowtide.kafka.protocol): building the response entities and writing
them cost about 18 us per request on an idle 2-core VM (5.5 + 12.5), this encoder 3 us, on a path
that costs each replica about 170 us per 16 KiB batch (issue 32,
docs/testing.md#where-time-goes-per-16-kib-produce-request). The request is still read by kio: its
reader is faster than a hand-written one was. The layout is small and fixed;
tests/unit/kafka/test_produce_codec.py checks it byte for byte against kio's writer for every
version served.

ProduceResponse body, versions 3 to 12 (all integers big-endian)::

    body        := topics:ARRAY(topic) throttle_time_ms:int32 [TAGS]
    topic       := name:STRING partitions:ARRAY(partition) [TAGS]
    partition   := index:int32 error_code:int16 base_offset:int64 log_append_time_ms:int64
                   log_start_offset:int64 (v5+)
                   record_errors:ARRAY(record_error) (v8+)  error_message:NULLABLE_STRING (v8+)
                   [TAGS]
    record_error := batch_index:int32 message:NULLABLE_STRING [TAGS]     (always empty here)

    v3-v8 (classic):  ARRAY = count:int32 items;  STRING = len:int16 utf8;
                      NULLABLE_STRING = -1:int16 | STRING;  no [TAGS]
    v9-v12 (flexible): ARRAY = uvarint(count + 1) items;  STRING = uvarint(len + 1) utf8;
                      NULLABLE_STRING = uvarint(0) | STRING;  [TAGS] = uvarint(0): no tagged
                      fields (current_leader and node_endpoints, KIP-951, are not sent)

``log_append_time_ms`` is -1 unless the topic uses LogAppendTime.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from lowtide.record.varint import encode_uvarint

MIN_VERSION, MAX_VERSION, FIRST_FLEXIBLE = 3, 12, 9
_CLASSIC_PARTITION = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time_ms
_INT16, _INT32, _INT64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class PartitionAnswer(NamedTuple):
    index: int
    error_code: int
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    error_message: str | None


def encode_produce_response(version: int, topics: Sequence[tuple[str, Sequence[PartitionAnswer]]],
                            *, throttle_time_ms: int = 0) -> bytes:
    """The body (no response header) of a ProduceResponse of ``version`` (3 to 12)."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Produce response v{version} is not encoded here (v{MIN_VERSION} to v{MAX_VERSION})")
    flexible = version >= FIRST_FLEXIBLE
    out = bytearray(_count(len(topics), flexible))
    for name, partitions in topics:
        out += _string(name, flexible)
        out += _count(len(partitions), flexible)
        for p in partitions:
            out += _CLASSIC_PARTITION.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms)
            if version >= 5:
                out += _INT64.pack(p.log_start_offset)
            if version >= 8:
                out += _count(0, flexible)  # record_errors
                out += _nullable_string(p.error_message, flexible)
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    out += _INT32.pack(throttle_time_ms)
    if flexible:
        out.append(0)
    return bytes(out)


def _count(n: int, flexible: bool) -> bytes:
    return encode_uvarint(n + 1) if flexible else _INT32.pack(n)


def _string(value: str, flexible: bool) -> bytes:
    data = value.encode()
    return (encode_uvarint(len(data) + 1) if flexible else _INT16.pack(len(data))) + data


def _nullable_string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\0" if flexible else _INT16.pack(-1)
    return _string(value, flexible)
