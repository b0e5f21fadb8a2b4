"""RecordBatch v2 <-> Arrow column buffers, for the Spark data source: per batch in Python, per record in C.

Hot paths handle batches as bytes and never loop per record in Python, so the per-record work is
``_columns.c`` (built by ``pip install -e .``): ``columnize`` cuts a fetch into batches, checks their
CRCs, skips control batches and inflates compressed ones here, then hands all the batches' records to the C
module in ONE call; ``encode_records`` / ``encode_batch_from_columns`` / ``partitions_for_keys`` /
``text_lines`` (the CLI's text output) are one C call each. When the C build failed (no compiler or
Python headers) the pure-Python twins below (``columnize_py``, ``encode_records_py``,
``partitions_py``, ``murmur2_py``, ``text_lines_py``) are used instead, with the
same rules, results and messages, and one warning is logged at import; ``NATIVE`` says which.
Tests run both on the same inputs and compare.

This module imports neither pyarrow (optional) nor ``lowtide.client``: it produces and consumes the
raw little-endian buffers of Arrow arrays, which the caller wraps (``pa.Array.from_buffers``) or
takes apart (``array.buffers()``)::

    BinaryColumn (Arrow binary / string)
      validity    bitmap, bit i set = row i not null, LSB first; None when there are no nulls
      offsets     int32 LE, rows + 1 entries: row i = data[offsets[i]:offsets[i + 1]]
      data        the rows' bytes, back to back

    Columns (one row per record)                      Arrow type
      offsets          int64 LE                       int64
      timestamps_us    int64 LE, ms * 1000            timestamp("us")  (Spark's TimestampType)
      timestamp_types  int32 LE, 0 Create 1 LogAppend int32
      keys, values     BinaryColumn                   binary
      headers          list offsets (int32 LE, rows + 1) + header keys (never null, string) +
                       header values (binary)         list<struct<key: string, value: binary>>

The records format (what follows a batch's 61-byte header) is drawn in ``batch.py`` and, with what
is checked, at the top of ``_columns.c``. Header keys are passed through as bytes, not checked as
UTF-8.
"""

from __future__ import annotations

import logging
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from lowtide.errors import CorruptMessage, LowtideError
from lowtide.record.batch import (
    BATCH_HEADER_SIZE,
    NO_TIMESTAMP,
    TIMESTAMP_LOG_APPEND_TIME,
    crc32c,
    iter_batches,
    seal_batch,
)
from lowtide.record.compression import Compression, decompress
from lowtide.record.varint import append_nullable_bytes, encode_varint
from lowtide.record.walk import INVALID_RECORD, WalkError, iter_headers, iter_records

log = logging.getLogger(__name__)

_CRC_START = 21  # the Attributes field: the CRC covers from here to the end of the batch
_INT32_MAX = (1 << 31) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class BinaryColumn:
    """The buffers of an Arrow ``binary``/``string`` array, little-endian.

    As input (``encode_*``, ``partitions_for_keys``) each buffer may be any object with the buffer
    protocol (bytes, memoryview, a ``pyarrow.Buffer``). The offsets need not start at 0: row i is
    ``data[offsets[i]:offsets[i + 1]]`` with absolute offsets, so a sliced array's offsets buffer
    (from its first row on) can be passed with the whole data buffer. The validity bitmap must start
    at bit 0 (pass arrays whose ``offset`` is 0 when they have nulls); ``None`` means no nulls.
    """

    validity: bytes | None  # bit i set = row i not null, LSB first; None when null_count == 0
    null_count: int
    offsets: bytes  # int32 LE, count + 1 entries (0 first in what columnize returns)
    data: bytes  # the concatenated bytes


@dataclass(frozen=True, slots=True)
class HeaderColumns:
    """Arrow ``list<struct<key: string, value: binary>>`` minus the struct wrapper."""

    list_offsets: bytes  # int32 LE, rows + 1 entries: row i has headers [list_offsets[i], list_offsets[i+1])
    keys: BinaryColumn  # never null
    values: BinaryColumn  # may be null
    count: int  # total headers


@dataclass(frozen=True, slots=True)
class Columns:
    """The records of a fetch as column buffers (see the module docstring)."""

    count: int  # rows
    # Where a reader continues: the next offset of the last whole batch examined, but never beyond
    # max_offset and never below min_offset.
    next_offset: int
    offsets: bytes  # int64 LE
    timestamps_us: bytes  # int64 LE, microseconds since the epoch (record timestamp ms * 1000)
    timestamp_types: bytes  # int32 LE: 0 CreateTime, 1 LogAppendTime
    keys: BinaryColumn
    values: BinaryColumn
    headers: HeaderColumns | None  # None unless with_headers


# A batch as the kernels take it: (records, position of the batch in the fetch, base offset, base
# timestamp, max timestamp, LogAppendTime?, record count); records are after decompression.
KernelBatch = tuple[Any, int, int, int, int, bool, int]
# A binary column as the kernels take it: (validity | None, offsets, data), buffer-protocol objects.
KernelColumn = tuple[Any, Any, Any]


class Kernels(NamedTuple):
    """The per-record functions: the C module's, or their Python twins."""

    name: str  # "c" or "python"
    columnize: Callable[[Sequence[KernelBatch], int, int, bool], tuple]
    encode_records: Callable[[int, KernelColumn, KernelColumn | None], bytes]
    partitions_for_keys: Callable[[int, KernelColumn, int], bytes]
    murmur2: Callable[[Any], int]
    text_lines: Callable[[int, KernelColumn, KernelColumn | None], bytes | None]


# ---------------------------------------------------------------------------------------------------
# Public API.


def columnize(
    data: bytes | bytearray | memoryview, *, min_offset: int, max_offset: int, with_headers: bool,
    verify_crc: bool = True,
) -> Columns:
    """Rows for every record with ``min_offset <= offset < max_offset`` in ``data``.

    ``data`` is whole RecordBatch v2 batches back to back, as a Fetch returns them; a truncated last
    batch is ignored. Per batch, in Python: batches ending at or below ``min_offset`` are skipped
    unread, the walk stops at the first batch starting at or after ``max_offset``, control batches
    (attributes bit 5) and empty batches are skipped, the CRC-32C is checked (``verify_crc``, as
    Kafka's ``check.crcs``) and compressed bodies are inflated. Then one C call turns every record of every
    remaining batch into rows. LogAppendTime batches (attributes bit 3) give every record the batch's
    MaxTimestamp and timestamp type 1, as Kafka does.

    Raises CorruptMessage (bad CRC, impossible batch length, a body that does not decompress or a
    malformed record: the message names the batch position, the record index and its byte
    position), UnsupportedForMessageFormat (magic other than 2, codec SNAPPY or unknown), and
    OverflowError when one binary column would exceed 2 GiB (Arrow's int32 offsets).
    """
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    batches: list[KernelBatch] = []
    next_offset = min_offset
    for header, pos in iter_batches(view):
        if header.base_offset >= max_offset:
            break
        next_offset = header.next_offset
        if next_offset <= min_offset or header.is_control or header.record_count == 0:
            continue
        where = f"batch at position {pos} (base offset {header.base_offset})"
        if header.record_count < 0:
            raise CorruptMessage(f"{where} has negative record count {header.record_count}")
        end = pos + header.size_in_bytes
        if verify_crc:
            actual = crc32c(view[pos + _CRC_START : end])
            if actual != header.crc:
                raise CorruptMessage(f"{where} has CRC {header.crc:#010x}, computed {actual:#010x}")
        records: bytes | memoryview = view[pos + BATCH_HEADER_SIZE : end]
        if header.compression:
            try:
                records = decompress(header.compression, records)
            except LowtideError as exc:  # same error, told which batch
                raise type(exc)(f"{where}: {exc.message}") from None
        batches.append((
            records, pos, header.base_offset, header.base_timestamp, header.max_timestamp,
            header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME, header.record_count,
        ))
    next_offset = min(max(next_offset, min_offset), max_offset)
    try:
        raw = KERNELS.columnize(batches, min_offset, max_offset, with_headers)
    except ValueError as exc:
        raise CorruptMessage(str(exc)) from None
    count, offsets, timestamps_us, types = raw[:4]
    headers = None
    if raw[12] is not None:
        h = raw[12]
        headers = HeaderColumns(list_offsets=h[0], keys=BinaryColumn(*h[1:5]), values=BinaryColumn(*h[5:9]),
                                count=h[9])
    return Columns(count=count, next_offset=next_offset, offsets=offsets, timestamps_us=timestamps_us,
                   timestamp_types=types, keys=BinaryColumn(*raw[4:8]), values=BinaryColumn(*raw[8:12]),
                   headers=headers)


def head(columns: Columns, n: int) -> Columns:
    """The first ``n`` rows of ``columns`` (``columns`` itself when it has no more), for a reader
    that takes only some of a fetch; ``next_offset`` becomes the first row left out. The binary
    columns keep their data and validity buffers whole (offsets are absolute, bit i stays row i);
    the header columns too, cut by their list offsets."""
    if n >= columns.count:
        return columns
    n = max(n, 0)
    rest = memoryview(columns.offsets).cast("q")[n]
    headers = columns.headers
    if headers is not None:
        headers = replace(headers, list_offsets=headers.list_offsets[:4 * (n + 1)])
    return replace(columns, count=n, next_offset=rest, offsets=columns.offsets[:8 * n],
                   timestamps_us=columns.timestamps_us[:8 * n], timestamp_types=columns.timestamp_types[:4 * n],
                   keys=_head_column(columns.keys, n), values=_head_column(columns.values, n), headers=headers)


def _head_column(column: BinaryColumn, n: int) -> BinaryColumn:
    nulls = 0
    if column.validity is not None and column.null_count:
        bits = int.from_bytes(bytes(column.validity)[: (n + 7) // 8], "little") & ((1 << n) - 1)
        nulls = n - bits.bit_count()
    return BinaryColumn(validity=column.validity if nulls else None, null_count=nulls,
                        offsets=column.offsets[:4 * (n + 1)], data=column.data)


def encode_records(*, values: BinaryColumn, keys: BinaryColumn | None, count: int) -> bytes:
    """The Records part (what follows the 61-byte header) of a batch holding ``count`` records.

    Record i has attributes 0, timestamp delta 0, offset delta i and no headers; its key is null when
    ``keys`` is None or its validity bit is clear, its value is null when its validity bit is clear.
    The bytes are what ``BatchBuilder.append`` writes for the same keys and values with one timestamp.
    See ``BinaryColumn`` for what the buffers may be. Raises ValueError for buffers too short for
    ``count`` rows or offsets outside the data.
    """
    return KERNELS.encode_records(count, _kernel_column(values, "values"),
                                  _kernel_column(keys, "keys") if keys is not None else None)


def encode_batch_from_columns(
    *, values: BinaryColumn, keys: BinaryColumn | None, count: int, timestamp_ms: int,
    compression: Compression | int = Compression.NONE,
) -> bytes:
    """A complete RecordBatch v2 (base offset 0, no producer id, CRC right) holding those records.

    Byte-identical to ``BatchBuilder(compression=compression)`` appending the same keys and values
    with ``timestamp_ms`` (and to ``encode_batch``); an empty batch has timestamps -1, as there.
    """
    records = encode_records(values=values, keys=keys, count=count)
    ts = timestamp_ms if count else NO_TIMESTAMP
    return seal_batch(records, record_count=count, base_timestamp=ts, max_timestamp=ts, compression=compression)


def partitions_for_keys(keys: BinaryColumn, count: int, num_partitions: int) -> bytes:
    """int32 LE per row: Kafka's ``toPositive(murmur2(key)) % num_partitions``, or -1 for a null key.

    The same partition ``lowtide.client.partitioner.partition_for_key`` (and Kafka's default
    partitioner) picks for the key.
    """
    return KERNELS.partitions_for_keys(count, _kernel_column(keys, "keys"), num_partitions)


def text_lines(*, values: BinaryColumn, keys: BinaryColumn | None, count: int) -> bytes | None:
    """The first ``count`` rows as lines of text, one C call: ``value + "\\n"`` each (with ``keys``:
    ``key + "\\t" + value + "\\n"``); None when a cell is null or holds a byte other than printable
    ASCII but the backslash (a console consumer escapes those, row by row)."""
    return KERNELS.text_lines(count, _kernel_column(values, "values"),
                              _kernel_column(keys, "keys") if keys is not None else None)


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """Kafka's ``Utils.murmur2`` (seed 0x9747b28c) as a signed int: C, or its Python twin."""
    return KERNELS.murmur2(data)


def _kernel_column(column: BinaryColumn, name: str) -> KernelColumn:
    if column.validity is None and column.null_count:
        raise ValueError(f"{name}: null_count {column.null_count} but no validity bitmap")
    return column.validity, column.offsets, column.data


# ---------------------------------------------------------------------------------------------------
# Python twins of the C kernels (used only when _columns is not built). Same rules, same results,
# same messages, character for character; see the comment block at the top of _columns.c. The walk
# is walk.py's (iter_records), as the C side's is _walk.h's.


class _ColumnBuilder:
    __slots__ = ("name", "valid", "ends", "data", "nulls")

    def __init__(self, name: str) -> None:
        self.name = name
        self.valid: list[bool] = []
        self.ends: list[int] = [0]
        self.data = bytearray()
        self.nulls = 0

    def append(self, src: bytes, start: int, length: int) -> None:
        """Append src[start:start + length], or a null when length < 0."""
        if length < 0:
            self.valid.append(False)
            self.nulls += 1
        else:
            if len(self.data) + length > _INT32_MAX:
                raise OverflowError(
                    f"{self.name} hold more than 2147483647 bytes: too many for one Arrow binary column"
                )
            self.valid.append(True)
            self.data += src[start : start + length]
        self.ends.append(len(self.data))

    @property
    def rows(self) -> int:
        return len(self.valid)

    def result(self) -> tuple[bytes | None, int, bytes, bytes]:
        validity = None
        if self.nulls:
            bitmap = bytearray((len(self.valid) + 7) // 8)
            for i, valid in enumerate(self.valid):
                if valid:
                    bitmap[i >> 3] |= 1 << (i & 7)
            validity = bytes(bitmap)
        return validity, self.nulls, _le("i", self.ends), bytes(self.data)


def _le(typecode: str, values: list[int]) -> bytes:
    packed = array(typecode, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def columnize_py(batches: Sequence[KernelBatch], min_offset: int, max_offset: int, with_headers: bool) -> tuple:
    """Pure-Python twin of ``_columns.columnize``: (rows, offsets, timestamps_us, timestamp_types,
    *keys, *values, headers | None), a binary column being (validity | None, null_count, offsets,
    data) and headers (list_offsets, *header_keys, *header_values, header_count). ValueError on a
    malformed record. The walk is ``walk.iter_records``; this adds the rows."""
    offsets: list[int] = []
    timestamps: list[int] = []
    types: list[int] = []
    keys, values = _ColumnBuilder("keys"), _ColumnBuilder("values")
    header_keys, header_values = _ColumnBuilder("header keys"), _ColumnBuilder("header values")
    list_offsets = [0]
    for body, position, base_offset, base_ts, max_ts, log_append_time, count in batches:
        data = bytes(body)
        try:
            for index, (start, _, _, _, ts_delta, offset_delta, key, key_len, value, value_len, headers,
                        header_count) in enumerate(iter_records(data, count, base_offset=base_offset)):
                offset = base_offset + offset_delta
                if not min_offset <= offset < max_offset:
                    continue
                # The same checks, messages and order as the C hook (columnize_record).
                if log_append_time:
                    ts_ms = max_ts
                else:
                    ts_ms = base_ts + ts_delta
                    if not _INT64_MIN <= ts_ms <= _INT64_MAX:
                        raise WalkError(INVALID_RECORD, f"record {index} at byte {start}: timestamp delta {ts_delta} "
                                                        "overflows the base timestamp")
                if not _INT64_MIN <= ts_ms * 1000 <= _INT64_MAX:
                    raise WalkError(INVALID_RECORD, f"record {index} at byte {start}: timestamp {ts_ms} ms is out of "
                                                    "range in microseconds")
                offsets.append(offset)
                timestamps.append(ts_ms * 1000)
                types.append(1 if log_append_time else 0)
                keys.append(data, key, key_len)
                values.append(data, value, value_len)
                if with_headers:
                    for hk, hk_len, hv, hv_len in iter_headers(data, headers, header_count):
                        if header_keys.rows >= _INT32_MAX:
                            raise OverflowError("more than 2147483647 headers: too many for one Arrow list")
                        header_keys.append(data, hk, hk_len)
                        header_values.append(data, hv, hv_len)
                    list_offsets.append(header_keys.rows)
        except WalkError as exc:
            raise ValueError(f"batch at position {position} (base offset {base_offset}): {exc.message}") from None
    headers_out = None
    if with_headers:
        headers_out = (_le("i", list_offsets), *header_keys.result(), *header_values.result(), header_keys.rows)
    return (len(offsets), _le("q", offsets), _le("q", timestamps), _le("i", types), *keys.result(),
            *values.result(), headers_out)


class _ColumnIn:
    """A binary column given to encode_records_py / partitions_py, its sizes checked for count rows."""

    __slots__ = ("name", "validity", "offsets", "data")

    def __init__(self, column: KernelColumn | Any, name: str, count: int) -> None:
        if not isinstance(column, tuple) or len(column) != 3:
            raise TypeError(f"{name} must be a tuple (validity, offsets, data)")
        validity, offsets, data = column
        self.name = name
        self.validity = memoryview(validity).cast("B") if validity is not None else None
        raw_offsets = memoryview(offsets).cast("B")
        self.data = memoryview(data).cast("B")
        if len(raw_offsets) // 4 < count + 1:
            raise ValueError(f"{name}: {len(raw_offsets)} bytes of offsets hold {len(raw_offsets) // 4} int32 "
                             f"entries; {count} rows need {count + 1}")
        if self.validity is not None and len(self.validity) < (count + 7) // 8:
            raise ValueError(f"{name}: a validity bitmap of {len(self.validity)} bytes is too short for {count} rows")
        self.offsets = struct.unpack_from(f"<{count + 1}i", raw_offsets)

    def row(self, i: int) -> bytes | None:
        if self.validity is not None and not (self.validity[i >> 3] >> (i & 7)) & 1:
            return None
        begin, end = self.offsets[i], self.offsets[i + 1]
        if begin < 0 or end < begin or end > len(self.data):
            raise ValueError(f"{self.name} row {i}: offsets {begin}..{end} are outside the {len(self.data)} bytes "
                             "of data")
        return bytes(self.data[begin:end])


def encode_records_py(count: int, values: KernelColumn, keys: KernelColumn | None) -> bytes:
    """Pure-Python twin of ``_columns.encode_records``."""
    if count < 0 or count > _INT32_MAX:
        raise ValueError(f"count {count} is not a record count (0 .. 2147483647)")
    value_in = _ColumnIn(values, "values", count)
    key_in = _ColumnIn(keys, "keys", count) if keys is not None else None
    rows = []
    for i in range(count):  # measured first, as the C does: a bad row raises before anything is written
        value = value_in.row(i)
        key = key_in.row(i) if key_in is not None else None
        size = (3 + len(encode_varint(i)) + (len(encode_varint(len(key))) + len(key) if key is not None else 1)
                + (len(encode_varint(len(value))) + len(value) if value is not None else 1))
        if size > _INT32_MAX:
            raise ValueError(f"row {i}: a record of {size} bytes is larger than a record can be")
        rows.append((size, key, value))
    out = bytearray()
    for i, (size, key, value) in enumerate(rows):
        out += encode_varint(size)
        out += b"\x00\x00"  # attributes, timestamp delta 0
        out += encode_varint(i)
        append_nullable_bytes(out, key)
        append_nullable_bytes(out, value)
        out += b"\x00"  # header count
    return bytes(out)


_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2_py(data: bytes | bytearray | memoryview) -> int:
    """Kafka's ``Utils.murmur2`` as a signed int; the twin of ``_columns.murmur2``."""
    data = bytes(data)
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length - (length & 3)
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partitions_py(count: int, keys: KernelColumn, num_partitions: int) -> bytes:
    """Pure-Python twin of ``_columns.partitions_for_keys``."""
    if num_partitions < 1 or num_partitions > _INT32_MAX:
        raise ValueError(f"num_partitions {num_partitions} is not a partition count (1 .. 2147483647)")
    if count < 0:
        raise ValueError(f"count {count} is not a row count")
    key_in = _ColumnIn(keys, "keys", count)
    out = []
    for i in range(count):
        key = key_in.row(i)
        out.append(-1 if key is None else (murmur2_py(key) & 0x7FFFFFFF) % num_partitions)
    return _le("i", out)


# Printable ASCII but the backslash: what text_lines copies as it is.
_PLAIN_TEXT = bytes(range(0x20, 0x7F)).replace(b"\\", b"")


def text_lines_py(count: int, values: KernelColumn, keys: KernelColumn | None) -> bytes | None:
    """Pure-Python twin of ``_columns.text_lines``."""
    if count < 0:
        raise ValueError(f"count {count} is not a row count")
    columns = [_ColumnIn(keys, "keys", count)] if keys is not None else []
    columns.append(_ColumnIn(values, "values", count))
    out = bytearray()
    for i in range(count):
        for column, end in zip(columns, (b"\t", b"\n")[-len(columns):], strict=True):
            cell = column.row(i)
            if cell is None or cell.translate(None, _PLAIN_TEXT):
                return None
            out += cell
            out += end
    return bytes(out)


PYTHON_KERNELS = Kernels("python", columnize_py, encode_records_py, partitions_py, murmur2_py, text_lines_py)

C_KERNELS: Kernels | None
try:
    import lowtide.record._columns as _columns
except ImportError as exc:  # the optional C build failed: slower, same answers
    C_KERNELS = None
    log.warning(
        "lowtide.record._columns (C record <-> Arrow columns) is not built (%s); converting records in "
        "pure Python, which is much slower. Install gcc and the Python headers, then rerun "
        "'pip install -e .' (make setup).",
        exc,
    )
else:
    C_KERNELS = Kernels("c", _columns.columnize, _columns.encode_records, _columns.partitions_for_keys,
                        _columns.murmur2, _columns.text_lines)

# What the public functions call (tests swap it to run both implementations through them).
KERNELS: Kernels = C_KERNELS if C_KERNELS is not None else PYTHON_KERNELS
NATIVE: bool = C_KERNELS is not None
