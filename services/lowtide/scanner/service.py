"""The orphan scanner as a service: one scan at a time, every ``scan_interval_ms`` and on demand.

``ScannerService.scan(dry_run=...)`` finds the shards (``find_shards``, read afresh each scan),
runs ``scan.run_scan`` and records the outcome in metrics and logs. A failure to find every shard
is a scan failure like any other (nothing deleted, ``failure`` says why). The periodic loop starts
with ``start()`` and stops with ``stop()``, which waits at most ``join_timeout_s`` for a scan in
progress (the thread is a daemon: an unfinished scan dies with the process, which is safe, since a
scan only deletes files no shard knows, one at a time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lowtide.clock import now_ms
from lowtide.objectstore.base import ObjectStore
from lowtide.scanner import metrics
from lowtide.scanner.scan import ScanConfig, ScanFailure, ScanReport, ShardView, run_scan

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ScannerConfig:
    """``scan`` is the per-scan configuration; ``scan_interval_ms`` the period of the loop (KIP-1164
    diskless.coordinator.orphan.scan.interval.ms)."""

    scan: ScanConfig
    scan_interval_ms: int

    def __post_init__(self) -> None:
        if self.scan_interval_ms <= 0:
            raise ValueError(f"scan interval must be > 0 ms, got {self.scan_interval_ms}")


@dataclass(frozen=True)
class ScannerState:
    running: bool
    current: ScanReport | None  # the scan in progress, counts so far (None before its first batch)
    last: ScanReport | None
    started_at_ms: int
    last_started_at_ms: int
    shards: tuple[str, ...]
    last_shards: tuple[str, ...]


class ScannerService:
    """Runs orphan scans against ``store`` and the shards ``find_shards`` returns.

    Contract: scans never overlap (a second caller waits for the first scan to end, then runs its
    own); every scan ends in metrics and one log line. Thread-safety: ``scan``, ``state``, ``start``
    and ``stop`` may be called from any thread.
    """

    def __init__(self, *, store: ObjectStore, config: ScannerConfig,
                 find_shards: Callable[[], Sequence[ShardView]], clock: Callable[[], int] = now_ms) -> None:
        self.store = store
        self.config = config
        self.find_shards = find_shards
        self.clock = clock
        self._scan_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._running = False
        self._current: ScanReport | None = None
        self._current_started_ms = 0
        self._current_shards: tuple[str, ...] = ()
        self._last: ScanReport | None = None
        self._last_started_ms = 0
        self._last_shards: tuple[str, ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- scans -------------------------------------------------------------------------------------
    def scan(self, *, dry_run: bool = False) -> tuple[ScanReport, int, tuple[str, ...]]:
        """One scan; returns (report, started at epoch ms, shard names asked)."""
        with self._scan_lock:
            started_ms = self.clock()
            with self._state_lock:
                self._running, self._current = True, None
                self._current_started_ms, self._current_shards = started_ms, ()
            began = time.monotonic()
            names: tuple[str, ...] = ()
            try:
                try:
                    shards = list(self.find_shards())
                except ScanFailure as exc:
                    report = ScanReport(dry_run=dry_run, failure=exc.reason, failure_detail=str(exc))
                    log.warning("orphan scan stopped, nothing deleted",
                                extra={"fields": {"reason": exc.reason, "detail": str(exc)}})
                else:
                    names = tuple(s.name for s in shards)
                    with self._state_lock:
                        self._current_shards = names
                    report = run_scan(self.store, shards, config=self.config.scan, now_ms=self.clock(),
                                      dry_run=dry_run, progress=self._on_progress)
            except Exception as exc:  # a bug must not kill the loop: count it as a failed scan
                log.exception("orphan scan failed unexpectedly")
                report = ScanReport(dry_run=dry_run, failure="internal_error",
                                    failure_detail=f"{type(exc).__name__}: {exc}")
            report.duration_s = time.monotonic() - began
            self._record(report)
            with self._state_lock:
                self._running, self._current = False, None
                self._last, self._last_started_ms, self._last_shards = report, started_ms, names
            return report, started_ms, names

    def _on_progress(self, report: ScanReport) -> None:
        with self._state_lock:
            self._current = report

    def _record(self, report: ScanReport) -> None:
        metrics.SCAN_DURATION.set(report.duration_s)
        metrics.CANDIDATES.set(report.candidates)
        if report.threshold_ms:
            metrics.THRESHOLD.set(report.threshold_ms / 1000)
        metrics.DELETED.inc(report.deleted_count)
        metrics.RECLAIMED.inc(report.deleted_bytes)
        fields = {"dry_run": report.dry_run, "threshold_ms": report.threshold_ms, "listed": report.listed,
                  "skipped": report.skipped, "candidates": report.candidates, "known": report.known,
                  "orphans": report.orphans, "deleted": report.deleted_count, "deleted_bytes": report.deleted_bytes,
                  "seconds": round(report.duration_s, 3)}
        if report.ok:
            metrics.SCANS.labels(result="success").inc()
            metrics.LAST_SUCCESS.set(time.time())
            log.info("orphan scan done", extra={"fields": fields})
        else:
            metrics.SCANS.labels(result="error").inc()
            metrics.FAILURES.labels(reason=report.failure).inc()
            log.warning("orphan scan failed: deleted nothing after the failure",
                        extra={"fields": {**fields, "reason": report.failure, "detail": report.failure_detail}})

    def state(self) -> ScannerState:
        with self._state_lock:
            return ScannerState(running=self._running, current=self._current, last=self._last,
                                started_at_ms=self._current_started_ms, last_started_at_ms=self._last_started_ms,
                                shards=self._current_shards, last_shards=self._last_shards)

    # ---- the periodic loop -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="orphan-scan", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # The first scan waits one interval too: a scanner restarting in a crash loop must not
        # turn into a scan storm against the store.
        while not self._stop.wait(self.config.scan_interval_ms / 1000):
            self.scan(dry_run=False)

    def stop(self, *, join_timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(join_timeout_s)
