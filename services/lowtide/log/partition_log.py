"""The log of one partition replica: segments + log start offset + high watermark, behind one lock.

Layers: LogSegment (one .log/.index/.timeindex) -> SegmentSet (ordered segments, active segment) ->
PartitionLog (this module: offsets, retention, truncation, the lock). Files: filenames.py.

Offsets (Kafka's words): LSO = log start offset (KIP-107), HW = high watermark, LEO = log end
offset. Invariant kept by every method: first segment base <= LSO <= HW <= LEO.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lowtide.clock import now_ms
from lowtide.errors import (
    InvalidRecord,
    KafkaStorageError,
    MessageTooLarge,
    OffsetOutOfRange,
    RecordListTooLarge,
)
from lowtide.log.checkpoint import fsync_directory
from lowtide.log.compacted_keys import require_keys
from lowtide.log.file_deleter import DELETER, PendingCall, PendingDelete
from lowtide.log.filenames import deleted_partition_dir_name
from lowtide.log.leader_epoch import LeaderEpochCache
from lowtide.log.log_config import LogConfig
from lowtide.log.producer_snapshot import ProducerSnapshots, load_producer_state
from lowtide.log.producer_state import AbortedTxn, ProducerDescription, ProducerStateManager
from lowtide.log.segment import LogSegment
from lowtide.log.segment_retention import count_segments_past_retention
from lowtide.log.segment_set import SegmentSet
from lowtide.log.start_offset_commit import LogStartOffsetCommit
from lowtide.log.start_offset_file import LogStartOffsetFile
from lowtide.record import NO_TIMESTAMP, BatchHeader, OwnedBatches, assign_offsets, iter_batches, validate_batches

logger = logging.getLogger(__name__)

_MAX_RELATIVE_OFFSET = 0xFFFFFFFF
RECYCLE_ACTIVE_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append wrote: offsets [base_offset, last_offset], next_offset = new LEO."""

    base_offset: int
    last_offset: int
    next_offset: int
    max_timestamp: int
    num_batches: int
    size_bytes: int


class PartitionLog:
    """One partition replica's log.

    Contract: appends are whole validated batches; reads return whole batches below a caller-given
    bound (HW for consumers, LEO for followers); LSO only grows except through truncation, never
    past HW (KIP-107); HW stays within [LSO, LEO]; segments entirely below LSO are deleted promptly
    (after ``file_delete_delay_ms``), with the producer-state snapshots below the first segment left;
    a producer-state snapshot is written at each roll and on ``close`` (producer_snapshot.py).

    Thread-safety: every public method takes the instance's RLock, so any thread may call any
    method. Lower layers (SegmentSet, LogSegment) are only touched with the lock held.
    """

    def __init__(self, *, dir: Path, topic: str, partition: int, config: LogConfig, segments: SegmentSet) -> None:
        self._dir = dir
        self._topic = topic
        self._partition = partition
        self._config = config
        self._segments = segments
        self._lock = threading.RLock()
        self._log_start_offset = segments.first.base_offset
        self._high_watermark = self._log_start_offset
        self._closed = False
        self._pending_deletes: list[PendingDelete | PendingCall] = []
        self._lso_file = LogStartOffsetFile(dir)
        # The highest LSO written to that file, taken or not: >= LSO, above it while a
        # LogStartOffsetCommit has written a value it has not flushed and taken yet. No write goes
        # below it, so a pending commit is never undercut by a lower value with a newer sequence.
        self._lso_written = self._log_start_offset
        self._epochs = LeaderEpochCache.load(dir, log_is_empty=segments.size_bytes == 0)
        self._producers = ProducerStateManager()  # read by open(): a snapshot and the headers after it
        self._snapshots = ProducerSnapshots(dir)

    @classmethod
    def open(
        cls,
        dir: Path,
        *,
        topic: str,
        partition: int,
        config: LogConfig,
        log_start_offset: int = 0,
        high_watermark: int | None = None,
        recover: bool = True,
    ) -> PartitionLog:
        """Open (creating) the partition directory and recover it.

        LSO = max(the partition's log start offset file, or ``log_start_offset`` (checkpointed)
        when that file does not exist yet, first segment's base offset); if that is past the
        recovered LEO the log restarts empty at it. ``high_watermark`` (checkpointed) is clamped
        to [LSO, LEO]; without it HW starts at LSO. The producer state comes from the newest valid
        producer-state snapshot at or below LEO plus the batch headers after it (every header
        without one), less the producers expired by ``producer.id.expiration.ms``. ``recover=False``
        (the directory was closed by a clean shutdown) skips the scan of the last segment
        (``SegmentSet.open``).
        """
        dir = Path(dir)
        segments = SegmentSet.open(
            dir,
            initial_offset=log_start_offset,
            index_interval_bytes=config.index_interval_bytes,
            max_message_bytes=config.max_message_bytes,
            recover=recover,
        )
        log = cls(dir=dir, topic=topic, partition=partition, config=config, segments=segments)
        durable = log._lso_file.read()
        # The file is written before every LSO change takes effect, so it is never older than the
        # periodic checkpoint; the checkpoint only counts for a directory that predates the file.
        lso = max(log_start_offset if durable is None else durable, segments.first.base_offset)
        if lso > segments.next_offset:
            segments.truncate_fully_and_start_at(lso)
        log._log_start_offset = log._lso_written = lso
        if durable is None:
            log._lso_file.create(lso)
        elif durable != lso:
            log._lso_file.write(lso)
        # Finish a deletion the durable LSO implies but a crash interrupted.
        for segment in segments.remove_below(lso):
            segment.delete()
        hw = lso if high_watermark is None else high_watermark
        log._high_watermark = min(max(hw, lso), segments.next_offset)
        # Recovery may have cut a torn tail: epochs starting past the recovered end wrote nothing.
        log._epochs.truncate_from_end(segments.next_offset)
        log._epochs.truncate_from_start(lso)
        log._load_producer_state()
        log.remove_expired_producers(now_ms=now_ms())
        return log

    def _load_producer_state(self) -> None:
        """The producer state of what the log holds: its newest valid snapshot at or below the log
        end plus the headers after it, else every header (producer_snapshot.py)."""
        self._producers = load_producer_state(segments=list(self._segments), snapshots=self._snapshots)
        self._producers.truncate_head(self._log_start_offset)

    # -- properties -------------------------------------------------------------------------------

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        with self._lock:
            return self._segments.next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._segments.size_bytes

    @property
    def num_segments(self) -> int:
        with self._lock:
            return len(self._segments)

    @contextmanager
    def segments_locked(self) -> Iterator[SegmentSet]:
        """For the log cleaner (log/cleaner/): the segment set with this log's lock held for the
        block; KafkaStorageError if the log is closed. The cleaner snapshots and swaps segments
        only inside such blocks, so no reader ever sees a half-swapped log."""
        with self._lock:
            self._ensure_open()
            yield self._segments

    def update_config(self, config: LogConfig) -> None:
        """Apply new topic settings (take effect at the next append / retention pass)."""
        with self._lock:
            self._config = config

    # -- appends ----------------------------------------------------------------------------------

    def append_as_leader(self, buf: bytes | bytearray | memoryview, *, leader_epoch: int,
                         from_coordinator: bool = False, expected_end_offset: int = -1) -> AppendInfo:
        """Validate producer batches, assign offsets from LEO and the leader epoch, append.

        ``expected_end_offset`` >= 0 makes the append conditional (producer_state.py ``check_expected_end``).

        Raises CorruptMessage / InvalidRecord / UnsupportedForMessageFormat (validation; a control
        batch is INVALID_RECORD unless ``from_coordinator``: only transaction markers write them;
        a coordinator's batches skip the sequence checks, as Kafka's COORDINATOR origin does),
        MessageTooLarge (a batch > max.message.bytes), RecordListTooLarge (> segment.bytes),
        InvalidProducerEpoch / InvalidTxnState / OutOfOrderSequenceNumber (producer_state.py; also a
        conditional append whose condition fails). Nothing is stored when any check fails. A retry
        of an idempotent producer's batches appends nothing and returns their original offsets
        (docs/design/idempotence.md; ``num_batches`` 0, ``next_offset`` the unchanged LEO).
        """
        headers = validate_batches(buf)
        if not from_coordinator and any(h.is_control for h in headers):
            raise InvalidRecord(f"control batches are not allowed from clients ({self._topic}-{self._partition})")
        config = self._config
        for header in headers:
            if header.size_in_bytes > config.max_message_bytes:
                raise MessageTooLarge(
                    f"batch of {header.size_in_bytes} bytes exceeds max.message.bytes "
                    f"{config.max_message_bytes} of {self._topic}-{self._partition}"
                )
        for header in headers:
            # Checked per batch, as Kafka does: a request of several batches may span segments.
            if header.size_in_bytes > config.segment_bytes:
                raise RecordListTooLarge(
                    f"batch of {header.size_in_bytes} bytes exceeds segment.bytes {config.segment_bytes} "
                    f"of {self._topic}-{self._partition}"
                )
        if config.compacts:  # Kafka's validateKey: compaction keeps the latest record *per key*
            require_keys(buf, topic_partition=f"{self._topic}-{self._partition}")
        # Offsets are assigned in place: in a copy, unless the caller handed the buffer over.
        data = buf if isinstance(buf, OwnedBatches) else bytearray(buf)
        with self._lock:
            self._ensure_open()
            base = self._segments.next_offset
            if expected_end_offset >= 0:
                self._producers.check_expected_end(
                    name=f"{self._topic}-{self._partition}", producer_id=headers[0].producer_id if headers else -1,
                    producer_epoch=headers[0].producer_epoch if headers else -1, end=base,
                    expected=expected_end_offset)
            duplicate = self._producers.check_append(headers, client=not from_coordinator)
            if duplicate is not None:  # a producer's retry: its original offsets, nothing appended
                return AppendInfo(duplicate.first_offset, duplicate.last_offset, base, duplicate.max_timestamp, 0, 0)
            assign_offsets(data, headers, base_offset=base, leader_epoch=leader_epoch)
            # Re-read the (now offset-assigned) headers: per batch struct unpacks, no record loop.
            assigned = [header for header, _ in iter_batches(data)]
            return self._append(data, assigned)

    def append_as_follower(self, buf: bytes | bytearray | memoryview) -> AppendInfo:
        """Append batches replicated from the leader, keeping their offsets.

        The first batch must start at LEO, or after it on a compacted log (offsets the leader's
        cleaner removed), else OffsetOutOfRange. One exception, as in
        Kafka: an empty log restarted at a leader LSO that falls inside a batch accepts that batch
        and restarts at its base offset (LSO is kept).
        """
        headers = validate_batches(buf, allow_compacted=True)
        prev_next = headers[0].base_offset
        for header in headers:
            if header.base_offset < prev_next:
                raise OffsetOutOfRange(
                    f"follower batches for {self._topic}-{self._partition} go back from {prev_next} "
                    f"to {header.base_offset}"
                )
            prev_next = header.next_offset
        # A read-only view of the fetched message is written as it is; anything writable is
        # copied first, since its owner could change it between the checks above and the write.
        data = buf if isinstance(buf, bytes) or (isinstance(buf, memoryview) and buf.readonly) else bytes(buf)
        with self._lock:
            self._ensure_open()
            leo = self._segments.next_offset
            first = headers[0]
            if first.base_offset != leo:
                if self._segments.size_bytes == 0 and first.base_offset < leo <= first.last_offset:
                    # Snapshots at the old end would skip this batch (it starts below them).
                    self._snapshots.remove_above(first.base_offset)
                    self._segments.truncate_fully_and_start_at(first.base_offset)
                elif first.base_offset < leo or not self._config.compacts:
                    # (A compacted log may skip ahead: the leader's cleaner removed those offsets.)
                    raise OffsetOutOfRange(
                        f"follower append to {self._topic}-{self._partition} starts at offset "
                        f"{first.base_offset} but the log end offset is {leo}"
                    )
            info = self._append(data, headers)
            # Per batch, not per record: a follower learns each new leader epoch from the batches
            # that carry it (KIP-101), so it can answer and truncate by epoch if it leads later.
            latest = self._epochs.latest_epoch
            for header in headers:
                if header.partition_leader_epoch > latest:
                    self._epochs.assign(header.partition_leader_epoch, header.base_offset)
                    latest = header.partition_leader_epoch
            return info

    def _append(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader]) -> AppendInfo:
        first, last = headers[0], headers[-1]
        config = self._config
        view = memoryview(data)
        start = 0  # index of the first batch not yet appended
        pos = 0  # its byte position in data
        while start < len(headers):
            active = self._segments.active
            room = config.segment_bytes - active.size_bytes
            # Take as many whole batches as fit in the active segment (per batch, never per record).
            end, size = start, 0
            while end < len(headers) and size + headers[end].size_in_bytes <= max(room, 0):
                size += headers[end].size_in_bytes
                end += 1
            chunk_first, chunk_last = headers[start], headers[max(end, start + 1) - 1]
            if active.size_bytes > 0 and (
                end == start
                or now_ms() - active.created_ms > config.segment_ms
                or chunk_last.last_offset - active.base_offset > _MAX_RELATIVE_OFFSET
            ):
                self._roll(chunk_first.base_offset)
                continue
            if active.size_bytes == 0 and active.base_offset != chunk_first.base_offset:
                # An empty segment is re-based so its name matches its first batch.
                active = self._segments.roll(chunk_first.base_offset)
            if end == start:  # an empty segment takes one batch even if it is larger than the room
                end, size = start + 1, headers[start].size_in_bytes
            chunk = view[pos:pos + size] if (pos or size != len(data)) else data
            active.append(chunk, headers[start:end])
            # Per chunk, so a roll's snapshot holds exactly the batches below the new segment.
            self._producers.apply_batches(chunk, headers[start:end])
            start, pos = end, pos + size
        return AppendInfo(
            base_offset=first.base_offset,
            last_offset=last.last_offset,
            next_offset=last.next_offset,
            max_timestamp=max(h.max_timestamp for h in headers),
            num_batches=len(headers),
            size_bytes=len(data),
        )

    def roll(self) -> LogSegment:
        """Start a new active segment at LEO (no-op on an empty active segment)."""
        with self._lock:
            self._ensure_open()
            return self._roll(self._segments.next_offset)

    def _roll(self, base_offset: int) -> LogSegment:
        """Seal the active segment and start one at ``base_offset``; a sealed segment gets the
        producer-state snapshot of everything below the new one (Kafka takes it at roll too)."""
        sealed = self._segments.active.size_bytes > 0
        segment = self._segments.roll(base_offset)
        if sealed:
            self._take_snapshot()
        return segment

    def _take_snapshot(self) -> None:
        """Write the producer-state snapshot at the log end offset. The segments below it are
        fsynced already (a roll seals, close flushes), so a crash never leaves a snapshot that
        describes batches the log lost. A failed write only costs the next open a longer read."""
        try:
            self._snapshots.write(self._producers, offset=self._segments.next_offset)
        except OSError as exc:
            logger.warning("cannot write the producer snapshot of %s-%s in %s: %s", self._topic, self._partition,
                        self._dir, exc)

    # -- reads ------------------------------------------------------------------------------------

    def read(self, fetch_offset: int, *, max_bytes: int, max_offset: int) -> bytes:
        """Whole batches from the one containing ``fetch_offset``, excluding batches at/after
        ``max_offset`` (HW for consumers, LEO for followers); at least one batch if any qualifies,
        else at most ``max_bytes``. Stops at a segment end (the client fetches again).

        Raises OffsetOutOfRange if ``fetch_offset`` is outside [LSO, LEO].
        """
        with self._lock:
            self._ensure_open()
            leo = self._segments.next_offset
            if fetch_offset < self._log_start_offset or fetch_offset > leo:
                raise OffsetOutOfRange(
                    f"fetch offset {fetch_offset} of {self._topic}-{self._partition} is outside the "
                    f"valid range [{self._log_start_offset}, {leo}]"
                )
            max_offset = min(max_offset, leo)
            if fetch_offset >= max_offset:
                return b""
            for segment in self._segments.segments_from(fetch_offset):
                if segment.base_offset >= max_offset:
                    return b""
                position = segment.translate_offset(fetch_offset)
                if position is None:
                    continue  # fetch_offset is past this segment's last batch
                if max_offset < segment.next_offset:
                    end = segment.position_of_offset_bound(max_offset)
                else:
                    end = segment.size_bytes
                return segment.read_batches(position, end_position=end, max_bytes=max_bytes)
            return b""

    def offset_for_timestamp(self, timestamp: int, *, max_offset: int | None = None) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after LSO with timestamp >= ``timestamp``,
        searching from the first batch whose max timestamp >= it (Kafka's ListOffsets). Results
        at/after ``max_offset`` (default HW: what a consumer may read) are None."""
        with self._lock:
            self._ensure_open()
            bound = self._high_watermark if max_offset is None else max_offset
            lso = self._log_start_offset
            for segment in self._segments:
                if segment.next_offset <= lso or segment.max_timestamp < timestamp:
                    continue
                found = segment.find_offset_by_timestamp(timestamp, starting_offset=lso)
                if found is not None:
                    return found if found[0] < bound else None
            return None

    # -- transactions (producer_state.py) ---------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """What read_committed consumers may read up to (excluded): min(HW, first offset of any
        ongoing transaction), never below the log start offset."""
        with self._lock:
            return self._producers.last_stable_offset(high_watermark=self._high_watermark,
                                                      log_start_offset=self._log_start_offset)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [start_offset, end_offset) (read_committed fetch, cleaner)."""
        with self._lock:
            return self._producers.aborted_transactions(start_offset, end_offset)

    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its ongoing transaction."""
        with self._lock:
            return self._producers.ongoing()

    def in_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether ``producer_id`` has an ongoing transaction in this log in ``producer_epoch``."""
        with self._lock:
            return self._producers.in_transaction(producer_id, producer_epoch)

    def describe_producers(self) -> list[ProducerDescription]:
        """The partition's active producers (Kafka's DescribeProducers), by producer id."""
        with self._lock:
            return self._producers.describe()

    def remove_expired_producers(self, *, now_ms: int) -> list[int]:
        """KIP-854: forget the producers idle for ``producer.id.expiration.ms`` with no open
        transaction (producer_state.py); their ids. Run periodically by the replica."""
        with self._lock:
            if self._closed:
                return []
            return self._producers.remove_expired(now_ms=now_ms,
                                                  expiration_ms=self._config.producer_id_expiration_ms)

    def producer_last_records(self) -> dict[int, tuple[int, int]]:
        """Producer id -> (last data offset or -1, epoch), for the cleaner's empty-batch rule."""
        with self._lock:
            return self._producers.last_records()

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with the largest timestamp (ListOffsets -3)."""
        with self._lock:
            self._ensure_open()
            best: LogSegment | None = None
            for segment in self._segments:
                if segment.max_timestamp != NO_TIMESTAMP and (
                    best is None or segment.max_timestamp > best.max_timestamp
                ):
                    best = segment
            return best.find_max_timestamp_offset() if best is not None else None

    # -- leader epochs (KIP-101 / KIP-279) ---------------------------------------------------------

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch this log has written or replicated, -1 if none."""
        with self._lock:
            return self._epochs.latest_epoch

    @property
    def epochs_known(self) -> bool:
        """False for a non-empty log written before epochs were recorded (its epochs are unknown)."""
        with self._lock:
            return self._epochs.known

    def release_idle_files(self) -> int:
        """Close the files of segments unused since the last call (LogSegment.release_idle_file);
        how many were closed. A later read or append opens them again, under this lock."""
        with self._lock:
            if self._closed:
                return 0
            return sum(segment.release_idle_file() for segment in self._segments)

    def assign_leader_epoch(self, epoch: int) -> None:
        """A new leadership: ``epoch`` starts at the current LEO (persisted before any append)."""
        with self._lock:
            self._ensure_open()
            self._epochs.assign(epoch, self._segments.next_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch on this log: (largest epoch <= ``epoch`` known, its end offset)."""
        with self._lock:
            self._ensure_open()
            return self._epochs.end_offset_for(epoch, log_end_offset=self._segments.next_offset)

    def leader_epochs(self) -> list[tuple[int, int]]:
        with self._lock:
            return self._epochs.entries()

    # -- offsets ----------------------------------------------------------------------------------

    def set_high_watermark(self, high_watermark: int) -> int:
        """Raise HW to ``high_watermark`` clamped to [LSO, LEO]; HW never decreases here. Returns HW."""
        with self._lock:
            clamped = min(max(high_watermark, self._log_start_offset), self._segments.next_offset)
            if clamped > self._high_watermark:
                self._high_watermark = clamped
            return self._high_watermark

    def increment_log_start_offset(self, offset: int, *, commit: LogStartOffsetCommit | None = None) -> bool:
        """KIP-107: LSO = max(LSO, offset), then delete segments whose last offset < LSO.

        Raises OffsetOutOfRange if ``offset`` > HW (deletes never pass the HW; a follower must set
        its HW from the fetch response before applying the leader's LSO). Returns whether LSO
        moved. With ``commit`` the new LSO is written without a flush and nothing else changes
        yet: ``commit.commit()`` flushes it with the others and takes it (the return value then
        says whether it will move).
        """
        with self._lock:
            self._ensure_open()
            if offset > self._high_watermark:
                raise OffsetOutOfRange(
                    f"cannot move the log start offset of {self._topic}-{self._partition} to {offset}: "
                    f"above the high watermark {self._high_watermark}"
                )
            if offset <= self._log_start_offset:
                return False
            if commit is None:
                self._write_log_start_offset(offset)  # durable before anyone can see it
                self._take_log_start_offset(offset)
                return True
            sequence = None
            if offset > self._lso_written:
                self._lso_file.write(offset, group=commit.sync_group)
                self._lso_written = offset
                sequence = self._lso_file.sequence
            # else an unfinished commit already wrote at least ``offset``: taking it waits for that
            # write to be durable (see take_committed).
            commit.add(self, offset, sequence)
            return True

    def _write_log_start_offset(self, offset: int) -> None:
        """Make ``offset`` (> LSO) durable in the LSO file now, for a take that follows at once."""
        if offset > self._lso_written:
            self._lso_file.write(offset)
            self._lso_written = offset
        elif (self._lso_file.durable_value or 0) < offset:
            self._lso_file.flush()  # a commit wrote >= offset and has not flushed yet

    def _take_log_start_offset(self, offset: int) -> None:
        """LSO = ``offset``, already durable: trim the epochs, delete the segments below it.

        An active segment left wholly below it is emptied by the file deleter's thread, not here:
        its truncation frees blocks (0.2-0.5 ms per file with ``discard``, three files), which on
        a 1,000-partition DeleteRecords sat on the leader's reply and each follower's next fetch.
        Until then it stays, dead bytes below the LSO (an append before that lands after them)."""
        self._log_start_offset = offset
        self._epochs.truncate_from_start(offset)
        self._producers.truncate_head(offset)
        limit = self._recycle_limit()
        self._delete_segments(self._segments.remove_below(offset, recycle_active_up_to=limit, defer_recycle=True))
        active = self._segments.active
        if active.size_bytes > 0 and active.next_offset <= offset:
            self._pending_deletes = [p for p in self._pending_deletes if not p.done]
            self._pending_deletes.append(DELETER.schedule_call(self._remove_dead_segments))

    def _remove_dead_segments(self) -> None:
        """File deleter thread: finish removing what lies wholly below the LSO."""
        with self._lock:
            if self._closed:
                return
            self._delete_segments(self._segments.remove_below(self._log_start_offset,
                                                              recycle_active_up_to=self._recycle_limit()))

    def take_committed(self, offset: int, sequence: int | None) -> bool:
        """Called by ``LogStartOffsetCommit`` (start_offset_commit.py) after its flush of the LSO
        file: take ``offset`` if it is still a raise the file durably holds. Returns whether LSO
        moved. ``sequence``: the write the flush made durable (None: nothing to mark)."""
        with self._lock:
            if sequence is not None:
                self._lso_file.mark_flushed(sequence)
            # Closed, already passed, or (a follower) truncated below it since: nothing to take.
            if self._closed or offset <= self._log_start_offset or offset > self._high_watermark:
                return False
            if (self._lso_file.durable_value or 0) < offset:
                if self._lso_written < offset:
                    return False  # a full truncation wrote a lower LSO since; it stands
                self._lso_file.flush()  # another commit's write covers it but is not durable yet
            self._take_log_start_offset(offset)
            return True

    def truncate_to(self, offset: int) -> bool:
        """Follower truncation: drop everything from the batch containing ``offset`` on, and the
        leader epochs that start there or later.

        Below LSO the log restarts empty at its LSO (Kafka would lower the LSO to ``offset``; here
        it may be an acknowledged low watermark, which must never go back). HW is clamped to the
        new LEO. Returns whether anything was truncated.
        """
        with self._lock:
            self._ensure_open()
            if offset >= self._segments.next_offset:
                return False
            if offset < self._log_start_offset:
                # Everything we hold diverges from the leader. Restart empty at our LSO rather than
                # lower it (it may be an acknowledged low watermark); the leader serves from there.
                self._truncate_fully(self._log_start_offset)
                return True
            # Kafka's truncateAndReload: no snapshot above the truncation offset describes the
            # leader's history (the directory fsync of the truncation makes this durable).
            self._snapshots.remove_above(offset)
            self._segments.truncate_to(offset)
            leo = self._segments.next_offset
            self._epochs.truncate_from_end(leo)
            if leo < self._log_start_offset:
                # ``offset`` was inside the batch holding the LSO, so the whole batch went. Its
                # records below the LSO are deleted anyway: restart empty at the LSO rather than
                # lower it (it may be an acknowledged low watermark). The next fetch from the
                # leader brings that batch back (see append_as_follower).
                self._segments.truncate_fully_and_start_at(self._log_start_offset)
                leo = self._log_start_offset
            # Follower truncation is rare: the producer state is read again from what is left,
            # after the snapshots of the history cut off are gone (durably: load fsyncs the dir).
            self._load_producer_state()
            self._high_watermark = min(self._high_watermark, leo)
            return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete all data; LSO = HW = LEO = ``offset``."""
        with self._lock:
            self._ensure_open()
            self._truncate_fully(offset)

    def _truncate_fully(self, offset: int) -> None:
        # Also when only an unfinished commit wrote something else: the file must say ``offset``.
        if offset != self._log_start_offset or offset != self._lso_written:
            self._lso_file.write(offset)
            self._lso_written = offset
        self._snapshots.remove(self._snapshots.offsets())  # the dir fsync of the next line covers this
        self._segments.truncate_fully_and_start_at(offset)
        self._log_start_offset = self._high_watermark = offset
        self._epochs.clear_and_start(offset)
        self._producers = ProducerStateManager()

    # -- retention --------------------------------------------------------------------------------

    def delete_retention_segments(self, *, now_ms: int) -> int:
        """Time (retention.ms) and size (retention.bytes) retention by whole segments.

        Only for policies including "delete"; which segments go: segment_retention.py. LSO rises to
        the first remaining offset. Returns the bytes freed.
        """
        with self._lock:
            self._ensure_open()
            config = self._config
            if not config.deletes:
                return 0
            segments = list(self._segments)
            hw = self._high_watermark
            count = count_segments_past_retention(segments, high_watermark=hw, config=config, now_ms=now_ms)
            if count == 0:
                return 0
            # New LSO: the first offset after the deleted prefix (next segment's base, if any).
            new_lso = segments[count].base_offset if count < len(segments) else segments[count - 1].next_offset
            new_lso = min(max(new_lso, segments[count - 1].next_offset), hw)
            freed = sum(s.size_bytes for s in segments[:count])
            if new_lso > self._log_start_offset:
                self._write_log_start_offset(new_lso)
                self._log_start_offset = new_lso
                self._epochs.truncate_from_start(new_lso)
                self._producers.truncate_head(new_lso)
            self._delete_segments(self._segments.remove_below(segments[count - 1].next_offset,
                                                              recycle_active_up_to=self._recycle_limit()))
            return freed

    def _recycle_limit(self) -> int:
        # A fully deleted active segment is emptied in place (no file creation) when that is
        # cheap: truncation frees its blocks on this thread, so only for small segments, and
        # never when file.delete.delay.ms asks for the data to linger.
        return RECYCLE_ACTIVE_MAX_BYTES if self._config.file_delete_delay_ms <= 0 else -1

    def _delete_segments(self, segments: list[LogSegment]) -> None:
        # Renamed to *.deleted now (cheap, and the names are free for new segments at once);
        # unlinked by the file deleter after file.delete.delay.ms, off this thread (see
        # file_deleter.py for why).
        paths: list[Path] = []
        for segment in segments:
            paths.extend(segment.rename_to_deleted())
        # Snapshots below the first segment go with the segments (producer_snapshot.py: one there
        # would never be used); also after an active segment was recycled in place (no segment
        # returned). When none is left (the log was deleted whole), the state goes to a new one,
        # so that a crash does not forget the producers of the deleted batches: written by the
        # file deleter's thread, since a fsync here would sit on the DeleteRecords reply.
        paths.extend(self._snapshots.take_below(self._segments.first.base_offset))
        self._pending_deletes = [p for p in self._pending_deletes if not p.done]
        if self._snapshots.latest() is None and self._producers.entries():
            self._pending_deletes.append(DELETER.schedule_call(self._snapshot_if_none))
        if paths:
            self._pending_deletes.append(DELETER.schedule(paths, delay_s=self._config.file_delete_delay_ms / 1000.0))

    def _snapshot_if_none(self) -> None:
        """File deleter thread: a snapshot of the producer state when the log has none left."""
        with self._lock:
            if not self._closed and self._snapshots.latest() is None and self._producers.entries():
                self._take_snapshot()

    # -- lifecycle --------------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync the active segment (sealed segments were fsynced when they were rolled)."""
        with self._lock:
            self._ensure_open()
            self._segments.flush()

    def close(self) -> None:
        """Flush and close files; pending delayed deletions are carried out now. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._segments.flush()
                next_offset = self._segments.next_offset
                # Clean shutdown: the next open reads no header. A log never written to has
                # nothing to describe (thousands of them are created at once: a file each saved).
                if self._snapshots.latest() != next_offset and (next_offset or self._producers.entries()):
                    self._take_snapshot()
            finally:
                self._segments.close()
                self._finish_pending_deletes()

    def delete(self) -> None:
        """Close and remove the whole partition directory."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._segments.close()
                self._finish_pending_deletes()
            remove_partition_dir(self._dir)

    def describe(self) -> dict:
        """Offsets, size and segments (base_offset, next_offset, size) for status pages and tests."""
        with self._lock:
            return {
                "topic": self._topic,
                "partition": self._partition,
                "lso": self._log_start_offset,
                "hw": self._high_watermark,
                "leo": self._segments.next_offset,
                "size_bytes": self._segments.size_bytes,
                "segments": [(s.base_offset, s.next_offset, s.size_bytes) for s in self._segments],
            }

    def _finish_pending_deletes(self) -> None:
        for pending in self._pending_deletes:
            pending.finish()
        self._pending_deletes = []

    def _ensure_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log of {self._topic}-{self._partition} in {self._dir} is closed")

    def __repr__(self) -> str:
        return f"PartitionLog({self._topic}-{self._partition}, dir={self._dir})"


def remove_partition_dir(dir: Path) -> None:
    """Delete a partition directory so that a crash at any point leaves either the whole log under
    its name or none of it: rename it to a ``-delete`` name (filenames.py) and fsync the parent,
    then remove the files. A ``-delete`` directory left by a crash is removed by the replica's
    sweep (replica/reconcile.py); it is never opened as a log."""
    try:
        target = dir.with_name(deleted_partition_dir_name(dir.name, uuid.uuid4().hex))
        os.rename(dir, target)
    except FileNotFoundError:
        return
    fsync_directory(dir.parent)
    shutil.rmtree(target, ignore_errors=True)
