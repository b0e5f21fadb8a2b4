"""A coordinator shard's mutation pipeline (coordinator.service draws it): its units, a queued
request (``Waiter``) and the requests sent in one Produce (``Group``), and the appends of groups to
the shard's metadata log (``LogAppender``).

An append is one acks=all Produce of one batch per decision with records, under the term's writer
id and coordinator epoch (metadata_log.writer_id), conditional on the log ending where the shard's
state plus its appends in flight end, after a batch of that writer id (replica.proto
``expected_log_end_offset``): that condition fences a deposed coordinator and keeps two appends in
flight in order (docs/design/diskless.md#fencing-by-epoch).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from prometheus_client import Histogram

from lowtide.clock import now_ms
from lowtide.coordinator.core import CoordinatorCore, Decision
from lowtide.coordinator.metadata_log import METADATA_TOPIC, MetadataLog, writer_id
from lowtide.coordinator.records import MetadataRecord, encode_record
from lowtide.errors import (
    InvalidProducerEpoch,
    KafkaStorageError,
    NotCoordinator,
    OutOfOrderSequenceNumber,
    RequestTimedOut,
)
from lowtide.leases import Lease
from lowtide.record import encode_batch
from lowtide.rpc.steps import Blocking, Steps, run_blocking

APPEND_DURATION = Histogram(
    "lowtide_coordinator_append_duration_seconds", "One metadata log append (acks=all Produce) of the appender",
    ["shard"], buckets=(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0, 5.0))
APPEND_DECISIONS = Histogram(
    "lowtide_coordinator_append_decisions", "Decisions (requests) carried by one metadata log append", ["shard"],
    buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 256, 512))


class Waiter:
    """A queued request: its check (None for a barrier), then its outcome; ``done`` is set once
    it has one, and ``wake.set()`` called if a waiter on an event loop armed one (rpc/steps.py
    ``Wait``: a framed CommitFile waits without a thread). Thread-safety: finished by any thread."""

    __slots__ = ("check", "records", "response", "error", "done", "queued_at", "wake")

    def __init__(self, check: Callable[[CoordinatorCore], Decision] | None) -> None:
        self.check = check
        self.queued_at = time.monotonic()  # the append linger counts from here
        self.records: list[MetadataRecord] = []
        self.response: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.wake: Any = None

    def finish(self) -> None:
        self.done.set()
        wake = self.wake
        if wake is not None:
            wake.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finish()


class WaiterWait:
    """A steps ``Wait`` (lowtide.rpc.steps) for a queued request's outcome, until ``deadline``
    (``time.monotonic()``); at the deadline the request stays queued, as a gRPC caller's would."""

    __slots__ = ("waiter", "deadline")

    def __init__(self, waiter: Waiter, *, deadline: float) -> None:
        self.waiter, self.deadline = waiter, deadline

    def arm(self, event: Any) -> None:
        self.waiter.wake = event

    def check(self) -> bool:
        return self.waiter.done.is_set()

    def expire(self) -> None:
        pass

    def disarm(self) -> None:
        self.waiter.wake = None


class FutureDone:
    """A steps ``Wait`` (lowtide.rpc.steps) for a ``concurrent.futures.Future`` (the append in
    flight before another), until ``deadline``."""

    __slots__ = ("future", "deadline", "_event")

    def __init__(self, future: Future, *, deadline: float) -> None:
        self.future, self.deadline = future, deadline
        self._event: Any = None

    def arm(self, event: Any) -> None:
        self._event = event
        self.future.add_done_callback(self._fire)

    def _fire(self, _future: Future) -> None:
        event = self._event
        if event is not None:
            event.set()

    def check(self) -> bool:
        return self.future.done()

    def expire(self) -> None:
        pass

    def disarm(self) -> None:
        self._event = None


def seconds_until_send(*, oldest_queued_at: float | None, in_flight: int, max_in_flight: int, linger_s: float,
                       now: float, busy: bool = False) -> float:
    """Seconds until the writer sends the checked requests (the oldest queued at
    ``oldest_queued_at``) as the next append; 0: now; 0.5 (a re-check) with nothing it may send.

    The first append in flight goes at once unless the shard is ``busy``: its oldest request
    arrived while an append was in flight, or within twice the linger of the request before it
    (the writer decides). So an idle shard, and requests spaced wider than that, add no latency.
    A further append, or a busy shard's first, goes once its oldest request has waited
    ``linger_s``, or sooner when the append before it lands and the shard is not busy: under
    load, the requests that arrive meanwhile ride one append together, as a Kafka producer's
    records do within its ``linger.ms``. Why: each append costs a Produce, a follower fetch round
    per replica and an apply whatever it carries, about as much CPU as a 100-batch file's own
    checks (docs/design/diskless.md#cost-per-commit). The price: one client committing files back
    to back, faster than one per twice the linger, waits up to the linger on each."""
    if oldest_queued_at is None or in_flight >= max_in_flight:
        return 0.5
    if in_flight == 0 and not busy:
        return 0.0
    return max(0.0, oldest_queued_at + linger_s - now)


@dataclass(slots=True, weakref_slot=True)
class Group:
    """The requests taken by the writer at once: one Produce, then one apply."""

    waiters: list[Waiter]
    data: bytes = b""                      # their records' batches, one per decision with records
    values: list[bytes] = field(default_factory=list)  # their records' values, in log order
    expected: int = -1                     # the log end offset its conditional append expects
    producer_id: int = -1                  # the shard's writer id of the term it was checked in
    epoch: int = 0                         # that term's coordinator epoch
    appended: Future | None = None         # the Produce: -> base offset of the first record
    finished: bool = False                 # the Produce ended (and, if it succeeded, the applier has it)

    def fail(self, error: BaseException) -> None:
        for waiter in self.waiters:
            if not waiter.done.is_set():
                waiter.fail(error)


class LogAppender:
    """Shard ``shard``'s appends to ``metadata_log`` while it holds ``lease``.

    Contract: ``encode(group)`` returns the group's batches (one per decision with records) and
    fills ``group.values``; ``append(group, previous)`` (or ``append_steps``) sends them (``group.data``) in one
    conditional acks=all Produce and returns the base offset of the first record, raising
    NOT_COORDINATOR (the lease lapsed, or ``fenced``: a newer epoch is in the log) or whatever the
    append raised; ``fenced(epoch, exc)`` is the error for a refused epoch. ``topic_ready`` says
    the metadata topic is known to exist (it is never deleted): the first append creates it if it
    was not, and the shard sets it when it finds the topic (a load, a standby's follow).

    Thread-safety: ``append_steps`` runs on the shard's pipeline loop, several at once (one per
    append in flight), and ``append`` on any thread; both read the lease and append, and set
    ``topic_ready`` (a flag only ever set to True; creating the topic is idempotent). ``encode``
    and ``fenced`` keep no state.
    """

    def __init__(self, *, shard: int, metadata_log: MetadataLog, lease: Lease, append_timeout_ms: int) -> None:
        self.shard = shard
        self.log = metadata_log
        self.lease = lease
        self.append_timeout_ms = append_timeout_ms
        self.topic_ready = False

    @staticmethod
    def encode(group: Group) -> bytes:
        """One batch per decision with records, under this term's writer id and coordinator epoch
        (metadata_log.writer_id); keeps the records' values for the applier."""
        now = now_ms()
        batches = []
        producer_id, producer_epoch = writer_id(group.epoch)
        epoch = group.epoch
        for waiter in group.waiters:
            if waiter.records:
                values = [encode_record(r, epoch=epoch) for r in waiter.records]
                group.values.extend(values)
                batches.append(encode_batch(values, timestamp_ms=now, producer_id=producer_id,
                                            producer_epoch=producer_epoch))
        return b"".join(batches)

    def append(self, group: Group, previous: Future | None) -> int:
        """``append_steps`` on the calling thread."""
        return run_blocking(self.append_steps(group, previous))

    def append_steps(self, group: Group, previous: Future | None, *,
                     loop: asyncio.AbstractEventLoop | None = None) -> Steps[int]:
        """One acks=all Produce, conditional on the log ending at ``group.expected`` after a
        batch of this term's writer id; the base offset of its first record. As steps: the shard
        drives it on its pipeline loop (``loop``: MetadataLog.append_steps). The condition is
        what fences a deposed coordinator (a successor's load moved the log end, and its appends
        are under another id) and what keeps two appends in flight in order: the second is
        refused unless the first landed just before it. Refused because the first was still on its
        way (the replica took them in the other order), it is sent again once the first succeeded;
        any other refusal fails the pipeline and the shard reloads."""
        if not self.lease.valid():
            raise NotCoordinator(f"coordinator {self.shard}: the leader lease lapsed")
        if not self.topic_ready:
            # Created on the first write, not at start: a cluster that never uses diskless
            # topics gets no metadata partitions (and a start never waits for replicas).
            yield Blocking(self.log.ensure_topic)
            self.topic_ready = True
        began = time.perf_counter()
        append = partial(self.log.append_steps, group.data, timeout_ms=self.append_timeout_ms,
                         expected_end_offset=group.expected, loop=loop)
        try:
            try:
                base = yield from append()
            except OutOfOrderSequenceNumber:
                if previous is None:
                    raise
                if not previous.done():
                    yield FutureDone(previous, deadline=time.monotonic() + self.append_timeout_ms / 1000)
                if not previous.done():
                    raise RequestTimedOut(f"coordinator {self.shard}: the append before this one did not end "
                                          f"within {self.append_timeout_ms} ms") from None
                previous.result()  # raises if the one before failed: then so does this one
                if not self.lease.valid():
                    raise NotCoordinator(f"coordinator {self.shard}: the leader lease lapsed") from None
                base = yield from append()
        except InvalidProducerEpoch as exc:
            raise self.fenced(group.epoch, exc) from None
        APPEND_DURATION.labels(str(self.shard)).observe(time.perf_counter() - began)
        APPEND_DECISIONS.labels(str(self.shard)).observe(sum(1 for w in group.waiters if w.records))
        if base != group.expected:
            raise KafkaStorageError(f"{METADATA_TOPIC}-{self.shard}: a conditional append expecting the log "
                                    f"end at {group.expected} was given base offset {base}")
        return base

    def fenced(self, epoch: int, exc: BaseException) -> NotCoordinator:
        """A replica refused our epoch: a newer leadership opened its epoch in the log."""
        error = NotCoordinator(f"coordinator {self.shard}: epoch {epoch} is fenced by a newer leader of the "
                               f"shard ({exc})")
        error.fenced = True  # type: ignore[attr-defined]  # ShardService._fail_pipeline steps down, not reloads
        return error
