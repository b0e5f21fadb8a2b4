"""Committed state plus pending records: what a diskless coordinator checks requests against.

KIP-1164's pipelining: a mutating request is checked, its records are appended to the metadata log,
and while they wait for replication the next request is already being checked. That check must
see the effect of the records still in flight, or two CommitFiles would get the same offsets. The
SQLite state (coordinator.state) holds only replicated, applied records; this overlay holds, for
each partition, topic, topic name, producer and file that a pending record touched, its value
after *all* pending records. Reads look in the overlay first, then in SQLite.

When the state applies pending record number ``s``, every overlay entry last touched by a record
``<= s`` now equals what SQLite holds, so it is dropped: the overlay stays as small as the pipeline
is deep. If an append fails, the pending records will never be applied: ``reset`` drops them all
(the service gives up leadership, as KRaft's controller does, and a new leader starts from the log).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from lowtide.coordinator import transactions as txn
from lowtide.coordinator.records import (
    FileCommitted,
    MetadataRecord,
    PartitionCreated,
    RecordsDeleted,
    TopicDeleted,
)
from lowtide.coordinator.state import (
    CoordinatorState,
    PartitionRow,
    ProducerRow,
)

_DELETED = None  # overlay value of a partition, topic or name that a pending TopicDeleted removed
_MISSING = object()  # not in the overlay: read the committed state


class _Table:
    """One overlay table: each key's value after all pending records, and the pending number of
    the record that last set it. Two dicts rather than one of (number, value) pairs: a 100-batch
    file sets ~100 partition rows, and ``dict.update`` + ``dict.fromkeys`` set them without a
    pair (and a Python-level loop) per row."""

    __slots__ = ("values", "seqs")

    def __init__(self) -> None:
        self.values: dict[Any, Any] = {}
        self.seqs: dict[Any, int] = {}

    def clear(self) -> None:
        self.values.clear()
        self.seqs.clear()


class PendingState:
    """Overlay of pending (appended, not yet applied) records over a ``CoordinatorState``.

    Contract: ``push`` records in the order they are appended to the log; ``applied`` them in the
    same order once the state has applied them. Thread-safety: none; the coordinator's single
    request-processing thread owns it (the same one that owns the state's writes).
    """

    def __init__(self, state: CoordinatorState) -> None:
        self.state = state
        self._seq = 0
        self._records: deque[tuple[int, MetadataRecord]] = deque()
        # Values: PartitionRow | None; (name, frozenset of indexes) | None; topic id | None;
        # ProducerRow; True (a pending file); the first offset of an ongoing transaction | None.
        self._partitions, self._topics, self._names = _Table(), _Table(), _Table()
        self._producers, self._files, self._txns = _Table(), _Table(), _Table()
        self._touched: deque[tuple[int, _Table, Iterable]] = deque()  # (seq, table, keys it set)

    # ---- reads: committed + pending ----------------------------------------------------------
    def partition(self, topic_id: bytes, index: int) -> PartitionRow | None:
        hit = self._partitions.values.get((topic_id, index), _MISSING)
        return self.state.partition(topic_id, index) if hit is _MISSING else hit

    def topic(self, topic_id: bytes) -> tuple[str, frozenset[int]] | None:
        hit = self._topics.values.get(topic_id, _MISSING)
        if hit is not _MISSING:
            return hit
        committed = self.state.topic(topic_id)
        return (committed[0], frozenset(committed[1])) if committed else None

    def topic_deletion_pending(self, topic_id: bytes) -> bool:
        return self._topics.values.get(topic_id, _MISSING) is _DELETED

    def topic_id_for_name(self, name: str) -> bytes | None:
        hit = self._names.values.get(name, _MISSING)
        return self.state.topic_id_for_name(name) if hit is _MISSING else hit

    def producer(self, topic_id: bytes, index: int, producer_id: int) -> ProducerRow | None:
        hit = self._producers.values.get((topic_id, index, producer_id), _MISSING)
        return self.state.producer(topic_id, index, producer_id) if hit is _MISSING else hit

    def ongoing_txn(self, topic_id: bytes, index: int, producer_id: int) -> int | None:
        """The first offset of the producer's ongoing transaction in the partition (None: none)."""
        hit = self._txns.values.get((topic_id, index, producer_id), _MISSING)
        if hit is not _MISSING:
            return hit
        p = self.state.partition(topic_id, index)
        return None if p is None else txn.ongoing_first_offset(self.state.db, p.partition_key, producer_id)

    def any_ongoing_txn(self) -> bool:
        """Whether any producer may have an ongoing transaction on this shard (pending or committed)."""
        return any(v is not None for v in self._txns.values.values()) or txn.any_ongoing(self.state.db)

    def file_pending(self, object_key: str) -> bool:
        return object_key in self._files.values

    def file_known(self, object_key: str) -> bool:
        return object_key in self._files.values or self.state.file_exists(object_key)

    @property
    def pending_count(self) -> int:
        return len(self._records)

    # ---- writes ----------------------------------------------------------------------------------
    def _set(self, table: _Table, key: Any, seq: int, value: Any) -> None:
        table.values[key] = value
        table.seqs[key] = seq
        self._touched.append((seq, table, (key,)))

    def _set_many(self, table: _Table, seq: int, values: dict) -> None:
        """``_set`` for every item of ``values``, as one touched entry: a 100-batch file's check
        sets ~100 partition rows, and one entry per row was a Python call each way."""
        if values:
            table.values.update(values)
            table.seqs.update(dict.fromkeys(values, seq))
            self._touched.append((seq, table, values.keys()))

    def push(self, record: MetadataRecord) -> int:
        """Add a record just appended to the log (not yet applied); returns its pending number."""
        if isinstance(record, FileCommitted):
            # Its partition and producer rows are the CommitFile check's result; recomputing them
            # here from the batches would be a second copy of that check.
            raise TypeError("a FileCommitted record is pushed with push_checked_file")
        seq = self._next(record)
        if isinstance(record, RecordsDeleted):
            p = self.partition(record.topic_id, record.partition_index)
            if p is not None and record.new_log_start_offset > p.log_start_offset:
                new_lso = min(record.new_log_start_offset, p.high_watermark)
                self._set(self._partitions, (record.topic_id, record.partition_index), seq,
                          p._replace(log_start_offset=new_lso))
        elif isinstance(record, PartitionCreated):
            topic = self.topic(record.topic_id)
            indexes = (topic[1] if topic else frozenset()) | {record.partition_index}
            self._set(self._topics, record.topic_id, seq, (record.name, indexes))
            self._set(self._names, record.name, seq, record.topic_id)
            self._set(self._partitions, (record.topic_id, record.partition_index), seq,
                      PartitionRow(-1, record.topic_id, record.name, record.partition_index, 0, 0, -1, -1))
        elif isinstance(record, TopicDeleted):
            topic = self.topic(record.topic_id)
            if topic is not None:
                for index in topic[1]:
                    self._set(self._partitions, (record.topic_id, index), seq, _DELETED)
                self._set(self._names, topic[0], seq, _DELETED)
            self._set(self._topics, record.topic_id, seq, _DELETED)
        # FileHandedOver / FileDeleted change nothing a request check reads.
        return seq

    def push_checked_file(self, record: FileCommitted, *, partitions: dict[tuple[bytes, int], PartitionRow],
                          producers: dict[tuple[bytes, int, int], ProducerRow],
                          txns: dict[tuple[bytes, int, int], int | None] | None = None) -> int:
        """Add a FileCommitted whose check already worked out the partition rows (new high
        watermarks), producer rows and ongoing transactions (first offset, or None once ended) it
        leads to: what ``push`` would compute from its batches."""
        seq = self._next(record)
        self._set(self._files, record.object_key, seq, True)
        self._set_many(self._partitions, seq, partitions)
        self._set_many(self._producers, seq, producers)
        if txns:
            self._set_many(self._txns, seq, txns)
        return seq

    def _next(self, record: MetadataRecord) -> int:
        self._seq += 1
        self._records.append((self._seq, record))
        return self._seq

    def head(self) -> MetadataRecord | None:
        """The oldest pending record, or None."""
        return self._records[0][1] if self._records else None

    def applied(self) -> None:
        """The state has applied the oldest pending record: drop what the overlay held for it."""
        seq, _ = self._records.popleft()
        touched = self._touched
        while touched and touched[0][0] <= seq:
            s, table, keys = touched.popleft()
            seqs, values = table.seqs, table.values
            for key in keys:
                if seqs.get(key, s + 1) <= s:
                    del seqs[key], values[key]

    def reset(self) -> None:
        """Forget every pending record (their append failed: they will never be applied)."""
        self._records.clear()
        for table in (self._partitions, self._topics, self._names, self._producers, self._files, self._txns):
            table.clear()
        self._touched.clear()
