"""log.cleaner.io.max.bytes.per.second: the average rate over each check interval is bounded."""

from __future__ import annotations

import pytest

from lowtide.log.cleaner.throttler import Throttler


class FakeTime:
    """A clock that only moves when the throttler sleeps or the test says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_cleaner_faster_than_the_limit_sleeps_down_to_it():
    t = FakeTime()
    throttler = Throttler(1000.0, check_interval_s=0.1, clock=t.clock, sleep=t.sleep)
    for _ in range(100):
        t.now += 0.01  # 100 bytes every 10 ms = 10,000 bytes/s, ten times the limit
        throttler.maybe_throttle(100)
    assert 10_000 / t.now == pytest.approx(1000.0, rel=0.15)
    assert throttler.slept_s == pytest.approx(sum(t.sleeps))


def test_a_cleaner_under_the_limit_never_sleeps():
    t = FakeTime()
    throttler = Throttler(1000.0, check_interval_s=0.1, clock=t.clock, sleep=t.sleep)
    for _ in range(100):
        t.now += 0.1
        throttler.maybe_throttle(50)  # 500 bytes/s
    assert t.sleeps == []


def test_the_default_unlimited_rate_never_sleeps():
    t = FakeTime()
    throttler = Throttler(float("inf"), clock=t.clock, sleep=t.sleep)
    throttler.maybe_throttle(10**12)
    assert throttler.unlimited and t.sleeps == []
