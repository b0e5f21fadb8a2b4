"""Test operations and small helpers shared by the purgatory tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import REGISTRY

from lowtide.errors import RequestTimedOut
from lowtide.purgatory import DelayedOperation, now_ms


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


def wait_until(predicate: Callable[[], bool], *, timeout_s: float = 5.0, step_s: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout_s``; a bounded wait for asynchronous effects."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def deadline_in(ms: int) -> int:
    return now_ms() + ms


PENDING_METRIC = "lowtide_purgatory_pending"
EXPIRED_METRIC = "lowtide_purgatory_expired_total"
