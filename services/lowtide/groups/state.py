"""Committed offsets materialized from ``__consumer_offsets``: the fold both readers share.

The front door (serving OffsetFetch/ListGroups/DescribeGroups) and each replica (broker-side
consumed retention) read the same partitions and must agree on what they say, so the rule lives
here once: records are applied in log order, the latest record of a key wins, a tombstone (null
value) deletes the key. Each entry remembers the log offset of the record it came from, so a
writer may apply its own acknowledged write at once (it knows the offset the leader gave it) and
the tail reading older records later never puts an older value back: a record only applies when
its log offset is above the one already applied for its key (tombstones included).

Transactional offsets (KIP-98 TxnOffsetCommit, KIP-447): records written in a producer's
transaction (a transactional batch with that producer id) are held as pending, per producer,
until that producer's marker: COMMIT applies them with the same latest-log-offset-wins rule
(Kafka's ``completePendingTxnOffsetCommit`` compares the same record offsets), ABORT drops them.
OffsetFetch with ``require_stable`` asks ``pending_keys`` and answers UNSTABLE_OFFSET_COMMIT for a
key some undecided transaction holds.

One ``PartitionOffsets`` per ``__consumer_offsets`` partition (a group lives in exactly one), so
when a reader has to start a partition over (its position fell out of the log) only that
partition's groups are forgotten and re-read. No I/O here: callers hand in fetched batch bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from lowtide.groups.codec import OffsetKey, OffsetValue, decode_offset_key, decode_offset_value
from lowtide.groups.consumer_codec import CONSUMER_RECORD_TYPES, ConsumerKey, decode_consumer_key
from lowtide.record import decode_batches
from lowtide.record.control import COMMIT, decode_control_key


@dataclass(frozen=True, slots=True)
class CommittedEntry:
    """One key's latest commit and the log offset of the record that carried it."""

    key: OffsetKey
    value: OffsetValue
    log_offset: int


@dataclass(frozen=True, slots=True)
class OffsetRecord:
    """A decoded record of ``__consumer_offsets`` (``value`` None = tombstone)."""

    key: OffsetKey
    value: OffsetValue | None
    log_offset: int
    producer_id: int = -1  # >= 0: written in that producer's transaction (pending until its marker)


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """A KIP-848 consumer group record (``consumer_codec``): its key, and its value's bytes, kept
    undecoded until the group is loaded (None = tombstone)."""

    key: ConsumerKey
    value: bytes | None
    log_offset: int


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A transaction marker of ``__consumer_offsets``: decides ``producer_id``'s pending offsets."""

    producer_id: int
    commit: bool
    log_offset: int


def _key_type(key: bytes) -> int:
    return int.from_bytes(key[:2], "big", signed=True) if len(key) >= 2 else -1


def decode_offset_records(records: bytes, *,
                          from_offset: int = 0) -> list[OffsetRecord | ConsumerRecord | TxnMarker]:
    """Every offset-commit record and transaction marker at or after ``from_offset`` in fetched
    batch bytes, in log order.

    KIP-848 consumer group records come back as ``ConsumerRecord``; classic group-metadata
    records are skipped. Raises CORRUPT_MESSAGE (and returns nothing) when a batch or an
    offset-commit record is malformed."""
    out: list[OffsetRecord | ConsumerRecord | TxnMarker] = []
    for header, batch_records in decode_batches(records):
        if header.next_offset <= from_offset:
            continue
        if header.is_control:
            for r in batch_records:
                if r.offset >= from_offset and r.key is not None:
                    out.append(TxnMarker(producer_id=header.producer_id, commit=decode_control_key(r.key) == COMMIT,
                                         log_offset=r.offset))
            continue
        producer_id = header.producer_id if header.is_transactional else -1
        for r in batch_records:
            if r.offset < from_offset or r.key is None:
                continue
            if _key_type(r.key) in CONSUMER_RECORD_TYPES:
                consumer_key = decode_consumer_key(r.key)
                if consumer_key is not None:
                    out.append(ConsumerRecord(key=consumer_key, value=r.value, log_offset=r.offset))
                continue
            key = decode_offset_key(r.key)
            if key is None:
                continue
            out.append(OffsetRecord(key=key, value=None if r.value is None else decode_offset_value(r.value),
                                    log_offset=r.offset, producer_id=producer_id))
    return out


class PartitionOffsets:
    """The fold of one ``__consumer_offsets`` partition (module doc).

    ``position`` is where the next fetch of this partition starts; ``apply`` folds records in
    any order of arrival with the latest-log-offset-wins rule. Not thread-safe: the owner locks.
    """

    def __init__(self, *, partition: int, position: int = 0) -> None:
        self.partition = partition
        self.position = position
        self._entries: dict[OffsetKey, CommittedEntry] = {}
        # Log offset of the last tombstone applied per deleted key, so an older commit read later
        # (own writes are applied before the tail reaches them) does not bring the key back.
        # Pruned once the tail has passed it: nothing older can arrive after that.
        self._tombstones: dict[OffsetKey | ConsumerKey, int] = {}
        # producer id -> {log offset: record} of its undecided transaction (keyed by log offset, so
        # records handed in twice count once).
        self._pending: dict[int, dict[int, OffsetRecord]] = {}
        # KIP-848 consumer group records, the latest per key (same rule as the offsets).
        self._consumer: dict[ConsumerKey, ConsumerRecord] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def apply(self, record: OffsetRecord | ConsumerRecord | TxnMarker) -> bool:
        """Fold one record or marker; returns whether it changed any committed offset."""
        if isinstance(record, ConsumerRecord):
            self._apply_consumer(record)
            return False
        if isinstance(record, TxnMarker):
            held = self._pending.pop(record.producer_id, {})
            # Only records before the marker are its transaction's: records of the producer's
            # next transaction handed in early (out of log order) stay pending.
            later = {o: r for o, r in held.items() if o > record.log_offset}
            if later:
                self._pending[record.producer_id] = later
            if not record.commit:
                return False
            changed = False
            for pending in sorted((r for o, r in held.items() if o < record.log_offset), key=lambda r: r.log_offset):
                changed |= self._apply_decided(pending)
            return changed
        if record.producer_id >= 0:
            self._pending.setdefault(record.producer_id, {})[record.log_offset] = record
            return False
        return self._apply_decided(record)

    def _apply_decided(self, record: OffsetRecord) -> bool:
        key = record.key
        current = self._entries.get(key)
        newest = max(current.log_offset if current else -1, self._tombstones.get(key, -1))
        if record.log_offset <= newest:
            return False
        if record.value is None:
            self._tombstones[key] = record.log_offset
            return self._entries.pop(key, None) is not None
        self._tombstones.pop(key, None)
        self._entries[key] = CommittedEntry(key=key, value=record.value, log_offset=record.log_offset)
        return True

    def _apply_consumer(self, record: ConsumerRecord) -> None:
        key = record.key
        current = self._consumer.get(key)
        if record.log_offset <= max(current.log_offset if current else -1, self._tombstones.get(key, -1)):
            return
        if record.value is None:
            self._tombstones[key] = record.log_offset
            self._consumer.pop(key, None)
        else:
            self._tombstones.pop(key, None)
            self._consumer[key] = record

    def consumer_records(self, group: str | None = None) -> list[ConsumerRecord]:
        """The live KIP-848 records (of ``group``, or all), in log order."""
        return sorted((r for k, r in self._consumer.items() if group is None or k.group == group),
                      key=lambda r: r.log_offset)

    def pending_keys(self) -> set[OffsetKey]:
        """Keys some undecided transaction holds offsets for."""
        return {r.key for held in self._pending.values() for r in held.values()}

    def apply_all(self, records: Iterable[OffsetRecord | ConsumerRecord | TxnMarker]) -> None:
        for record in records:
            self.apply(record)

    def advance(self, position: int) -> None:
        """The tail has read everything below ``position``."""
        if position > self.position:
            self.position = position
            self._tombstones = {k: o for k, o in self._tombstones.items() if o >= position}

    def reset(self, position: int) -> None:
        """Forget everything and read again from ``position`` (the log moved under the reader)."""
        self._entries.clear()
        self._consumer.clear()
        self._tombstones.clear()
        self._pending.clear()
        self.position = position

    def entries(self) -> Iterator[CommittedEntry]:
        return iter(list(self._entries.values()))

    def get(self, key: OffsetKey) -> CommittedEntry | None:
        return self._entries.get(key)


@dataclass(frozen=True, slots=True)
class TopicCommit:
    """One group's commit on one partition of a topic, as consumed retention reads it."""

    offset: int
    commit_timestamp: int


def commits_by_topic(partitions: Iterable[PartitionOffsets], topic: str) -> dict[str, dict[int, TopicCommit]]:
    """``{group: {partition: commit}}`` of every group with a commit on ``topic``."""
    out: dict[str, dict[int, TopicCommit]] = {}
    for part in partitions:
        for entry in part.entries():
            if entry.key.topic == topic:
                out.setdefault(entry.key.group, {})[entry.key.partition] = TopicCommit(
                    offset=entry.value.offset, commit_timestamp=entry.value.commit_timestamp)
    return out


def commits_by_topics(partitions: Iterable[PartitionOffsets],
                      topics: set[str]) -> dict[str, dict[str, dict[int, TopicCommit]]]:
    """``commits_by_topic`` for many topics in one walk: ``{topic: {group: {partition: commit}}}``."""
    out: dict[str, dict[str, dict[int, TopicCommit]]] = {t: {} for t in topics}
    for part in partitions:
        for entry in part.entries():
            by_group = out.get(entry.key.topic)
            if by_group is not None:
                by_group.setdefault(entry.key.group, {})[entry.key.partition] = TopicCommit(
                    offset=entry.value.offset, commit_timestamp=entry.value.commit_timestamp)
    return out
