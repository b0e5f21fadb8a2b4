"""Reading an internal topic: folding its partitions up to their leaders' high watermarks.

A user of an internal topic keeps a fold per partition (the latest committed offsets, transaction
states, ...) and brings it up to date the same way: ask where each partition's leader is, fetch
from each leader at the fold's position (whole batches, as a consumer: only what is below the high
watermark, i.e. acknowledged), decode and fold the records, repeat while positions move; a tail
does that again every round. A position the leader no longer holds (OFFSET_OUT_OF_RANGE: below its
log start offset, or past its log end after a truncation) restarts that partition from the
leader's log start offset with an empty fold: it forgets only that partition's keys, then reads
them back. A reader that must not miss an acknowledged record (a state loaded once, then served)
first asks each leader whether its high watermark is settled (``grpc_settled``): a leader just
elected, or restarted, may report one below what was acknowledged. ``FoldReader`` is that loop; the
routing and the fetch call are parameters (the front door's router or the replica's metadata; the
same ``ReplicaClient``), and so are the record codec and the fold: the user's.

``call_leader`` is the one-partition call with the appender's back-off (``RetryPolicy``): a fetch
or DeleteRecords against the leader, re-resolving it while leadership moves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from lowtide.client.replica import ReplicaClient
from lowtide.errors import LowtideError, OffsetOutOfRange
from lowtide.internal_topics.append import RetryPolicy
from lowtide.internal_topics.topic import LeaderRouter
from lowtide.messages.replica import FetchPosition
from lowtide.record import iter_batches

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Fetched:
    """One partition of a fetch answer, as a reader needs it."""

    partition: int
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    error: LowtideError | None = None


# partitions -> ({leader address: [partitions]}, {partition: why it cannot be read now})
Router = Callable[[list[int]], tuple[dict[str, list[int]], dict[int, str]]]
# (leader address, [(partition, fetch offset)]) -> answers; raises LowtideError when the call fails
Fetcher = Callable[[str, list[tuple[int, int]]], list[Fetched]]
# (leader address, [partitions]) -> {partition: why its leader's HW may still be below records
# acknowledged}; raises LowtideError when the call fails
Settler = Callable[[str, list[int]], dict[int, str]]


def grpc_fetch(replicas: ReplicaClient, topic: str, *, max_bytes: int, deadline_s: float) -> Fetcher:
    """The gRPC fetcher of a ``FoldReader``: one Fetch per leader, not waiting for new records."""

    def fetch(address: str, asks: list[tuple[int, int]]) -> list[Fetched]:
        got = replicas.fetch(address, [FetchPosition(topic=topic, partition=p, fetch_offset=o, max_bytes=max_bytes)
                                       for p, o in asks], max_wait_ms=0, deadline_s=deadline_s)
        return [Fetched(partition=r.partition, records=r.records, high_watermark=r.high_watermark,
                        log_start_offset=r.log_start_offset, error=r.error) for r in got]

    return fetch


def grpc_settled(replicas: ReplicaClient, topic: str, *, timeout_s: float) -> Settler:
    """The gRPC check that each leader's high watermark is settled: a ListOffsets (latest) per
    leader, which a replica answers OFFSET_NOT_AVAILABLE while its HW is below where its leadership
    started (``Partition.check_high_watermark_settled``). A leader just elected may report an HW
    below records acknowledged under its predecessor (its followers bring it up a round later), and
    one back from a restart its HW checkpoint, below what it acknowledged before: a fold read to
    that HW would miss them. Asked first, the HW read to afterwards is past every acknowledged
    record."""

    def unsettled(address: str, partitions: list[int]) -> dict[int, str]:
        answers = replicas.list_offsets(address, [(topic, p, -1) for p in partitions], timeout_s=timeout_s)
        return {a.partition: f"{a.error.name}: {a.error.message}" for a in answers if a.error is not None}

    return unsettled


class PartitionFold(Protocol[R]):
    """A user's fold of one partition: its records folded below ``position``."""

    @property
    def position(self) -> int: ...

    def apply_all(self, records: Iterable[R]) -> None: ...

    def advance(self, position: int) -> None: ...

    def reset(self, position: int) -> None: ...


F = TypeVar("F", bound=PartitionFold)


class FoldReader(Generic[F, R]):
    """Per-partition folds of an internal topic and the loop that reads them up to date.

    ``new_fold(partition)`` makes an empty fold; ``decode(records, from_offset)`` turns a fetch
    answer's batches into the records to fold (those at or above ``from_offset``), raising
    LowtideError on a record it cannot read.

    Contract: ``read_to_high_watermark`` returns, for every asked partition it could not bring up
    to its leader's high watermark, the reason; an empty dict means every one was read up to the
    HW its leader reported during this call. ``apply`` folds records a writer got acknowledged.

    Thread-safety: thread-safe; the folds are guarded by ``_lock`` (subclasses read them under
    it), never held during I/O.
    """

    def __init__(self, *, new_fold: Callable[[int], F], decode: Callable[[bytes, int], Sequence[R]]) -> None:
        self._lock = threading.Lock()
        self._folds: dict[int, F] = {}
        self._new_fold = new_fold
        self._decode = decode

    def _fold(self, partition: int) -> F:
        """The partition's fold, made if missing (caller holds ``_lock``)."""
        fold = self._folds.get(partition)
        if fold is None:
            fold = self._folds[partition] = self._new_fold(partition)
        return fold

    def positions(self) -> dict[int, int]:
        with self._lock:
            return {p: fold.position for p, fold in self._folds.items()}

    def apply(self, partition: int, records: Iterable[R]) -> None:
        """Fold records the leader acknowledged (a writer's own)."""
        with self._lock:
            self._fold(partition).apply_all(records)

    def read_to_high_watermark(self, partitions: Iterable[int], *, route: Router, fetch: Fetcher,
                               settled: Settler | None = None) -> dict[int, str]:
        """Fetch and fold until each partition reached its leader's HW or stopped moving (see class
        doc). With ``settled``, each leader is first asked whether its HW is settled (``grpc_settled``):
        a partition whose leader's is not is a failure, not read."""
        pending = set(partitions)
        failures: dict[int, str] = {}
        checked: set[str] = set()
        while pending:
            before = self.positions()
            by_address, unroutable = route(sorted(pending))
            for partition, why in unroutable.items():
                failures[partition] = why
                pending.discard(partition)
            if settled is not None:
                for address in [a for a in by_address if a not in checked]:
                    checked.add(address)
                    try:
                        not_yet = settled(address, by_address[address])
                    except LowtideError as err:
                        not_yet = {p: f"at {address}: {err.name}: {err.message}" for p in by_address[address]}
                    for partition, why in not_yet.items():
                        failures[partition] = why
                        pending.discard(partition)
                    by_address[address] = [p for p in by_address[address] if p not in not_yet]
            for address, parts in by_address.items():
                if not parts:
                    continue
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
            asks = [(p, self._fold(p).position) for p in partitions]
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
                    self._fold(p).reset(max(0, answer.log_start_offset))
                continue
            if answer.error is not None:
                failed[p] = f"{answer.error.name}: {answer.error.message}"
                continue
            try:  # decoded outside the lock: the user's reads go on meanwhile
                records = self._decode(answer.records, starts[p])
            except LowtideError as err:
                failed[p] = f"at offset {starts[p]}: {err.name}: {err.message}"
                continue
            end = starts[p]
            for header, _ in iter_batches(answer.records):
                end = max(end, header.next_offset)
            with self._lock:
                fold = self._fold(p)
                if fold.position != starts[p]:
                    continue  # reset meanwhile: this answer is about the old position
                fold.apply_all(records)
                fold.advance(end)
                if fold.position >= answer.high_watermark:
                    done.add(p)
        return done, failed


def call_leader(call: Callable[[str], T], *, router: LeaderRouter, partition: int, deadline: float,
                retry: RetryPolicy = RetryPolicy(),
                retry_on: Callable[[LowtideError], bool] = lambda err: err.retriable) -> T:
    """``call(leader address)`` for ``partition``, re-resolving the leader and backing off while it
    fails with an error ``retry_on`` accepts and ``deadline`` (``time.monotonic()``) allows; the
    last error otherwise. On this thread (it sleeps)."""
    attempt = 0
    while True:
        try:
            address = router.cached_leader(partition) if attempt == 0 else None
            return call(address if address is not None else router.find_leader(partition, refresh=attempt > 0))
        except LowtideError as exc:
            if not retry_on(exc) or not retry.has_time(attempt + 1, deadline):
                raise
            router.forget_leader(partition)
        attempt += 1
        retry.sleep(attempt)

