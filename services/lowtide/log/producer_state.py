"""Per-partition producer state (Kafka's ``ProducerStateManager``): what the batch headers of a log
say about its producers and their transactions.

Kept by every replica of a partition (leader and followers append the same batches), from the
61-byte header of each appended batch (``batch.py``) and, for a control batch, the type of its
marker (``record/control.py``); never per record. Nothing is written to disk: ``rebuild`` scans
the batch headers of the log's segments when the log opens or is truncated (a 64 KiB window at a
time, or one 61-byte read per batch where batches are large), so the state always describes the
bytes the log holds, whatever a crash or the cleaner did to them.

State::

    producers   producer id -> ProducerEntry(epoch, last data offset, last sequence,
                                             first offset of its ongoing transaction or -1)
    ongoing     producer id -> first offset of its ongoing transaction (those with one)
    aborted     [AbortedTxn(producer id, first offset, last offset = its ABORT marker)], in marker
                order (so by last offset): the aborted-transaction index of the partition

Rules (Kafka's, per batch with a producer id >= 0, in log order):

* a batch whose epoch is below the producer's is fenced: INVALID_PRODUCER_EPOCH on the leader,
  nothing appended (``check_append``); a newer epoch replaces the producer's and its sequence;
* a non-empty transactional data batch starts the producer's transaction if none is ongoing; a
  non-transactional batch while one is ongoing is INVALID_TXN_STATE;
* a marker ends the ongoing transaction; an ABORT marker adds (pid, first, marker offset) to the
  aborted index. A control batch the cleaner emptied, or a marker with no ongoing transaction (its
  data was cleaned or deleted), changes nothing but the epoch;
* an empty data batch (kept by the cleaner to hold the producer's last sequence) updates the
  producer's last data offset and starts nothing: the cleaner only empties decided transactions.

``last_stable_offset(hw, log_start_offset)`` = min(hw, first offset of any ongoing transaction),
never below the log start offset. (In lowtide "LSO" means the log start offset: never abbreviate this.)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from lowtide.errors import InvalidProducerEpoch, InvalidRecord, InvalidTxnState
from lowtide.log.segment import LogSegment
from lowtide.record import BATCH_HEADER_SIZE, BatchHeader, read_header
from lowtide.record.control import ABORT, read_marker_type

_WINDOW = 64 * 1024
# A batch this large is read past: the next header is fetched on its own (61 bytes, not a window).
_LARGE_BATCH = _WINDOW // 4


@dataclass(slots=True)
class ProducerEntry:
    """One producer as the log knows it (-1: nothing known)."""

    epoch: int
    last_data_offset: int = -1
    last_sequence: int = -1
    txn_first_offset: int = -1


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction: its first offset, and its ABORT marker's offset (``last_offset``)."""

    producer_id: int
    first_offset: int
    last_offset: int


class ProducerStateManager:
    """The producer state of one partition log (module docstring).

    Not thread-safe: the owning PartitionLog calls it with its lock held.
    """

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}
        self._ongoing: dict[int, int] = {}
        self._aborted: list[AbortedTxn] = []
        self._aborted_last: list[int] = []  # last offsets of _aborted, for bisect

    # -- building --------------------------------------------------------------------------------

    @classmethod
    def rebuild(cls, segments: Iterable[LogSegment]) -> ProducerStateManager:
        """The state of the batches in ``segments`` (in offset order), from their headers."""
        state = cls()
        for segment in segments:
            for header, marker_type in iter_segment_headers(segment):
                state.apply(header, marker_type=marker_type)
        return state

    def check_append(self, headers: Iterable[BatchHeader]) -> None:
        """Leader side, before anything is appended: raise InvalidProducerEpoch (a fenced
        producer) or InvalidTxnState for the first batch that breaks the rules; nothing changes."""
        epochs: dict[int, int] = {}
        ongoing: dict[int, bool] = {}
        for header in headers:
            pid = header.producer_id
            if pid < 0:
                if header.is_transactional:
                    raise InvalidRecord(f"transactional batch at offset {header.base_offset} has no producer id")
                continue
            entry = self._producers.get(pid)
            current = epochs.get(pid, entry.epoch if entry is not None else -1)
            if header.producer_epoch < current:
                raise InvalidProducerEpoch(
                    f"producer {pid} has epoch {header.producer_epoch}, below its current epoch {current}: "
                    f"a newer producer with the same transactional id fenced it")
            in_txn = ongoing.get(pid, pid in self._ongoing) and header.producer_epoch == current
            if header.is_control:
                in_txn = False
            elif not header.is_transactional and in_txn:
                raise InvalidTxnState(f"producer {pid} wrote a non-transactional batch inside its ongoing "
                                      f"transaction")
            elif header.is_transactional:
                in_txn = True
            epochs[pid] = header.producer_epoch
            ongoing[pid] = in_txn

    def apply(self, header: BatchHeader, *, marker_type: int | None = None) -> None:
        """Take one appended batch into the state (``marker_type``: a control batch's ABORT or
        COMMIT, None when it is empty)."""
        pid = header.producer_id
        if pid < 0:
            return
        entry = self._producers.get(pid)
        if entry is None:
            entry = self._producers[pid] = ProducerEntry(epoch=header.producer_epoch)
        elif header.producer_epoch > entry.epoch:
            entry.epoch = header.producer_epoch
            entry.last_sequence = -1
        if header.is_control:
            if marker_type is None or entry.txn_first_offset < 0:
                return
            if marker_type == ABORT:
                self._aborted.append(AbortedTxn(pid, entry.txn_first_offset, header.last_offset))
                self._aborted_last.append(header.last_offset)
            entry.txn_first_offset = -1
            self._ongoing.pop(pid, None)
            return
        entry.last_data_offset = header.last_offset
        if header.record_count <= 0:
            return
        if header.base_sequence >= 0:
            entry.last_sequence = header.base_sequence + header.last_offset_delta
        if header.is_transactional and entry.txn_first_offset < 0:
            entry.txn_first_offset = header.base_offset
            self._ongoing[pid] = header.base_offset

    def apply_batches(self, data: bytes | bytearray | memoryview, headers: Iterable[BatchHeader]) -> None:
        """Take appended batches (``data``: the batches of ``headers``, back to back)."""
        pos = 0
        for header in headers:
            if header.producer_id >= 0:
                marker = read_marker_type(data, pos) if header.is_control else None
                self.apply(header, marker_type=marker)
            pos += header.size_in_bytes

    def truncate_head(self, log_start_offset: int) -> None:
        """Forget aborted transactions wholly below the new log start offset (KIP-107 deletes)."""
        cut = bisect_left(self._aborted_last, log_start_offset)
        if cut:
            del self._aborted[:cut]
            del self._aborted_last[:cut]

    # -- reading ---------------------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest ongoing transaction, None when none is ongoing."""
        return min(self._ongoing.values()) if self._ongoing else None

    def last_stable_offset(self, *, high_watermark: int, log_start_offset: int) -> int:
        """What a read_committed consumer may read up to (excluded): min(HW, first unstable offset),
        never below the log start offset."""
        first = self.first_unstable_offset()
        if first is None:
            return high_watermark
        return min(high_watermark, max(first, log_start_offset))

    def ongoing(self) -> dict[int, int]:
        """Producer id -> first offset of its ongoing transaction."""
        return dict(self._ongoing)

    def producer(self, producer_id: int) -> ProducerEntry | None:
        entry = self._producers.get(producer_id)
        return None if entry is None else ProducerEntry(entry.epoch, entry.last_data_offset, entry.last_sequence,
                                                        entry.txn_first_offset)

    def last_data_offset(self, producer_id: int) -> int | None:
        """The last offset of the producer's last data batch, None if it never wrote here."""
        entry = self._producers.get(producer_id)
        return None if entry is None or entry.last_data_offset < 0 else entry.last_data_offset

    def last_records(self) -> dict[int, tuple[int, int]]:
        """Producer id -> (last data offset or -1, epoch): what the cleaner must keep of each producer."""
        return {pid: (e.last_data_offset, e.epoch) for pid, e in self._producers.items()}

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [start_offset, end_offset): marker at or after the start,
        first offset before the end; in marker order."""
        i = bisect_left(self._aborted_last, start_offset)
        return [a for a in self._aborted[i:] if a.first_offset < end_offset]


def iter_segment_headers(segment: LogSegment) -> Iterator[tuple[BatchHeader, int | None]]:
    """(header, marker type or None) of each batch of ``segment``; the marker type only for control
    batches (read from their first record, which needs the whole small batch)."""
    size = segment.size_bytes
    window = b""
    start = 0
    position = 0
    large = False
    while position < size:
        offset = position - start
        if offset + BATCH_HEADER_SIZE > len(window):
            window = segment.read(position, BATCH_HEADER_SIZE if large else _WINDOW)
            start, offset = position, 0
        header = read_header(window, offset)
        marker = None
        if header.is_control and header.producer_id >= 0:
            end = offset + header.size_in_bytes
            batch = window[offset:end] if end <= len(window) else segment.read(position, header.size_in_bytes)
            marker = read_marker_type(batch)
        large = header.size_in_bytes > _LARGE_BATCH
        yield header, marker
        position += header.size_in_bytes
