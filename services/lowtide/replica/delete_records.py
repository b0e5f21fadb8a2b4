"""The delayed DeleteRecords operation of a leader (KIP-107 step 4).

It completes when, for every partition of the request, the low watermark (min LSO over the leader
and every live replica) has reached the requested offset, or that partition failed (leadership
moved: NOT_LEADER_OR_FOLLOWER). At its deadline the remaining partitions get REQUEST_TIMED_OUT;
the leader's LSO stays advanced either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lowtide.errors import LowtideError, NotLeaderOrFollower, RequestTimedOut
from lowtide.purgatory.delayed import DelayedOperation
from lowtide.replica.partition import LEADER

if TYPE_CHECKING:
    from lowtide.replica.manager import ReplicaManager

TP = tuple[str, int]


class DelayedDeleteRecords(DelayedOperation):
    """Thread-safe: try_complete may run concurrently from several fetch handlers; results are
    only read after completion, and each partition's result is written once under the op lock."""

    def __init__(self, *, manager: ReplicaManager, required: dict[TP, tuple[int, int]], deadline_ms: int) -> None:
        super().__init__(deadline_ms=deadline_ms)
        self.manager = manager
        self.required = required  # tp -> (offset, leader epoch when the request was applied)
        self.results: dict[TP, int | LowtideError] = {}
        self._pending: list[TP] = list(reversed(list(required)))  # popped from the end, in request order

    def try_complete(self) -> bool:
        # Partitions are checked in order and the check stops at the first one still short of its
        # offset: one follower fetch moves many partitions at once and calls this once per
        # partition, so scanning every pending partition each time would be O(n^2) for a
        # 1,000-partition request. A partition whose leadership moved is resolved when reached
        # (or times out with the rest).
        live = self.manager.live_brokers
        while self._pending:
            tp = self._pending[-1]
            offset, epoch = self.required[tp]
            p = self.manager._parts.get(tp)
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
