"""The per-record walk of a RecordBatch v2 body: the C walker, or its pure-Python twin as a fallback.

The leader validates every record of a produced batch (docs/design/invariants.md, rule 5;
Kafka's LogValidator) without a per-record Python loop on the produce path
(docs/testing.md#targets), so the walk is ``_validate.c``, built by ``pip install -e .``. When
that build failed (no compiler or Python headers) ``walk_records`` is ``walk_records_py`` below,
with the same rules, return values and messages, and one warning is logged at import. Tests run
both on the same inputs and compare.

Input: the records of one batch, after decompression (what follows the 61-byte header)::

    Records => Record x RecordCount, back to back, nothing after the last one

    Record =>                                       checked
      Length            => Varint   (int32)         >= 0, record ends inside the body
      Attributes        => Int8                     present (value unused)
      TimestampDelta    => Varlong  (int64)         well formed
      OffsetDelta       => Varint                   == record index (see below)
      KeyLength         => Varint   (-1 = null)     >= -1, key inside the record
      Key               => Bytes
      ValueLength       => Varint   (-1 = null)     >= -1, value inside the record
      Value             => Bytes
      HeaderCount       => Varint                   >= 0
      Headers           => Header x HeaderCount
        HeaderKeyLength   => Varint                 >= 0 (a header key is never null)
        HeaderKey         => Bytes (UTF-8)
        HeaderValueLength => Varint  (-1 = null)    >= -1
        HeaderValue       => Bytes
      (the fields end exactly Length bytes after the Length varint)

    Varint = zig-zag, 7 bits per byte, low group first, high bit = more bytes follow; an int32
    takes at most 5 bytes (the 5th holds 4 bits), an int64 at most 10 (the 10th holds 1 bit).

Offset deltas: when RecordCount == LastOffsetDelta + 1 (every produced batch) record i must have
delta i; otherwise (a compacted batch) deltas rise strictly and stay <= LastOffsetDelta.

Result: None, or (code, message) with Kafka's code: 2 CORRUPT_MESSAGE when the body cannot be cut
into the declared records (a length runs past the end, bytes left over, fewer records), 87
INVALID_RECORD when one record is inconsistent inside (Kafka's InvalidRecordException cases).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

CORRUPT_MESSAGE = 2
INVALID_RECORD = 87

WalkResult = tuple[int, str] | None
Walker = Callable[[bytes | bytearray | memoryview, int, int], WalkResult]

log = logging.getLogger(__name__)


VARINT_TRUNCATED = 1
VARINT_MALFORMED = 2

# The fields after Attributes and TimestampDelta, in order: (name, lowest valid value). The bytes
# fields follow their length; headers repeat the last two pairs HeaderCount times.
_KEY_VALUE = (("key", -1), ("value", -1))
_HEADER = (("header key", 0), ("header value", -1))


def read_varint(data: bytes, pos: int, end: int, max_bytes: int, last_bits: int) -> tuple[int, int] | int:
    """(value, next position), or VARINT_TRUNCATED (ran past ``end``) / VARINT_MALFORMED (too long or too wide)."""
    raw = 0
    for i in range(max_bytes):
        if pos >= end:
            return VARINT_TRUNCATED
        c = data[pos]
        pos += 1
        if i == max_bytes - 1 and c >> last_bits:
            return VARINT_MALFORMED
        raw |= (c & 0x7F) << (7 * i)
        if c < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
    return VARINT_MALFORMED


def walk_records_py(buffer: bytes | bytearray | memoryview, expected_count: int, last_offset_delta: int) -> WalkResult:
    """Pure-Python twin of ``_validate.walk_records`` (only used when the C module is missing).

    One per-record loop, as in the C; the messages are built the same way, character for character.
    """
    data = bytes(buffer)
    consecutive = expected_count == last_offset_delta + 1
    n = len(data)
    pos = 0
    index = 0
    prev_delta = -1
    while pos < n:
        if index >= expected_count:
            return CORRUPT_MESSAGE, (
                f"{n - pos} bytes at byte {pos} after the {expected_count} records the batch declares"
            )
        start = pos
        got = read_varint(data, pos, n, 5, 4)
        if got == VARINT_TRUNCATED:
            return CORRUPT_MESSAGE, f"record {index} at byte {start}: its length runs past the end of the records"
        if got == VARINT_MALFORMED:
            return CORRUPT_MESSAGE, f"record {index} at byte {start}: its length is not a valid varint"
        length, pos = got  # type: ignore[misc]
        if length < 0:
            return CORRUPT_MESSAGE, f"record {index} at byte {start}: negative length {length}"
        if length > n - pos:
            return CORRUPT_MESSAGE, (
                f"record {index} at byte {start}: length {length} runs past the end of the records "
                f"({n - pos} bytes left)"
            )
        problem = _walk_one(data, pos, pos + length, index, consecutive, prev_delta, last_offset_delta)
        if isinstance(problem, str):
            return INVALID_RECORD, f"record {index} at byte {start}: {problem}"
        prev_delta = problem
        pos += length
        index += 1
    if index != expected_count:
        return CORRUPT_MESSAGE, f"the batch declares {expected_count} records but its records hold {index}"
    return None


def _walk_one(
    data: bytes, pos: int, rec_end: int, index: int, consecutive: bool, prev_delta: int, last_offset_delta: int
) -> int | str:
    """Check one record's fields (between ``pos`` and ``rec_end``); its offset delta, or what is wrong."""
    length = rec_end - pos
    past = f"runs past the record's length {length}"
    if pos >= rec_end:
        return f"attributes {past}"
    pos += 1  # attributes: unused by RecordBatch v2
    got = read_varint(data, pos, rec_end, 10, 1)
    if not isinstance(got, tuple):
        return f"timestamp delta {past}" if got == VARINT_TRUNCATED else "timestamp delta is not a valid varint"
    pos = got[1]
    got = read_varint(data, pos, rec_end, 5, 4)
    if not isinstance(got, tuple):
        return f"offset delta {past}" if got == VARINT_TRUNCATED else "offset delta is not a valid varint"
    delta, pos = got
    if consecutive:
        if delta != index:
            return f"offset delta {delta}, expected {index}"
    elif delta <= prev_delta or delta > last_offset_delta:
        return f"offset delta {delta} is not above {prev_delta} or is past the last offset delta {last_offset_delta}"
    fields = _KEY_VALUE
    headers = -1  # -1: key and value not read yet
    while True:
        for name, low in fields:
            got = read_varint(data, pos, rec_end, 5, 4)
            if not isinstance(got, tuple):
                return f"{name} length {past}" if got == VARINT_TRUNCATED else f"{name} length is not a valid varint"
            size, pos = got
            if size < low:
                return f"invalid {name} length {size}"
            if size > 0:
                if size > rec_end - pos:
                    return f"{name} {past}"
                pos += size
        if headers < 0:
            got = read_varint(data, pos, rec_end, 5, 4)
            if not isinstance(got, tuple):
                return f"header count {past}" if got == VARINT_TRUNCATED else "header count is not a valid varint"
            headers, pos = got
            if headers < 0:
                return f"invalid header count {headers}"
            fields = _HEADER
        if headers == 0:
            break
        headers -= 1
    if pos != rec_end:
        return f"its fields take {pos - (rec_end - length)} of its length {length} bytes"
    return delta


walk_records_c: Walker | None
try:
    from lowtide.record._validate import walk_records as walk_records_c
except ImportError as exc:  # the optional C build failed: slower, same answers
    walk_records_c = None
    log.warning(
        "lowtide.record._validate (C record walker) is not built (%s); validating produced records in "
        "pure Python, which is much slower. Install gcc and the Python headers, then rerun "
        "'pip install -e .' (make setup).",
        exc,
    )

walk_records: Walker = walk_records_c if walk_records_c is not None else walk_records_py
WALKER = "c" if walk_records_c is not None else "python"
