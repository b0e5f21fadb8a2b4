"""Arrow <-> RecordBatch v2, column-wise: the data source never builds a Python object per record.

Read: ``lowtide.record.columns.columnize`` (C) cuts the fetched batches into little-endian column
buffers; here they become Arrow arrays with ``Array.from_buffers`` (no copy) under the Kafka
source's schema::

    key binary, value binary, topic string, partition int32, offset int64,
    timestamp timestamp[us, tz=UTC], timestampType int32
    [, headers list<element: struct<key: string, value: binary>>]      (includeHeaders=true)

Write: rows are routed to partitions column-wise (explicit ``partition`` column, else Kafka's
murmur2 of the key in C, else one sticky partition per Arrow batch as Kafka's sticky partitioner
does), cut into ~``batch_bytes`` runs of rows and encoded by ``encode_batch_from_columns`` (C).
Rows with headers take the per-record ``BatchBuilder`` path (Spark rarely sends headers).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from lowtide.errors import InvalidRecord
from lowtide.record import BATCH_HEADER_SIZE, BatchBuilder
from lowtide.record.columns import BinaryColumn, Columns, encode_batch_from_columns, partitions_for_keys

# Most bytes a record takes beyond its key and value: length (5) + attributes (1) + timestamp
# delta (1: every row of a batch has the batch's timestamp) + offset delta (5) + key and value
# lengths (5 + 5) + header count (1).
_RECORD_FRAMING = 23

HEADER_TYPE = pa.list_(pa.field("element", pa.struct([pa.field("key", pa.string()),
                                                      pa.field("value", pa.binary())])))
_BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
SCHEMA = pa.schema(_BASE_FIELDS)
SCHEMA_WITH_HEADERS = pa.schema([*_BASE_FIELDS, pa.field("headers", HEADER_TYPE)])


def _binary(column: BinaryColumn, count: int, type_: pa.DataType = pa.binary()) -> pa.Array:
    validity = pa.py_buffer(column.validity) if column.validity is not None else None
    return pa.Array.from_buffers(type_, count, [validity, pa.py_buffer(column.offsets), pa.py_buffer(column.data)],
                                 null_count=column.null_count)


def to_record_batch(columns: Columns, *, topic: str, partition: int) -> pa.RecordBatch:
    """The rows of one fetch as an Arrow batch of the Kafka source's schema (headers when decoded)."""
    n = columns.count
    arrays = [
        _binary(columns.keys, n),
        _binary(columns.values, n),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(columns.offsets)]),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(columns.timestamps_us)]),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(columns.timestamp_types)]),
    ]
    if columns.headers is None:
        return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)
    h = columns.headers
    pairs = pa.StructArray.from_arrays([_binary(h.keys, h.count, pa.string()), _binary(h.values, h.count)],
                                       fields=list(HEADER_TYPE.value_type))
    headers = pa.Array.from_buffers(HEADER_TYPE, n, [None, pa.py_buffer(h.list_offsets)], children=[pairs])
    return pa.RecordBatch.from_arrays([*arrays, headers], schema=SCHEMA_WITH_HEADERS)


# ---- write side --------------------------------------------------------------------------------

def _as_binary(array: pa.Array, name: str) -> pa.Array:
    t = pa.types
    if not (t.is_string(array.type) or t.is_binary(array.type) or t.is_large_string(array.type)
            or t.is_large_binary(array.type)):
        raise InvalidRecord(f"column {name} must be binary or string, not {array.type}")
    array = array.cast(pa.binary())
    if array.offset != 0:
        array = pa.concat_arrays([array])  # a fresh array: its validity bitmap starts at bit 0
    return array


def _column(array: pa.Array) -> BinaryColumn:
    validity, offsets, data = array.buffers()[:3]
    return BinaryColumn(validity=validity if array.null_count else None, null_count=array.null_count,
                        offsets=offsets, data=data if data is not None else b"")


def route(batch: pa.RecordBatch, *, partitions: int, rng: random.Random) -> pa.Array:
    """int32 partition of every row: the ``partition`` column where set, else murmur2(key) where the
    key is set, else one sticky partition for the whole Arrow batch."""
    n = batch.num_rows
    sticky = rng.randrange(partitions)
    names = batch.schema.names
    routed: pa.Array | None = None
    if "key" in names and batch.column("key").null_count < n:
        keys = _as_binary(batch.column("key"), "key")
        hashed = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(partitions_for_keys(_column(keys), n,
                                                                                              partitions))])
        routed = pc.if_else(pc.equal(hashed, -1), pa.scalar(sticky, pa.int32()), hashed)
    if "partition" in names:
        explicit = batch.column("partition").cast(pa.int32())
        bad = pc.and_(pc.is_valid(explicit), pc.or_(pc.less(explicit, 0), pc.greater_equal(explicit, partitions)))
        if pc.any(bad).as_py():
            first = explicit.filter(bad)[0].as_py()
            raise InvalidRecord(f"partition column names partition {first}, but the topic has {partitions}")
        fallback = routed if routed is not None else pa.repeat(pa.scalar(sticky, pa.int32()), n)
        routed = pc.if_else(pc.is_valid(explicit), explicit, fallback)
    if routed is None:
        routed = pa.repeat(pa.scalar(sticky, pa.int32()), n)
    return routed


def encode_rows(batch: pa.RecordBatch, *, batch_bytes: int, timestamp_ms: int, compression: int) -> Iterator[bytes]:
    """RecordBatch v2 batches of ~``batch_bytes`` holding the rows of ``batch`` in order."""
    n = batch.num_rows
    if n == 0:
        return
    names = batch.schema.names
    values = _as_binary(batch.column("value"), "value")
    keys = _as_binary(batch.column("key"), "key") if "key" in names else None
    if "headers" in names and batch.column("headers").null_count < n:
        yield from _encode_with_headers(values, keys, batch.column("headers"), batch_bytes=batch_bytes,
                                        timestamp_ms=timestamp_ms, compression=compression)
        return
    # Cumulative bytes per row (value + key + at most _RECORD_FRAMING bytes of varints) pick where
    # each batch ends, so a batch never exceeds batch_bytes (max.message.bytes is checked on it).
    ends = memoryview(values.buffers()[1]).cast("i")
    key_ends = memoryview(keys.buffers()[1]).cast("i") if keys is not None else None
    budget = max(1, batch_bytes - BATCH_HEADER_SIZE)
    start = 0
    while start < n:
        def size_to(i: int, _start: int = start) -> int:
            size = ends[i] - ends[_start] + _RECORD_FRAMING * (i - _start)
            return size + (key_ends[i] - key_ends[_start] if key_ends is not None else 0)

        # The largest stop with size_to(stop) <= budget (at least one row).
        stop = bisect.bisect_right(range(start, n + 1), budget, key=size_to) + start - 1
        stop = max(stop, start + 1)
        values_part = values.slice(start, stop - start)
        keys_part = keys.slice(start, stop - start) if keys is not None else None
        yield encode_batch_from_columns(values=_column(_rebase(values_part)),
                                        keys=_column(_rebase(keys_part)) if keys_part is not None else None,
                                        count=stop - start, timestamp_ms=timestamp_ms, compression=compression)
        start = stop


def _rebase(array: pa.Array) -> pa.Array:
    """A slice with nulls is copied so its validity bitmap starts at bit 0; without nulls the slice's
    offsets (absolute into the shared data buffer) are used as they are."""
    if array.offset == 0:
        return array
    if array.null_count:
        return pa.concat_arrays([array])
    validity, offsets, data = array.buffers()[:3]
    return pa.Array.from_buffers(array.type, len(array), [None, offsets.slice(array.offset * 4), data])


def _encode_with_headers(values: pa.Array, keys: pa.Array | None, headers: pa.Array, *, batch_bytes: int,
                         timestamp_ms: int, compression: int) -> Iterator[bytes]:
    builder = BatchBuilder(compression=compression)
    key_list = keys.to_pylist() if keys is not None else [None] * len(values)
    for value, key, hdrs in zip(values.to_pylist(), key_list, headers.to_pylist(), strict=True):
        pairs = [(h["key"], h["value"]) for h in hdrs or ()]
        builder.append(timestamp_ms=timestamp_ms, key=key, value=value, headers=pairs)
        if builder.size_estimate >= batch_bytes:
            yield builder.build()
            builder = BatchBuilder(compression=compression)
    if builder.record_count:
        yield builder.build()
