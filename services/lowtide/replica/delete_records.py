"""DeleteRecords on a leader (KIP-107 steps 3-4 and 7).

``DeleteRecordsHandler.delete_records`` raises each leader's LSO (all of them made durable by one
flush: a LogStartOffsetCommit), then parks a
``DelayedDeleteRecords`` in the purgatory until, for every partition of the request, the low
watermark (min LSO over the leader and every live replica) has reached the requested offset, or
that partition failed (leadership moved: NOT_LEADER_OR_FOLLOWER). At its deadline the remaining
partitions get REQUEST_TIMED_OUT; the leader's LSO stays advanced either way.

Whatever may move a low watermark (a follower reporting a new LSO, a broker joining or leaving,
a leadership change) calls ``recheck_low_watermarks`` or ``complete_ready``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from lowtide.clock import now_ms
from lowtide.errors import LowtideError, NotLeaderOrFollower, RequestTimedOut, UnknownServerError
from lowtide.log.partition_log import LogStartOffsetCommit
from lowtide.messages import TopicPartition
from lowtide.messages.replica import DeleteRecordsResult
from lowtide.purgatory.delayed import DelayedOperation
from lowtide.purgatory.purgatory import Purgatory
from lowtide.replica.partition import LEADER, Partition
from lowtide.replica.registry import PartitionRegistry

# Called with the partitions whose low watermark changed: [(tp, lw), ...].
LowWatermarkListener = Callable[[list[tuple[TopicPartition, int]]], None]


class DelayedDeleteRecords(DelayedOperation):
    """Waits until the low watermark of every requested partition reaches its offset.

    Contract: ``required`` maps each partition to (offset, leader epoch when the request was
    applied). ``results`` holds, once completed, the low watermark or the error of every
    partition: the LW (>= offset) when reached, NOT_LEADER_OR_FOLLOWER when the partition is no
    longer hosted, no longer led here or led under another epoch, REQUEST_TIMED_OUT otherwise.

    Thread-safety: try_complete may run concurrently from several fetch handlers (the purgatory
    serialises the checks of one operation); results are only read after completion, and each
    partition's result is written once under the op lock.
    """

    def __init__(self, *, registry: PartitionRegistry, required: dict[TopicPartition, tuple[int, int]],
                 deadline_ms: int) -> None:
        super().__init__(deadline_ms=deadline_ms)
        self.registry = registry
        self.required = required
        self.results: dict[TopicPartition, int | LowtideError] = {}
        self._pending: list[TopicPartition] = list(reversed(list(required)))  # popped from the end, in request order

    def try_complete(self) -> bool:
        # Partitions are checked in order and the check stops at the first one still short of its
        # offset: one follower fetch moves many partitions at once and calls this once per
        # partition, so scanning every pending partition each time would be O(n^2) for a
        # 1,000-partition request. A partition whose leadership moved is resolved when reached
        # (or times out with the rest).
        live = self.registry.live_brokers
        while self._pending:
            tp = self._pending[-1]
            offset, epoch = self.required[tp]
            p = self.registry.find(*tp)
            if p is None or p.role != LEADER or p.leader_epoch != epoch:
                self.results[tp] = NotLeaderOrFollower(f"leadership of {tp[0]}-{tp[1]} moved while deleting")
            else:
                lw = p.low_watermark(live)
                if lw < offset:
                    return False
                self.results[tp] = lw
            self._pending.pop()
        return self.force_complete()

    def on_expiration(self) -> None:
        for tp, (offset, _) in self.required.items():
            if tp not in self.results:
                self.results[tp] = RequestTimedOut(
                    f"{tp[0]}-{tp[1]}: low watermark did not reach {offset} before the timeout "
                    "(a live replica has not caught up with the log start offset)")

    def on_complete(self) -> None:
        # Results were recorded by try_complete / on_expiration; waiting threads use wait().
        for tp in self.required:
            self.results.setdefault(tp, RequestTimedOut(f"{tp[0]}-{tp[1]}: completed without a result"))


class DeleteRecordsHandler:
    """The leader side of DeleteRecords, and the low watermarks it reports.

    Contract: ``delete_records`` returns one ``DeleteRecordsResult`` (the low watermark, or -1 and
    the error) per item, in request order, after the LW of every applied partition reached its offset or the
    timeout passed. ``recheck_low_watermarks`` completes the waiting requests the given partitions
    may satisfy and, when a partition's LW differs from the last one reported, calls
    ``on_low_watermark_change`` (one event per change, not per fetch).

    Thread-safety: thread-safe; ``delete_records`` blocks its caller (a gRPC handler thread)
    while it waits. The reported-LW map is updated from fetch handler threads and the membership
    thread, under its own lock.
    """

    def __init__(self, *, registry: PartitionRegistry, purgatory: Purgatory,
                 on_low_watermark_change: LowWatermarkListener | None = None) -> None:
        self.registry = registry
        self.purgatory = purgatory
        self.on_low_watermark_change = on_low_watermark_change
        self._reported_lw: dict[TopicPartition, int] = {}
        self._reported_lock = threading.Lock()

    def delete_records(self, items: list[tuple[str, int, int]], *, timeout_ms: int) -> list[DeleteRecordsResult]:
        """KIP-107 on the leader. Returns one ``DeleteRecordsResult`` per item, in request order."""
        required: dict[TopicPartition, tuple[int, int]] = {}
        errors: dict[TopicPartition, LowtideError] = {}
        raised: list[TopicPartition] = []
        # One flush for every LSO this request raises, not one per partition (start_offset_file.py).
        with LogStartOffsetCommit() as lso_commit:
            for topic, partition, offset in items:
                tp = (topic, partition)
                try:
                    p = self.registry.get(topic, partition)
                    target, changed = p.delete_records_before(offset, lso_commit=lso_commit)
                    required[tp] = (target, p.leader_epoch)
                    if changed:
                        raised.append(tp)
                except LowtideError as err:
                    errors[tp] = err
            if raised:
                try:
                    lso_commit.commit()
                except LowtideError as err:  # the flush failed: none of these LSOs moved
                    for tp in raised:
                        errors[tp] = err
                        required.pop(tp, None)
        if raised:
            # The new LSOs are durable and taken now, so the parked follower fetches can go at once.
            self.registry.notify(list(required))
        op = DelayedDeleteRecords(registry=self.registry, required=required,
                                  deadline_ms=now_ms() + max(1, timeout_ms))
        if required:
            if not self.purgatory.try_complete_else_watch(op, list(required)):
                op.wait(timeout_ms / 1000 + 5)
            if not op.is_completed:
                op.force_complete()
        out: list[DeleteRecordsResult] = []
        for topic, partition, _ in items:
            tp = (topic, partition)
            # Explicit None checks: a low watermark of 0 is a result, not a missing one.
            result = errors.get(tp)
            if result is None:
                result = op.results.get(tp)
            if result is None:
                result = UnknownServerError("no result")
            if isinstance(result, LowtideError):
                out.append(DeleteRecordsResult(topic=topic, partition=partition, error=result))
            else:
                out.append(DeleteRecordsResult(topic=topic, partition=partition, low_watermark=result))
        return out

    def complete_ready(self, keys: Iterable[TopicPartition]) -> None:
        """Re-check the requests waiting on these partitions (an LW or a leadership moved)."""
        for key in keys:
            self.purgatory.check_and_complete(key)

    def recheck_low_watermarks(self, parts: list[Partition]) -> None:
        """The LW of these led partitions may have moved: complete what it satisfies, report it."""
        self.complete_ready(p.key for p in parts)
        self.report_low_watermarks(parts)

    def report_low_watermarks(self, parts: list[Partition]) -> None:
        """Publish the low watermarks that changed (one event per change, not per fetch).

        A computed LW of -1 (a counted replica not heard from yet: a follower added by a
        reassignment, one repositioning at our LSO, a new leadership) is never published: the
        last published value stays, so what is shown is never lowered either."""
        listener = self.on_low_watermark_change
        if not listener or not parts:
            return
        live = self.registry.live_brokers
        changed = []
        with self._reported_lock:
            for p in parts:
                lw = p.low_watermark(live)
                if lw >= 0 and self._reported_lw.get(p.key) != lw:
                    self._reported_lw[p.key] = lw
                    changed.append((p.key, lw))
        if changed:
            listener(changed)
