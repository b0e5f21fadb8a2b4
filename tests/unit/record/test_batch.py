"""RecordBatch v2 codec: byte-exact against kafka-python, decoding, validation, offsets."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from lowtide.errors import CorruptMessage, InvalidRecord, UnsupportedForMessageFormat
from lowtide.record.batch import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchBuilder,
    Compression,
    Record,
    assign_offsets,
    crc32c,
    decode_batch,
    decode_batches,
    decode_varint,
    encode_batch,
    encode_varint,
    iter_batches,
    read_header,
    validate_batches,
)

# One record: key null, value b"a", timestamp 0, producer fields "none", leader epoch 0.
TINY_BATCH_HEX = (
    "0000000000000000"  # base offset 0
    "00000039"  # batch length 57 = 49 + 8 record bytes
    "00000000"  # partition leader epoch 0
    "02"  # magic 2
    "dbe9c876"  # CRC-32C of everything after this field
    "0000"  # attributes: no compression, create time
    "00000000"  # last offset delta 0
    "0000000000000000"  # base timestamp 0
    "0000000000000000"  # max timestamp 0
    "ffffffffffffffff"  # producer id -1
    "ffff"  # producer epoch -1
    "ffffffff"  # base sequence -1
    "00000001"  # record count 1
    "0e"  # record length 7 (zig-zag)
    "00"  # record attributes
    "00"  # timestamp delta 0
    "00"  # offset delta 0
    "01"  # key length -1 (null)
    "02"  # value length 1
    "61"  # value "a"
    "00"  # header count 0
)

RECORDS = [
    (1_700_000_000_000, b"key-0", b"value-0", [("trace", b"abc"), ("empty", None)]),
    (1_700_000_000_005, None, b"no key", []),
    (1_699_999_999_000, b"tombstone", None, []),  # earlier than the first: negative delta
    (1_700_000_100_000, b"", b"x" * 1000, [("h", b"")]),
]


def build_with_kafka_python(records, *, compression: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, (ts, key, value, headers) in enumerate(records):
        builder.append(offset, ts, key, value, headers)
    return bytes(builder.build())


def build_with_lowtide(records, *, compression: Compression = Compression.NONE) -> bytes:
    # kafka-python writes partition leader epoch 0 where Kafka's Java producer writes -1.
    builder = BatchBuilder(compression=compression, partition_leader_epoch=0)
    for ts, key, value, headers in records:
        builder.append(timestamp_ms=ts, key=key, value=value, headers=headers)
    return builder.build()


def test_tiny_batch_matches_handwritten_hex_vector():
    builder = BatchBuilder(partition_leader_epoch=0)
    builder.append(timestamp_ms=0, key=None, value=b"a")
    assert builder.build().hex() == TINY_BATCH_HEX


def test_tiny_hex_vector_crc_is_crc32c_from_attributes_to_end():
    raw = bytes.fromhex(TINY_BATCH_HEX)
    assert crc32c(raw[21:]) == 0xDBE9C876


def test_uncompressed_batch_is_byte_identical_to_kafka_python():
    assert build_with_lowtide(RECORDS) == build_with_kafka_python(RECORDS)


@pytest.mark.parametrize("count", [1, 2, 100])
def test_batches_of_various_sizes_are_byte_identical_to_kafka_python(count):
    records = [(1000 + i * 7, f"k{i}".encode(), b"v" * (i * 13 % 300), []) for i in range(count)]
    assert build_with_lowtide(records) == build_with_kafka_python(records)


def test_kafka_python_decodes_lowtide_batch():
    batch = DefaultRecordBatch(build_with_lowtide(RECORDS))
    assert batch.validate_crc()
    decoded = [(r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert decoded == [(ts, k, v, list(h)) for ts, k, v, h in RECORDS]


def test_lowtide_decodes_kafka_python_batch():
    header, records = decode_batch(build_with_kafka_python(RECORDS))
    assert header.record_count == 4
    assert header.max_timestamp == 1_700_000_100_000
    assert [(r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (ts, k, v, tuple(h)) for ts, k, v, h in RECORDS
    ]
    assert [r.offset for r in records] == [0, 1, 2, 3]


def test_gzip_batch_written_by_lowtide_decodes_in_kafka_python():
    raw = build_with_lowtide(RECORDS, compression=Compression.GZIP)
    assert read_header(raw).compression == Compression.GZIP
    batch = DefaultRecordBatch(raw)
    assert batch.compression_type == 1
    assert [(r.timestamp, r.key, r.value) for r in batch] == [(ts, k, v) for ts, k, v, _ in RECORDS]


def test_gzip_batch_written_by_kafka_python_decodes_in_lowtide():
    raw = build_with_kafka_python(RECORDS, compression=1)
    header, records = decode_batch(raw)
    assert header.compression == Compression.GZIP  # the data compresses, so kafka-python kept gzip
    assert [(r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (ts, k, v, tuple(h)) for ts, k, v, h in RECORDS
    ]
    assert validate_batches(raw)[0].record_count == 4


@pytest.mark.parametrize("codec", [Compression.SNAPPY, 5, 7])
def test_unsupported_codecs_raise_unsupported_for_message_format(codec):
    expected = "SNAPPY" if codec == Compression.SNAPPY else f"codec {codec}"
    with pytest.raises(UnsupportedForMessageFormat, match=expected):
        BatchBuilder(compression=codec)


def test_decoding_a_snappy_batch_raises_unsupported_for_message_format():
    raw = bytearray(build_with_lowtide(RECORDS[:1]))
    struct.pack_into(">h", raw, 21, Compression.SNAPPY)
    with pytest.raises(UnsupportedForMessageFormat, match="SNAPPY"):
        decode_batch(raw, verify_crc=False)


def test_header_properties_describe_the_batch():
    raw = encode_batch([b"a", b"b", b"c"], timestamp_ms=[5, 9, 7], base_offset=100, producer_id=7,
                       producer_epoch=1, base_sequence=3, is_transactional=True)
    header = read_header(raw)
    assert header.magic == MAGIC
    assert (header.base_offset, header.last_offset, header.next_offset) == (100, 102, 103)
    assert header.size_in_bytes == len(raw) == header.batch_length + LOG_OVERHEAD
    assert (header.base_timestamp, header.max_timestamp) == (5, 9)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 3)
    assert header.is_transactional and not header.is_control
    assert header.timestamp_type == 0
    assert not header.has_delete_horizon and header.delete_horizon_ms is None


def test_delete_horizon_batch_reads_back_original_record_timestamps():
    horizon = 2_000_000_000_000
    builder = BatchBuilder(delete_horizon_ms=horizon, partition_leader_epoch=0)
    builder.append(timestamp_ms=1_000, key=b"k", value=None)
    builder.append(timestamp_ms=1_500, key=b"j", value=None)
    header, records = decode_batch(builder.build())
    assert header.has_delete_horizon
    assert header.delete_horizon_ms == horizon == header.base_timestamp
    assert header.max_timestamp == 1_500
    assert [r.timestamp for r in records] == [1_000, 1_500]
    validate_batches(builder.build(), allow_compacted=True)  # base > max is fine with a horizon


def test_builder_keeps_original_offsets_of_a_compacted_batch():
    builder = BatchBuilder(base_offset=10, last_offset_delta=9)
    builder.append(timestamp_ms=1, key=b"a", value=b"1", offset_delta=3)
    builder.append(timestamp_ms=2, key=b"b", value=b"2", offset_delta=7)
    raw = builder.build()
    header, records = decode_batch(raw)
    assert (header.record_count, header.last_offset) == (2, 19)
    assert [r.offset for r in records] == [13, 17]
    with pytest.raises(InvalidRecord):
        validate_batches(raw)
    assert validate_batches(raw, allow_compacted=True) == [header]


def test_log_append_time_batch_gives_every_record_the_max_timestamp():
    builder = BatchBuilder(timestamp_type=1)
    builder.append(timestamp_ms=10, key=None, value=b"a")
    builder.append(timestamp_ms=20, key=None, value=b"b")
    header, records = decode_batch(builder.build())
    assert header.timestamp_type == 1
    assert [r.timestamp for r in records] == [20, 20]


def test_record_is_a_frozen_value():
    record = Record(offset=1, timestamp=2, key=None, value=b"v")
    with pytest.raises(AttributeError):
        record.offset = 3  # type: ignore[misc]


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, 8191, -8192, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)])
def test_varints_round_trip(value):
    encoded = encode_varint(value)
    assert decode_varint(encoded, 0) == (value, len(encoded))


def test_size_estimate_grows_with_appended_records():
    builder = BatchBuilder()
    assert builder.size_estimate == BATCH_HEADER_SIZE
    builder.append(timestamp_ms=0, key=None, value=b"x" * 1024)
    assert builder.size_estimate == len(builder.build())


# -- iter_batches -----------------------------------------------------------------------------------


def test_iter_batches_yields_each_complete_batch_and_ignores_a_partial_tail():
    first = encode_batch([b"a"], timestamp_ms=1)
    second = encode_batch([b"b", b"c"], timestamp_ms=1, base_offset=1)
    buf = first + second + second[:30]
    assert [(h.base_offset, pos) for h, pos in iter_batches(buf)] == [(0, 0), (1, len(first))]
    assert [len(r) for _, r in decode_batches(buf)] == [1, 2]


def test_iter_batches_of_an_empty_buffer_yields_nothing():
    assert list(iter_batches(b"")) == []


# -- validate_batches -------------------------------------------------------------------------------


def test_validate_batches_returns_one_header_per_batch():
    buf = encode_batch([b"a"], timestamp_ms=1) + encode_batch([b"b", b"c"], timestamp_ms=2)
    headers = validate_batches(buf)
    assert [h.record_count for h in headers] == [1, 2]


def test_validate_empty_buffer_raises_invalid_record():
    with pytest.raises(InvalidRecord, match="empty"):
        validate_batches(b"")


def test_validate_bad_crc_raises_corrupt_message():
    buf = bytearray(encode_batch([b"hello"], timestamp_ms=1))
    buf[-2] ^= 0xFF
    with pytest.raises(CorruptMessage, match="CRC"):
        validate_batches(buf)


def test_validate_truncated_batch_raises_corrupt_message():
    buf = encode_batch([b"hello"], timestamp_ms=1)
    with pytest.raises(CorruptMessage, match="truncated"):
        validate_batches(buf[:-1])
    with pytest.raises(CorruptMessage, match="truncated"):
        validate_batches(buf[:40])


def test_validate_trailing_garbage_raises_corrupt_message():
    buf = encode_batch([b"hello"], timestamp_ms=1) + b"\x00" * 5
    with pytest.raises(CorruptMessage):
        validate_batches(buf)


def test_validate_length_below_minimum_raises_corrupt_message():
    buf = bytearray(encode_batch([b"hello"], timestamp_ms=1))
    struct.pack_into(">i", buf, 8, 10)
    with pytest.raises(CorruptMessage, match="length"):
        validate_batches(buf)


def test_validate_magic_other_than_two_raises_unsupported_for_message_format():
    buf = bytearray(encode_batch([b"hello"], timestamp_ms=1))
    buf[16] = 1
    with pytest.raises(UnsupportedForMessageFormat, match="magic 1"):
        validate_batches(buf)


def _rewrite(buf: bytes, fmt: str, pos: int, value: int) -> bytearray:
    out = bytearray(buf)
    struct.pack_into(fmt, out, pos, value)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return out


def test_validate_record_count_mismatch_raises_invalid_record():
    buf = _rewrite(encode_batch([b"a", b"b"], timestamp_ms=1), ">i", 57, 1)
    with pytest.raises(InvalidRecord, match="record count"):
        validate_batches(buf)


def test_validate_zero_records_raises_invalid_record():
    with pytest.raises(InvalidRecord):
        validate_batches(BatchBuilder().build())


def test_validate_max_timestamp_below_base_raises_invalid_record():
    buf = _rewrite(encode_batch([b"a"], timestamp_ms=100), ">q", 35, 50)
    with pytest.raises(InvalidRecord, match="timestamp"):
        validate_batches(buf)


def test_validate_unknown_codec_raises_unsupported_for_message_format():
    buf = _rewrite(encode_batch([b"a"], timestamp_ms=1), ">h", 21, 7)
    with pytest.raises(UnsupportedForMessageFormat, match="codec 7"):
        validate_batches(buf)


def test_read_header_of_short_buffer_raises_corrupt_message():
    with pytest.raises(CorruptMessage, match="truncated"):
        read_header(b"\x00" * 60)


def test_decode_batch_with_bad_crc_raises_corrupt_message():
    buf = bytearray(encode_batch([b"hello"], timestamp_ms=1))
    buf[-1] ^= 1
    with pytest.raises(CorruptMessage, match="CRC"):
        decode_batch(buf)


# -- assign_offsets ---------------------------------------------------------------------------------


def test_assign_offsets_rewrites_offsets_and_epoch_in_place_without_touching_the_crc():
    buf = bytearray(encode_batch([b"a", b"b"], timestamp_ms=1) + encode_batch([b"c"], timestamp_ms=2))
    headers = validate_batches(buf)
    next_offset = assign_offsets(buf, headers, base_offset=500, leader_epoch=9)
    assert next_offset == 503
    rewritten = validate_batches(buf)  # CRC still valid
    assert [(h.base_offset, h.partition_leader_epoch) for h in rewritten] == [(500, 9), (502, 9)]
    _, records = decode_batch(buf, pos=headers[0].size_in_bytes)
    assert records[0].offset == 502
