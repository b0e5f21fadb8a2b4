"""The background log cleaner of one replica process: which compacted log to clean, and when.

Each round (``LogCleaner.run_once``) looks at every hosted log whose ``cleanup.policy`` includes
``compact``:

* an idle active segment older than min(``segment.ms``, ``max.compaction.lag.ms``) is rolled, so
  its records become cleanable without waiting for the next append (Kafka rolls only on append,
  which would leave the last records of an idle topic, tombstones included, uncompacted forever);
* the plan (``cleaner.plan_clean``) says whether the log needs cleaning by Kafka's rule (dirty
  ratio above ``min.cleanable.dirty.ratio``, or a dirty record older than
  ``max.compaction.lag.ms``);
* **delete horizons**: the scheduler keeps, per log, the earliest delete horizon of a batch that
  still holds a tombstone (learnt from each pass, or from one header scan when this process first
  sees a log). Once it passes, the log gets a pass even if nothing is dirty: Kafka only re-cleans a
  log that became dirty again, so on an idle compacted topic a tombstone can outlive its horizon
  indefinitely; here it goes in the first round after its horizon. Such a pass only rewrites the
  segment groups holding an expired tombstone.

Of the logs that need it, the one with the highest dirty ratio gets one pass; rounds follow each
other while there is work, then the thread sleeps until the earliest of: a delete horizon, an
active segment's roll time, a log waiting only for its high watermark (1 s), or
``log.cleaner.backoff.ms``. A pass that fails is logged and its log retried after a growing
backoff; a closed log is skipped. After every pass the log's new first dirty offset is written to
``cleaner-offset-checkpoint``.

Every replica cleans its own copy of every compacted partition it hosts, leader or follower (as in
Kafka): offsets never change, so copies cleaned at different times still agree on every offset.

Thread-safety: ``start``/``stop`` once each from the owner; ``run_once``, ``clean_now`` and
``wake`` may be called from any thread (a lock runs one round at a time); ``metrics`` is
thread-safe.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from lowtide.clock import Clock, now_ms
from lowtide.errors import KafkaStorageError, LowtideError
from lowtide.log.cleaner.checkpoint import CleanerCheckpoint
from lowtide.log.cleaner.cleaner import Cleaner, CleanerStopped, CleanPlan, PassResult, plan_clean
from lowtide.log.cleaner.config import LONG_MAX, CleanerSettings, CompactionConfig
from lowtide.log.cleaner.swap import SwapHook
from lowtide.log.cleaner.throttler import Throttler
from lowtide.log.partition_log import PartitionLog

log = logging.getLogger(__name__)

LogSource = Callable[[], Iterable[tuple[PartitionLog, CompactionConfig]]]
# A log that waits only for its high watermark is looked at again this soon.
HW_RECHECK_MS = 1000
MAX_RETRY_BACKOFF_MS = 5 * 60 * 1000


@dataclass
class CleanerMetricsSnapshot:
    passes: int = 0
    failures: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    dirty_bytes_cleaned: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    delete_horizons_set: int = 0
    segments_rolled: int = 0
    pass_seconds: float = 0.0
    throttle_seconds: float = 0.0


class CleanerMetrics:
    """Counters of a cleaner (process totals, for /metrics). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = CleanerMetricsSnapshot()

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._values, name, getattr(self._values, name) + delta)

    def snapshot(self) -> CleanerMetricsSnapshot:
        with self._lock:
            return CleanerMetricsSnapshot(**{f.name: getattr(self._values, f.name) for f in fields(self._values)})


@dataclass
class _LogState:
    """What the scheduler knows of one log (lost on restart; rebuilt by a header scan)."""

    horizons: dict[int, int] | None = None  # segment base offset -> earliest tombstone delete horizon
    retry_at_ms: int = 0
    failures: int = 0

    @property
    def earliest_horizon(self) -> int | None:
        return min(self.horizons.values()) if self.horizons else None


class LogCleaner:
    """The cleaner thread of a replica process (module docstring).

    ``logs`` lists the hosted logs with their compaction settings (every call: partitions come and
    go); ``data_dir`` holds the ``cleaner-offset-checkpoint``. ``swap_hook`` is for tests (see
    ``Cleaner``).
    """

    def __init__(self, *, data_dir: Path | str, logs: LogSource, settings: CleanerSettings = CleanerSettings(),
                 clock: Clock = now_ms, swap_hook: SwapHook | None = None) -> None:
        self.settings = settings
        self.checkpoint = CleanerCheckpoint(data_dir)
        self.metrics = CleanerMetrics()
        self._logs = logs
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._round_lock = threading.Lock()
        self._states: weakref.WeakKeyDictionary[PartitionLog, _LogState] = weakref.WeakKeyDictionary()
        self._throttler = Throttler(settings.io_max_bytes_per_second, sleep=self._stop.wait)
        self.cleaner = Cleaner(settings=settings, throttler=self._throttler, stop=self._stop, swap_hook=swap_hook)
        self._thread: threading.Thread | None = None
        self.next_round_ms = 0

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-cleaner", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread; a pass in progress gives up at its next chunk (its files are removed)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wake(self) -> None:
        """Run a round now (e.g. a config changed)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.run_once()
            except Exception:  # the thread must outlive any one round
                log.exception("log cleaner round failed")
                worked = False
            if worked or self._stop.is_set():
                continue
            wait_s = max(0.01, (self.next_round_ms - self._clock()) / 1000)
            self._wake.wait(wait_s)
            self._wake.clear()

    # -- rounds ------------------------------------------------------------------------------------

    def run_once(self) -> bool:
        """One round: roll idle active segments, then clean the log that needs it most (at most
        one pass). Returns whether a pass ran. Sets ``next_round_ms``."""
        with self._round_lock:
            now = self._clock()
            next_round = now + self.settings.backoff_ms
            best: tuple[float, PartitionLog, CompactionConfig, CleanPlan] | None = None
            hosted: list[tuple[str, int]] = []
            for plog, compaction in self._logs():
                hosted.append((plog.topic, plog.partition))
                if not plog.config.compacts:
                    continue
                state = self._state(plog)
                try:
                    roll_at = self._maybe_roll(plog, compaction, now)
                    if roll_at is not None:
                        next_round = min(next_round, roll_at)
                    if state.retry_at_ms > now:
                        next_round = min(next_round, state.retry_at_ms)
                        continue
                    plan = plan_clean(plog, compaction, checkpoint=self.checkpoint.get((plog.topic, plog.partition)),
                                      now_ms=now)
                    if state.horizons is None and plan.segments and not plan.needs_cleaning(compaction):
                        state.horizons = self.cleaner.scan_horizons(plog)
                except (KafkaStorageError, OSError) as exc:  # closed (partition going away) or unreadable
                    log.debug("log cleaner skips %s-%d: %s", plog.topic, plog.partition, exc)
                    continue
                if plan.waiting_for_high_watermark:
                    next_round = min(next_round, now + HW_RECHECK_MS)
                horizon = state.earliest_horizon
                due = horizon is not None and horizon <= now and bool(plan.segments)
                if horizon is not None and horizon > now:
                    next_round = min(next_round, horizon)
                if plan.needs_cleaning(compaction) or due:
                    score = plan.dirty_ratio
                    if best is None or score > best[0]:
                        best = (score, plog, compaction, plan)
            if best is None:
                self.next_round_ms = next_round
                return False
            _, plog, compaction, _ = best
            self._clean(plog, compaction, now, hosted)
            self.next_round_ms = now
            return True

    def clean_now(self, plog: PartitionLog, compaction: CompactionConfig) -> PassResult | None:
        """One pass over ``plog`` now, whatever its dirty ratio (tests, tools). None if it failed."""
        with self._round_lock:
            return self._clean(plog, compaction, self._clock(), None)

    def _clean(self, plog: PartitionLog, compaction: CompactionConfig, now: int,
               hosted: list[tuple[str, int]] | None) -> PassResult | None:
        tp = (plog.topic, plog.partition)
        state = self._state(plog)
        try:
            result = self.cleaner.clean(plog, compaction, checkpoint=self.checkpoint.get(tp), now_ms=now,
                                        horizons=state.horizons)
        except CleanerStopped:
            return None
        except (LowtideError, OSError) as exc:
            state.failures += 1
            state.retry_at_ms = now + min(self.settings.backoff_ms * 2 ** min(state.failures, 8),
                                          MAX_RETRY_BACKOFF_MS)
            self.metrics.add(failures=1)
            log.warning("log cleaner: pass over %s-%d failed (retry in %d ms): %s", plog.topic, plog.partition,
                        state.retry_at_ms - now, exc)
            return None
        state.failures = 0
        state.retry_at_ms = 0
        gone = result.replaced | result.seen
        # An expired horizon the pass could not act on (its segment left the log, or its group was
        # abandoned) is forgotten, or it would make every round "due"; a tombstone still there is
        # found again by the next pass over dirty data.
        horizons = {b: h for b, h in (state.horizons or {}).items() if b not in gone and h > now}
        horizons.update(result.horizons)
        state.horizons = horizons
        if self.checkpoint.get(tp) != result.end_offset:
            try:
                self.checkpoint.update(tp, result.end_offset, hosted=hosted)
            except KafkaStorageError as exc:  # the next pass redoes the work; nothing is wrong
                log.warning("log cleaner: %s", exc)
        stats = result.stats
        self.metrics.add(passes=1, bytes_read=result.bytes_read, bytes_written=result.bytes_written,
                         dirty_bytes_cleaned=result.dirty_bytes, records_removed=stats.records_removed,
                         tombstones_removed=stats.tombstones_removed, delete_horizons_set=stats.horizons_set,
                         pass_seconds=result.duration_s, throttle_seconds=self._take_throttle_seconds())
        log.info("log cleaner pass", extra={"fields": {
            "topic": plog.topic, "partition": plog.partition, "first_dirty": result.first_dirty_offset,
            "end": result.end_offset, "groups": result.groups_cleaned, "skipped": result.groups_skipped,
            "aborted": result.groups_aborted, "read": result.bytes_read, "written": result.bytes_written,
            "removed": stats.records_removed, "tombstones_removed": stats.tombstones_removed,
            "horizons_set": stats.horizons_set, "seconds": round(result.duration_s, 3)}})
        return result

    def _take_throttle_seconds(self) -> float:
        slept, self._throttler.slept_s = self._throttler.slept_s, 0.0
        return slept

    def _state(self, plog: PartitionLog) -> _LogState:
        state = self._states.get(plog)
        if state is None:
            state = self._states[plog] = _LogState()
        return state

    def _maybe_roll(self, plog: PartitionLog, compaction: CompactionConfig, now: int) -> int | None:
        """Roll an idle active segment older than min(segment.ms, max.compaction.lag.ms); returns
        when to look again (None: nothing to wait for)."""
        roll_ms = min(plog.config.segment_ms, compaction.max_compaction_lag_ms)
        if roll_ms >= LONG_MAX:
            return None
        with plog.segments_locked() as segments:
            active = segments.active
            if active.size_bytes == 0:
                return None
            due = active.created_ms + roll_ms
            if now < due:
                return due
        plog.roll()
        self.metrics.add(segments_rolled=1)
        return None
