"""THE record walker in pure Python: the twin of ``_walk.h``, used by every Python fallback.

Validation (``validate.walk_records_py``), batch parsing and the cleaner's rewrite
(``validate.record_fields_py``) and the Arrow columns (``columns.columnize_py``) walk a batch's
records with ``iter_records`` only when the C extensions are not built; with them, the same walk is
``walk_records`` in ``_walk.h``. Both make the same checks in the same order and build the same
messages, character for character; tests run both on the same inputs and compare.

Input: the records of one batch, after decompression (what follows the 61-byte header)::

    Records => Record x RecordCount, back to back, nothing after the last one

    Record =>                                       checked                 RecordFields item
      Length            => Varint   (int32)         >= 0, inside the body   start (its byte)
      Attributes        => Int8                     present (value unused)  body (its byte)
      TimestampDelta    => Varlong  (int64)         well formed             timestamp_delta
      OffsetDelta       => Varint                   see below               delta_pos, offset_delta
      KeyLength         => Varint   (-1 = null)     >= -1, key inside       key_len
      Key               => Bytes                                            key (its byte)
      ValueLength       => Varint   (-1 = null)     >= -1, value inside     value_len
      Value             => Bytes                                            value (its byte)
      HeaderCount       => Varint                   >= 0                    header_count
      Headers           => Header x HeaderCount                             headers (first byte)
        HeaderKeyLength   => Varint                 >= 0 (a header key is never null)
        HeaderKey         => Bytes (UTF-8, not checked)
        HeaderValueLength => Varint  (-1 = null)    >= -1
        HeaderValue       => Bytes
      (the fields end exactly Length bytes after the Length varint)      end

    Varint = zig-zag, 7 bits per byte, low group first, high bit = more bytes follow; an int32
    takes at most 5 bytes (the 5th holds 4 bits), an int64 at most 10 (the 10th holds 1 bit).

Offset deltas: always well formed, and BaseOffset + delta must fit an int64. With
``last_offset_delta`` (the leader's validation): when RecordCount == LastOffsetDelta + 1 (every
produced batch) record i must have delta i; otherwise (a compacted batch) deltas rise strictly and
stay <= LastOffsetDelta.

Errors (``WalkError``): code 2 CORRUPT_MESSAGE when the body cannot be cut into the declared
records (a Length runs past the end, bytes left over, fewer records), 87 INVALID_RECORD when one
record is inconsistent inside (Kafka's InvalidRecordException cases).
"""

from __future__ import annotations

from collections.abc import Iterator

CORRUPT_MESSAGE = 2
INVALID_RECORD = 87

VARINT_TRUNCATED = 1
VARINT_MALFORMED = 2
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

# (start, body, delta_pos, end, timestamp_delta, offset_delta, key, key_len, value, value_len,
#  headers, header_count): byte positions and field values of one record (lengths -1 = null).
RecordFields = tuple[int, int, int, int, int, int, int, int, int, int, int, int]


# The bytes fields of a header: (name in messages, lowest valid length).
_HEADER = (("header key", 0), ("header value", -1))


class WalkError(Exception):
    """A body the walk refuses: Kafka's error ``code`` and a ``message`` naming the record."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


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


def _varint(data: bytes, pos: int, end: int, max_bytes: int, last_bits: int) -> tuple[int, int] | int:
    """read_varint with the one- and two-byte cases first: almost every length and delta (< 8192)."""
    if pos + 1 < end:
        c = data[pos]
        if c < 0x80:
            return (c >> 1) ^ -(c & 1), pos + 1
        d = data[pos + 1]
        if d < 0x80:
            raw = (c & 0x7F) | (d << 7)
            return (raw >> 1) ^ -(raw & 1), pos + 2
    return read_varint(data, pos, end, max_bytes, last_bits)


def _invalid(index: int, start: int, problem: str) -> WalkError:
    return WalkError(INVALID_RECORD, f"record {index} at byte {start}: {problem}")


def _bad_varint(got: int, name: str, index: int, start: int, length: int) -> WalkError:
    """The error of a field varint that read_varint refused (``got``: why)."""
    if got == VARINT_TRUNCATED:
        return _invalid(index, start, f"{name} runs past the record's length {length}")
    return _invalid(index, start, f"{name} is not a valid varint")


def _bytes_field(data, pos: int, end: int, what: str, index: int, start: int,
                 length: int) -> tuple[int, int, int]:
    """A record's key or value at ``pos``: (its length, -1 for null; where its bytes start; where
    the next field starts)."""
    got = _varint(data, pos, end, 5, 4)
    if got.__class__ is not tuple:
        raise _bad_varint(got, f"{what} length", index, start, length)  # type: ignore[arg-type]
    size, at = got  # type: ignore[misc]
    if size < -1:
        raise _invalid(index, start, f"invalid {what} length {size}")
    if size > 0:
        if size > end - at:
            raise _invalid(index, start, f"{what} runs past the record's length {length}")
        return size, at, at + size
    return size, at, at


def iter_records(
    data: bytes, expected_count: int, *, last_offset_delta: int | None = None, base_offset: int = 0
) -> Iterator[RecordFields]:
    """Walk ``data`` (bytes: indexing a memoryview is slower) and yield each record's fields once
    the record passed every check; raise WalkError at the first problem, checking in _walk.h's
    order. ``last_offset_delta``: check the offset deltas (module docstring); None: any order.

    One flat loop, the key and value reads written out and messages formatted only on failure:
    without the C module this runs for every record of every batch, so its cost is per field."""
    check_deltas = last_offset_delta is not None
    consecutive = check_deltas and expected_count == last_offset_delta + 1  # type: ignore[operator]
    n = len(data)
    pos = 0
    index = 0
    prev_delta = -1
    while pos < n:
        if index >= expected_count:
            raise WalkError(CORRUPT_MESSAGE,
                            f"{n - pos} bytes at byte {pos} after the {expected_count} records the batch declares")
        start = pos
        got = _varint(data, pos, n, 5, 4)
        if got.__class__ is not tuple:
            raise WalkError(CORRUPT_MESSAGE, f"record {index} at byte {start}: " + (
                "its length runs past the end of the records" if got == VARINT_TRUNCATED
                else "its length is not a valid varint"))
        length, body = got  # type: ignore[misc]
        if length < 0:
            raise WalkError(CORRUPT_MESSAGE, f"record {index} at byte {start}: negative length {length}")
        if length > n - body:
            raise WalkError(CORRUPT_MESSAGE, f"record {index} at byte {start}: length {length} runs past the end "
                                             f"of the records ({n - body} bytes left)")
        end = body + length
        if body >= end:
            raise _invalid(index, start, f"attributes runs past the record's length {length}")
        # body + 1: the attributes byte is unused by RecordBatch v2
        got = _varint(data, body + 1, end, 10, 1)
        if got.__class__ is not tuple:
            raise _bad_varint(got, "timestamp delta", index, start, length)  # type: ignore[arg-type]
        ts_delta, delta_pos = got  # type: ignore[misc]
        got = _varint(data, delta_pos, end, 5, 4)
        if got.__class__ is not tuple:
            raise _bad_varint(got, "offset delta", index, start, length)  # type: ignore[arg-type]
        delta, pos = got  # type: ignore[misc]
        if check_deltas:
            if consecutive:
                if delta != index:
                    raise _invalid(index, start, f"offset delta {delta}, expected {index}")
            elif delta <= prev_delta or delta > last_offset_delta:  # type: ignore[operator]
                raise _invalid(index, start, f"offset delta {delta} is not above {prev_delta} or is past the last "
                                             f"offset delta {last_offset_delta}")
            prev_delta = delta
        if not _INT64_MIN <= base_offset + delta <= _INT64_MAX:
            raise _invalid(index, start, f"offset delta {delta} overflows the base offset")
        # Key then value: a length varint (>= -1), then that many bytes.
        key_len, key, pos = _bytes_field(data, pos, end, "key", index, start, length)
        value_len, value, pos = _bytes_field(data, pos, end, "value", index, start, length)
        got = _varint(data, pos, end, 5, 4)
        if got.__class__ is not tuple:
            raise _bad_varint(got, "header count", index, start, length)  # type: ignore[arg-type]
        header_count, headers = got  # type: ignore[misc]
        if header_count < 0:
            raise _invalid(index, start, f"invalid header count {header_count}")
        pos = headers
        for _ in range(header_count):  # each header takes >= 2 bytes: a huge count ends at the record's end
            for name, low in _HEADER:
                got = _varint(data, pos, end, 5, 4)
                if got.__class__ is not tuple:
                    raise _bad_varint(got, f"{name} length", index, start, length)  # type: ignore[arg-type]
                size, pos = got  # type: ignore[misc]
                if size < low:
                    raise _invalid(index, start, f"invalid {name} length {size}")
                if size > 0:
                    if size > end - pos:
                        raise _invalid(index, start, f"{name} runs past the record's length {length}")
                    pos += size
        if pos != end:
            raise _invalid(index, start, f"its fields take {pos - body} of its length {length} bytes")
        yield (start, body, delta_pos, end, ts_delta, delta, key, key_len, value, value_len, headers, header_count)
        pos = end
        index += 1
    if index != expected_count:
        raise WalkError(CORRUPT_MESSAGE, f"the batch declares {expected_count} records but its records hold {index}")


def iter_headers(data: bytes, pos: int, count: int) -> Iterator[tuple[int, int, int, int]]:
    """(key, key_len, value, value_len) of each header of a record ``iter_records`` accepted
    (``pos``, ``count``: its ``headers`` and ``header_count``): no checks left to make."""
    for _ in range(count):
        key_len, pos = read_varint(data, pos, len(data), 5, 4)  # type: ignore[misc]
        key = pos
        value_len, pos = read_varint(data, pos + key_len, len(data), 5, 4)  # type: ignore[misc]
        yield key, key_len, pos, value_len
        pos += max(value_len, 0)
