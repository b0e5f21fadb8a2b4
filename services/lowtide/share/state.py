"""The share-partition state machine of KIP-932: which records of one partition a share group has
in flight, who holds them, and how often they were delivered. Pure: no I/O, no clock (``now_ms``
is passed in), no threads. Design: docs/design/kip-932-share-groups.md.

The records between the start offset (SPSO) and the end offset (SPEO) are kept as ranges of one
state, never per record: a fetch acquires whole log batches, so a 1000-record batch is one range.
A range splits only where an acknowledgement covers part of it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lowtide.errors import InvalidRecordState, InvalidRequest
from lowtide.messages.share import ShareAckBatch as AckBatch

# Kafka's RecordState codes (also what __share_group_state stores).
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
STATE_NAMES = {AVAILABLE: "AVAILABLE", ACQUIRED: "ACQUIRED", ACKNOWLEDGED: "ACKNOWLEDGED", ARCHIVED: "ARCHIVED"}
# Kafka's AcknowledgeType codes in ShareFetch/ShareAcknowledge (0 = a gap: no record there).
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
ACKNOWLEDGE_TYPES = (GAP, ACCEPT, RELEASE, REJECT, RENEW)
_DONE = (ACKNOWLEDGED, ARCHIVED)


@dataclass(frozen=True, slots=True)
class SharePartitionConfig:
    """Kafka's ``group.share.record.lock.duration.ms`` and ``group.share.delivery.count.limit``."""

    lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5


@dataclass(slots=True)
class InFlight:
    """Records ``first``..``last`` (inclusive) in one state; ``member`` and ``deadline_ms`` only
    while ACQUIRED."""

    first: int
    last: int
    state: int
    delivery_count: int
    member: str = ""
    deadline_ms: int = 0

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class Acquired:
    """One range a fetch acquired, as ShareFetch's AcquiredRecords carries it."""

    first: int
    last: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class StateBatch:
    """A persisted range (``__share_group_state``'s StateBatch)."""

    first: int
    last: int
    state: int
    delivery_count: int


class SharePartitionState:
    """One share-partition: SPSO, SPEO and the in-flight ranges between them (module doc).

    Contract: every public method either changes the state as documented or raises and changes
    nothing (an acknowledgement of records the member does not hold is INVALID_RECORD_STATE for
    the whole call). The ranges always tile ``[start_offset, end_offset)`` exactly, in order.

    Thread-safety: none; the owner (``share.partitions.SharePartition``) holds a lock around it.
    """

    def __init__(self, *, start_offset: int, config: SharePartitionConfig,
                 batches: Iterable[StateBatch] = ()) -> None:
        self.config = config
        self.start_offset = start_offset
        self.ranges: list[InFlight] = []
        end = start_offset
        for b in sorted(batches, key=lambda b: b.first):
            if b.last < end:
                continue  # below the start offset: done
            first = max(b.first, end)
            if first > end:  # a hole in what was written: nothing was delivered there
                self.ranges.append(InFlight(end, first - 1, AVAILABLE, 0))
            # A lock does not survive the leader that granted it (Kafka's rule): ACQUIRED is AVAILABLE.
            state = AVAILABLE if b.state == ACQUIRED else b.state
            self.ranges.append(InFlight(first, b.last, state, b.delivery_count))
            end = b.last + 1
        self.end_offset = end
        self._advance_start()

    # -- reading ---------------------------------------------------------------------------------
    def copy(self) -> SharePartitionState:
        return copy.deepcopy(self)

    def find_next_read_offset(self) -> int:
        """Where a fetch should read the log from: the first AVAILABLE in-flight record, else SPEO."""
        for r in self.ranges:
            if r.state == AVAILABLE:
                return r.first
        return self.end_offset

    def has_available(self, high_watermark: int) -> bool:
        """Whether a fetch could acquire anything: a record given back, or one never delivered below the HW."""
        return any(r.state == AVAILABLE for r in self.ranges) or self.end_offset < high_watermark

    def to_state_batches(self) -> list[StateBatch]:
        """What is persisted: the in-flight ranges, ACQUIRED written as AVAILABLE (a lock does not
        survive a restart), adjacent equal ones merged."""
        out: list[StateBatch] = []
        for r in self.ranges:
            state = AVAILABLE if r.state == ACQUIRED else r.state
            if out and out[-1].state == state and out[-1].delivery_count == r.delivery_count \
                    and out[-1].last + 1 == r.first:
                out[-1] = StateBatch(out[-1].first, r.last, state, r.delivery_count)
            else:
                out.append(StateBatch(r.first, r.last, state, r.delivery_count))
        return out

    # -- changes ---------------------------------------------------------------------------------
    def acquire(self, *, member: str, batches: Sequence[tuple[int, int]], max_records: int,
                now_ms: int) -> list[Acquired]:
        """Acquire for ``member`` what is available inside ``batches`` (the (base offset, last
        offset) of each whole batch the log read returned, in order): first AVAILABLE in-flight
        ranges (redeliveries), then new records from SPEO, whole batches, until at least
        ``max_records`` records (batch-aligned: it may go over, as Kafka's). Returns the ranges."""
        if not batches or max_records <= 0:
            return []
        window_first, window_last = batches[0][0], batches[-1][1]
        deadline = now_ms + self.config.lock_duration_ms
        taken: list[Acquired] = []
        count = 0
        i = 0
        while i < len(self.ranges) and count < max_records:
            r = self.ranges[i]
            if r.state != AVAILABLE or r.last < window_first or r.first > window_last:
                i += 1
                continue
            if r.first < window_first:
                self._split(i, window_first)
                i += 1
                continue
            if r.last > window_last:
                self._split(i, window_last + 1)
                r = self.ranges[i]
            r.state, r.member, r.deadline_ms = ACQUIRED, member, deadline
            r.delivery_count += 1
            taken.append(Acquired(r.first, r.last, r.delivery_count))
            count += r.count
            i += 1
        for _base, last in batches:
            if count >= max_records:
                break
            if last < self.end_offset:
                continue
            # From SPEO, never from the batch's base: the ranges stay contiguous, and a hole the
            # log has (compaction) is acquired too; the client acknowledges it as a gap.
            first = self.end_offset
            self.ranges.append(InFlight(first, last, ACQUIRED, 1, member, deadline))
            self.end_offset = last + 1
            taken.append(Acquired(first, last, 1))
            count += last - first + 1
        return taken

    def acknowledge(self, *, member: str, batches: Sequence[AckBatch], now_ms: int) -> None:
        """Apply ``member``'s acknowledgements, all or nothing (class doc)."""
        spans: list[tuple[int, int, int]] = []  # (first, last, type), per run of one type
        for b in batches:
            if b.last < b.first or not b.types or (len(b.types) != 1 and len(b.types) != b.last - b.first + 1):
                raise InvalidRequest(f"acknowledgement batch {b.first}-{b.last} with {len(b.types)} types")
            if any(t not in ACKNOWLEDGE_TYPES for t in b.types):
                raise InvalidRequest(f"unknown acknowledge type in {b.types}")
            if len(b.types) == 1:
                spans.append((b.first, b.last, b.types[0]))
                continue
            run_start = b.first
            for k in range(1, len(b.types) + 1):
                if k == len(b.types) or b.types[k] != b.types[k - 1]:
                    spans.append((run_start, b.first + k - 1, b.types[k - 1]))
                    run_start = b.first + k
        for first, last, _ in spans:
            self._check_held(member, first, last, now_ms)
        for first, last, kind in spans:
            for r in self._isolate(first, last):
                if kind == ACCEPT:
                    r.state = ACKNOWLEDGED
                elif kind in (REJECT, GAP):
                    r.state = ARCHIVED
                elif kind == RELEASE:
                    self._release(r)
                else:  # RENEW: the member keeps the records a lock duration longer
                    r.deadline_ms = now_ms + self.config.lock_duration_ms
                    continue
                r.member, r.deadline_ms = "", 0
        self._advance_start()

    def expire_locks(self, now_ms: int) -> bool:
        """Acquired records whose lock ran out go back (or are archived past the delivery limit)."""
        changed = False
        for r in self.ranges:
            if r.state == ACQUIRED and r.deadline_ms <= now_ms:
                self._release(r)
                changed = True
        if changed:
            self._advance_start()
        return changed

    def release_member(self, member: str) -> bool:
        """Everything ``member`` holds goes back (its share session closed)."""
        changed = False
        for r in self.ranges:
            if r.state == ACQUIRED and r.member == member:
                self._release(r)
                changed = True
        if changed:
            self._advance_start()
        return changed

    def advance_to(self, log_start_offset: int) -> bool:
        """Records below the log's start offset are gone (DeleteRecords, retention): SPSO follows."""
        if log_start_offset <= self.start_offset:
            return False
        while self.ranges and self.ranges[0].last < log_start_offset:
            self.ranges.pop(0)
        if self.ranges and self.ranges[0].first < log_start_offset:
            self.ranges[0].first = log_start_offset
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        return True

    # -- internals -------------------------------------------------------------------------------
    def _release(self, r: InFlight) -> None:
        r.state = ARCHIVED if r.delivery_count >= self.config.delivery_count_limit else AVAILABLE
        r.member, r.deadline_ms = "", 0

    def _check_held(self, member: str, first: int, last: int, now_ms: int) -> None:
        if first < self.start_offset or last >= self.end_offset:
            raise InvalidRecordState(f"offsets {first}-{last} are not in flight "
                                     f"[{self.start_offset}, {self.end_offset})")
        for r in self.ranges:
            if r.last < first or r.first > last:
                continue
            if r.state != ACQUIRED or r.member != member or r.deadline_ms <= now_ms:
                held = "lock timed out" if r.state == ACQUIRED and r.member == member else \
                    STATE_NAMES[r.state] + ("" if r.state != ACQUIRED else " by another member")
                raise InvalidRecordState(f"offsets {max(first, r.first)}-{min(last, r.last)} are not acquired by "
                                         f"{member}: {held}")

    def _split(self, i: int, at: int) -> None:
        """Split range ``i`` so that a new range starts at ``at`` (first < at <= last)."""
        r = self.ranges[i]
        tail = InFlight(at, r.last, r.state, r.delivery_count, r.member, r.deadline_ms)
        r.last = at - 1
        self.ranges.insert(i + 1, tail)

    def _isolate(self, first: int, last: int) -> list[InFlight]:
        """The ranges covering exactly ``first``..``last``, splitting the ones at its edges."""
        out = []
        i = 0
        while i < len(self.ranges):
            r = self.ranges[i]
            if r.last < first:
                i += 1
                continue
            if r.first > last:
                break
            if r.first < first:
                self._split(i, first)
                i += 1
                continue
            if r.last > last:
                self._split(i, last + 1)
            out.append(self.ranges[i])
            i += 1
        return out

    def _advance_start(self) -> None:
        """Drop leading ranges that are done; SPSO moves past them. Done neighbours merge, so the
        list stays as short as what is still open."""
        drop = 0
        while drop < len(self.ranges) and self.ranges[drop].state in _DONE:
            drop += 1
        if drop:
            self.start_offset = self.ranges[drop - 1].last + 1
            del self.ranges[:drop]
        merged: list[InFlight] = []
        for r in self.ranges:
            prev = merged[-1] if merged else None
            if prev is not None and prev.state == r.state and r.state in _DONE \
                    and prev.delivery_count == r.delivery_count:
                prev.last = r.last
            else:
                merged.append(r)
        self.ranges = merged
