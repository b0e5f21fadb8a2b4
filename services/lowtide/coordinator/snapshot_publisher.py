"""A leading coordinator shard's snapshots: when to take one, and publishing it to the object store
before the metadata log below it is deleted (docs/design/diskless.md#snapshots).

Order of a snapshot (``SnapshotPublisher.take``): the state is snapshotted locally (SQLite backup
API through a connection of its own, at a lower CPU priority: coordinator.snapshots has the files
and ``run_at_low_priority``), put in the object store (at that priority too)
(coordinator.snapshot_store), and only then are the log entries it covers removed and old snapshots
pruned, here and in the store: until it is in the store, a lost disk needs them. A failed upload
(a store outage) truncates nothing and is retried by ``maybe_snapshot`` with backoff (0.5 s,
doubling up to 30 s), without a new snapshot each time and without holding up the shard thread's
other work (file lifetimes, retention) meanwhile; a newer snapshot replaces an older one still
waiting for the store. The newest snapshot found at start-up is published again (its upload skipped
when the store has it): a kill between a snapshot and the truncation after it would otherwise keep
the log below it until the next snapshot, which an idle shard may never take.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from lowtide.coordinator.metadata_log import MetadataLog
from lowtide.coordinator.snapshot_store import SnapshotStore
from lowtide.coordinator.snapshots import SnapshotPolicy, latest_snapshot, prune_snapshots, run_at_low_priority
from lowtide.coordinator.state import snapshot_offset

# The shard's log lines keep the logger they were always written under (log searches name it).
log = logging.getLogger("lowtide.coordinator.service")


class SnapshotPublisher:
    """Takes a shard's snapshots when ``policy`` says so and publishes them (see the module).

    Contract: ``maybe_snapshot()`` first retries a publish whose backoff has run out, then takes a
    snapshot if the policy is due (``applied_offset()`` against the last one); ``take()`` writes one
    through ``write_snapshot(snapshot_dir)`` (a consistent copy of the state) and publishes it,
    returning its path; ``publish(path)`` uploads it (when there is a store), then deletes
    ``metadata_log`` below its offset + 1 and prunes to ``policy.keep``,
    returning whether that happened (False: kept for a retry); ``restored(path)`` notes a snapshot
    the shard restored, which counts as the last one. ``last_offset`` (-1 if none) and
    ``last_time`` (wall clock, None if none) describe the newest snapshot taken or found.

    Thread-safety: not thread-safe; one thread calls the methods (the shard thread). ``last_offset``
    and ``last_time`` are plain attributes that any thread may read (the metrics collector).
    """

    def __init__(self, *, snapshot_dir: Path, policy: SnapshotPolicy, metadata_log: MetadataLog,
                 snapshot_store: SnapshotStore | None, applied_offset: Callable[[], int],
                 write_snapshot: Callable[[Path], Path]) -> None:
        self.snapshot_dir = snapshot_dir
        self.policy = policy
        self.log = metadata_log
        self.snapshot_store = snapshot_store
        self._applied_offset = applied_offset
        self._write_snapshot = write_snapshot
        newest = latest_snapshot(snapshot_dir)
        self.last_offset = snapshot_offset(newest) if newest else -1
        self.last_time = newest.stat().st_mtime if newest else None
        self._last_mono = time.monotonic()
        # A snapshot taken here but not yet published (a store outage, or found at start-up: module
        # docstring), and when to retry.
        self._unuploaded: Path | None = newest
        self._found_at_start = newest
        self._upload_backoff_s = 0.0
        self._upload_retry_at = 0.0

    def maybe_snapshot(self) -> None:
        if self._unuploaded is not None and time.monotonic() >= self._upload_retry_at:
            self.publish(self._unuploaded)
        applied = self._applied_offset()
        if not self.policy.is_due(applied=applied, last_offset=self.last_offset,
                                  seconds_since=time.monotonic() - self._last_mono):
            return
        self.take()

    def take(self) -> Path:
        """Snapshot the state (SQLite backup API), put it in the object store, and only then remove
        the log entries it covers: until it is in the store, a lost disk needs them. A failed
        upload truncates nothing and is retried with backoff (``maybe_snapshot``), without a new
        snapshot each time and without holding up file lifetimes and retention meanwhile."""
        path = self._write_snapshot(self.snapshot_dir)
        self.last_offset = snapshot_offset(path)
        self.last_time = time.time()
        self._last_mono = time.monotonic()
        self.publish(path)
        return path

    def publish(self, path: Path) -> bool:
        """Upload ``path`` (when there is a store), then delete the log below it and prune; returns
        whether that happened. A newer snapshot replaces an older one still waiting for the store."""
        offset = snapshot_offset(path)
        if self.snapshot_store is not None:
            try:
                if path != self._found_at_start or not self.snapshot_store.has(offset):
                    store = self.snapshot_store
                    run_at_low_priority(lambda: store.upload(path), name="coordinator-snapshot-upload")
            except Exception as exc:  # noqa: BLE001 - a store outage: keep serving, retry later
                self._unuploaded = path
                self._upload_backoff_s = min(30.0, max(0.5, self._upload_backoff_s * 2))
                self._upload_retry_at = time.monotonic() + self._upload_backoff_s
                log.warning("snapshot not in the object store yet; the log is kept below it", extra={"fields": {
                    "path": str(path), "offset": offset, "error": f"{type(exc).__name__}: {exc}",
                    "retry_in_s": self._upload_backoff_s}})
                return False
        self._unuploaded, self._upload_backoff_s = None, 0.0
        low = self.log.delete_below(offset + 1)
        prune_snapshots(self.snapshot_dir, keep=self.policy.keep)
        if self.snapshot_store is not None:
            self.snapshot_store.prune()
        log.info("snapshot taken", extra={"fields": {"path": str(path), "offset": offset, "log_start": low}})
        return True

    def restored(self, path: Path) -> None:
        """The shard's state was restored from snapshot ``path``."""
        self.last_offset = max(self.last_offset, snapshot_offset(path))
