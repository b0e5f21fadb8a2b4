"""WAL checkpoints of the shard state off the commit path: commits never checkpoint, a background
checkpoint copies the WAL while the writer goes on, and the writer restarts the WAL once it is
large, so it stays bounded; none of it changes a row."""

from __future__ import annotations

import os
import random
import sqlite3
import threading

import pytest

from lowtide.coordinator import state as state_module
from lowtide.coordinator.records import decode_record
from lowtide.coordinator.state import CoordinatorState
from tests.unit.coordinator.shard import Shard
from tests.unit.coordinator.test_rebuild import serve_a_mixed_workload


def wal_bytes(path) -> int:
    wal = f"{path}-wal"
    return os.path.getsize(wal) if os.path.exists(wal) else 0


@pytest.fixture
def background_shard(tmp_path):
    s = Shard(tmp_path / "bg")
    s.state.close()
    s.state = CoordinatorState(tmp_path / "bg" / "state.sqlite", coordinator_id=0, background_checkpoints=True)
    s.core.state = s.state
    s.core.pending.state = s.state
    yield s
    s.close()


def test_a_new_shard_database_has_small_pages_and_commits_that_never_checkpoint(background_shard):
    db = background_shard.state.db
    assert db.execute("PRAGMA page_size").fetchone()[0] == state_module.PAGE_SIZE
    assert db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    serve_a_mixed_workload(background_shard, random.Random(1), files=300)
    background_shard.replicate()
    # SQLite's own checkpoint would have started the WAL over every 1,000 pages; nothing did here.
    assert wal_bytes(background_shard.state.path) > 3 * 1000 * (state_module.PAGE_SIZE + 24)


def test_a_background_checkpoint_copies_the_wal_while_the_writer_commits(background_shard):
    rng = random.Random(2)
    stop = threading.Event()
    pages_seen: list[int] = []

    def checkpoint_until_stopped() -> None:
        while not stop.is_set():
            pages_seen.append(background_shard.state.checkpoint())

    worker = threading.Thread(target=checkpoint_until_stopped)
    worker.start()
    try:
        for round_ in range(5):
            serve_a_mixed_workload(background_shard, rng, files=20, start=round_ * 20)
            background_shard.replicate()
    finally:
        stop.set()
        worker.join()
    assert pages_seen and max(pages_seen) > 0
    # What the writer committed meanwhile is all there, as a rebuild from the log has it.
    rebuilt = Shard(background_shard.directory.parent / "rebuilt")
    for offset, value in enumerate(background_shard.log):
        rebuilt.state.apply(decode_record(value), offset)
    assert rebuilt.state.dump() == background_shard.state.dump()
    rebuilt.close()


def wal_frames_in_use(path) -> int:
    """The WAL's page count as SQLite has it (a PASSIVE checkpoint on a connection of our own)."""
    probe = sqlite3.connect(path)
    try:
        return probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    finally:
        probe.close()


def test_the_writer_restarts_a_large_wal_so_the_next_commit_writes_it_from_its_start(background_shard,
                                                                                      monkeypatch):
    monkeypatch.setattr(state_module, "WAL_RESTART_PAGES", 200)
    serve_a_mixed_workload(background_shard, random.Random(3), files=60)
    background_shard.replicate()
    state = background_shard.state
    assert state.restart_wal() is False  # no checkpoint has reported the WAL's size yet
    # What a background checkpoint overtaken by commits reports: the WAL is large.
    state.wal_pages = (wal_bytes(state.path) - 32) // (state_module.PAGE_SIZE + 24)
    assert state.wal_pages >= 200
    assert state.restart_wal() is True
    size = wal_bytes(state.path)
    serve_a_mixed_workload(background_shard, random.Random(4), files=2, start=60)
    background_shard.replicate()
    # The next commits were written from the WAL's start: few pages in use, the file not grown.
    assert 0 < wal_frames_in_use(state.path) < 200
    assert wal_bytes(state.path) == size
    assert state.restart_wal() is False  # small again: nothing to do


def test_a_restarted_wal_loses_nothing_across_a_reopen(background_shard, monkeypatch, tmp_path):
    monkeypatch.setattr(state_module, "WAL_RESTART_PAGES", 100)
    rng = random.Random(4)
    for round_ in range(10):
        serve_a_mixed_workload(background_shard, rng, files=5, start=round_ * 5)
        background_shard.replicate()
        background_shard.state.checkpoint()
        background_shard.state.restart_wal()
    before = background_shard.state.dump()
    applied = background_shard.state.applied_offset
    path = background_shard.state.path
    background_shard.state.close()
    reopened = CoordinatorState(path, coordinator_id=0, background_checkpoints=True)
    try:
        assert reopened.applied_offset == applied
        assert reopened.dump() == before
    finally:
        reopened.close()
        background_shard.state = CoordinatorState(path, coordinator_id=0)


def test_checkpoint_after_close_does_nothing(tmp_path):
    state = CoordinatorState(tmp_path / "s.sqlite", coordinator_id=0, background_checkpoints=True)
    state.close()
    assert state.checkpoint() == 0
