"""One cleaning pass over one partition log (Kafka's ``Cleaner.doClean``).

Offsets of a compacted log, left to right (Kafka's words)::

    LSO        first dirty offset        first uncleanable offset        active segment     LEO
     |  clean   |          dirty           |  too young / not committed   |  never cleaned     |
     +----------+--------------------------+------------------------------+--------------------+
                 ^ cleaner-offset-checkpoint

* first dirty offset: the checkpoint (``checkpoint.py``), or the LSO when it has none or it lies
  outside [LSO, LEO];
* first uncleanable offset: min(active segment's base, last stable offset (the HW, or the first
  offset of an undecided transaction: its records cannot be judged yet), base of the first dirty
  segment whose largest timestamp is within ``min.compaction.lag.ms`` of now). Only whole
  non-active segments below it are *cleanable*: the active segment is never touched and nothing
  above the last stable offset is;
* dirty ratio = dirty bytes / (clean + dirty bytes), by whole segments.

A pass (``Cleaner.clean``):

1. builds the offset map (key -> latest offset) over the dirty records, stopping early when the
   map is full (``log.cleaner.dedupe.buffer.size``); the first offset it did not cover becomes the
   new checkpoint;
2. groups the cleanable segments below that offset into runs of at most ``segment.bytes``
   (Kafka's ``groupSegmentsBySize``), so small cleaned segments merge;
3. cleans each group that can change (any group while there is dirty data; otherwise only groups
   holding a tombstone whose delete horizon has passed) into a ``CleanedSegment`` with the rules of
   ``batch_filter``, then swaps it in under the log's lock (``swap``), after checking that the
   group's segments are still exactly what was read (a truncation or deletion meanwhile aborts
   that group; its cleaned files are removed).

Transactions: the plan takes the log's aborted transactions and each producer's last data offset;
the offset map skips the records of aborted transactions (they must never supersede a committed
value), and one ``TxnTracker`` follows the whole pass in offset order, a group the pass skips
included (its batch headers only), so markers and aborted records follow ``batch_filter``'s rules.

Offsets of kept records never change; a batch's base offset and offset range never change.
Reads of segment data go through the cleaner's own file descriptors, opened under the log's lock,
so a segment deleted meanwhile still reads its old bytes. Every byte read or written is reported to
the throttler.

Thread-safety: a ``Cleaner`` is used by one thread at a time (the scheduler's); it only touches a
log's segments inside ``PartitionLog.segments_locked`` blocks, so logs stay usable by every other
thread during a pass.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lowtide.errors import CorruptMessage, KafkaStorageError
from lowtide.log.cleaner.batch_filter import BatchFilter, ChunkRows, FilterStats, OffsetMap, TxnTracker
from lowtide.log.cleaner.config import LONG_MAX, CleanerSettings, CompactionConfig
from lowtide.log.cleaner.swap import STEP_CLEANED, CleanedSegment, SwapHook, swap_in
from lowtide.log.cleaner.throttler import Throttler
from lowtide.log.file_deleter import DELETER
from lowtide.log.partition_log import PartitionLog
from lowtide.log.producer_state import AbortedTxn
from lowtide.log.segment import LogSegment
from lowtide.log.segment_set import SegmentSet
from lowtide.record import BATCH_HEADER_SIZE, LOG_OVERHEAD, BatchHeader, iter_batches, read_header

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">qi")
_MAX_RELATIVE_OFFSET = 0xFFFFFFFF


class CleanerStopped(Exception):
    """The cleaner is shutting down: the pass stops between chunks (its cleaned files are removed)."""


class GroupChanged(Exception):
    """The segments of a group changed while it was cleaned (truncation, deletion): not swapped."""


@dataclass(frozen=True, slots=True)
class SegmentView:
    """A segment as a plan saw it (the object itself, for the swap's identity check)."""

    segment: LogSegment
    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp: int
    path: Path

    @classmethod
    def of(cls, segment: LogSegment) -> SegmentView:
        return cls(segment=segment, base_offset=segment.base_offset, next_offset=segment.next_offset,
                   size_bytes=segment.size_bytes, max_timestamp=segment.max_timestamp, path=segment.log_path)


@dataclass(frozen=True)
class CleanPlan:
    """Where a log stands for compaction at ``now_ms`` (Kafka's LogToClean and cleanableOffsets)."""

    topic: str
    partition: int
    now_ms: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    first_dirty_offset: int
    first_uncleanable_offset: int
    segments: tuple[SegmentView, ...]  # the cleanable segments, in offset order
    clean_bytes: int
    dirty_bytes: int
    # How long ago a dirty record passed max.compaction.lag.ms (0: none did). Kafka's
    # maxCompactionDelay: the earliest first-batch timestamp of the dirty non-active segments.
    max_compaction_delay_ms: int
    # A non-active segment waits only for the HW: worth another look soon, not after a backoff.
    waiting_for_high_watermark: bool
    # Transactions (cleaner module docstring): aborted ones overlapping the log, and producer id ->
    # (last data offset or -1, epoch).
    aborted: tuple[AbortedTxn, ...] = ()
    last_records: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0

    def needs_cleaning(self, compaction: CompactionConfig) -> bool:
        """Kafka's rule: dirty bytes to clean, and a ratio above min.cleanable.dirty.ratio or a
        record past max.compaction.lag.ms."""
        return self.dirty_bytes > 0 and (self.dirty_ratio > compaction.min_cleanable_dirty_ratio
                                         or self.max_compaction_delay_ms > 0)


@dataclass
class PassResult:
    """What one pass did."""

    topic: str
    partition: int
    first_dirty_offset: int
    end_offset: int  # the next pass's first dirty offset (the checkpoint)
    dirty_bytes: int
    bytes_read: int = 0
    bytes_written: int = 0
    groups_cleaned: int = 0
    groups_unchanged: int = 0
    groups_skipped: int = 0
    groups_aborted: int = 0
    stats: FilterStats = field(default_factory=FilterStats)
    # Earliest delete horizon of a batch still holding a tombstone, per segment base offset, for
    # every segment this pass produced or read whole; ``replaced``: base offsets that are gone.
    horizons: dict[int, int] = field(default_factory=dict)
    replaced: set[int] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)
    duration_s: float = 0.0


def plan_clean(log: PartitionLog, compaction: CompactionConfig, *, checkpoint: int | None, now_ms: int) -> CleanPlan:
    """The plan of a pass over ``log`` at ``now_ms`` (module docstring). Takes the log's lock briefly;
    raises KafkaStorageError if the log is closed."""
    with log.segments_locked() as segments:
        views = [SegmentView.of(s) for s in segments]
        lso, hw, leo = log.log_start_offset, log.high_watermark, segments.next_offset
        stable = log.last_stable_offset
        aborted = tuple(log.aborted_transactions(lso, leo))
        last_records = log.producer_last_records()
        first_dirty = checkpoint if checkpoint is not None and lso <= checkpoint <= leo else lso
        first_batch_ts = _first_batch_timestamps(segments, first_dirty) if (
            compaction.max_compaction_lag_ms < LONG_MAX) else []
    active = views[-1]
    uncleanable = min(active.base_offset, stable)
    if compaction.min_compaction_lag_ms > 0:
        for v in views[:-1]:
            if v.next_offset > first_dirty and v.max_timestamp > now_ms - compaction.min_compaction_lag_ms:
                uncleanable = min(uncleanable, v.base_offset)
                break
    cleanable: list[SegmentView] = []
    for v in views[:-1]:
        if v.next_offset <= lso:
            continue  # wholly deleted, on its way out
        if v.next_offset > uncleanable:
            break
        cleanable.append(v)
    waiting_for_hw = any(lso < v.next_offset and v.next_offset > hw for v in views[:-1])
    first_dirty = min(max(first_dirty, lso), max(uncleanable, lso))
    dirty = sum(v.size_bytes for v in cleanable if v.next_offset > first_dirty)
    clean = sum(v.size_bytes for v in cleanable if v.next_offset <= first_dirty)
    delay = 0
    positive = [ts for ts in first_batch_ts if ts > 0]
    if positive:
        clean_until = now_ms - compaction.max_compaction_lag_ms
        earliest = min(positive)
        delay = clean_until - earliest if earliest < clean_until else 0
    return CleanPlan(topic=log.topic, partition=log.partition, now_ms=now_ms, log_start_offset=lso,
                     high_watermark=hw, log_end_offset=leo, first_dirty_offset=first_dirty,
                     first_uncleanable_offset=uncleanable, segments=tuple(cleanable), clean_bytes=clean,
                     dirty_bytes=dirty, max_compaction_delay_ms=delay, waiting_for_high_watermark=waiting_for_hw,
                     aborted=aborted, last_records=last_records)


def _first_batch_timestamps(segments: SegmentSet, first_dirty: int) -> list[int]:
    # The max timestamp of the first batch of each dirty non-active segment (one pread each).
    out = []
    for segment in list(segments)[:-1]:
        if segment.next_offset > first_dirty and segment.size_bytes:
            header = next(segment.iter_headers(0), None)
            if header is not None:
                out.append(header[0].max_timestamp)
    return out


def group_segments(views: list[SegmentView] | tuple[SegmentView, ...], *, max_bytes: int) -> list[list[SegmentView]]:
    """Consecutive runs of segments whose sizes add up to at most ``max_bytes`` (at least one
    segment each) and whose offsets fit one segment's 32-bit relative offsets."""
    groups: list[list[SegmentView]] = []
    current: list[SegmentView] = []
    size = 0
    for v in views:
        if current and (size + v.size_bytes > max_bytes
                        or v.next_offset - 1 - current[0].base_offset > _MAX_RELATIVE_OFFSET):
            groups.append(current)
            current, size = [], 0
        current.append(v)
        size += v.size_bytes
    if current:
        groups.append(current)
    return groups


class Cleaner:
    """Runs passes (module docstring) with ``settings``' buffers and the shared ``throttler``.

    ``swap_hook`` is for tests only: called with each step name of a swap (``swap.SWAP_STEPS``); a
    test raises from it to stop a swap there as a crash would (a BaseException skips every
    clean-up). ``stop`` makes a running pass give up between chunks.
    """

    def __init__(self, *, settings: CleanerSettings = CleanerSettings(), throttler: Throttler | None = None,
                 stop: threading.Event | None = None, swap_hook: SwapHook | None = None) -> None:
        self.settings = settings
        self.throttler = throttler or Throttler(settings.io_max_bytes_per_second)
        self.stop = stop or threading.Event()
        self.swap_hook = swap_hook

    # -- a pass ------------------------------------------------------------------------------------

    def clean(self, log: PartitionLog, compaction: CompactionConfig, *, checkpoint: int | None, now_ms: int,
              horizons: dict[int, int] | None = None) -> PassResult:
        """One pass over ``log`` at ``now_ms``. ``horizons`` (segment base -> earliest tombstone
        horizon, from earlier passes; None = unknown) lets a pass with nothing dirty skip the
        groups where nothing can change. Raises KafkaStorageError / CorruptMessage (a log that
        cannot be read or written; nothing half-done stays behind) or CleanerStopped."""
        began = time.monotonic()
        plan = plan_clean(log, compaction, checkpoint=checkpoint, now_ms=now_ms)
        result = PassResult(topic=log.topic, partition=log.partition, first_dirty_offset=plan.first_dirty_offset,
                            end_offset=plan.first_dirty_offset, dirty_bytes=plan.dirty_bytes)
        if not plan.segments:
            return result
        offset_map = OffsetMap(max_bytes=self.settings.dedupe_buffer_size)
        end_limit = plan.segments[-1].next_offset
        try:
            result.end_offset = self._build_offset_map(log, plan, offset_map, end_limit, result)
        except GroupChanged as exc:  # a segment was deleted meanwhile: the next pass starts afresh
            logger.info("log cleaner: pass over %s-%d abandoned: %s", log.topic, log.partition, exc)
            result.groups_aborted += 1
            return result
        txns = TxnTracker(plan.aborted)
        batch_filter = BatchFilter(offset_map, now_ms=now_ms, delete_retention_ms=log.config.delete_retention_ms,
                                   txns=txns, last_records=plan.last_records)
        in_range = [v for v in plan.segments if not len(offset_map) or v.base_offset < result.end_offset]
        for group in group_segments(in_range, max_bytes=log.config.segment_bytes):
            if not self._may_change(group, plan, offset_map, horizons, now_ms):
                result.groups_skipped += 1
                if plan.aborted or plan.last_records:
                    self._observe_group(log, group, txns)
                continue
            try:
                self._clean_group(log, group, batch_filter, result)
            except GroupChanged as exc:
                result.groups_aborted += 1
                logger.info("log cleaner: group of %s-%d at %d abandoned: %s", log.topic, log.partition,
                            group[0].base_offset, exc)
        result.duration_s = time.monotonic() - began
        return result

    @staticmethod
    def _may_change(group: list[SegmentView], plan: CleanPlan, offset_map: OffsetMap,
                    horizons: dict[int, int] | None, now_ms: int) -> bool:
        # With dirty records anything may change; below the checkpoint every record has been through
        # a pass, so only a tombstone whose horizon has passed can (or unknown horizons).
        if len(offset_map) or horizons is None:
            return True
        if any(v.next_offset > plan.first_dirty_offset for v in group):
            return True
        return any(horizons.get(v.base_offset, LONG_MAX) <= now_ms for v in group)

    def _build_offset_map(self, log: PartitionLog, plan: CleanPlan, offset_map: OffsetMap, end_limit: int,
                          result: PassResult) -> int:
        """Map the dirty records; return the first offset the map does not cover."""
        start = plan.first_dirty_offset
        end = start
        txns = TxnTracker(plan.aborted)
        for view in plan.segments:
            if view.next_offset <= start:
                continue
            for chunk, batches in self._chunks(log, view, result):
                last = batches[-1][0].next_offset
                if last <= start:
                    continue  # below the dirty part of a partly clean segment
                offset_map.add(ChunkRows.of(_without_aborted(chunk, batches, txns)), start=start, end=end_limit)
                end = min(last, end_limit)
                if offset_map.full:
                    logger.info("offset map full: cleaning %s-%d up to offset %d this pass", plan.topic,
                                plan.partition, end)
                    return end
            end = max(end, min(view.next_offset, end_limit))
        return end

    def _clean_group(self, log: PartitionLog, group: list[SegmentView], batch_filter: BatchFilter,
                     result: PassResult) -> None:
        base = group[0].base_offset
        cleaned = CleanedSegment(log.dir, base, index_interval_bytes=log.config.index_interval_bytes)
        earliest: int | None = None
        changed = len(group) > 1  # merging segments is a change worth a swap
        stats = FilterStats()
        mtimes: list[int] = []
        try:
            for view in group:
                for chunk, batches in self._chunks(log, view, result, mtimes=mtimes):
                    out = batch_filter.filter(chunk, batches, ChunkRows.of(chunk))
                    stats.add(out.stats)
                    changed |= out.changed
                    if out.earliest_horizon is not None and (earliest is None or out.earliest_horizon < earliest):
                        earliest = out.earliest_horizon
                    if out.headers:
                        data = b"".join(out.pieces)
                        cleaned.append(data, out.headers)
                        result.bytes_written += len(data)
                        self.throttler.maybe_throttle(len(data))
            if not changed:
                # The one segment would come back byte for byte: keep it, skip the swap.
                cleaned.discard()
                result.groups_unchanged += 1
                result.stats.add(stats)
                result.seen.add(base)
                _note_horizon(result, base, earliest)
                return
            # Kafka's cleaned segment inherits the last modification time of what it replaces.
            cleaned.finish(replaced_end=group[-1].next_offset, mtime_ms=max(mtimes, default=None))
        except Exception:
            cleaned.discard()
            raise
        if self.swap_hook is not None:
            self.swap_hook(STEP_CLEANED)
        committed = False
        try:
            with log.segments_locked() as segments:
                _check_unchanged(segments, group)
                committed = True  # swap_in commits, or removes the cleaned files itself
                _, deleted = swap_in(segments, [v.segment for v in group], cleaned,
                                     index_interval_bytes=log.config.index_interval_bytes,
                                     max_message_bytes=log.config.max_message_bytes, hook=self.swap_hook)
        except (GroupChanged, KafkaStorageError) as exc:
            if committed:
                raise
            cleaned.discard()
            result.groups_aborted += 1
            logger.info("log cleaner: group of %s-%d at %d not swapped: %s", log.topic, log.partition, base, exc)
            return
        # Unlinked off this thread after file.delete.delay.ms, as every deleted segment is.
        DELETER.schedule(deleted, delay_s=log.config.file_delete_delay_ms / 1000.0)
        result.groups_cleaned += 1
        result.stats.add(stats)
        result.replaced.update(v.base_offset for v in group)
        result.seen.add(base)
        _note_horizon(result, base, earliest)

    def _observe_group(self, log: PartitionLog, group: list[SegmentView], txns: TxnTracker) -> None:
        """Feed a skipped group's batch headers (one 61-byte read each) to the pass's TxnTracker."""
        for view in group:
            for header in _headers(log, view):
                txns.observe(header)

    # -- reading -----------------------------------------------------------------------------------

    def _chunks(self, log: PartitionLog, view: SegmentView, result: PassResult, *, mtimes: list[int] | None = None,
                ) -> Iterator[tuple[memoryview, list[tuple[BatchHeader, int]]]]:
        """Whole batches of ``view``'s segment, in windows of ``io_buffer_size`` (grown to fit one
        larger batch, as Kafka grows its read buffer), read through a descriptor of our own
        (``mtimes`` gets the file's modification time)."""
        fd = _open_segment(log, view)
        try:
            if mtimes is not None:
                mtimes.append(os.fstat(fd).st_mtime_ns // 1_000_000)
            position, size = 0, view.size_bytes
            window = self.settings.io_buffer_size
            while position < size:
                if self.stop.is_set():
                    raise CleanerStopped(f"log cleaner stopping: pass over {log.topic}-{log.partition} abandoned")
                data = os.pread(fd, min(window, size - position), position)
                batches = list(iter_batches(data))
                if not batches:
                    data = os.pread(fd, _batch_size(data, view, position), position)
                    batches = list(iter_batches(data))
                    if not batches:
                        raise CorruptMessage(f"{view.path} at position {position}: truncated batch")
                header, last = batches[-1]
                used = last + header.size_in_bytes
                result.bytes_read += used
                self.throttler.maybe_throttle(used)
                yield memoryview(data)[:used], batches
                position += used
        finally:
            os.close(fd)

    def scan_horizons(self, log: PartitionLog) -> dict[int, int]:
        """Earliest delete horizon per non-active segment, from batch headers only (one pread of 61
        bytes per batch): for a log this process has not cleaned yet. Batches with the flag count
        whether or not they still hold a tombstone (at worst one pass too many)."""
        with log.segments_locked() as segments:
            views = [SegmentView.of(s) for s in list(segments)[:-1]]
        out: dict[int, int] = {}
        for view in views:
            for header in _headers(log, view):  # none when the segment left the log
                horizon = header.delete_horizon_ms
                if horizon is not None:  # a tombstone's, or a marker's waiting to go
                    out[view.base_offset] = min(horizon, out.get(view.base_offset, horizon))
        return out


def _without_aborted(chunk: memoryview, batches: list[tuple[BatchHeader, int]],
                     txns: TxnTracker) -> memoryview | bytes:
    """``chunk`` without the data batches of aborted transactions (per batch: their records must
    not enter the offset map); the chunk itself when it has none."""
    keep: list[tuple[int, int]] = []
    dropped = False
    for header, pos in batches:
        if header.is_control:
            txns.on_marker(header)
        elif txns.on_batch(header):
            dropped = True
            continue
        keep.append((pos, pos + header.size_in_bytes))
    if not dropped:
        return chunk
    return b"".join(chunk[a:b] for a, b in keep)


def _headers(log: PartitionLog, view: SegmentView) -> Iterator[BatchHeader]:
    """The batch headers of ``view``'s .log, one pread each; none if the segment left the log."""
    try:
        fd = _open_segment(log, view)
    except GroupChanged:
        return
    try:
        position = 0
        while position < view.size_bytes:
            header = read_header(os.pread(fd, BATCH_HEADER_SIZE, position))
            yield header
            position += header.size_in_bytes
    finally:
        os.close(fd)


def _note_horizon(result: PassResult, base: int, earliest: int | None) -> None:
    if earliest is not None:
        result.horizons[base] = earliest


def _batch_size(data: bytes, view: SegmentView, position: int) -> int:
    if len(data) < LOG_OVERHEAD:
        raise CorruptMessage(f"{view.path} at position {position}: truncated batch")
    length = _LENGTH.unpack_from(data)[1]
    if position + LOG_OVERHEAD + length > view.size_bytes:
        raise CorruptMessage(f"{view.path} at position {position}: batch runs past the segment end")
    return LOG_OVERHEAD + length


def _open_segment(log: PartitionLog, view: SegmentView) -> int:
    """A read-only descriptor of ``view``'s .log, opened while the segment is still in the log (under
    its lock, so the name is that segment's). Raises GroupChanged if it left the log."""
    with log.segments_locked() as segments:
        if not any(s is view.segment for s in segments):
            raise GroupChanged(f"segment {view.base_offset} of {log.topic}-{log.partition} is gone")
        try:
            return os.open(view.path, os.O_RDONLY)
        except OSError as exc:
            raise KafkaStorageError(f"cannot open {view.path} for cleaning: {exc}") from exc


def _check_unchanged(segments: SegmentSet, group: list[SegmentView]) -> None:
    """Under the lock: the group is still consecutive non-active segments, as big as when read."""
    current = list(segments)
    start = next((i for i, s in enumerate(current) if s is group[0].segment), -1)
    if start < 0 or start + len(group) >= len(current):
        raise GroupChanged("segments left the log or became active")
    for v, s in zip(group, current[start:start + len(group)], strict=True):
        if s is not v.segment or s.size_bytes != v.size_bytes or s.next_offset != v.next_offset:
            raise GroupChanged(f"segment {v.base_offset} changed while it was cleaned")
