"""Per-partition producer state (Kafka's ``ProducerStateManager``): what the batch headers of a log
say about its producers, their sequences (idempotent produce) and their transactions.

Kept by every replica of a partition (leader and followers append the same batches), from the
61-byte header of each appended batch (``batch.py``) and, for a control batch, the type of its
marker (``record/control.py``); never per record. Since every replica applies the same batches in
the same order, a follower that becomes leader holds the state its leader had.

On disk (``producer_snapshot.py``): the owning log writes the state to ``<offset>.snapshot`` at each
segment roll and on clean shutdown; opening a log reads the newest valid snapshot and ``replay``s
the batch headers after it, and falls back to ``rebuild`` (every header of every segment, a 64 KiB
window at a time, or one 61-byte read per batch where batches are large) when there is none. A
snapshot also keeps the producers whose batches retention or DeleteRecords removed.

Expiry (KIP-854 ``producer.id.expiration.ms``): ``remove_expired`` forgets a producer with no open
transaction whose batches' largest timestamp is that old; a produce from it is then a new producer's
(KIP-360, below). Timestamps come from the batches, so expiry is the same on every replica that runs
it at the same time.

State::

    producers   producer id -> ProducerEntry(epoch, last data offset, last sequence,
                                             first offset of its ongoing transaction or -1,
                                             largest timestamp of its batches (expiry),
                                             its last 5 data batches of that epoch as BatchMetadata)
    ongoing     producer id -> first offset of its ongoing transaction (those with one)
    aborted     [AbortedTxn(producer id, first offset, last offset = its ABORT marker)], in marker
                order (so by last offset): the aborted-transaction index of the partition

Rules (Kafka's, per batch with a producer id >= 0, in log order):

* a batch whose epoch is below the producer's is fenced: INVALID_PRODUCER_EPOCH on the leader,
  nothing appended (``check_append``); a newer epoch replaces the producer's and its sequence;
* idempotent produce (``check_append``, leader side, clients' data batches with a base sequence
  >= 0; Kafka's ``ProducerAppendInfo.checkSequence`` and ``ProducerStateEntry.findDuplicateBatch``,
  docs/design/idempotence.md):

  - a batch of the producer's epoch whose first and last sequence are those of one of its last 5
    batches is a retry: ``check_append`` returns that batch's offsets and nothing is appended
    (when every batch of the request is one; a request mixing retries and new batches is
    OUT_OF_ORDER_SEQUENCE_NUMBER, which Kafka never has to answer: it takes one batch per partition);
  - a known producer's batch of its epoch must follow its last sequence (int32, wrapping to 0), a
    batch of a newer epoch must start at 0: else OUT_OF_ORDER_SEQUENCE_NUMBER;
  - an unknown producer (it never wrote here, or its batches were deleted before this replica last
    opened the log) may start at any sequence (KIP-360; Kafka >= 2.5 no longer answers
    UNKNOWN_PRODUCER_ID to a produce);
  - followers and recovery take every batch as it is (Kafka's REPLICATION origin): no checks;
  - a batch with a producer id but no sequence (-1) is not checked: Kafka refuses it as
    INVALID_RECORD, but lowtide's own writers use one for conditional appends (the diskless
    coordinator's metadata log, ``check_expected_end``);
* a non-empty transactional data batch starts the producer's transaction if none is ongoing; a
  non-transactional batch while one is ongoing is INVALID_TXN_STATE;
* a marker ends the ongoing transaction; an ABORT marker adds (pid, first, marker offset) to the
  aborted index. A control batch the cleaner emptied, or a marker with no ongoing transaction (its
  data was cleaned or deleted), changes nothing but the epoch;
* an empty data batch (kept by the cleaner to hold the producer's last sequence) updates the
  producer's last data offset and sequences and starts nothing: the cleaner only empties decided
  transactions.

``last_stable_offset(hw, log_start_offset)`` = min(hw, first offset of any ongoing transaction),
never below the log start offset. (In lowtide "LSO" means the log start offset: never abbreviate this.)
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from lowtide.errors import InvalidProducerEpoch, InvalidRecord, InvalidTxnState, OutOfOrderSequenceNumber
from lowtide.log.segment import LogSegment
from lowtide.messages.replica import ProducerDescription
from lowtide.record import BATCH_HEADER_SIZE, BatchHeader, read_header
from lowtide.record.control import ABORT, read_marker_type

_WINDOW = 64 * 1024
# A batch this large is read past: the next header is fetched on its own (61 bytes, not a window).
_LARGE_BATCH = _WINDOW // 4
# Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN: a producer has at most 5 requests in flight
# (max.in.flight.requests.per.connection with idempotence), so a retry is one of its last 5 batches.
BATCHES_TO_RETAIN = 5
_SEQUENCE_MOD = 1 << 31  # sequences are int32 and wrap from INT32_MAX to 0


def last_sequence(header: BatchHeader) -> int:
    """The sequence of the batch's last record (Kafka's ``incrementSequence``: wraps to 0)."""
    return (header.base_sequence + header.last_offset_delta) % _SEQUENCE_MOD


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One appended data batch of a producer (Kafka's ``BatchMetadata``): what a retry is answered."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer as the log knows it (-1: nothing known)."""

    epoch: int
    last_data_offset: int = -1
    last_sequence: int = -1
    txn_first_offset: int = -1
    last_timestamp: int = -1  # the largest max timestamp of its batches: what expiry looks at
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_TO_RETAIN))

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        """The retained batch ``header`` retries (same epoch, first and last sequence), if any."""
        if header.producer_epoch != self.epoch:
            return None
        last = last_sequence(header)
        for batch in self.batches:
            if batch.first_sequence == header.base_sequence and batch.last_sequence == last:
                return batch
        return None


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A produce that retries batches already in the log: their offsets, from the first batch's
    first to the last one's last, and the largest timestamp (what the original append answered)."""

    first_offset: int
    last_offset: int
    max_timestamp: int


# ProducerDescription is lowtide.messages.replica's: DescribeProducers hands it to both doors as is.


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction: its first offset, and its ABORT marker's offset (``last_offset``)."""

    producer_id: int
    first_offset: int
    last_offset: int


class ProducerStateManager:
    """The producer state of one partition log (module docstring).

    Contract: ``check_append`` judges a leader's batches against the state without changing it
    (an error, a Duplicate to answer, or None to append); ``apply``/``apply_batches`` take batches
    that were appended (leader or follower) in log order; ``rebuild`` gives the state of a log's
    batches, and ``restore`` (a snapshot's) followed by ``replay`` of the batches after the
    snapshot gives the same, so the state is a function of the log's batch headers (and of the
    snapshots that remember the deleted ones), less what ``remove_expired`` forgot.

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
        state.replay(segments, from_offset=0)
        return state

    @classmethod
    def restore(cls, *, producers: Iterable[tuple[int, ProducerEntry]],
                aborted: Iterable[AbortedTxn]) -> ProducerStateManager:
        """The state a snapshot holds (``producer_snapshot.py``): its producers, and its aborted
        transactions in marker order. The ongoing transactions follow from the producers."""
        state = cls()
        for pid, entry in producers:
            state._producers[pid] = entry
            if entry.txn_first_offset >= 0:
                state._ongoing[pid] = entry.txn_first_offset
        for txn in aborted:
            state._aborted.append(txn)
            state._aborted_last.append(txn.last_offset)
        return state

    def replay(self, segments: Iterable[LogSegment], *, from_offset: int) -> None:
        """Apply the batches of ``segments`` that start at or after ``from_offset`` (the offset of
        the snapshot this state came from), reading headers from the batch holding it on."""
        for segment in segments:
            if segment.next_offset <= from_offset:
                continue
            position = 0
            if segment.base_offset < from_offset:
                found = segment.translate_offset(from_offset)
                if found is None:
                    continue
                position = found
            for header, marker_type in iter_segment_headers(segment, position=position):
                if header.base_offset >= from_offset:
                    self.apply(header, marker_type=marker_type)

    def check_append(self, headers: list[BatchHeader], *, client: bool = True) -> Duplicate | None:
        """Leader side, before anything is appended: a Duplicate when the batches retry ones the
        log holds (nothing is to be appended), else None; raise InvalidProducerEpoch (a fenced
        producer), OutOfOrderSequenceNumber or InvalidTxnState for the first batch that breaks
        the rules (module docstring). Nothing changes. ``client`` False: a coordinator's write
        (Kafka's AppendOrigin.COORDINATOR), whose sequences are neither checked nor retries."""
        epochs: dict[int, int] = {}
        ongoing: dict[int, bool] = {}
        sequences: dict[int, int] = {}  # producer id -> last sequence after this request's batches so far
        duplicates: list[BatchMetadata] = []
        for header in headers:
            pid = header.producer_id
            if pid < 0:
                if header.is_transactional:
                    raise InvalidRecord(f"transactional batch at offset {header.base_offset} has no producer id")
                continue
            entry = self._producers.get(pid)
            sequenced = client and header.base_sequence >= 0 and not header.is_control
            if sequenced and entry is not None:
                duplicate = entry.find_duplicate(header)
                if duplicate is not None:
                    duplicates.append(duplicate)
                    continue
            current = epochs.get(pid, entry.epoch if entry is not None else -1)
            if header.producer_epoch < current:
                raise InvalidProducerEpoch(
                    f"producer {pid} has epoch {header.producer_epoch}, below its current epoch {current}: "
                    f"a newer producer with the same transactional id fenced it")
            if sequenced:
                self._check_sequence(header, entry, current, sequences.get(pid))
                sequences[pid] = last_sequence(header)
            elif header.producer_epoch != current:
                sequences[pid] = -1  # a marker of a newer epoch: that epoch's data starts at 0
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
        if not duplicates:
            return None
        if len(duplicates) != len(headers):
            raise OutOfOrderSequenceNumber(
                f"a request mixes retries of batches at offsets {duplicates[0].first_offset}.."
                f"{duplicates[-1].last_offset} with new batches: send the new ones on their own")
        return Duplicate(first_offset=min(d.first_offset for d in duplicates),
                         last_offset=max(d.last_offset for d in duplicates),
                         max_timestamp=max(d.max_timestamp for d in duplicates))

    @staticmethod
    def _check_sequence(header: BatchHeader, entry: ProducerEntry | None, current_epoch: int,
                        pending_last: int | None) -> None:
        """Kafka's ``ProducerAppendInfo.checkSequence`` for one data batch of a producer whose
        epoch is ``current_epoch`` (after the request's earlier batches, -1: unknown) and whose
        earlier batches in this request end at ``pending_last`` (None: it has none)."""
        pid, seq = header.producer_id, header.base_sequence
        if entry is None:
            return  # KIP-360: an unknown producer starts anywhere (its state may have expired)
        if header.producer_epoch != current_epoch:
            if seq != 0:
                raise OutOfOrderSequenceNumber(
                    f"producer {pid} starts its new epoch {header.producer_epoch} (current {current_epoch}) "
                    f"at sequence {seq}: a new epoch starts at 0")
            return
        if pending_last is not None:
            last = pending_last
        else:
            last = entry.batches[-1].last_sequence if entry.batches else -1
        expected = 0 if last == _SEQUENCE_MOD - 1 else last + 1
        if seq != expected:
            raise OutOfOrderSequenceNumber(
                f"producer {pid} epoch {header.producer_epoch}: sequence {seq} does not follow its last "
                f"sequence {last} (expected {expected}): a batch before it is missing")

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
            # Kafka's maybeUpdateProducerEpoch: a new epoch's sequences start again, so the old
            # epoch's batches can no longer be retried.
            entry.epoch = header.producer_epoch
            entry.last_sequence = -1
            entry.batches.clear()
        if header.max_timestamp > entry.last_timestamp:
            entry.last_timestamp = header.max_timestamp
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
        if header.base_sequence >= 0 and header.producer_epoch == entry.epoch:
            # Also for an empty batch the cleaner kept: its header holds the original sequences.
            entry.last_sequence = last_sequence(header)
            entry.batches.append(BatchMetadata(header.base_sequence, entry.last_sequence, header.base_offset,
                                               header.last_offset, header.max_timestamp))
        if header.record_count <= 0:
            return
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

    def retain_aborted(self, keep: Callable[[AbortedTxn], bool]) -> None:
        """Keep only the aborted transactions ``keep`` accepts (a snapshot's whose markers the
        cleaner has since removed go: producer_snapshot.py)."""
        kept = [txn for txn in self._aborted if keep(txn)]
        if len(kept) != len(self._aborted):
            self._aborted = kept
            self._aborted_last = [txn.last_offset for txn in kept]

    def remove_expired(self, *, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget the producers with no ongoing transaction whose newest batch timestamp is at least
        ``expiration_ms`` old (Kafka's ``removeExpiredProducers``); returns their ids. A later
        produce from one of them is an unknown producer's (KIP-360)."""
        expired = [pid for pid, entry in self._producers.items()
                   if entry.txn_first_offset < 0 and now_ms - entry.last_timestamp >= expiration_ms]
        for pid in expired:
            del self._producers[pid]
        return expired

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

    def in_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether ``producer_id`` has an ongoing transaction here in ``producer_epoch``."""
        entry = self._producers.get(producer_id)
        return entry is not None and entry.epoch == producer_epoch and entry.txn_first_offset >= 0

    def producer(self, producer_id: int) -> ProducerEntry | None:
        entry = self._producers.get(producer_id)
        return None if entry is None else ProducerEntry(entry.epoch, entry.last_data_offset, entry.last_sequence,
                                                        entry.txn_first_offset, entry.last_timestamp,
                                                        deque(entry.batches, BATCHES_TO_RETAIN))

    def describe(self) -> list[ProducerDescription]:
        """Every producer the state holds (Kafka's active producers), by id. The coordinator epoch
        is not kept (markers are not checked against it), so it is -1, as Kafka answers for a
        producer whose transaction markers it has not seen."""
        return [ProducerDescription(producer_id=pid, producer_epoch=e.epoch, last_sequence=e.last_sequence,
                                    last_timestamp=e.last_timestamp, coordinator_epoch=-1,
                                    current_txn_start_offset=e.txn_first_offset)
                for pid, e in sorted(self._producers.items())]

    def last_data_offset(self, producer_id: int) -> int | None:
        """The last offset of the producer's last data batch, None if it never wrote here."""
        entry = self._producers.get(producer_id)
        return None if entry is None or entry.last_data_offset < 0 else entry.last_data_offset

    def check_expected_end(self, *, name: str, producer_id: int, producer_epoch: int, end: int,
                           expected: int) -> None:
        """A conditional append's condition (replica.proto ``expected_log_end_offset``) on log
        ``name``, which ends at ``end``: it must end at ``expected`` and, if ``producer_id`` wrote
        here before in ``producer_epoch``, its last batch must be the log's last. With the offset
        alone, a writer that lost a race to another one of the same size would see its next append
        go through after the other's records. Epochs (a diskless coordinator's writer id, one
        producer epoch per leadership): a batch of an older epoch than the producer's is fenced
        first (INVALID_PRODUCER_EPOCH, as the producer check would), and one of a newer epoch opens
        a new term, bound by the offset alone."""
        current = self._producers.get(producer_id) if producer_id >= 0 else None
        if current is not None and 0 <= producer_epoch < current.epoch:
            raise InvalidProducerEpoch(
                f"{name}: producer {producer_id} has epoch {producer_epoch}, below its current epoch "
                f"{current.epoch}: a newer writer fenced it")
        if current is not None and producer_epoch > current.epoch:
            producer_id = -1
        if end != expected:
            raise OutOfOrderSequenceNumber(
                f"{name} ends at offset {end}, not at {expected} as the conditional append expected: another "
                f"append came first (or an expected one is missing)")
        if producer_id >= 0:
            last = self.last_data_offset(producer_id)
            if last is not None and last != end - 1:
                raise OutOfOrderSequenceNumber(
                    f"{name}: the last batch of producer {producer_id} ends at offset {last}, but the log ends "
                    f"at {end}: another writer appended after it")

    def last_records(self) -> dict[int, tuple[int, int]]:
        """Producer id -> (last data offset or -1, epoch): what the cleaner must keep of each producer."""
        return {pid: (e.last_data_offset, e.epoch) for pid, e in self._producers.items()}

    def entries(self) -> list[tuple[int, ProducerEntry]]:
        """(producer id, entry) of every producer, by id: what a snapshot writes (not copies: read only)."""
        return sorted(self._producers.items())

    def all_aborted(self) -> list[AbortedTxn]:
        """The whole aborted-transaction index, in marker order."""
        return list(self._aborted)

    def __eq__(self, other: object) -> bool:
        """Same producers (with their retained batches), ongoing and aborted transactions: what
        tests compare between a state opened from a snapshot and one rebuilt from every header."""
        if not isinstance(other, ProducerStateManager):
            return NotImplemented
        return (self._producers == other._producers and self._ongoing == other._ongoing
                and self._aborted == other._aborted)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [start_offset, end_offset): marker at or after the start,
        first offset before the end; in marker order."""
        i = bisect_left(self._aborted_last, start_offset)
        return [a for a in self._aborted[i:] if a.first_offset < end_offset]


def iter_segment_headers(segment: LogSegment, *, position: int = 0) -> Iterator[tuple[BatchHeader, int | None]]:
    """(header, marker type or None) of each batch of ``segment`` from byte ``position`` (a batch
    start); the marker type only for control batches (read from their first record, which needs
    the whole small batch)."""
    size = segment.size_bytes
    window = b""
    start = position
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
