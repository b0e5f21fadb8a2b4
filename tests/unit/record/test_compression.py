"""LZ4 and ZSTD record compression, byte-exact with what Kafka's Java producer writes.

The LZ4 reference is ``kafka_lz4_frame`` below: Kafka's ``Lz4BlockOutputStream`` framing re-stated in
the test (magic, FLG, BD, HC = second byte of XXH32 over FLG and BD, 64 KiB blocks each compressed
alone by liblz4's one-shot fast compressor as lz4-java's JNI fastCompressor does, an incompressible
block stored raw with the size's high bit set, optional XXH32 block checksums, end mark) with a
pure-Python XXH32, so only the block compressor call is shared with lowtide; liblz4's own frame
reader and writer check the framing independently. The ZSTD reference is libzstd's streaming writer
fed 16 KiB at a time, as Kafka's ``BufferedOutputStream(ZstdOutputStream)`` feeds zstd-jni. The peer
for whole batches is kafka-python.
"""

from __future__ import annotations

import io
import os
import struct
import tracemalloc

import lz4.block
import lz4.frame
import pytest
import zstandard
from kafka.record.default_records import DefaultRecordBatch

from lowtide.errors import CorruptMessage, MessageTooLarge
from lowtide.record.batch import BATCH_HEADER_SIZE, Compression, decode_batch, encode_batch, read_header
from lowtide.record.compression import (
    BY_NAME,
    SUPPORTED,
    compress,
    decompress,
    lz4_frame_bound,
    zstd_frames_bound,
)
from tests.unit.record.test_batch import RECORDS, build_with_kafka_python, build_with_lowtide

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 (the LZ4 frame format's checksum), written out from its specification."""
    n, i = len(data), 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed, (seed - _P1) & _M32]
        while i + 16 <= n:
            for lane, word in enumerate(struct.unpack_from("<4I", data, i)):
                v[lane] = (_rotl((v[lane] + word * _P2) & _M32, 13) * _P1) & _M32
            i += 16
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while i + 4 <= n:
        h = (_rotl((h + struct.unpack_from("<I", data, i)[0] * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    while i < n:
        h = (_rotl((h + data[i] * _P5) & _M32, 11) * _P1) & _M32
        i += 1
    h = ((h ^ (h >> 15)) * _P2) & _M32
    h = ((h ^ (h >> 13)) * _P3) & _M32
    return h ^ (h >> 16)


def kafka_lz4_frame(data: bytes, *, block_checksum: bool = False) -> bytes:
    """What Kafka's Lz4BlockOutputStream (magic >= 1, default level) writes for ``data``."""
    flg = 0x40 | 0x20 | (0x10 if block_checksum else 0)  # version 01, independent blocks
    bd = 4 << 4  # 64 KiB blocks
    out = bytearray(b"\x04\x22\x4d\x18") + bytes([flg, bd, (xxh32(bytes([flg, bd])) >> 8) & 0xFF])
    for i in range(0, len(data), 64 << 10):
        chunk = data[i:i + (64 << 10)]
        packed = lz4.block.compress(chunk, mode="default", store_size=False)
        body, size = (chunk, len(chunk) | 0x80000000) if len(packed) >= len(chunk) else (packed, len(packed))
        out += struct.pack("<I", size) + body
        if block_checksum:
            out += struct.pack("<I", xxh32(body))
    out += b"\x00\x00\x00\x00"
    return bytes(out)


def kafka_zstd_frame(data: bytes) -> bytes:
    """What Kafka's ZSTD codec writes: zstd-jni's streaming compressor at level 3, fed through a
    16 KiB BufferedOutputStream and closed (no pledged size, so no content size; no checksum)."""
    sink = io.BytesIO()
    writer = zstandard.ZstdCompressor(level=3, write_content_size=False, write_checksum=False).stream_writer(
        sink, closefd=False)
    for i in range(0, len(data), 16 << 10):
        writer.write(data[i:i + (16 << 10)])
    writer.flush(zstandard.FLUSH_FRAME)
    return sink.getvalue()


PAYLOADS = {
    "empty": b"",
    "one byte": b"a",
    "short text": b"hello lowtide " * 20,
    "exactly one block": bytes(range(256)) * 256,
    "compressible, several blocks": (b"record-" * 5000 + os.urandom(64)) * 8,
    "incompressible, several blocks": os.urandom(150_000),
}


# -- LZ4 ---------------------------------------------------------------------------------------------


def test_xxh32_of_the_test_matches_the_published_vectors():
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"a") == 0x550D7456
    assert xxh32(b"abc") == 0x32D153FF
    assert xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F


def test_lz4_of_one_byte_is_the_handwritten_kafka_frame():
    assert compress(Compression.LZ4, b"a").hex() == (
        "04224d18"  # LZ4 frame magic, little-endian 0x184D2204
        "60"  # FLG: version 01, block independence, no block/content checksum, no content size
        "40"  # BD: 64 KiB maximum block size
        "82"  # HC: (XXH32(FLG BD) >> 8) & 0xFF
        "01000080"  # block of 1 byte, high bit: stored uncompressed (1 byte does not compress)
        "61"  # "a"
        "00000000"  # end mark; no content checksum
    )


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_lz4_is_byte_identical_to_kafkas_lz4_block_output_stream(name):
    data = PAYLOADS[name]
    assert compress(Compression.LZ4, data) == kafka_lz4_frame(data)


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_liblz4s_frame_reader_reads_lowtides_lz4(name):
    data = PAYLOADS[name]
    for source in (data, bytearray(data), memoryview(data)):
        assert lz4.frame.decompress(compress(Compression.LZ4, source)) == data


@pytest.mark.parametrize("name", ["empty", "one byte", "short text"])
def test_under_one_block_liblz4s_frame_writer_with_kafkas_settings_writes_the_same_bytes(name):
    # (From 64 KiB on, LZ4F's framer reuses its context between blocks and limits their output,
    # and its blocks differ by a few bytes from lz4-java's one-shot ones: Kafka's are the latter.)
    data = PAYLOADS[name]
    assert compress(Compression.LZ4, data) == lz4.frame.compress(
        data, compression_level=0, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
        content_checksum=False, block_checksum=False, store_size=False)


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_lz4_frames_with_block_checksums_decode(name):
    data = PAYLOADS[name]
    frame = kafka_lz4_frame(data, block_checksum=True)
    assert frame[4] == 0x70
    assert decompress(Compression.LZ4, frame) == data
    assert decompress(Compression.LZ4, memoryview(frame), max_size=max(1, len(data))) == data


def test_lz4_frames_of_other_writers_decode():
    data = PAYLOADS["compressible, several blocks"]
    # kafka-python / librdkafka style: content size in the header; the lz4 CLI's content checksum;
    # bigger blocks.
    for frame in (lz4.frame.compress(data, block_linked=False),
                  lz4.frame.compress(data, block_linked=False, content_checksum=True),
                  lz4.frame.compress(data, block_linked=False, block_size=lz4.frame.BLOCKSIZE_MAX4MB)):
        assert decompress(Compression.LZ4, frame) == data
        assert decompress(Compression.LZ4, frame, max_size=len(data)) == data


def test_lz4_dependent_blocks_are_refused_as_kafka_refuses_them():
    frame = kafka_lz4_frame(PAYLOADS["short text"])
    flg, bd = frame[4] & ~0x20, frame[5]  # block independence off, header checksum made right again
    frame = frame[:4] + bytes([flg, bd, (xxh32(bytes([flg, bd])) >> 8) & 0xFF]) + frame[7:]
    with pytest.raises(CorruptMessage, match="dependent blocks"):
        decompress(Compression.LZ4, frame)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: f[:-2], "truncated: the LZ4 frame does not end"),
    (lambda f: f[:len(f) // 2], "truncated: the LZ4 frame does not end"),
    (lambda f: f + b"junk", "4 bytes after the end of the LZ4 frame"),
    (lambda f: f + f, "after the end of the LZ4 frame"),
    (lambda f: f[:6] + bytes([f[6] ^ 1]) + f[7:], "does not decompress.*headerChecksum"),
    (lambda f: b"\x00" + f[1:], "not an LZ4 frame"),
    (lambda f: b"", "not an LZ4 frame"),
])
def test_damaged_lz4_data_is_corrupt_message(damage, message):
    frame = kafka_lz4_frame(PAYLOADS["compressible, several blocks"])
    with pytest.raises(CorruptMessage, match=message):
        decompress(Compression.LZ4, damage(frame), max_size=1 << 20)


def test_lz4_block_checksum_mismatch_is_corrupt_message():
    frame = bytearray(kafka_lz4_frame(PAYLOADS["short text"], block_checksum=True))
    frame[-5] ^= 1  # last byte of the block checksum
    with pytest.raises(CorruptMessage, match="blockChecksum"):
        decompress(Compression.LZ4, bytes(frame))


def test_lz4_inflating_past_the_limit_is_message_too_large():
    frame = compress(Compression.LZ4, b"\x00" * 1_000_000)
    assert len(frame) < 5000
    assert decompress(Compression.LZ4, frame, max_size=1_000_000) == b"\x00" * 1_000_000
    with pytest.raises(MessageTooLarge, match="lz4 record data inflates to more than 999999 bytes"):
        decompress(Compression.LZ4, frame, max_size=999_999)


def test_lz4_bound_is_at_least_the_content_and_counts_raw_blocks_exactly():
    assert lz4_frame_bound(compress(Compression.LZ4, b"")) == 0
    data = PAYLOADS["incompressible, several blocks"]
    assert lz4_frame_bound(compress(Compression.LZ4, data)) == len(data)  # every block stored raw
    data = PAYLOADS["compressible, several blocks"]
    assert len(data) <= lz4_frame_bound(compress(Compression.LZ4, data)) < len(data) + (64 << 10)


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_the_limit_bounds_the_memory_a_small_body_makes_the_leader_allocate(codec):
    frame = compress(codec, b"x" * 1_000_000)
    tracemalloc.start()
    try:
        assert len(decompress(codec, frame, max_size=64 << 20)) == 1_000_000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # about the output, not the 64 MiB limit


# -- ZSTD --------------------------------------------------------------------------------------------


def test_zstd_frame_header_is_the_streaming_one_kafka_writes():
    frame = compress(Compression.ZSTD, b"hello lowtide " * 20)
    assert frame[:4] == b"\x28\xb5\x2f\xfd"  # zstd magic
    assert frame[4] == 0x00  # FHD: no content size, not single-segment, no checksum, no dictionary
    assert frame[5] == 0x58  # window descriptor: 2^21 = 2 MiB, level 3's window
    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert not params.has_checksum and params.dict_id == 0 and params.window_size == 2 << 20


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_zstd_is_byte_identical_to_kafkas_streaming_zstd_output(name):
    data = PAYLOADS[name]
    frame = compress(Compression.ZSTD, data)
    assert frame == kafka_zstd_frame(data)
    assert decompress(Compression.ZSTD, frame) == data
    assert decompress(Compression.ZSTD, memoryview(frame), max_size=max(1, len(data))) == data


def test_zstd_frames_of_other_writers_decode():
    data = PAYLOADS["compressible, several blocks"]
    one_shot = zstandard.ZstdCompressor(level=3)  # kafka-python: content size in the header
    checksummed = zstandard.ZstdCompressor(level=19, write_checksum=True)
    for frame in (one_shot.compress(data), checksummed.compress(data)):
        assert decompress(Compression.ZSTD, frame) == data
        assert decompress(Compression.ZSTD, frame, max_size=len(data)) == data


def test_zstd_frames_back_to_back_and_skippable_frames_decode_as_zstd_jni_reads_them():
    a, b = PAYLOADS["short text"], PAYLOADS["exactly one block"]
    skippable = struct.pack("<II", 0x184D2A5E, 3) + b"xyz"
    data = skippable + compress(Compression.ZSTD, a) + compress(Compression.ZSTD, b)
    assert decompress(Compression.ZSTD, data) == a + b
    assert decompress(Compression.ZSTD, data, max_size=len(a + b)) == a + b


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: f[:-1], "truncated: the frame at byte 0 does not end"),
    (lambda f: f[:len(f) // 2], "truncated"),
    (lambda f: f[:5], "truncated"),
    (lambda f: f + b"junk", r"no zstd frame at byte \d+"),
    (lambda f: b"", "empty"),
    (lambda f: b"\x00" + f[1:], "no zstd frame at byte 0"),
    (lambda f: f[:4] + bytes([f[4] | 0x08]) + f[5:], "reserved bit"),
])
def test_damaged_zstd_data_is_corrupt_message(damage, message):
    frame = compress(Compression.ZSTD, PAYLOADS["compressible, several blocks"])
    with pytest.raises(CorruptMessage, match=message):
        decompress(Compression.ZSTD, damage(frame), max_size=1 << 20)


def test_zstd_body_that_does_not_decode_is_corrupt_message():
    frame = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(PAYLOADS["short text"]))
    frame[-1] ^= 1  # the content checksum
    with pytest.raises(CorruptMessage, match="zstd record data does not decompress"):
        decompress(Compression.ZSTD, bytes(frame))


def test_zstd_inflating_past_the_limit_is_message_too_large():
    frame = compress(Compression.ZSTD, b"\x00" * 10_000_000)
    assert len(frame) < 2000 and zstd_frames_bound(frame) >= 10_000_000
    assert decompress(Compression.ZSTD, frame, max_size=10_000_000) == b"\x00" * 10_000_000
    with pytest.raises(MessageTooLarge, match="zstd record data inflates to more than 9999999 bytes"):
        decompress(Compression.ZSTD, frame, max_size=9_999_999)


def test_zstd_bound_is_at_least_the_content_and_walks_every_block():
    data = PAYLOADS["incompressible, several blocks"]
    frame = compress(Compression.ZSTD, data)
    assert len(data) <= zstd_frames_bound(frame) <= len(data) + (128 << 10)


# -- whole batches -----------------------------------------------------------------------------------


def test_codec_names_are_kafkas_compression_type_values():
    assert BY_NAME == {"none": 0, "gzip": 1, "lz4": 3, "zstd": 4}
    assert set(BY_NAME.values()) == SUPPORTED


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_a_batch_compressed_with_each_codec_decodes_to_the_same_records(codec):
    plain = decode_batch(build_with_lowtide(RECORDS))[1]
    raw = build_with_lowtide(RECORDS, compression=codec)
    header, records = decode_batch(raw)
    assert header.compression == codec
    assert records == plain
    assert raw[:BATCH_HEADER_SIZE] != build_with_lowtide(RECORDS)[:BATCH_HEADER_SIZE]  # attributes, length, CRC


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_lz4_and_zstd_batches_written_by_lowtide_decode_in_kafka_python(codec):
    batch = DefaultRecordBatch(build_with_lowtide(RECORDS, compression=codec))
    assert batch.validate_crc()
    assert batch.compression_type == codec
    assert [(r.timestamp, r.key, r.value, list(r.headers)) for r in batch] == [
        (ts, k, v, list(h)) for ts, k, v, h in RECORDS]


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_lz4_and_zstd_batches_written_by_kafka_python_decode_in_lowtide(codec):
    raw = build_with_kafka_python(RECORDS, compression=int(codec))
    header, records = decode_batch(raw)
    assert header.compression == codec  # the data compresses, so kafka-python kept the codec
    assert [(r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (ts, k, v, tuple(h)) for ts, k, v, h in RECORDS]


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_batch_body_is_exactly_the_kafka_frame_of_the_uncompressed_records(codec):
    values = [b"value-%d" % i * 50 for i in range(2000)]
    plain = encode_batch(values, timestamp_ms=1)
    packed = encode_batch(values, timestamp_ms=1, compression=codec)
    body = plain[BATCH_HEADER_SIZE:]
    frame = kafka_lz4_frame(body) if codec == Compression.LZ4 else kafka_zstd_frame(body)
    assert packed[BATCH_HEADER_SIZE:] == frame
    assert read_header(packed).batch_length == read_header(plain).batch_length - len(body) + len(frame)
