"""Batches <-> Arrow column buffers (lowtide.record.columns): C and pure Python on the same inputs.

Every case runs through the public functions once with the C kernels and once with their Python
twins (the ``kernels`` fixture swaps ``columns.KERNELS``), and is checked value by value against the
per-record reference codec (``decode_batches``, ``BatchBuilder``, ``encode_batch``) or byte by byte.
A seeded mutation run then checks that both kernels give the same result, or the same message, on
thousands of damaged bodies.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import struct
import sys

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from lowtide.errors import CorruptMessage, UnsupportedForMessageFormat
from lowtide.record import columns
from lowtide.record.batch import (
    BatchBuilder,
    Compression,
    decode_batches,
    encode_batch,
    iter_batches,
    seal_batch,
)
from lowtide.record.columns import BinaryColumn, Columns

C_MISSING = "lowtide.record._columns is not built (needs gcc and Python headers; rerun pip install -e .)"


def require_c_kernels() -> None:
    """Skip without the C module, except in CI, which installs a compiler and must build it."""
    if columns.C_KERNELS is None:
        if os.environ.get("CI") == "true":
            pytest.fail(C_MISSING)
        pytest.skip(C_MISSING)


@pytest.fixture(params=["c", "python"])
def kernels(request, monkeypatch):
    if request.param == "c":
        require_c_kernels()
        chosen = columns.C_KERNELS
    else:
        chosen = columns.PYTHON_KERNELS
    monkeypatch.setattr(columns, "KERNELS", chosen)
    return chosen


# ---------------------------------------------------------------------------------------------------
# Helpers: read column buffers back into Python values (test side, per row) and build them.


def binary_rows(column: BinaryColumn, count: int) -> list[bytes | None]:
    """The rows of a binary column, checking its layout: offsets from 0, validity only with nulls."""
    ends = struct.unpack(f"<{count + 1}i", column.offsets)
    assert ends[0] == 0 and len(column.offsets) == 4 * (count + 1)
    assert ends[-1] == len(column.data)
    assert (column.validity is None) == (column.null_count == 0)
    if column.validity is not None:
        assert len(column.validity) == (count + 7) // 8
    rows = []
    for i in range(count):
        valid = column.validity is None or (column.validity[i >> 3] >> (i & 7)) & 1
        rows.append(bytes(column.data[ends[i] : ends[i + 1]]) if valid else None)
        if not valid:
            assert ends[i] == ends[i + 1]  # a null takes no bytes
    assert column.null_count == rows.count(None)
    return rows


def rows_of(cols: Columns) -> list[tuple]:
    """(offset, timestamp_us, timestamp_type, key, value, headers | None) per row."""
    n = cols.count
    offsets = struct.unpack(f"<{n}q", cols.offsets)
    timestamps = struct.unpack(f"<{n}q", cols.timestamps_us)
    types = struct.unpack(f"<{n}i", cols.timestamp_types)
    keys = binary_rows(cols.keys, n)
    values = binary_rows(cols.values, n)
    headers: list[list | None] = [None] * n
    if cols.headers is not None:
        h = cols.headers
        assert h.keys.validity is None and h.keys.null_count == 0
        lo = struct.unpack(f"<{n + 1}i", h.list_offsets)
        assert lo[0] == 0 and lo[-1] == h.count
        names = binary_rows(h.keys, h.count)
        header_values = binary_rows(h.values, h.count)
        headers = [list(zip(names[lo[i] : lo[i + 1]], header_values[lo[i] : lo[i + 1]], strict=True))
                   for i in range(n)]
    return list(zip(offsets, timestamps, types, keys, values, headers, strict=True))


def expected_rows(data: bytes, min_offset: int, max_offset: int, with_headers: bool) -> list[tuple]:
    """The same rows from the per-record reference decoder."""
    rows = []
    for header, records in decode_batches(data):
        if header.is_control:
            continue
        for r in records:
            if min_offset <= r.offset < max_offset:
                headers = [(k.encode(), v) for k, v in r.headers] if with_headers else None
                rows.append((r.offset, r.timestamp * 1000, header.timestamp_type, r.key, r.value, headers))
    return rows


def column_of(items: list[bytes | None], *, start: int = 0, always_bitmap: bool = False) -> BinaryColumn:
    """A binary column of ``items``; with ``start`` its data has ``start`` junk bytes first and its
    offsets begin there (as a sliced Arrow array's do)."""
    data = bytearray(b"#" * start)
    ends = [start]
    bitmap = bytearray((len(items) + 7) // 8)
    for i, item in enumerate(items):
        if item is not None:
            data += item
            bitmap[i >> 3] |= 1 << (i & 7)
        ends.append(len(data))
    nulls = items.count(None)
    return BinaryColumn(validity=bytes(bitmap) if nulls or always_bitmap else None, null_count=nulls,
                        offsets=struct.pack(f"<{len(ends)}i", *ends), data=bytes(data))


def records_body(batch: bytes) -> bytes:
    """The uncompressed records of an uncompressed batch."""
    return batch[61:]


# ---------------------------------------------------------------------------------------------------
# columnize


MIXED_VALUES = [b"a", None, b"", b"x" * 300, b"\x00\xff"]
MIXED_KEYS = [None, b"k1", b"", None, b"key-" * 40]
MIXED_HEADERS = [[("h1", b"v1"), ("h2", None)], [], [("", b"")], [("x" * 200, b"y" * 200)], [("h", None)]]


def mixed_fetch(compression: int = Compression.NONE) -> bytes:
    """Three batches at offsets 0, 5, 10 with null/empty keys and values and headers."""
    return b"".join(
        encode_batch(MIXED_VALUES, keys=MIXED_KEYS, headers=MIXED_HEADERS, timestamp_ms=[1000 + i for i in range(5)],
                     base_offset=base, compression=compression)
        for base in (0, 5, 10)
    )


@pytest.mark.parametrize("with_headers", [True, False])
def test_columns_hold_every_record_as_decode_batches_reads_it(kernels, with_headers):
    data = mixed_fetch()
    cols = columns.columnize(data, min_offset=0, max_offset=100, with_headers=with_headers)
    assert cols.count == 15
    assert rows_of(cols) == expected_rows(data, 0, 100, with_headers)
    assert (cols.headers is None) == (not with_headers)


def test_null_and_empty_keys_and_values_have_exact_validity_bitmaps(kernels):
    data = encode_batch([b"a", None, b"", None] * 3, keys=[None] * 12, timestamp_ms=7)
    cols = columns.columnize(data, min_offset=0, max_offset=100, with_headers=False)
    assert cols.values.validity == bytes([0b0101_0101, 0b0000_0101])
    assert cols.values.null_count == 6
    assert cols.values.offsets == struct.pack("<13i", 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
    assert cols.values.data == b"aaa"
    assert cols.keys.validity == b"\x00\x00" and cols.keys.null_count == 12 and cols.keys.data == b""


def test_a_column_without_nulls_has_no_validity_bitmap(kernels):
    cols = columns.columnize(encode_batch([b"a", b"bc"], keys=[b"k", b""], timestamp_ms=1), min_offset=0,
                             max_offset=9, with_headers=True)
    assert cols.keys.validity is None and cols.values.validity is None
    assert cols.headers is not None and cols.headers.count == 0
    assert cols.headers.list_offsets == struct.pack("<3i", 0, 0, 0)
    assert cols.headers.keys.offsets == cols.headers.values.offsets == struct.pack("<i", 0)


def test_headers_keep_their_order_and_null_header_values(kernels):
    data = encode_batch([b"v", b"w"], headers=[[("a", b"1"), ("b", None), ("a", b"")], [("c", None)]], timestamp_ms=1)
    cols = columns.columnize(data, min_offset=0, max_offset=9, with_headers=True)
    assert [row[5] for row in rows_of(cols)] == [[(b"a", b"1"), (b"b", None), (b"a", b"")], [(b"c", None)]]
    assert cols.headers is not None and cols.headers.values.validity == bytes([0b0101])


def test_timestamps_are_microseconds_and_create_time_is_type_zero(kernels):
    data = encode_batch([b"a", b"b"], timestamp_ms=[1_700_000_000_123, 1_700_000_000_001])
    cols = columns.columnize(data, min_offset=0, max_offset=9, with_headers=False)
    assert struct.unpack("<2q", cols.timestamps_us) == (1_700_000_000_123_000, 1_700_000_000_001_000)
    assert cols.timestamp_types == struct.pack("<2i", 0, 0)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_compressed_batches_are_inflated_before_their_records_are_cut(kernels, codec):
    data = mixed_fetch(codec)
    assert next(iter_batches(data))[0].compression == codec
    cols = columns.columnize(data, min_offset=0, max_offset=100, with_headers=True)
    assert rows_of(cols) == expected_rows(data, 0, 100, True)
    assert cols == columns.columnize(mixed_fetch(), min_offset=0, max_offset=100, with_headers=True)


@pytest.mark.parametrize(("min_offset", "max_offset", "next_offset"), [
    (0, 100, 15),   # everything: the reader continues after the last batch
    (3, 12, 12),    # straddles the first and last batch: never beyond max_offset
    (5, 10, 10),    # exactly the middle batch
    (7, 8, 8),      # one record inside the middle batch
    (15, 20, 15),   # past every batch: nothing, and never below min_offset
    (4, 6, 6),      # the last record of one batch and the first of the next
])
def test_only_records_between_min_and_max_offset_become_rows(kernels, min_offset, max_offset, next_offset):
    data = mixed_fetch(Compression.GZIP)
    cols = columns.columnize(data, min_offset=min_offset, max_offset=max_offset, with_headers=True)
    assert rows_of(cols) == expected_rows(data, min_offset, max_offset, True)
    assert [row[0] for row in rows_of(cols)] == list(range(min_offset, min(max_offset, 15)))
    assert cols.next_offset == next_offset


def test_an_empty_fetch_gives_no_rows_and_continues_at_min_offset(kernels):
    cols = columns.columnize(b"", min_offset=42, max_offset=100, with_headers=True)
    assert cols.count == 0 and cols.next_offset == 42
    assert cols.offsets == cols.timestamps_us == cols.timestamp_types == b""
    assert cols.keys == cols.values == BinaryColumn(None, 0, b"\x00\x00\x00\x00", b"")
    assert cols.headers is not None and cols.headers.list_offsets == b"\x00\x00\x00\x00"


def test_control_batches_are_skipped_but_advance_next_offset(kernels):
    control = BatchBuilder(base_offset=3, is_control=True, is_transactional=True, producer_id=7)
    control.append(timestamp_ms=5, key=b"\x00\x00\x00\x01", value=b"\x00\x00\x00\x00\x00\x00")  # a COMMIT marker
    data = (encode_batch([b"a", b"b", b"c"], timestamp_ms=1) + control.build()
            + encode_batch([b"d"], timestamp_ms=2, base_offset=4) + control.build())
    cols = columns.columnize(data, min_offset=0, max_offset=100, with_headers=False)
    assert [(row[0], row[4]) for row in rows_of(cols)] == [(0, b"a"), (1, b"b"), (2, b"c"), (4, b"d")]
    assert cols.next_offset == 4  # the trailing marker at 3 is examined too (a reader must not refetch it)
    only_marker = columns.columnize(control.build(), min_offset=3, max_offset=100, with_headers=False)
    assert only_marker.count == 0 and only_marker.next_offset == 4


def test_log_append_time_batches_give_every_record_the_max_timestamp(kernels):
    body = records_body(encode_batch([b"a", b"b", b"c"], timestamp_ms=[10, 30, 20]))
    # As a broker stamps it: attribute bit 3 and MaxTimestamp = the append time.
    data = seal_batch(body, record_count=3, base_timestamp=10, max_timestamp=99_000, timestamp_type=1, base_offset=8)
    assert data[22] & 0x08
    cols = columns.columnize(data, min_offset=0, max_offset=100, with_headers=False)
    assert struct.unpack("<3q", cols.timestamps_us) == (99_000_000,) * 3
    assert cols.timestamp_types == struct.pack("<3i", 1, 1, 1)
    assert rows_of(cols) == expected_rows(data, 0, 100, False)


def test_a_truncated_trailing_batch_is_ignored(kernels):
    whole = mixed_fetch()
    for cut in (1, 11, 12, 60, 61, 80):
        data = whole[:-cut]
        cols = columns.columnize(data, min_offset=0, max_offset=100, with_headers=True)
        assert rows_of(cols) == expected_rows(data, 0, 100, True)
        assert cols.count == 10 and cols.next_offset == 10


def test_columnize_accepts_bytearray_and_memoryview(kernels):
    data = mixed_fetch()
    expected = columns.columnize(data, min_offset=2, max_offset=13, with_headers=True)
    assert columns.columnize(bytearray(data), min_offset=2, max_offset=13, with_headers=True) == expected
    assert columns.columnize(memoryview(b"xx" + data)[2:], min_offset=2, max_offset=13, with_headers=True) == expected


def test_empty_batches_of_a_compacted_topic_give_no_rows(kernels):
    empty = BatchBuilder(base_offset=0, last_offset_delta=4).build()
    data = empty + encode_batch([b"z"], timestamp_ms=1, base_offset=5)
    cols = columns.columnize(data, min_offset=0, max_offset=100, with_headers=False)
    assert [(row[0], row[4]) for row in rows_of(cols)] == [(5, b"z")]


def test_a_compacted_batch_keeps_its_offset_gaps(kernels):
    builder = BatchBuilder(base_offset=100, last_offset_delta=9)
    for delta in (0, 4, 9):
        builder.append(timestamp_ms=delta, key=b"k%d" % delta, value=b"v", offset_delta=delta)
    cols = columns.columnize(builder.build(), min_offset=101, max_offset=200, with_headers=False)
    assert [row[0] for row in rows_of(cols)] == [104, 109]
    assert cols.next_offset == 110


def test_many_records_are_the_same_whichever_kernel_cuts_them():
    # > GIL_RELEASE_MIN_RECORDS records: the C kernel releases the GIL for them.
    require_c_kernels()
    rng = random.Random(11)
    data = b"".join(
        encode_batch([rng.randbytes(rng.randrange(40)) if rng.random() > 0.1 else None for _ in range(1000)],
                     keys=[rng.randbytes(4) if rng.random() > 0.5 else None for _ in range(1000)],
                     headers=[[("h", None)] if i % 3 else [] for i in range(1000)],
                     timestamp_ms=5, base_offset=1000 * b, compression=Compression.GZIP if b % 2 else 0)
        for b in range(3)
    )
    batches = [(memoryview(data)[pos + 61 : pos + h.size_in_bytes], pos, h.base_offset, h.base_timestamp,
                h.max_timestamp, False, h.record_count) for h, pos in iter_batches(data) if not h.compression]
    assert columns.C_KERNELS.columnize(batches, 500, 2700, True) == columns.PYTHON_KERNELS.columnize(
        batches, 500, 2700, True)
    c = columns.columnize(data, min_offset=500, max_offset=2700, with_headers=True)
    assert c.count == 2200 and rows_of(c) == expected_rows(data, 500, 2700, True)


# ---------------------------------------------------------------------------------------------------
# columnize: corrupt input

REC0 = "0e" "00" "00" "00" "01" "02" "61" "00"  # length 7 | attrs | ts 0 | offset delta 0 | null key | "a" | 0 headers
REC1 = "0e" "00" "00" "02" "01" "02" "62" "00"  # the same with offset delta 1, value "b"

CORRUPT_BODIES = [
    # (records hex, record count, the message after "batch at position P (base offset B): ")
    (REC0 + "0e" "00" "00" "02" "03" "02" "62" "00", 2, "record 1 at byte 8: invalid key length -2"),
    (REC0 + "0e" "00" "00" "02" "01" "0a" "62" "00", 2, "record 1 at byte 8: value runs past the record's length 7"),
    (REC0 + "10" "00" "00" "02" "01" "02" "62" "00" "00", 2,
     "record 1 at byte 8: its fields take 7 of its length 8 bytes"),
    ("0e" "00" "00", 1, "record 0 at byte 0: length 7 runs past the end of the records (2 bytes left)"),
    ("01", 1, "record 0 at byte 0: negative length -1"),
    ("ff", 1, "record 0 at byte 0: its length runs past the end of the records"),
    ("ffffffffff", 1, "record 0 at byte 0: its length is not a valid varint"),
    ("02" "00", 1, "record 0 at byte 0: timestamp delta runs past the record's length 1"),
    ("0e" "00" "00" "00" "01" "02" "61" "01", 1, "record 0 at byte 0: invalid header count -1"),
    ("0c" "00" "00" "00" "01" "01" "02", 1, "record 0 at byte 0: header key length runs past the record's length 6"),
    ("0e" "00" "00" "00" "01" "01" "02" "00", 1,
     "record 0 at byte 0: header value length runs past the record's length 7"),
    ("0e" "00" "00" "00" "01" "01" "02" "01", 1, "record 0 at byte 0: invalid header key length -1"),
    (REC0, 2, "the batch declares 2 records but its records hold 1"),
    (REC0 + REC1, 1, "8 bytes at byte 8 after the 1 records the batch declares"),
]


@pytest.mark.parametrize(("records_hex", "count", "message"), CORRUPT_BODIES, ids=[c[2] for c in CORRUPT_BODIES])
def test_a_corrupt_record_body_raises_corrupt_message_naming_batch_record_and_byte(kernels, records_hex, count,
                                                                                   message):
    good = encode_batch([b"ok"], timestamp_ms=1, base_offset=40)
    bad = seal_batch(bytes.fromhex(records_hex), record_count=count, base_timestamp=1, max_timestamp=1, base_offset=41)
    with pytest.raises(CorruptMessage) as info:
        columns.columnize(good + bad, min_offset=0, max_offset=100, with_headers=True)
    assert info.value.message == f"batch at position {len(good)} (base offset 41): {message}"


def test_a_corrupt_record_is_reported_even_outside_the_offset_range(kernels):
    bad = seal_batch(bytes.fromhex(REC0 + "0e" "00" "00" "02" "03" "02" "62" "00"), record_count=2,
                     base_timestamp=1, max_timestamp=1)
    with pytest.raises(CorruptMessage, match="record 1 at byte 8: invalid key length -2"):
        columns.columnize(bad, min_offset=0, max_offset=1, with_headers=False)


def test_a_bad_crc_raises_corrupt_message_unless_unchecked(kernels):
    data = bytearray(encode_batch([b"abc"], timestamp_ms=1))
    data[-2] ^= 0x01  # inside the value: still well formed
    with pytest.raises(CorruptMessage, match=r"batch at position 0 \(base offset 0\) has CRC"):
        columns.columnize(data, min_offset=0, max_offset=9, with_headers=False)
    cols = columns.columnize(data, min_offset=0, max_offset=9, with_headers=False, verify_crc=False)
    assert binary_rows(cols.values, 1) == [b"abb"]


def test_gzip_data_that_does_not_inflate_raises_corrupt_message_naming_the_batch(kernels):
    data = seal_batch(b"not gzip", record_count=1, base_timestamp=1, max_timestamp=1)
    data = data[:22] + bytes([data[22] | 1]) + data[23:]  # claim gzip without recomputing the CRC
    with pytest.raises(CorruptMessage, match=r"batch at position 0 \(base offset 0\): gzip record data"):
        columns.columnize(data, min_offset=0, max_offset=9, with_headers=False, verify_crc=False)


def test_an_unsupported_codec_raises_unsupported_for_message_format(kernels):
    data = seal_batch(b"", record_count=1, base_timestamp=1, max_timestamp=1)
    data = data[:22] + bytes([data[22] | 2]) + data[23:]  # snappy
    with pytest.raises(UnsupportedForMessageFormat, match="SNAPPY"):
        columns.columnize(data, min_offset=0, max_offset=9, with_headers=False, verify_crc=False)


def test_timestamps_that_overflow_microseconds_are_corrupt(kernels):
    body = records_body(encode_batch([b"a"], timestamp_ms=0))
    data = seal_batch(body, record_count=1, base_timestamp=2**62, max_timestamp=2**62)
    with pytest.raises(CorruptMessage, match=f"record 0 at byte 0: timestamp {2**62} ms is out of range"):
        columns.columnize(data, min_offset=0, max_offset=9, with_headers=False)


def test_offsets_and_timestamps_that_overflow_int64_are_corrupt(kernels):
    body = records_body(encode_batch([b"a", b"b", b"c"], timestamp_ms=[0, 10, 0]))
    data = seal_batch(body, record_count=3, base_timestamp=0, max_timestamp=10, base_offset=2**63 - 2)
    with pytest.raises(CorruptMessage, match="record 2 at byte 16: offset delta 2 overflows the base offset"):
        columns.columnize(data, min_offset=0, max_offset=2**63 - 1, with_headers=False)
    data = seal_batch(body, record_count=3, base_timestamp=2**63 - 5, max_timestamp=10)
    with pytest.raises(CorruptMessage, match="record 1 at byte 8: timestamp delta 10 overflows the base timestamp"):
        columns.columnize(data, min_offset=1, max_offset=9, with_headers=False)  # record 0's is not read


def outcome(data: bytes, with_headers: bool, max_offset: int) -> Columns | str:
    try:
        return columns.columnize(data, min_offset=2, max_offset=max_offset, with_headers=with_headers)
    except (CorruptMessage, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"


def test_c_and_python_kernels_agree_on_thousands_of_damaged_bodies(monkeypatch):
    require_c_kernels()
    rng = random.Random(20240601)
    disagreements = []
    corrupt = 0
    for trial in range(3000):
        n = rng.randrange(1, 6)
        body = records_body(encode_batch(
            [rng.randbytes(rng.randrange(4)) if rng.random() > 0.2 else None for _ in range(n)],
            keys=[rng.randbytes(rng.randrange(3)) if rng.random() > 0.5 else None for _ in range(n)],
            headers=[[("h" * rng.randrange(3), rng.choice([None, b"", b"v"]))] * rng.randrange(3) for _ in range(n)],
            timestamp_ms=[rng.randrange(1 << 40) for _ in range(n)],
        ))
        damaged = bytearray(body)
        for _ in range(rng.randrange(1, 4)):
            what = rng.random()
            if what < 0.6:
                damaged[rng.randrange(len(damaged))] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)])
            elif what < 0.8:
                del damaged[rng.randrange(len(damaged)):]
                damaged = damaged or bytearray(b"\x00")
            else:
                damaged.insert(rng.randrange(len(damaged) + 1), rng.randrange(256))
        count = n + rng.choice([0, 0, 0, -1, 1])
        data = seal_batch(bytes(damaged), record_count=count, max_timestamp=5,
                          base_timestamp=rng.choice([0, 2**62, -(2**62), 2**63 - 10]),
                          base_offset=rng.choice([0, 2, 2**63 - 3]), timestamp_type=rng.choice([0, 1]))
        with_headers = rng.random() < 0.5
        max_offset = rng.choice([30, 2**63 - 1])
        monkeypatch.setattr(columns, "KERNELS", columns.C_KERNELS)
        c = outcome(data, with_headers, max_offset)
        monkeypatch.setattr(columns, "KERNELS", columns.PYTHON_KERNELS)
        py = outcome(data, with_headers, max_offset)
        corrupt += isinstance(c, str)
        if c != py:
            disagreements.append((trial, bytes(damaged).hex(), count, c, py))
    assert disagreements == []
    assert 1000 < corrupt < 2900  # the run exercises both outcomes


# ---------------------------------------------------------------------------------------------------
# encode_records / encode_batch_from_columns


def builder_batch(values, keys, timestamp_ms, compression=Compression.NONE) -> bytes:
    builder = BatchBuilder(compression=compression)
    for i, value in enumerate(values):
        builder.append(timestamp_ms=timestamp_ms, key=keys[i] if keys is not None else None, value=value)
    return builder.build()


ENCODE_CASES = {
    "nulls and empties": ([b"a", None, b"", b"x" * 200, None], [None, b"k", b"", None, b"kk"]),
    "no keys": ([b"v1", b"v2", None], None),
    "all keys null": ([b"v", b"w"], [None, None]),
    "one record": ([b"only"], [b"key"]),
    "no records": ([], None),
    "200 records (two-byte offset deltas)": ([bytes([i]) * (i % 7) for i in range(200)],
                                             [None if i % 3 else b"%d" % i for i in range(200)]),
    "a 20000-byte value": ([b"z" * 20000], [b"big"]),
}


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
@pytest.mark.parametrize("case", list(ENCODE_CASES))
def test_encode_batch_from_columns_is_byte_identical_to_batch_builder(kernels, case, compression):
    values, keys = ENCODE_CASES[case]
    batch = columns.encode_batch_from_columns(values=column_of(values), keys=column_of(keys) if keys else None,
                                              count=len(values), timestamp_ms=1_700_000_000_000,
                                              compression=compression)
    assert batch == builder_batch(values, keys, 1_700_000_000_000, compression)
    if values:
        assert batch == encode_batch(values, keys=keys, timestamp_ms=1_700_000_000_000, compression=compression)


def test_encode_records_is_the_body_batch_builder_writes(kernels):
    values, keys = ENCODE_CASES["nulls and empties"]
    body = columns.encode_records(values=column_of(values), keys=column_of(keys), count=len(values))
    assert body == records_body(builder_batch(values, keys, 5))


def test_encode_records_reads_rows_by_absolute_offsets_and_ignores_extra_buffer(kernels):
    values = [b"aa", None, b"", b"bbb"]
    keys = [b"k", b"kk", None, b""]
    shifted_values = column_of(values, start=17)
    shifted_keys = column_of(keys, start=3, always_bitmap=True)
    # Longer offsets/validity/data buffers than count needs are fine (a slice of a longer array).
    longer = BinaryColumn(shifted_values.validity + b"\xff", 1, shifted_values.offsets + b"\x00" * 8,
                          shifted_values.data + b"tail")
    expected = records_body(builder_batch(values, keys, 0))
    assert columns.encode_records(values=shifted_values, keys=shifted_keys, count=4) == expected
    assert columns.encode_records(values=longer, keys=shifted_keys, count=4) == expected
    assert columns.encode_records(values=longer, keys=shifted_keys, count=2) == records_body(
        builder_batch(values[:2], keys[:2], 0))


def test_a_set_null_bit_wins_over_the_offsets_of_a_null_row(kernels):
    column = BinaryColumn(validity=b"\x05", null_count=1, offsets=struct.pack("<4i", 0, 1, 3, 4), data=b"abcd")
    assert columns.encode_records(values=column, keys=None, count=3) == records_body(
        builder_batch([b"a", None, b"d"], None, 0))


def test_encode_records_accepts_memoryviews_and_bytearrays(kernels):
    c = column_of([b"a", None, b"bc"])
    views = BinaryColumn(memoryview(c.validity), 1, bytearray(c.offsets), memoryview(c.data))
    assert columns.encode_records(values=views, keys=None, count=3) == columns.encode_records(values=c, keys=None,
                                                                                                count=3)


@pytest.mark.parametrize(("values", "keys", "count", "message"), [
    (BinaryColumn(None, 0, struct.pack("<3i", 0, 2, 9), b"abcd"), None, 2,
     "values row 1: offsets 2..9 are outside the 4 bytes of data"),
    (BinaryColumn(None, 0, struct.pack("<3i", 0, 3, 2), b"abcd"), None, 2,
     "values row 1: offsets 3..2 are outside the 4 bytes of data"),
    (BinaryColumn(None, 0, struct.pack("<2i", -1, 2), b"abcd"), None, 1,
     "values row 0: offsets -1..2 are outside the 4 bytes of data"),
    (BinaryColumn(None, 0, struct.pack("<2i", 0, 2), b"abcd"), None, 2,
     "values: 8 bytes of offsets hold 2 int32 entries; 2 rows need 3"),
    (BinaryColumn(b"\xff", 0, struct.pack("<10i", *range(10)), b"x" * 9), None, 9,
     "values: a validity bitmap of 1 bytes is too short for 9 rows"),
    (column_of([b"a", b"b"]), BinaryColumn(None, 0, struct.pack("<3i", 0, 1, 5), b"ab"), 2,
     "keys row 1: offsets 1..5 are outside the 2 bytes of data"),
    (column_of([b"a"]), None, -1, "count -1 is not a record count (0 .. 2147483647)"),
    (BinaryColumn(None, 3, struct.pack("<2i", 0, 0), b""), None, 1, "values: null_count 3 but no validity bitmap"),
])
def test_encode_records_rejects_columns_that_do_not_hold_count_rows(kernels, values, keys, count, message):
    with pytest.raises(ValueError) as info:
        columns.encode_records(values=values, keys=keys, count=count)
    assert str(info.value) == message


def test_encoded_columns_read_back_as_the_same_columns(kernels):
    values, keys = ENCODE_CASES["200 records (two-byte offset deltas)"]
    batch = columns.encode_batch_from_columns(values=column_of(values), keys=column_of(keys), count=200,
                                              timestamp_ms=123, compression=Compression.GZIP)
    cols = columns.columnize(batch, min_offset=0, max_offset=1000, with_headers=False)
    assert cols.values == column_of(values) and cols.keys == column_of(keys)
    assert cols.next_offset == 200 and cols.timestamps_us == struct.pack("<q", 123_000) * 200


# ---------------------------------------------------------------------------------------------------
# partitions_for_keys / murmur2

# org.apache.kafka.common.utils.UtilsTest#testMurmur2 (also in tests/unit/client/test_partitioner.py)
KAFKA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
                 b"a-little-bit-longer-string": -1486304829,
                 b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}


def test_murmur2_of_both_kernels_matches_kafkas_utils_test_values(kernels):
    for data, expected in KAFKA_MURMUR2.items():
        assert kernels.murmur2(data) == expected


def test_partitions_for_keys_are_kafkas_positive_murmur2_modulo_partitions(kernels):
    keys = list(KAFKA_MURMUR2) + [None, b"", None]
    got = struct.unpack(f"<{len(keys)}i", columns.partitions_for_keys(column_of(keys, start=5), len(keys), 7))
    assert list(got) == [(h & 0x7FFFFFFF) % 7 for h in KAFKA_MURMUR2.values()] + [
        -1, (kafka_python_murmur2(b"") & 0x7FFFFFFF) % 7, -1]


def test_partitions_for_random_keys_match_kafka_python(kernels):
    rng = random.Random(3)
    keys = [rng.randbytes(rng.randrange(40)) for _ in range(300)]
    got = struct.unpack("<300i", columns.partitions_for_keys(column_of(keys), 300, 13))
    assert list(got) == [(kafka_python_murmur2(k) & 0x7FFFFFFF) % 13 for k in keys]


def test_many_keys_get_the_same_partitions_from_both_kernels():
    require_c_kernels()
    rng = random.Random(5)
    keys = [rng.randbytes(rng.randrange(30)) if rng.random() > 0.1 else None for _ in range(5000)]
    col = columns._kernel_column(column_of(keys), "keys")
    assert columns.C_KERNELS.partitions_for_keys(5000, col, 100) == columns.PYTHON_KERNELS.partitions_for_keys(
        5000, col, 100)


@pytest.mark.parametrize("num_partitions", [0, -3])
def test_partitions_for_keys_rejects_a_partition_count_below_one(kernels, num_partitions):
    with pytest.raises(ValueError, match=f"num_partitions {num_partitions} is not a partition count"):
        columns.partitions_for_keys(column_of([b"a"]), 1, num_partitions)


# ---------------------------------------------------------------------------------------------------
# Arrow interop (pyarrow is optional: the spark extra)


def test_columns_load_into_pyarrow_arrays_and_sliced_arrays_encode(kernels):
    pa = pytest.importorskip("pyarrow")
    data = mixed_fetch()
    cols = columns.columnize(data, min_offset=0, max_offset=100, with_headers=True)
    n = cols.count

    def arrow(column: BinaryColumn, count: int, type_=pa.binary()):
        validity = pa.py_buffer(column.validity) if column.validity is not None else None
        return pa.Array.from_buffers(type_, count, [validity, pa.py_buffer(column.offsets), pa.py_buffer(column.data)],
                                     null_count=column.null_count)

    values = arrow(cols.values, n)
    values.validate(full=True)
    assert values.to_pylist() == MIXED_VALUES * 3
    assert arrow(cols.keys, n).to_pylist() == MIXED_KEYS * 3
    assert pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(cols.offsets)]).to_pylist() == list(range(15))
    h = cols.headers
    struct_type = pa.struct([("key", pa.string()), ("value", pa.binary())])
    entries = pa.StructArray.from_arrays([arrow(h.keys, h.count, pa.string()), arrow(h.values, h.count)],
                                         fields=list(struct_type))
    headers = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(h.list_offsets)]),
                                       entries)
    headers.validate(full=True)
    assert headers.to_pylist()[:5] == [[{"key": k, "value": v} for k, v in row] for row in MIXED_HEADERS]

    # A sliced array without nulls: its offsets from the slice's first row, the whole data buffer.
    whole = pa.array([b"a", b"bb", b"ccc", b"dddd", b"e"], pa.binary())
    part = whole.slice(1, 3)
    _, offsets, buffer = part.buffers()
    sliced = BinaryColumn(None, 0, offsets.slice(part.offset * 4), buffer)
    assert columns.encode_records(values=sliced, keys=None, count=3) == records_body(
        builder_batch([b"bb", b"ccc", b"dddd"], None, 0))


# ---------------------------------------------------------------------------------------------------
# Selection of the implementation


def test_native_says_whether_the_c_kernels_are_used():
    assert columns.NATIVE == (columns.C_KERNELS is not None)
    assert columns.KERNELS is (columns.C_KERNELS if columns.NATIVE else columns.PYTHON_KERNELS)


def test_missing_c_module_selects_the_python_kernels_with_one_warning(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "lowtide.record._columns", None)  # import now raises ImportError
    spec = importlib.util.spec_from_file_location("lowtide_columns_without_c", columns.__file__)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, probe)  # dataclasses look their module up while defining
    with caplog.at_level(logging.WARNING):
        spec.loader.exec_module(probe)
    assert probe.NATIVE is False
    assert probe.KERNELS.name == "python"
    warnings = [r for r in caplog.records if r.name == "lowtide_columns_without_c"]
    assert len(warnings) == 1 and "pure Python" in warnings[0].getMessage()


def test_the_record_package_does_not_import_pyarrow_or_the_client():
    import subprocess

    code = ("import sys, lowtide.record.columns; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'pyspark') "
            "or m.startswith('lowtide.client')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------------------
# head


@pytest.mark.parametrize("n", [0, 1, 6, 14])
def test_head_keeps_the_first_rows_and_continues_at_the_first_row_left_out(kernels, n):
    from lowtide.client.consumer import records_from_columns

    cols = columns.columnize(mixed_fetch(), min_offset=0, max_offset=100, with_headers=True)
    cut = columns.head(cols, n)
    every = records_from_columns(cols, topic="t", partition=0)
    assert cut.count == n and cut.next_offset == n
    assert records_from_columns(cut, topic="t", partition=0) == every[:n]
    for column, whole in ((cut.keys, cols.keys), (cut.values, cols.values)):
        nulls = sum(1 for i in range(n) if not (whole.validity[i >> 3] >> (i & 7)) & 1)
        assert column.null_count == nulls and (column.validity is None) == (nulls == 0)


def test_head_of_at_least_every_row_is_the_columns_themselves(kernels):
    cols = columns.columnize(mixed_fetch(), min_offset=0, max_offset=100, with_headers=False)
    assert columns.head(cols, 15) is cols and columns.head(cols, 99) is cols


# ---------------------------------------------------------------------------------------------------
# text_lines


def test_text_lines_puts_each_value_on_a_line_and_a_key_before_a_tab(kernels):
    values, keys = column_of([b"v1", b"", b"a b ~"]), column_of([b"k1", b"k2", b""])
    assert columns.text_lines(values=values, keys=None, count=3) == b"v1\n\na b ~\n"
    assert columns.text_lines(values=values, keys=keys, count=3) == b"k1\tv1\nk2\t\n\ta b ~\n"
    assert columns.text_lines(values=values, keys=keys, count=0) == b""


def test_text_lines_reads_offsets_that_do_not_start_at_zero(kernels):
    assert columns.text_lines(values=column_of([b"x", b"yz"], start=5), keys=None, count=2) == b"x\nyz\n"


@pytest.mark.parametrize("cell", [None, b"back\\slash", b"new\nline", b"tab\t", b"\x7f", b"caf\xc3\xa9", b"\x00"])
def test_text_lines_gives_none_for_a_null_or_a_byte_a_console_consumer_escapes(kernels, cell):
    assert columns.text_lines(values=column_of([b"ok", cell]), keys=None, count=2) is None
    assert columns.text_lines(values=column_of([b"ok", b"ok"]), keys=column_of([b"k", cell]), count=2) is None
    # Rows past count are not looked at.
    assert columns.text_lines(values=column_of([b"ok", cell]), keys=None, count=1) == b"ok\n"


def test_text_lines_refuses_offsets_outside_the_data(kernels):
    bad = BinaryColumn(validity=None, null_count=0, offsets=struct.pack("<2i", 0, 9), data=b"abc")
    with pytest.raises(ValueError, match="outside the 3 bytes"):
        columns.text_lines(values=bad, keys=None, count=1)


def test_text_lines_judges_every_byte_value_at_every_place_of_a_word_and_its_tail(kernels):
    # The C checks eight bytes a step (SWAR) and the rest one by one: every byte at each of the 11
    # places of an 11-byte cell covers both.
    for byte in range(256):
        plain = 0x20 <= byte <= 0x7E and byte != 0x5C
        for place in range(11):
            cell = bytearray(b"abcdefghijk")
            cell[place] = byte
            got = columns.text_lines(values=column_of([bytes(cell)]), keys=None, count=1)
            assert (got == bytes(cell) + b"\n") if plain else got is None, (byte, place)
