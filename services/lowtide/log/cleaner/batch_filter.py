"""Which records a cleaning pass keeps, decided per batch and applied to the batch's bytes.

A pass reads each segment in windows of whole batches ("chunks"). Per chunk:

1. ``ChunkRows.of(chunk)``: ONE call into the C record walker (``record/_walk.h`` in
   ``record/_columns.c``, through ``columnize``) turns every record of every data batch of the
   chunk into columns: offset, key, and whether key and value are null. The CRC of each batch
   is checked on the way. Control batches and empty batches give no rows.
2. Map building (``OffsetMap.add``): ``dict.update(zip(keys, offsets))`` — the loop runs in C,
   and since offsets rise, each key ends up with its latest offset.
3. Filtering (``BatchFilter.filter``): for all rows at once, in C (``map`` over builtins),
   ``superseded[i] = offset[i] < latest offset of key[i]``; then, per batch, ``bytes.find`` on the
   row flags says whether the batch loses anything. Python runs per batch, not per record, unless a
   batch must change.

What a record needs to stay (Kafka's ``LogCleaner.shouldRetainRecord`` with KIP-534)::

    record                                         kept?
    no key                                         no  (counted; the produce path refuses them)
    a later record with its key is in the map      no  (superseded)
    has a value                                    yes
    tombstone, batch has no delete horizon         yes, and the batch gets one: now + delete.retention.ms
    tombstone, now <  the batch's delete horizon   yes
    tombstone, now >= the batch's delete horizon   no

What happens to a batch (Kafka's ``LogCleaner`` with KIP-534; "last of its producer": the batch
holds the last data offset the log's producer state knows for its producer id, or, for a producer
with no data left, it is a control batch of the producer's current epoch)::

    data batch of an aborted transaction           every record removed (the aborted index says so)
    empty batch (no records)                       dropped, unless last of its producer
    every record kept, no horizon to set           copied as is: its bytes, no per-record work
    no record kept                                 dropped, or kept empty when last of its producer
                                                   (it holds the producer's last sequence and epoch)
    otherwise                                      re-encoded by ``rewrite_batch``

    marker (control batch) whose transaction still has a batch in this pass     copied as is
    marker whose transaction has none, no horizon  horizon set: now + delete.retention.ms, bit 6
    ... horizon set, now <  horizon                copied as is
    ... horizon set, now >= horizon                dropped (kept empty when last of its producer)

Whether a transaction "still has a batch" is decided as Kafka's ``CleanedTransactionMetadata`` does
(``TxnTracker``): walking the pass in offset order, a transactional data batch read before the
marker (kept or not: it goes in this same pass, and the marker one pass later) keeps the marker.

``rewrite_batch`` keeps what identifies the batch: base offset, last offset delta (so the offset
range and the producer's last sequence survive, as Kafka's ``overrideLastOffset``), partition
leader epoch, producer id/epoch, base sequence, compression and every attribute bit; it drops
the removed records and, for KIP-534, sets BaseTimestamp to the horizon, attribute bit 6, and
re-expresses each kept record's TimestampDelta against the horizon, so every record reads back
its original timestamp (``timestamp = BaseTimestamp + TimestampDelta``). Kept records are copied
as bytes: only the Length and TimestampDelta varints of a record are rewritten, and only when the
base timestamp changes. Where each record's fields are comes from the one record walker
(``record_fields``: ``_walk.h`` in C, ``record/walk.py`` without it). MaxTimestamp becomes the
largest kept timestamp (LogAppendTime batches keep theirs, which is every record's timestamp).

An empty batch is the 61-byte header alone (``empty_batch``): RecordCount 0, same base offset,
last offset delta, producer id/epoch, base sequence and attributes (no codec: nothing to compress).
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat

import crc32c as _crc32c_mod

from lowtide.errors import CorruptMessage
from lowtide.log.cleaner.config import MAP_ENTRY_OVERHEAD
from lowtide.log.producer_state import AbortedTxn
from lowtide.record import (
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    DELETE_HORIZON_MASK,
    LOG_OVERHEAD,
    MAGIC,
    NO_TIMESTAMP,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchHeader,
    read_header,
)
from lowtide.record.columns import columnize
from lowtide.record.compression import compress, decompress
from lowtide.record.validate import record_fields
from lowtide.record.varint import encode_varint

_ALL_OFFSETS = (1 << 63) - 1
_BIG_ENDIAN = sys.byteorder == "big"
_CRC_POS = 17
_CRC_START = 21  # Attributes: the CRC covers from here to the end of the batch
# Drawn in record/batch.py: BaseOffset, BatchLength, PartitionLeaderEpoch, Magic, CRC, Attributes,
# LastOffsetDelta, BaseTimestamp, MaxTimestamp, ProducerId, ProducerEpoch, BaseSequence, RecordCount.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC = struct.Struct(">I")
# byte -> its 8 validity bits as 8 bytes (LSB first, Arrow's order): expands a bitmap in C.
_BITS = tuple(bytes((b >> i) & 1 for i in range(8)) for b in range(256))


def _row_flags(validity: bytes | None, null_count: int, rows: int) -> bytes | None:
    """One byte per row: 1 = not null, 0 = null; None when no row is null."""
    if not null_count or validity is None:
        return None
    return b"".join(map(_BITS.__getitem__, validity))[:rows]


@dataclass(slots=True)
class ChunkRows:
    """The records of the data batches of a chunk, as columns (row i = i-th record, in offset order)."""

    count: int
    offsets: array  # 'q'
    keys: list[bytes | None]
    key_present: bytes | None  # per row 1/0; None: every key present
    value_present: bytes | None  # per row 1/0 (0 = tombstone); None: no tombstone
    key_bytes: int

    @classmethod
    def of(cls, chunk: bytes | bytearray | memoryview) -> ChunkRows:
        """Columns of every record in ``chunk`` (whole batches). Raises CorruptMessage for a bad CRC
        or malformed records, UnsupportedForMessageFormat for a codec lowtide cannot read."""
        cols = columnize(chunk, min_offset=0, max_offset=_ALL_OFFSETS, with_headers=False)
        offsets = array("q")
        offsets.frombytes(cols.offsets)
        bounds = array("i")
        bounds.frombytes(cols.keys.offsets)
        if _BIG_ENDIAN:
            offsets.byteswap()
            bounds.byteswap()
        data = cols.keys.data
        # bytes slices made by map() over builtins: C loops, one key object per record.
        keys: list[bytes | None] = list(map(data.__getitem__, map(slice, bounds, bounds[1:])))
        key_present = _row_flags(cols.keys.validity, cols.keys.null_count, cols.count)
        if key_present is not None:
            index = key_present.find(0)
            while index >= 0:  # only the (rare, refused at produce) keyless records
                keys[index] = None
                index = key_present.find(0, index + 1)
        return cls(count=cols.count, offsets=offsets, keys=keys, key_present=key_present,
                   value_present=_row_flags(cols.values.validity, cols.values.null_count, cols.count),
                   key_bytes=len(data))


class OffsetMap:
    """Key -> latest offset over the dirty part of a log (Kafka's OffsetMap), bounded in memory.

    Contract: ``add`` takes the rows of consecutive chunks in offset order; ``full`` turns true once
    the estimated size passes ``max_bytes`` (the caller stops adding at a batch boundary and records
    how far the map goes: records past that are kept by the pass whatever their key).

    Not thread-safe: one pass owns it.
    """

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._map: dict[bytes | None, int] = {}
        self._rows = 0
        self._key_bytes = 0

    def __len__(self) -> int:
        return len(self._map)

    def get(self, key: bytes) -> int:
        return self._map.get(key, -1)

    @property
    def estimated_bytes(self) -> int:
        average_key = self._key_bytes / self._rows if self._rows else 0
        return int(len(self._map) * (MAP_ENTRY_OVERHEAD + average_key))

    @property
    def full(self) -> bool:
        return self.estimated_bytes >= self.max_bytes

    def add(self, rows: ChunkRows, *, start: int, end: int) -> None:
        """Map the keys of the rows with ``start <= offset < end``."""
        i = bisect_left(rows.offsets, start)
        j = bisect_left(rows.offsets, end)
        if i >= j:
            return
        whole = i == 0 and j == rows.count
        keys = rows.keys if whole else rows.keys[i:j]
        self._map.update(zip(keys, rows.offsets if whole else rows.offsets[i:j], strict=True))
        if rows.key_present is not None:
            self._map.pop(None, None)
        self._rows += j - i
        self._key_bytes += rows.key_bytes * (j - i) // max(rows.count, 1)

    def superseded(self, rows: ChunkRows) -> bytes | None:
        """Per row 1 if a later record of its key is in the map, else 0; None if the map is empty."""
        if not self._map:
            return None
        # Both maps run in C: dict.get over the keys, then offset < latest over the pairs.
        return bytes(map(operator.lt, rows.offsets, map(self._map.get, rows.keys, repeat(-1))))


class TxnTracker:
    """Which batches of a pass belong to aborted transactions, and which markers' transactions have
    no batch left (Kafka's ``CleanedTransactionMetadata``). Fed every batch of the pass in offset
    order. ``aborted``: the log's aborted transactions overlapping the pass.

    Not thread-safe: one pass owns it.
    """

    def __init__(self, aborted: Sequence[AbortedTxn] = ()) -> None:
        self._pending = deque(sorted(aborted, key=lambda a: a.first_offset))
        self._aborted: dict[int, bool] = {}  # producer id -> a batch of its aborted txn was read
        self._committed: set[int] = set()  # producers whose (not aborted) txn had a batch read

    def _reach(self, offset: int) -> None:
        pending = self._pending
        while pending and pending[0].first_offset <= offset:
            self._aborted.setdefault(pending.popleft().producer_id, False)

    def on_batch(self, header: BatchHeader) -> bool:
        """A data batch; True when its records belong to an aborted transaction."""
        self._reach(header.last_offset)
        if not header.is_transactional:
            return False
        pid = header.producer_id
        if pid in self._aborted:
            self._aborted[pid] = True
            return True
        self._committed.add(pid)
        return False

    def on_marker(self, header: BatchHeader) -> bool:
        """A control batch; True when the pass read no batch of its transaction (it may go)."""
        self._reach(header.last_offset)
        if header.record_count <= 0:
            return True  # emptied by an earlier pass
        pid = header.producer_id
        if pid in self._aborted:
            return not self._aborted.pop(pid)
        if pid in self._committed:
            self._committed.discard(pid)
            return False
        return True

    def observe(self, header: BatchHeader) -> None:
        """A batch of a group the pass skips: its effect on the state, nothing else."""
        if header.is_control:
            self.on_marker(header)
        else:
            self.on_batch(header)


@dataclass
class FilterStats:
    """What filtering did (summed over a pass)."""

    batches_copied: int = 0
    batches_rewritten: int = 0
    batches_removed: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    keyless_removed: int = 0
    horizons_set: int = 0
    aborted_removed: int = 0
    markers_removed: int = 0
    empty_batches_kept: int = 0

    def add(self, other: FilterStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class FilteredChunk:
    """The output of one chunk: whole batches (pieces of bytes) and their headers, in order."""

    pieces: list[bytes | memoryview] = field(default_factory=list)
    headers: list[BatchHeader] = field(default_factory=list)
    # Earliest delete horizon of an output batch that still holds a tombstone (None: no such batch).
    earliest_horizon: int | None = None
    # False when the output is the input byte for byte.
    changed: bool = False
    stats: FilterStats = field(default_factory=FilterStats)

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.pieces)

    def _horizon(self, horizon: int) -> None:
        if self.earliest_horizon is None or horizon < self.earliest_horizon:
            self.earliest_horizon = horizon


class BatchFilter:
    """Applies the retention rules of the module docstring to chunks of one log, at time ``now_ms``.

    Not thread-safe: one pass owns it.
    """

    def __init__(self, offset_map: OffsetMap, *, now_ms: int, delete_retention_ms: int,
                 txns: TxnTracker | None = None, last_records: Mapping[int, tuple[int, int]] | None = None) -> None:
        self.offset_map = offset_map
        self.now_ms = now_ms
        self.new_horizon_ms = now_ms + delete_retention_ms
        self.txns = txns or TxnTracker()
        self.last_records = last_records or {}

    def _last_of_producer(self, header: BatchHeader) -> bool:
        last = self.last_records.get(header.producer_id) if header.producer_id >= 0 else None
        if last is None:
            return False
        last_data_offset, epoch = last
        if last_data_offset >= 0:
            return header.last_offset == last_data_offset
        return header.is_control and header.producer_epoch == epoch

    def _marker(self, out: FilteredChunk, batch: memoryview, header: BatchHeader) -> None:
        """A control batch (module docstring's marker rows)."""
        stats = out.stats
        can_go = self.txns.on_marker(header)
        last = self._last_of_producer(header)
        horizon = header.delete_horizon_ms
        if header.record_count <= 0 or (can_go and horizon is not None and self.now_ms >= horizon):
            out.changed |= header.record_count > 0 or not last
            if last:
                kept = batch if header.record_count <= 0 else empty_batch(batch)
                out.pieces.append(kept)
                out.headers.append(read_header(kept))
                stats.empty_batches_kept += 1
            else:
                stats.batches_removed += 1
            stats.markers_removed += header.record_count > 0
            return
        if can_go and horizon is None:
            horizon = self.new_horizon_ms
            batch = rewrite_batch(batch, [True] * header.record_count, delete_horizon_ms=horizon)
            header = read_header(batch)
            stats.horizons_set += 1
            stats.batches_rewritten += 1
            out.changed = True
        else:
            stats.batches_copied += 1
        out.pieces.append(batch)
        out.headers.append(header)
        if can_go:
            out._horizon(horizon)  # type: ignore[arg-type]

    def _emptied(self, out: FilteredChunk, batch: memoryview, header: BatchHeader) -> None:
        """A data batch that loses every record: kept empty when last of its producer."""
        out.changed = True
        if self._last_of_producer(header):
            kept = empty_batch(batch)
            out.pieces.append(kept)
            out.headers.append(read_header(kept))
            out.stats.empty_batches_kept += 1
        else:
            out.stats.batches_removed += 1

    def filter(self, chunk: memoryview, batches: Sequence[tuple[BatchHeader, int]], rows: ChunkRows) -> FilteredChunk:
        """Filter the whole batches of ``chunk`` (``batches``: header and position of each, in order;
        ``rows``: ``ChunkRows.of(chunk)``)."""
        out = FilteredChunk()
        stats = out.stats
        now = self.now_ms
        superseded = self.offset_map.superseded(rows)
        key_present, value_present = rows.key_present, rows.value_present
        row = 0
        for header, pos in batches:
            end = pos + header.size_in_bytes
            if header.is_control:
                self._marker(out, chunk[pos:end], header)
                continue
            aborted = self.txns.on_batch(header)
            count = header.record_count
            if count <= 0:
                if self._last_of_producer(header):  # an empty batch holding a producer's last sequence
                    out.pieces.append(chunk[pos:end])
                    out.headers.append(header)
                    stats.batches_copied += 1
                else:
                    out.changed = True  # an empty batch holds nothing to keep
                    stats.batches_removed += 1
                continue
            lo, hi = row, row + count
            row = hi
            if aborted:
                stats.records_removed += count
                stats.aborted_removed += count
                self._emptied(out, chunk[pos:end], header)
                continue
            lose = (superseded is not None and superseded.find(1, lo, hi) >= 0) or (
                key_present is not None and key_present.find(0, lo, hi) >= 0)
            tombstones = value_present is not None and value_present.find(0, lo, hi) >= 0
            horizon = header.delete_horizon_ms
            if not lose and (not tombstones or (horizon is not None and now < horizon)):
                out.pieces.append(chunk[pos:end])
                out.headers.append(header)
                stats.batches_copied += 1
                if tombstones:
                    out._horizon(horizon)
                continue
            # Per record, only for a batch that changes.
            keep = [True] * count
            tombstone_kept = False
            for k in range(count):
                r = lo + k
                if superseded is not None and superseded[r]:
                    keep[k] = False
                    stats.records_removed += 1
                elif key_present is not None and not key_present[r]:
                    keep[k] = False
                    stats.records_removed += 1
                    stats.keyless_removed += 1
                elif value_present is not None and not value_present[r]:
                    if horizon is not None and now >= horizon:
                        keep[k] = False
                        stats.records_removed += 1
                        stats.tombstones_removed += 1
                    else:
                        tombstone_kept = True
            new_horizon = horizon
            if tombstone_kept and horizon is None:
                new_horizon = self.new_horizon_ms
                stats.horizons_set += 1
            rewritten = rewrite_batch(chunk[pos:end], keep, delete_horizon_ms=new_horizon)
            out.changed = True
            if rewritten is None:
                self._emptied(out, chunk[pos:end], header)
                continue
            out.pieces.append(rewritten)
            out.headers.append(read_header(rewritten))
            stats.batches_rewritten += 1
            if tombstone_kept:
                out._horizon(new_horizon)  # type: ignore[arg-type]
        if row != rows.count:
            raise CorruptMessage(f"the batches of a chunk declare {row} records but hold {rows.count}")
        return out


def rewrite_batch(batch: bytes | bytearray | memoryview, keep: Sequence[bool], *,
                  delete_horizon_ms: int | None) -> bytes | None:
    """``batch`` with only the records ``keep`` marks (one flag per record, in order); None if none.

    With ``delete_horizon_ms`` (KIP-534) BaseTimestamp becomes the horizon, attribute bit 6 is set
    and every kept record's TimestampDelta is re-expressed against it; without, the base timestamp
    (and a horizon flag the batch already has) stays and kept records are copied byte for byte.
    Everything else that identifies the batch is kept (module docstring). The result equals what
    ``BatchBuilder(delete_horizon_ms=..., last_offset_delta=..., base_offset=..., ...)`` builds from
    the kept records with their offset deltas.
    """
    header = read_header(batch)
    view = memoryview(batch)[:header.size_in_bytes]
    if len(view) < header.size_in_bytes:
        raise CorruptMessage(f"batch at offset {header.base_offset} is truncated")
    if len(keep) != header.record_count:
        raise ValueError(f"{len(keep)} keep flags for {header.record_count} records")
    codec = header.compression
    body = view[BATCH_HEADER_SIZE:]
    records = decompress(codec, body) if codec else bytes(body)
    base_ts = header.base_timestamp
    new_base = base_ts if delete_horizon_ms is None else delete_horizon_ms
    try:
        fields = record_fields(records, header.record_count)  # the one record walker, in C
    except ValueError as exc:  # (code, message) of the walk
        raise CorruptMessage(f"batch at offset {header.base_offset}: {exc.args[-1]}") from None
    out = bytearray()
    kept = 0
    max_ts = NO_TIMESTAMP
    for k, (start, attributes, delta_pos, end, ts_delta, *_) in enumerate(fields):
        if not keep[k]:
            continue
        kept += 1
        timestamp = base_ts + ts_delta
        if timestamp > max_ts:
            max_ts = timestamp
        if new_base == base_ts:
            out += records[start:end]
        else:  # only Length and TimestampDelta change; the bytes from OffsetDelta on are copied
            new_delta = encode_varint(timestamp - new_base)
            out += encode_varint(1 + len(new_delta) + end - delta_pos)
            out.append(records[attributes])  # record attributes (unused, copied)
            out += new_delta
            out += records[delta_pos:end]
    if not kept:
        return None
    if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        max_ts = header.max_timestamp  # every record's timestamp is the batch's append time
    attributes = header.attributes | (DELETE_HORIZON_MASK if delete_horizon_ms is not None else 0)
    payload = compress(codec, bytes(out)) if codec else out
    head = bytearray(BATCH_HEADER_SIZE)
    _HEADER.pack_into(head, 0, header.base_offset, BATCH_HEADER_SIZE - LOG_OVERHEAD + len(payload),
                      header.partition_leader_epoch, MAGIC, 0, attributes, header.last_offset_delta, new_base,
                      max_ts, header.producer_id, header.producer_epoch, header.base_sequence, kept)
    crc = _crc32c_mod.crc32c(payload, _crc32c_mod.crc32c(memoryview(head)[_CRC_START:]))
    _CRC.pack_into(head, _CRC_POS, crc)
    return bytes(head) + bytes(payload)


def empty_batch(batch: bytes | bytearray | memoryview) -> bytes:
    """The header of ``batch`` alone, as a batch of no records (module docstring), CRC recomputed."""
    header = read_header(batch)
    head = bytearray(BATCH_HEADER_SIZE)
    _HEADER.pack_into(head, 0, header.base_offset, BATCH_HEADER_SIZE - LOG_OVERHEAD, header.partition_leader_epoch,
                      MAGIC, 0, header.attributes & ~COMPRESSION_MASK, header.last_offset_delta,
                      header.base_timestamp, header.max_timestamp, header.producer_id, header.producer_epoch,
                      header.base_sequence, 0)
    _CRC.pack_into(head, _CRC_POS, _crc32c_mod.crc32c(memoryview(head)[_CRC_START:]))
    return bytes(head)
