"""Test operations and small helpers shared by the purgatory tests."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY

from lowtide.errors import RequestTimedOut
from lowtide.purgatory import DelayedOperation, Purgatory, now_ms


class Watermark:
    """A value the test moves, standing in for a partition's low watermark."""

    def __init__(self, value: int = 0) -> None:
        self.value = value


class WaitForWatermark(DelayedOperation):
    """Completes once ``watermark.value >= target``; records every callback it receives."""

    def __init__(self, *, watermark: Watermark, target: int, deadline_ms: int, op_id: str | None = None):
        super().__init__(deadline_ms=deadline_ms, op_id=op_id)
        self.watermark = watermark
        self.target = target
        self.calls: list[str] = []
        self.result: int | None = None
        self._calls_lock = threading.Lock()

    def try_complete(self) -> bool:
        if self.watermark.value >= self.target:
            return self.force_complete()
        return False

    def on_expiration(self) -> None:
        with self._calls_lock:
            self.calls.append("expire")
        self.error = RequestTimedOut(f"watermark did not reach {self.target}")

    def on_complete(self) -> None:
        with self._calls_lock:
            self.calls.append("complete")
        if self.error is None:
            self.result = self.watermark.value


def read_metric(name: str, operation: str) -> float:
    return REGISTRY.get_sample_value(name, {"operation": operation}) or 0.0


class ManualClock:
    """A purgatory ``Clock`` that moves only when the test calls ``advance``.

    Contract: ``now()`` returns epoch milliseconds, starting at the real wall clock (so deadlines it
    produces sit next to those of real processes sharing the Redis zset) and never going back.
    Thread-safety: ``now`` and ``advance`` may be called from any thread (the reaper reads the
    clock while the test moves it).
    """

    def __init__(self, start_ms: int | None = None) -> None:
        self._now_ms = now_ms() if start_ms is None else start_ms
        self._lock = threading.Lock()

    def now(self) -> int:
        with self._lock:
            return self._now_ms

    def advance(self, ms: int) -> int:
        """Move the clock forward by ``ms``; returns the new time."""
        if ms < 0:
            raise ValueError(f"a clock only moves forward, got {ms} ms")
        with self._lock:
            self._now_ms += ms
            return self._now_ms


def reaper_round(purgatory: Purgatory) -> None:
    """Have the reaper run one round at the clock's current time and wait until it has finished."""
    assert purgatory.wake_reaper(wait_s=5.0), f"the reaper of {purgatory.name} ran no round within 5 s"


def advance_and_reap(clock: ManualClock, purgatory: Purgatory, ms: int) -> None:
    """Move the clock by ``ms``, then let the reaper act on the new time before returning."""
    clock.advance(ms)
    reaper_round(purgatory)


PENDING_METRIC = "lowtide_purgatory_pending"
EXPIRED_METRIC = "lowtide_purgatory_expired_total"
