"""A bound on the cleaner's I/O rate: ``log.cleaner.io.max.bytes.per.second`` (Kafka's Throttler).

The cleaner reports every byte it reads or writes with ``maybe_throttle(n)``. Once per check
interval the throttler compares the bytes seen since the interval began with the elapsed time; if
the rate is above the limit it sleeps exactly long enough for the average over the interval to
come down to the limit, then starts a new interval. So the rate is bounded on average over
intervals of ``check_interval_s`` (bursts inside one interval are allowed, as in Kafka), and a
cleaner under the limit never sleeps.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class Throttler:
    """Sleeps the calling thread to keep the observed rate at or below ``bytes_per_second``.

    ``sleep`` returns True when the wait was cut short (the cleaner is stopping); ``clock`` is a
    monotonic clock in seconds. Both are injectable so tests need no real time.

    Thread-safety: thread-safe (one internal lock; a sleeping caller holds it, so concurrent
    callers share the budget, as Kafka's throttler does).
    """

    def __init__(self, bytes_per_second: float, *, check_interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        if not bytes_per_second > 0:
            raise ValueError(f"bytes_per_second must be > 0, got {bytes_per_second}")
        self.bytes_per_second = bytes_per_second
        self._interval = check_interval_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start = clock()
        self._observed = 0.0
        self.slept_s = 0.0  # total sleep, for metrics and tests

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.bytes_per_second)

    def maybe_throttle(self, observed: float) -> None:
        """Account ``observed`` bytes; sleep if the rate over the current interval is too high."""
        if self.unlimited or observed <= 0:
            return
        with self._lock:
            self._observed += observed
            now = self._clock()
            elapsed = now - self._period_start
            if elapsed < self._interval:
                return
            # Sleep so that observed / (elapsed + sleep) == the limit.
            wait = self._observed / self.bytes_per_second - elapsed
            if wait > 0:
                self.slept_s += wait
                self._sleep(wait)
            self._period_start = self._clock()
            self._observed = 0.0
