"""When a coordinator shard snapshots its SQLite state, and which snapshot files it keeps.

Files (``state.CoordinatorState.snapshot`` writes them crash-safely: .tmp, fsync, rename, fsync dir)::

    <data-dir>/snapshots/snapshot-<20-digit applied metadata offset>.sqlite
    <data-dir>/snapshots/snapshot-in-progress.sqlite.tmp   (being written; named once copied,
                                                           after the offset the copy holds)

A snapshot is a self-contained SQLite database (SQLite's backup API) of the state after applying
every record up to and including that offset. After one is written it is put in the object store
(``coordinator.snapshot_store``: its key layout and manifest), and only once it is there are the
metadata partition's entries below offset + 1 deleted (DeleteRecords), so the newest stored snapshot
plus the log tail is always the whole state, even when the data directory is lost. The newest
``keep`` snapshots stay, here and in the store; older ones and half-written .tmp files are removed.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from lowtide.coordinator.state import SNAPSHOT_PREFIX, SNAPSHOT_SUFFIX, CoordinatorState, snapshot_offset

T = TypeVar("T")
# A snapshot's copy and upload run at this much lower CPU priority (Linux ``nice``).
SNAPSHOT_NICENESS = 10


def run_at_low_priority(fn: Callable[[], T], *, name: str) -> T:
    """``fn()`` on a short-lived thread at nice +``SNAPSHOT_NICENESS`` (Linux: a thread's own
    priority), returning or raising what it did. Why: a snapshot's copy and upload of a large state
    are a few hundred milliseconds of CPU (SQLite's and the store's, mostly without the GIL) that
    the writer, the applier and the replicas on the same cores need more; at 300 files/s one raised
    the CommitFile p99 from ~13 to ~28 ms. A thread of its own because a raised niceness cannot be
    lowered again without privilege, and the shard thread must keep its priority for loading."""
    outcome: list[T | BaseException] = []

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SNAPSHOT_NICENESS)
        except (OSError, AttributeError):  # not Linux, or not allowed: run at normal priority
            pass
        try:
            outcome.append(fn())
        except BaseException as exc:  # noqa: BLE001 - raised on the calling thread below
            outcome.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


@dataclass(frozen=True, kw_only=True)
class SnapshotPolicy:
    """Snapshot every ``every_records`` applied records or every ``every_ms`` (0 = never by time),
    whichever comes first, and only when something was applied since the last one."""

    every_records: int = 10_000
    every_ms: int = 300_000
    keep: int = 2

    def __post_init__(self) -> None:
        if self.every_records < 1 or self.every_ms < 0 or self.keep < 1:
            raise ValueError(f"bad snapshot policy: {self}")

    def is_due(self, *, applied: int, last_offset: int, seconds_since: float) -> bool:
        if applied <= last_offset:
            return False
        return applied - last_offset >= self.every_records or (
            self.every_ms > 0 and seconds_since * 1000 >= self.every_ms)


def prune_snapshots(directory: Path, *, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` snapshots (and stale .tmp files); returns what went."""
    if not directory.is_dir():
        return []
    found = sorted((p for p in directory.iterdir()
                    if p.name.startswith(SNAPSHOT_PREFIX) and p.name.endswith(SNAPSHOT_SUFFIX)),
                   key=snapshot_offset)
    gone = found[:-keep] if len(found) > keep else []
    gone += [p for p in directory.iterdir() if p.name.endswith(SNAPSHOT_SUFFIX + ".tmp")]
    for path in gone:
        path.unlink(missing_ok=True)
    return gone


def latest_snapshot(directory: Path | str) -> Path | None:
    """The newest complete snapshot in ``directory`` (half-written .tmp files are ignored)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = [p for p in directory.iterdir()
             if p.name.startswith(SNAPSHOT_PREFIX) and p.name.endswith(SNAPSHOT_SUFFIX)]
    return max(found, key=snapshot_offset, default=None)


def restore_snapshot(snapshot: Path | str, db_path: Path | str, *, coordinator_id: int,
                     background_checkpoints: bool = False) -> CoordinatorState:
    """Replace the database at ``db_path`` with ``snapshot`` and open it; the caller then applies
    the metadata log from ``applied_offset + 1`` on."""
    db_path = Path(db_path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    source = sqlite3.connect(f"file:{snapshot}?mode=ro", uri=True)
    target = sqlite3.connect(db_path)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return CoordinatorState(db_path, coordinator_id=coordinator_id, background_checkpoints=background_checkpoints)

