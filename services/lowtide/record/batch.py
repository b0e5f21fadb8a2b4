"""Kafka RecordBatch v2 (magic 2): the byte format of batches on disk, on the wire and in WAL files.

Layout (all integers big-endian; offsets in the table are byte positions inside the batch)::

    RecordBatch =>                                        pos  size
      BaseOffset           => Int64                        0    8  \\  LOG_OVERHEAD = 12: not counted
      BatchLength          => Int32                        8    4  /  in BatchLength
      PartitionLeaderEpoch => Int32                       12    4     set by the leader, not in the CRC
      Magic                => Int8   (= 2)                16    1
      CRC                  => Uint32 (CRC-32C)            17    4     covers byte 21 .. end of batch
      Attributes           => Int16                       21    2
      LastOffsetDelta      => Int32                       23    4
      BaseTimestamp        => Int64                       27    8     delete horizon when bit 6 is set
      MaxTimestamp         => Int64                       35    8
      ProducerId           => Int64                       43    8
      ProducerEpoch        => Int16                       51    2
      BaseSequence         => Int32                       53    4
      RecordCount          => Int32                       57    4
      Records              => [Record]                    61    ...   compressed when codec > 0
                                                          (BATCH_HEADER_SIZE = 61)
    Attributes (Int16):
      | unused 7-15 | delete horizon 6 (KIP-534) | control 5 | transactional 4 |
      | timestamp type 3 (0 create, 1 log append) | compression 0-2 (0 none 1 gzip 2 snappy 3 lz4 4 zstd) |

    Record =>
      Length         => Varint      bytes after this field
      Attributes     => Int8        (unused, 0)
      TimestampDelta => Varlong     record timestamp - BaseTimestamp
      OffsetDelta    => Varint      record offset - BaseOffset
      KeyLength      => Varint      -1 = null key
      Key            => Bytes
      ValueLength    => Varint      -1 = null value (tombstone)
      Value          => Bytes
      HeaderCount    => Varint
      Headers        => [HeaderKeyLength Varint, HeaderKey UTF-8, HeaderValueLength Varint (-1 null), Value]

    Varint/Varlong = protobuf zig-zag: (n << 1) ^ (n >> 63), 7 bits per byte, low groups first,
    high bit set on every byte but the last.

Hot path: the broker side (``read_header``, ``iter_batches``, ``validate_batches``,
``assign_offsets``) works per batch with ``struct`` on the fixed 61-byte header and C CRC-32C over the
batch bytes. The leader's ``validate_batches`` also walks every record, in C (``record/validate.py``,
``_validate.c`` on the one record walker ``_walk.h``). The consumer-side ``decode_batch`` takes each
record's field positions from the same walk and builds its ``Record`` objects in Python.

KIP-534 (delete horizon): a cleaner that retains a tombstone or marker sets BaseTimestamp to the
horizon, re-expresses every TimestampDelta relative to it and sets attribute bit 6. Because a record's
timestamp is always BaseTimestamp + TimestampDelta, ``decode_batch`` reads back the original
timestamps with no special case; ``BatchHeader.delete_horizon_ms`` exposes the horizon.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import crc32c as _crc32c_mod

from lowtide.clock import now_ms
from lowtide.errors import CorruptMessage, InvalidRecord, LowtideError, UnsupportedForMessageFormat
from lowtide.record.compression import SUPPORTED, Compression, compress, decompress, describe_unsupported
from lowtide.record.validate import CORRUPT_MESSAGE, record_fields, walk_records
from lowtide.record.varint import append_nullable_bytes, encode_varint
from lowtide.record.varint import decode_varint as decode_varint  # re-exported (tests, older callers)
from lowtide.record.walk import iter_headers

MAGIC = 2
BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # BaseOffset + BatchLength: the bytes BatchLength does not count
MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD  # 49: a batch with zero records
NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
# Most a compressed batch may inflate to when the leader validates it: bounds the memory one
# produce request can make the broker allocate (a batch itself is capped by max.message.bytes).
MAX_DECOMPRESSED_BATCH_BYTES = 64 << 20

# Byte positions of the fields broker code touches directly.
_LENGTH_POS = 8
_LEADER_EPOCH_POS = 12
_MAGIC_POS = 16
_CRC_POS = 17
_ATTRIBUTES_POS = 21  # the CRC covers from here to the end of the batch

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == BATCH_HEADER_SIZE
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")

# Attribute bits.
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1


def compose_attributes(
    *,
    compression: int = Compression.NONE,
    timestamp_type: int = TIMESTAMP_CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
    has_delete_horizon: bool = False,
) -> int:
    """Build the Int16 attributes field from its parts."""
    attrs = int(compression) & COMPRESSION_MASK
    if timestamp_type:
        attrs |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attrs |= TRANSACTIONAL_MASK
    if is_control:
        attrs |= CONTROL_MASK
    if has_delete_horizon:
        attrs |= DELETE_HORIZON_MASK
    return attrs


def _writable_attributes(
    compression: Compression | int, timestamp_type: int, is_transactional: bool, is_control: bool,
    has_delete_horizon: bool,
) -> int:
    """``compose_attributes`` for a batch about to be written: the one place both writers
    (``BatchBuilder`` and ``seal_batch``) refuse a codec this build cannot compress, before any
    record is encoded, so neither can seal a batch whose attributes name it."""
    if compression not in SUPPORTED:
        raise UnsupportedForMessageFormat(describe_unsupported(int(compression)))
    return compose_attributes(
        compression=int(compression),
        timestamp_type=timestamp_type,
        is_transactional=is_transactional,
        is_control=is_control,
        has_delete_horizon=has_delete_horizon,
    )


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of ``data``, computed in C."""
    return _crc32c_mod.crc32c(data)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed 61-byte header of one batch, decoded."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.attributes & DELETE_HORIZON_MASK else None


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record (consumer side)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


# ---------------------------------------------------------------------------------------------------
# Header access (broker hot path).


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the 61-byte header at ``pos``.

    Raises CorruptMessage if fewer than 61 bytes remain or BatchLength is impossible (< 49), and
    UnsupportedForMessageFormat if the magic byte is not 2.
    """
    if len(buf) - pos < BATCH_HEADER_SIZE:
        raise CorruptMessage(
            f"batch header at position {pos} is truncated: {len(buf) - pos} of {BATCH_HEADER_SIZE} bytes"
        )
    fields = _HEADER.unpack_from(buf, pos)
    if fields[3] != MAGIC:
        raise UnsupportedForMessageFormat(f"batch at position {pos} has magic {fields[3]}; only magic 2")
    if fields[1] < MIN_BATCH_LENGTH:
        raise CorruptMessage(f"batch at position {pos} has length {fields[1]} < {MIN_BATCH_LENGTH}")
    return BatchHeader(*fields)


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[BatchHeader, int]]:
    """Yield (header, position) for each complete batch; a trailing partial batch is ignored.

    A fetch response may be cut in the middle of its last batch, so running out of bytes is not an
    error; an impossible length or magic is (CorruptMessage / UnsupportedForMessageFormat).
    """
    end = len(buf)
    pos = 0
    while end - pos >= LOG_OVERHEAD:
        _, length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
        if length < MIN_BATCH_LENGTH:
            raise CorruptMessage(f"batch at position {pos} has length {length} < {MIN_BATCH_LENGTH}")
        if pos + LOG_OVERHEAD + length > end:
            return
        yield read_header(buf, pos), pos
        pos += LOG_OVERHEAD + length


def validate_batches(
    buf: bytes | bytearray | memoryview,
    *,
    allow_compacted: bool = False,
    verify_records: bool | None = None,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BATCH_BYTES,
) -> list[BatchHeader]:
    """Validate producer or follower input and return the header of each batch, in order.

    Checks per batch: header complete, magic 2, BatchLength >= 49 and inside ``buf`` (and the last
    batch ends exactly at the end of ``buf``), CRC-32C, a known codec, record counts and timestamps.
    With ``allow_compacted`` (follower input of a compacted topic) a batch may hold fewer records
    than its offset range, even none; otherwise RecordCount must be >= 1 and == LastOffsetDelta + 1.

    ``verify_records`` (default: ``not allow_compacted``, i.e. on for the leader's producer input,
    off for follower input the leader already checked) also decompresses each body (at most
    ``max_decompressed_bytes``) and walks its records (``lowtide.record.validate``): exactly
    RecordCount records, offset deltas 0, 1, ... (rising and <= LastOffsetDelta when compacted),
    every record's fields inside its Length, nothing after the last record.

    Raises CorruptMessage (truncated, bad length, bad CRC, body that does not decompress or does not
    hold RecordCount records), UnsupportedForMessageFormat (magic, codec), InvalidRecord (empty input,
    counts, timestamps, a malformed record) or MessageTooLarge (inflates past the limit). An empty
    buffer is InvalidRecord: there is no corrupt data, just nothing to append. A bad batch rejects
    the whole input.
    """
    if verify_records is None:
        verify_records = not allow_compacted
    end = len(buf)
    if end == 0:
        raise InvalidRecord("record set is empty: at least one batch is required")
    view = memoryview(buf)
    headers: list[BatchHeader] = []
    pos = 0
    unpack = _HEADER.unpack_from
    while pos < end:
        if end - pos < BATCH_HEADER_SIZE:
            if end - pos > _MAGIC_POS and buf[pos + _MAGIC_POS] != MAGIC:
                raise UnsupportedForMessageFormat(
                    f"batch at position {pos} has magic {buf[pos + _MAGIC_POS]}; only magic 2 is supported"
                )
            raise CorruptMessage(f"batch at position {pos} is truncated: {end - pos} bytes left, need 61")
        fields = unpack(buf, pos)
        (_, length, _, magic, crc, attrs, last_delta, base_ts, max_ts, _, _, _, count) = fields
        if magic != MAGIC:
            raise UnsupportedForMessageFormat(
                f"batch at position {pos} has magic {magic}; only magic 2 is supported"
            )
        if length < MIN_BATCH_LENGTH:
            raise CorruptMessage(f"batch at position {pos} has length {length} < {MIN_BATCH_LENGTH}")
        batch_end = pos + LOG_OVERHEAD + length
        if batch_end > end:
            raise CorruptMessage(
                f"batch at position {pos} is truncated: length {length} but {end - pos - LOG_OVERHEAD} bytes left"
            )
        actual = _crc32c_mod.crc32c(view[pos + _ATTRIBUTES_POS : batch_end])
        if actual != crc:
            raise CorruptMessage(f"batch at position {pos} has CRC {crc:#010x}, computed {actual:#010x}")
        if attrs & COMPRESSION_MASK > Compression.ZSTD:
            raise UnsupportedForMessageFormat(describe_unsupported(attrs & COMPRESSION_MASK))
        if last_delta < 0:
            raise InvalidRecord(f"batch at position {pos} has negative last offset delta {last_delta}")
        if allow_compacted:
            if count < 0 or count > last_delta + 1:
                raise InvalidRecord(
                    f"batch at position {pos} has {count} records for offset range {last_delta + 1}"
                )
        elif count < 1 or count != last_delta + 1:
            raise InvalidRecord(
                f"batch at position {pos} has record count {count} but last offset delta {last_delta}"
            )
        if base_ts < NO_TIMESTAMP or max_ts < NO_TIMESTAMP:
            raise InvalidRecord(f"batch at position {pos} has negative timestamps {base_ts}/{max_ts}")
        # With a delete horizon the base timestamp is the horizon (future), so only plain batches
        # must have max >= base.
        if count and not attrs & DELETE_HORIZON_MASK and max_ts < base_ts:
            raise InvalidRecord(f"batch at position {pos} has max timestamp {max_ts} < base {base_ts}")
        if verify_records:
            _verify_records(view[pos + BATCH_HEADER_SIZE : batch_end], pos, attrs, count, last_delta,
                            max_decompressed_bytes)
        headers.append(BatchHeader(*fields))
        pos = batch_end
    return headers


def _verify_records(
    body: memoryview, pos: int, attrs: int, count: int, last_delta: int, max_decompressed_bytes: int
) -> None:
    """Walk the records of the batch at ``pos`` (one C call per batch); raise on the first problem."""
    codec = attrs & COMPRESSION_MASK
    records: bytes | memoryview = body
    if codec:
        try:
            records = decompress(codec, body, max_size=max_decompressed_bytes)
        except LowtideError as exc:  # same error, told which batch
            raise type(exc)(f"batch at position {pos}: {exc.message}") from None
    problem = walk_records(records, count, last_delta)
    if problem is not None:
        code, message = problem
        error = CorruptMessage if code == CORRUPT_MESSAGE else InvalidRecord
        where = f"batch at position {pos}" + (f" ({Compression(codec).name} records)" if codec else "")
        raise error(f"{where}: {message}")


class OwnedBatches(bytearray):
    """Record batches whose buffer is handed over to the log with them: a leader append assigns
    offsets in it in place instead of copying it first. Made by whoever owns a fresh copy anyway
    (the Produce request deserializer copies each partition's batches out of the received message
    exactly once); never made from a buffer anything else still reads."""

    __slots__ = ()


def assign_offsets(
    buf: bytearray, headers: list[BatchHeader], *, base_offset: int, leader_epoch: int
) -> int:
    """Rewrite BaseOffset and PartitionLeaderEpoch of each batch in place; return the next offset.

    Both fields precede the CRC-covered range, so no CRC is recomputed. ``headers`` must be the
    result of ``validate_batches(buf)``; they are not updated (they are frozen).
    """
    pos = 0
    offset = base_offset
    pack_offset = _INT64.pack_into
    pack_epoch = _INT32.pack_into
    for header in headers:
        pack_offset(buf, pos, offset)
        pack_epoch(buf, pos + _LEADER_EPOCH_POS, leader_epoch)
        offset += header.last_offset_delta + 1
        pos += header.batch_length + LOG_OVERHEAD
    return offset


# ---------------------------------------------------------------------------------------------------
# Encoding (client side and the cleaner).


class BatchBuilder:
    """Accumulates records and builds one RecordBatch v2.

    Not thread-safe; one builder per batch. ``delete_horizon_ms`` (KIP-534, for the cleaner) sets the
    base timestamp to the horizon, attribute bit 6, and makes record deltas relative to the horizon.
    ``append(offset_delta=...)`` and ``last_offset_delta`` let the cleaner keep the original offsets
    of a compacted batch; by default records get consecutive offsets.
    """

    __slots__ = (
        "_base_offset",
        "_producer_id",
        "_producer_epoch",
        "_base_sequence",
        "_partition_leader_epoch",
        "_attributes",
        "_delete_horizon_ms",
        "_last_offset_delta",
        "_body",
        "_count",
        "_last_delta",
        "_base_ts",
        "_max_ts",
    )

    def __init__(
        self,
        *,
        compression: Compression | int = Compression.NONE,
        base_offset: int = 0,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        partition_leader_epoch: int = -1,
        is_transactional: bool = False,
        is_control: bool = False,
        timestamp_type: int = TIMESTAMP_CREATE_TIME,
        delete_horizon_ms: int | None = None,
        last_offset_delta: int | None = None,
    ) -> None:
        self._attributes = _writable_attributes(compression, timestamp_type, is_transactional, is_control,
                                                delete_horizon_ms is not None)
        self._base_offset = base_offset
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._partition_leader_epoch = partition_leader_epoch
        self._delete_horizon_ms = delete_horizon_ms
        self._last_offset_delta = last_offset_delta
        self._body = bytearray()
        self._count = 0
        self._last_delta = -1
        self._base_ts: int | None = delete_horizon_ms
        self._max_ts = NO_TIMESTAMP

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def size_estimate(self) -> int:
        """Bytes of the batch if built now without compression (roughly an upper bound with a codec)."""
        return BATCH_HEADER_SIZE + len(self._body)

    def append(
        self,
        *,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
        offset_delta: int | None = None,
    ) -> None:
        """Add one record. ``offset_delta`` defaults to the next consecutive delta."""
        if offset_delta is None:
            offset_delta = self._last_delta + 1
        elif offset_delta <= self._last_delta:
            raise ValueError(f"offset delta {offset_delta} is not above the previous {self._last_delta}")
        base_ts = self._base_ts
        if base_ts is None:
            base_ts = self._base_ts = timestamp_ms
        if timestamp_ms > self._max_ts:
            self._max_ts = timestamp_ms
        ts_part = encode_varint(timestamp_ms - base_ts)
        off_part = encode_varint(offset_delta)
        if key is None:
            key_len_part = b"\x01"
            key_len = 0
        else:
            key_len = len(key)
            key_len_part = encode_varint(key_len)
        if value is None:
            value_len_part = b"\x01"
            value_len = 0
        else:
            value_len = len(value)
            value_len_part = encode_varint(value_len)
        header_part = _encode_headers(headers) if headers else b"\x00"
        size = (
            1
            + len(ts_part)
            + len(off_part)
            + len(key_len_part)
            + key_len
            + len(value_len_part)
            + value_len
            + len(header_part)
        )
        body = self._body
        body += encode_varint(size)
        body.append(0)  # record attributes: unused
        body += ts_part
        body += off_part
        body += key_len_part
        if key_len:
            body += key
        body += value_len_part
        if value_len:
            body += value
        body += header_part
        self._count += 1
        self._last_delta = offset_delta

    def build(self) -> bytes:
        """Return the finished batch (header + possibly compressed records)."""
        last_delta = self._last_offset_delta if self._last_offset_delta is not None else self._last_delta
        if last_delta < self._last_delta:
            raise ValueError(f"last offset delta {last_delta} is below the last record's {self._last_delta}")
        return _seal(
            self._body,
            attributes=self._attributes,
            record_count=self._count,
            last_offset_delta=last_delta,
            base_timestamp=self._base_ts if self._base_ts is not None else NO_TIMESTAMP,
            max_timestamp=self._max_ts,
            base_offset=self._base_offset,
            producer_id=self._producer_id,
            producer_epoch=self._producer_epoch,
            base_sequence=self._base_sequence,
            partition_leader_epoch=self._partition_leader_epoch,
        )


def seal_batch(
    records_body: bytes | bytearray | memoryview,
    *,
    record_count: int,
    base_timestamp: int,
    max_timestamp: int,
    compression: Compression | int = Compression.NONE,
    last_offset_delta: int | None = None,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    timestamp_type: int = TIMESTAMP_CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
) -> bytes:
    """A complete batch around an already-encoded, uncompressed Records body (what follows the
    61-byte header): compressed with ``compression``, header filled in, CRC-32C computed.

    ``BatchBuilder.build`` seals its records the same way, so the same body and fields give the same
    bytes. ``last_offset_delta`` defaults to ``record_count - 1`` (0 for an empty batch). Nothing
    checks that the body holds ``record_count`` records: that is the caller's contract.
    """
    attributes = _writable_attributes(compression, timestamp_type, is_transactional, is_control, False)
    if last_offset_delta is None:
        last_offset_delta = record_count - 1
    return _seal(
        records_body,
        attributes=attributes,
        record_count=record_count,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch,
    )


def _seal(
    records_body: bytes | bytearray | memoryview,
    *,
    attributes: int,
    record_count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    partition_leader_epoch: int,
) -> bytes:
    codec = attributes & COMPRESSION_MASK
    records = compress(codec, records_body) if codec else records_body
    if last_offset_delta < 0:
        last_offset_delta = 0  # an empty batch still covers one offset, like Kafka's empty batches
    header = bytearray(BATCH_HEADER_SIZE)
    _HEADER.pack_into(
        header,
        0,
        base_offset,
        BATCH_HEADER_SIZE - LOG_OVERHEAD + len(records),
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    # The CRC runs on from the header's covered part into the records, which are copied once.
    crc = _crc32c_mod.crc32c(records, _crc32c_mod.crc32c(memoryview(header)[_ATTRIBUTES_POS:]))
    _UINT32.pack_into(header, _CRC_POS, crc)
    return bytes(header) + records


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    out = bytearray(encode_varint(len(headers)))
    for name, value in headers:
        raw = name.encode("utf-8")
        out += encode_varint(len(raw))
        out += raw
        append_nullable_bytes(out, value)
    return bytes(out)


def encode_batch(
    values: Iterable[bytes | None],
    *,
    keys: Iterable[bytes | None] | None = None,
    timestamp_ms: int | Sequence[int] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None,
    compression: Compression | int = Compression.NONE,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    is_transactional: bool = False,
) -> bytes:
    """Encode one batch of ``values`` (with optional parallel ``keys``/``headers``).

    ``timestamp_ms`` is one timestamp for all records, one per record, or None for the wall clock.
    """
    if timestamp_ms is None:
        timestamp_ms = now_ms()
    builder = BatchBuilder(
        compression=compression,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch,
        is_transactional=is_transactional,
    )
    values = list(values)
    key_list = list(keys) if keys is not None else [None] * len(values)
    if len(key_list) != len(values):
        raise ValueError(f"{len(key_list)} keys for {len(values)} values")
    ts_list = [timestamp_ms] * len(values) if isinstance(timestamp_ms, int) else list(timestamp_ms)
    if len(ts_list) != len(values):
        raise ValueError(f"{len(ts_list)} timestamps for {len(values)} values")
    append = builder.append
    for i, value in enumerate(values):
        append(
            timestamp_ms=ts_list[i],
            key=key_list[i],
            value=value,
            headers=headers[i] if headers is not None else (),
        )
    return builder.build()


# ---------------------------------------------------------------------------------------------------
# Decoding (consumer side: per record).


def decode_batch(
    buf: bytes | bytearray | memoryview, *, pos: int = 0, verify_crc: bool = True
) -> tuple[BatchHeader, list[Record]]:
    """Decode the batch at ``pos`` into its header and records.

    Record timestamp = BaseTimestamp + TimestampDelta, which is also right for KIP-534 batches (the
    cleaner re-expressed the deltas relative to the horizon). For LOG_APPEND_TIME batches every
    record carries MaxTimestamp, as in Kafka.
    """
    header = read_header(buf, pos)
    end = pos + header.size_in_bytes
    if end > len(buf):
        raise CorruptMessage(f"batch at position {pos} is truncated: needs {header.size_in_bytes} bytes")
    view = memoryview(buf)
    if verify_crc:
        actual = _crc32c_mod.crc32c(view[pos + _ATTRIBUTES_POS : end])
        if actual != header.crc:
            raise CorruptMessage(
                f"batch at offset {header.base_offset} has CRC {header.crc:#010x}, computed {actual:#010x}"
            )
    raw: bytes | memoryview = view[pos + BATCH_HEADER_SIZE : end]
    # bytes either way: the records' keys and values are slices of it.
    data = decompress(header.compression, raw) if header.compression else bytes(raw)
    base_offset = header.base_offset
    try:
        fields = record_fields(data, header.record_count)  # the one record walker, in C
    except ValueError as exc:  # (code, message) of the walk
        raise CorruptMessage(f"batch at offset {base_offset}: {exc.args[-1]}") from None
    base_ts = header.base_timestamp
    log_append_ts = header.max_timestamp if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME else None
    records: list[Record] = []
    append = records.append
    for _, _, _, _, ts_delta, off_delta, key, key_len, value, value_len, headers, header_count in fields:
        append(Record(
            offset=base_offset + off_delta,
            timestamp=log_append_ts if log_append_ts is not None else base_ts + ts_delta,
            key=data[key : key + key_len] if key_len >= 0 else None,
            value=data[value : value + value_len] if value_len >= 0 else None,
            headers=tuple(
                (data[k : k + k_len].decode("utf-8"), data[v : v + v_len] if v_len >= 0 else None)
                for k, k_len, v, v_len in iter_headers(data, headers, header_count)
            ) if header_count else (),
        ))
    return header, records


def decode_batches(buf: bytes | bytearray | memoryview) -> list[tuple[BatchHeader, list[Record]]]:
    """Decode every complete batch in ``buf`` (a trailing partial batch is ignored)."""
    return [decode_batch(buf, pos=pos) for _, pos in iter_batches(buf)]

