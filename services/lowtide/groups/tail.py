"""Reading ``__consumer_offsets`` up to its high watermarks, with the I/O handed in.

The front door (group APIs) and the replicas (consumed retention) both keep a fold per partition
and bring it up to date the same way: ask where each partition's leader is, fetch from each
leader at the fold's position (whole batches, as a consumer: only what is below the high
watermark, i.e. acknowledged), fold the records, repeat while positions move. Only the routing
and the fetch call differ (the front door's router vs the replica's metadata; the same
``ReplicaClient``), so those are the two callables this module takes; it imports no server code.

A position the leader no longer holds (OFFSET_OUT_OF_RANGE: below its log start offset, or past
its log end after a truncation) restarts that partition from the leader's log start offset with
an empty fold: it forgets only that partition's groups, then reads them back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lowtide.errors import LowtideError, OffsetOutOfRange
from lowtide.groups.state import (
    CommittedEntry,
    OffsetRecord,
    PartitionOffsets,
    TopicCommit,
    TxnMarker,
    commits_by_topics,
    decode_offset_records,
)
from lowtide.record import iter_batches


@dataclass(frozen=True, slots=True)
class FetchedOffsets:
    """One partition of a fetch answer, as the tail needs it."""

    partition: int
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    error: LowtideError | None = None


# partitions -> ({leader address: [partitions]}, {partition: why it cannot be read now})
Router = Callable[[list[int]], tuple[dict[str, list[int]], dict[int, str]]]
# (leader address, [(partition, fetch offset)]) -> answers; raises LowtideError when the call fails
Fetcher = Callable[[str, list[tuple[int, int]]], list[FetchedOffsets]]


class OffsetsTail:
    """Per-partition folds of ``__consumer_offsets`` and the loop that reads them up to date.

    Contract: ``read_to_high_watermark`` returns, for every asked partition it could not bring up
    to its leader's high watermark, the reason; an empty dict means every one was read up to the
    HW its leader reported during this call. ``apply`` folds records a writer got acknowledged.

    Thread-safety: thread-safe; the folds are guarded by one lock, never held during I/O.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[int, PartitionOffsets] = {}

    def _part(self, partition: int) -> PartitionOffsets:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = PartitionOffsets(partition=partition)
        return part

    # -- reads of the folded state ---------------------------------------------------------------
    def entries(self, *, group: str | None = None) -> list[CommittedEntry]:
        with self._lock:
            return [e for part in self._parts.values() for e in part.entries()
                    if group is None or e.key.group == group]

    def commits_by_topics(self, topics: set[str]) -> dict[str, dict[str, dict[int, TopicCommit]]]:
        """``{topic: {group: {partition: commit}}}`` for the given topics."""
        with self._lock:
            return commits_by_topics(self._parts.values(), topics)

    def pending_keys(self, *, group: str) -> set[tuple[str, int]]:
        """(topic, partition) of ``group`` with offsets of an undecided transaction."""
        with self._lock:
            return {(k.topic, k.partition) for part in self._parts.values() for k in part.pending_keys()
                    if k.group == group}

    def positions(self) -> dict[int, int]:
        with self._lock:
            return {p: part.position for p, part in self._parts.items()}

    # -- writes ----------------------------------------------------------------------------------
    def apply(self, partition: int, records: Iterable[OffsetRecord | TxnMarker]) -> None:
        """Fold records the leader acknowledged (a writer's own)."""
        with self._lock:
            self._part(partition).apply_all(records)

    def read_to_high_watermark(self, partitions: Iterable[int], *, route: Router, fetch: Fetcher) -> dict[int, str]:
        """Fetch and fold until each partition reached its leader's HW or stopped moving (see class doc)."""
        pending = set(partitions)
        failures: dict[int, str] = {}
        while pending:
            before = self.positions()
            by_address, unroutable = route(sorted(pending))
            for partition, why in unroutable.items():
                failures[partition] = why
                pending.discard(partition)
            for address, parts in by_address.items():
                done, failed = self._fetch_once(address, parts, fetch)
                pending -= done
                for partition, why in failed.items():
                    failures[partition] = why
                    pending.discard(partition)
            if self.positions() == before:
                break  # nothing moved: what is left cannot be brought up to date now
        for partition in pending:
            failures.setdefault(partition, "made no progress towards the high watermark")
        return failures

    def _fetch_once(self, address: str, partitions: list[int], fetch: Fetcher) -> tuple[set[int], dict[int, str]]:
        with self._lock:
            asks = [(p, self._part(p).position) for p in partitions]
        try:
            answers = fetch(address, asks)
        except LowtideError as err:
            return set(), {p: f"fetch from {address}: {err.name}: {err.message}" for p in partitions}
        starts = dict(asks)
        done: set[int] = set()
        failed: dict[int, str] = {}
        for answer in answers:
            p = answer.partition
            if p not in starts:
                continue
            if isinstance(answer.error, OffsetOutOfRange):
                with self._lock:
                    self._part(p).reset(max(0, answer.log_start_offset))
                continue
            if answer.error is not None:
                failed[p] = f"{answer.error.name}: {answer.error.message}"
                continue
            try:
                records = decode_offset_records(answer.records, from_offset=starts[p])
            except LowtideError as err:
                failed[p] = f"at offset {starts[p]}: {err.name}: {err.message}"
                continue
            end = starts[p]
            for header, _ in iter_batches(answer.records):
                end = max(end, header.next_offset)
            with self._lock:
                part = self._part(p)
                if part.position != starts[p]:
                    continue  # reset meanwhile: this answer is about the old position
                part.apply_all(records)
                part.advance(end)
                if part.position >= answer.high_watermark:
                    done.add(p)
        return done, failed
