"""validate_batches on the leader: every record of every batch is checked, by the C walker and by
its pure-Python fallback (each test runs with both).

Damaged batches are built as a real producer could send them: header fields and body changed, then
BatchLength and the CRC recomputed so that only the body walk can catch them.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest

import lowtide.record.batch as batch_module
from lowtide.errors import CorruptMessage, InvalidRecord, MessageTooLarge, UnsupportedForMessageFormat
from lowtide.record.batch import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchBuilder,
    Compression,
    crc32c,
    encode_batch,
    read_header,
    validate_batches,
)
from lowtide.record.compression import compress
from lowtide.record.validate import walk_records_c, walk_records_py
from tests.unit.record.test_batch import RECORDS, TINY_BATCH_HEX, build_with_kafka_python, build_with_lowtide
from tests.unit.record.test_compression import kafka_lz4_frame
from tests.unit.record.test_walk_records import require_c_walker


@pytest.fixture(autouse=True, params=["c", "python"])
def walker(request, monkeypatch) -> str:
    """Run the test with validate_batches using the C walker, then the Python fallback."""
    if request.param == "c":
        require_c_walker()
        monkeypatch.setattr(batch_module, "walk_records", walk_records_c)
    else:
        monkeypatch.setattr(batch_module, "walk_records", walk_records_py)
    return request.param


def reframe(raw: bytes, *, body: bytes | None = None, count: int | None = None,
            last_delta: int | None = None, attributes: int | None = None) -> bytes:
    """``raw`` with its records, RecordCount, LastOffsetDelta or attributes replaced, then
    BatchLength and CRC made consistent again (what a buggy or hostile producer sends)."""
    out = bytearray(raw[:BATCH_HEADER_SIZE] + (raw[BATCH_HEADER_SIZE:] if body is None else body))
    struct.pack_into(">i", out, 8, len(out) - LOG_OVERHEAD)
    if attributes is not None:
        struct.pack_into(">h", out, 21, attributes)
    if last_delta is not None:
        struct.pack_into(">i", out, 23, last_delta)
    if count is not None:
        struct.pack_into(">i", out, 57, count)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def three_records() -> bytes:
    return encode_batch([b"a", b"b", b"c"], timestamp_ms=1)


# -- batches that pass ------------------------------------------------------------------------------


def test_tiny_hex_vector_passes():
    assert validate_batches(bytes.fromhex(TINY_BATCH_HEX))[0].record_count == 1


def test_batch_of_the_lowtide_encoder_with_headers_passes():
    headers = validate_batches(build_with_lowtide(RECORDS))
    assert headers[0].record_count == len(RECORDS)


def test_batch_of_kafka_python_builder_with_headers_passes():
    assert validate_batches(build_with_kafka_python(RECORDS))[0].record_count == len(RECORDS)


def test_gzip_batches_of_lowtide_and_kafka_python_pass():
    for raw in (build_with_lowtide(RECORDS, compression=Compression.GZIP),
                build_with_kafka_python(RECORDS, compression=1)):
        assert read_header(raw).compression == Compression.GZIP
        assert validate_batches(raw)[0].record_count == len(RECORDS)


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_lz4_and_zstd_batches_of_lowtide_and_kafka_python_pass(codec):
    for raw in (build_with_lowtide(RECORDS, compression=codec),
                build_with_kafka_python(RECORDS, compression=int(codec))):
        assert read_header(raw).compression == codec
        assert validate_batches(raw)[0].record_count == len(RECORDS)


def test_lz4_frame_with_block_checksums_as_java_can_write_it_passes():
    raw = encode_batch([b"v" * 100] * 1000, timestamp_ms=1)
    body = kafka_lz4_frame(raw[BATCH_HEADER_SIZE:], block_checksum=True)
    assert validate_batches(reframe(raw, body=body, attributes=Compression.LZ4))[0].record_count == 1000


def test_gzip_body_of_two_concatenated_members_passes_as_java_reads_it():
    raw = encode_batch([b"a", b"b"], timestamp_ms=1)
    body = raw[BATCH_HEADER_SIZE:]
    members = gzip.compress(body[:8]) + gzip.compress(body[8:])
    assert validate_batches(reframe(raw, body=members, attributes=Compression.GZIP))[0].record_count == 2


def test_many_batches_of_one_kib_records_pass():
    buf = b"".join(encode_batch([b"x" * 1024] * 16, timestamp_ms=1) for _ in range(8))
    assert [h.record_count for h in validate_batches(buf)] == [16] * 8


# -- record count and offset deltas -----------------------------------------------------------------


def test_count_of_2_pow_31_minus_1_with_recomputed_crc_is_corrupt_message():
    raw = reframe(three_records(), count=2**31 - 1, last_delta=2**31 - 2)
    with pytest.raises(CorruptMessage, match="declares 2147483647 records but its records hold 3"):
        validate_batches(raw)


def test_count_one_above_the_records_is_corrupt_message():
    with pytest.raises(CorruptMessage, match="position 0: the batch declares 4 records but its records hold 3"):
        validate_batches(reframe(three_records(), count=4, last_delta=3))


def test_count_one_below_the_records_is_corrupt_message():
    with pytest.raises(CorruptMessage, match="8 bytes at byte 16 after the 2 records the batch declares"):
        validate_batches(reframe(three_records(), count=2, last_delta=1))


def test_count_disagreeing_with_last_offset_delta_is_invalid_record_before_any_walk():
    with pytest.raises(InvalidRecord, match="record count 2 but last offset delta 2"):
        validate_batches(reframe(three_records(), count=2))


def test_offset_deltas_0_and_2_are_invalid_record():
    builder = BatchBuilder()
    builder.append(timestamp_ms=1, key=None, value=b"a", offset_delta=0)
    builder.append(timestamp_ms=1, key=None, value=b"b", offset_delta=2)
    raw = reframe(builder.build(), last_delta=1)  # count 2 == last delta + 1: only the walk sees it
    with pytest.raises(InvalidRecord, match="record 1 at byte 8: offset delta 2, expected 1"):
        validate_batches(raw)


# -- framing of the records -------------------------------------------------------------------------


def test_record_length_running_past_the_batch_end_is_corrupt_message():
    raw = three_records()
    body = bytearray(raw[BATCH_HEADER_SIZE:])
    body[16] = 0x7E  # third record's length 7 -> 63
    with pytest.raises(CorruptMessage, match="record 2 at byte 16: length 63 runs past the end of the records"):
        validate_batches(reframe(raw, body=bytes(body)))


def test_trailing_garbage_inside_the_batch_is_corrupt_message():
    raw = three_records()
    with pytest.raises(CorruptMessage, match="3 bytes at byte 24 after the 3 records"):
        validate_batches(reframe(raw, body=raw[BATCH_HEADER_SIZE:] + b"\x00\x01\x02"))


def test_record_fields_overrunning_its_length_are_invalid_record():
    raw = three_records()
    body = bytearray(raw[BATCH_HEADER_SIZE:])
    body[5] = 0x04  # first record's value length 1 -> 2: the header count falls outside
    with pytest.raises(InvalidRecord, match="record 0 at byte 0: header count runs past"):
        validate_batches(reframe(raw, body=bytes(body)))


def test_error_names_the_position_of_the_bad_batch_and_nothing_is_accepted():
    good = three_records()
    bad = reframe(three_records(), count=4, last_delta=3)
    with pytest.raises(CorruptMessage, match=f"batch at position {len(good)}:"):
        validate_batches(good + bad)


# -- codecs -----------------------------------------------------------------------------------------


def test_gzip_attribute_on_an_uncompressed_body_is_corrupt_message():
    with pytest.raises(CorruptMessage, match="batch at position 0: gzip record data does not decompress"):
        validate_batches(reframe(three_records(), attributes=Compression.GZIP))


def test_codec_id_7_is_unsupported_for_message_format():
    with pytest.raises(UnsupportedForMessageFormat, match="unknown compression codec 7"):
        validate_batches(reframe(three_records(), attributes=7))


def test_snappy_which_lowtide_cannot_read_is_refused_on_the_leader():
    with pytest.raises(UnsupportedForMessageFormat, match="SNAPPY"):
        validate_batches(reframe(three_records(), attributes=Compression.SNAPPY))


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_lz4_or_zstd_attribute_on_an_uncompressed_body_is_corrupt_message(codec):
    with pytest.raises(CorruptMessage, match=f"batch at position 0: {codec.name.lower()} record data"):
        validate_batches(reframe(three_records(), attributes=codec))


def test_truncated_gzip_body_is_corrupt_message():
    raw = encode_batch([b"a" * 100] * 3, timestamp_ms=1, compression=Compression.GZIP)
    with pytest.raises(CorruptMessage, match="truncated"):
        validate_batches(reframe(raw, body=raw[BATCH_HEADER_SIZE:-4]))


def test_garbage_after_the_gzip_stream_is_corrupt_message():
    raw = encode_batch([b"a"], timestamp_ms=1, compression=Compression.GZIP)
    with pytest.raises(CorruptMessage, match="does not decompress"):
        validate_batches(reframe(raw, body=raw[BATCH_HEADER_SIZE:] + b"junk"))


def test_gzip_body_inflating_past_the_limit_is_message_too_large():
    raw = encode_batch([b"\x00" * 100_000], timestamp_ms=1, compression=Compression.GZIP)
    assert validate_batches(raw, max_decompressed_bytes=200_000)
    with pytest.raises(MessageTooLarge, match="inflates to more than 50000 bytes"):
        validate_batches(raw, max_decompressed_bytes=50_000)


def test_records_inside_a_gzip_body_are_walked():
    raw = three_records()
    body = zlib.compress(raw[BATCH_HEADER_SIZE:] + b"\x00")  # zlib container, one byte of garbage
    with pytest.raises(CorruptMessage, match=r"\(GZIP records\): 1 bytes at byte 24 after the 3 records"):
        validate_batches(reframe(raw, body=body, attributes=Compression.GZIP))


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_records_inside_lz4_and_zstd_bodies_are_walked(codec):
    raw = three_records()
    body = compress(codec, raw[BATCH_HEADER_SIZE:] + b"\x00")  # a well-formed frame, one byte of garbage
    with pytest.raises(CorruptMessage, match=rf"\({codec.name} records\): 1 bytes at byte 24 after the 3 records"):
        validate_batches(reframe(raw, body=body, attributes=codec))


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_truncated_lz4_and_zstd_bodies_are_corrupt_message(codec):
    raw = encode_batch([b"a" * 100] * 3, timestamp_ms=1, compression=codec)
    with pytest.raises(CorruptMessage, match="batch at position 0: .* truncated"):
        validate_batches(reframe(raw, body=raw[BATCH_HEADER_SIZE:-1]))


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_lz4_and_zstd_bodies_inflating_past_the_limit_are_message_too_large(codec):
    raw = encode_batch([b"\x00" * 100_000], timestamp_ms=1, compression=codec)
    assert validate_batches(raw, max_decompressed_bytes=200_000)
    with pytest.raises(MessageTooLarge, match="inflates to more than 50000 bytes"):
        validate_batches(raw, max_decompressed_bytes=50_000)


# -- follower input ---------------------------------------------------------------------------------


def test_follower_input_skips_the_record_walk_by_default():
    raw = reframe(three_records(), count=4, last_delta=3)
    assert validate_batches(raw, allow_compacted=True)[0].record_count == 4
    with pytest.raises(CorruptMessage, match="declares 4 records"):
        validate_batches(raw, allow_compacted=True, verify_records=True)


def test_compacted_batch_with_rising_offset_deltas_passes_a_full_check():
    builder = BatchBuilder(last_offset_delta=9)
    builder.append(timestamp_ms=1, key=b"a", value=b"1", offset_delta=3)
    builder.append(timestamp_ms=2, key=b"b", value=b"2", offset_delta=7)
    assert validate_batches(builder.build(), allow_compacted=True, verify_records=True)[0].record_count == 2


def test_leader_can_skip_the_walk_explicitly():
    raw = reframe(three_records(), count=4, last_delta=3)
    assert validate_batches(raw, verify_records=False)[0].record_count == 4
