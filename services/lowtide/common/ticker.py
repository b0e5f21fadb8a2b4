"""A daemon thread that calls one function every interval until stopped: the group
coordinators' timers (session expiry, rebalance timeouts) run on one each.

Thread-safety: ``start``/``stop`` once each, from the owner; ``stopped`` from any thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Ticker:
    """Calls ``tick`` every ``interval_s`` on a thread named ``name``; an exception is logged
    and the next tick still comes (one bad group must not stop every group's timeouts)."""

    def __init__(self, *, name: str, interval_s: float, tick: Callable[[], None]) -> None:
        self.name, self.interval_s, self._tick = name, interval_s, tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - logged; the next tick still comes
                log.exception("%s tick failed", self.name)
