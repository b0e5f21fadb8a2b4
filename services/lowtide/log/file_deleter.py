"""Unlinks the files of deleted segments in the background.

Why: unlinking a segment's three files frees their blocks, which costs about 0.1-0.5 ms per file
on the benchmark machine (ext4 mounted with ``discard``). Done inline it sat on the DeleteRecords
path: the leader's request thread and, worse, each follower's fetch thread, whose next fetch is
what reports the new LSO. The log instead renames the files to ``*.deleted`` (15 us each) under
its lock, so they are gone from the segment namespace at once, and this thread unlinks them.

A crash before the unlink loses nothing: ``*.deleted`` files are removed when the partition
directory is opened (SegmentSet.open), and the durable log start offset already excludes them.

The same thread also runs the other block-freeing work a log hands off (``schedule_call``):
emptying an active segment that a new log start offset left wholly deleted (a truncation of its
three files, as costly as unlinking them).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import Counter

log = logging.getLogger(__name__)

# Disk space given back by deleted segments (their .log and index files), for the Deletion
# dashboard: DeleteRecords and retention make a log start offset move; this is when it pays off.
RECLAIMED_BYTES = Counter("lowtide_log_reclaimed_bytes", "Bytes of deleted segment files unlinked from disk")


class PendingDelete:
    """Files scheduled together; ``done`` once they are unlinked (by the thread or ``finish``)."""

    __slots__ = ("paths", "done")

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.done = False

    def finish(self) -> None:
        """Unlink now (idempotent; missing files are fine)."""
        if self.done:
            return
        for path in self.paths:
            try:
                size = path.stat().st_size if path.exists() else 0
                path.unlink(missing_ok=True)
                RECLAIMED_BYTES.inc(size)
            except OSError as exc:  # nothing to hand it to: the next open removes leftovers
                log.warning("cannot delete %s: %s", path, exc)
        self.done = True


class PendingCall:
    """A function run once, by the thread or by ``finish``; ``done`` once it ran."""

    __slots__ = ("fn", "done")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.done = False

    def finish(self) -> None:
        """Run now (idempotent). Exceptions are logged: the thread must survive them."""
        if self.done:
            return
        self.done = True
        try:
            self.fn()
        except Exception:
            log.exception("background log task failed")


class FileDeleter:
    """A daemon thread unlinking scheduled files at or after their due time, earliest first.

    Thread-safe. The thread starts on first use (and again after a fork, where threads do not
    survive).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, PendingDelete | PendingCall]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, paths: Iterable[Path], *, delay_s: float = 0.0) -> PendingDelete:
        pending = PendingDelete(list(paths))
        self._push(pending, delay_s)
        return pending

    def schedule_call(self, fn: Callable[[], None], *, delay_s: float = 0.0) -> PendingCall:
        """Run ``fn`` on the thread at or after ``delay_s``."""
        pending = PendingCall(fn)
        self._push(pending, delay_s)
        return pending

    def _push(self, pending: PendingDelete | PendingCall, delay_s: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq), pending))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="file-deleter", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._heap:
                        wait_s = self._heap[0][0] - time.monotonic()
                        if wait_s <= 0:
                            break
                        self._cond.wait(wait_s)
                    else:
                        self._cond.wait()
                _, _, pending = heapq.heappop(self._heap)
            pending.finish()


DELETER = FileDeleter()
