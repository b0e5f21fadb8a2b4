"""One orphan scan over a real local object store and real coordinator shards (the domain core
on SQLite, tests/unit/coordinator/shard.py), the transport left out."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from lowtide.objectstore.local import LocalObjectStore
from lowtide.scanner.scan import ScanConfig, run_scan
from tests.unit.coordinator.shard import Clock, Shard, batch, commit, create_topic

GRACE_MS = 60_000


class CoreShard:
    """The scan's view of a shard, answered by the shard's domain core in process: a file is
    known while the shard has a row for it (live, released, handing over or waiting out its
    deletion grace) or a pending commit of it."""

    def __init__(self, shard: Shard, name: str) -> None:
        self.shard, self.name = shard, name

    def oldest_file_created_ms(self) -> int | None:
        created = [f.created_at_ms for f in self.shard.state.files_in_state("live")]
        return min(created) if created else None

    def known_files(self, keys: Sequence[str]) -> set[str]:
        return {k for k in keys if self.shard.state.file(k) is not None or self.shard.core.pending.file_pending(k)}


class Unreachable(CoreShard):
    """A shard that cannot answer. A test double: the scan must be shown deleting nothing when a
    shard fails, and a real shard cannot be made to fail on demand inside a unit test (the
    integration test stops a real coordinator process for the same property)."""

    def __init__(self, shard: Shard, name: str, *, fail_on: str) -> None:
        super().__init__(shard, name)
        self.fail_on = fail_on

    def oldest_file_created_ms(self) -> int | None:
        if self.fail_on == "oldest":
            raise ConnectionError("connection refused")
        return super().oldest_file_created_ms()

    def known_files(self, keys: Sequence[str]) -> set[str]:
        raise ConnectionError("connection refused")


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


@pytest.fixture
def shards(tmp_path: Path):
    now = int(time.time() * 1000)
    made = [Shard(tmp_path / f"shard-{i}", coordinator_id=i, clock=Clock(now)) for i in range(2)]
    yield made
    for s in made:
        s.close()


def committed_file(shard: Shard, store: LocalObjectStore, key: str) -> None:
    tid = create_topic(shard, f"t-{key.replace('/', '-')}")
    store.put(key, b"x" * 100)
    response = shard.run(shard.core.commit_file(commit(key, [batch(tid)], owners=(shard.state.coordinator_id,))))
    assert [b.error_code for b in response.batches] == [0], response


def age(store: LocalObjectStore, key: str, *, ms: int) -> None:
    """Make an object ``ms`` older (the local store's last-modified time is the file's mtime)."""
    path = store.root / key
    stamp = path.stat().st_mtime - ms / 1000
    os.utime(path, (stamp, stamp))


def later(ms: int) -> int:
    """A scan clock ``ms`` after now: objects written now are that much older than the scan."""
    return int(time.time() * 1000) + ms


def test_a_file_no_shard_knows_is_deleted_and_a_committed_one_is_kept(store, shards) -> None:
    committed_file(shards[0], store, "wal/committed")
    store.put("wal/orphan", b"y" * 50)
    for key in ("wal/committed", "wal/orphan"):
        age(store, key, ms=5 * GRACE_MS)  # both older than the threshold: both candidates
    report = run_scan(store, [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)],
                      config=ScanConfig(grace_period_ms=GRACE_MS), now_ms=later(2 * GRACE_MS))
    assert report.ok and report.deleted == ["wal/orphan"] and report.deleted_bytes == 50
    assert (report.candidates, report.known, report.orphans) == (2, 1, 1)
    assert store.head("wal/committed") is not None and store.head("wal/orphan") is None


def test_a_file_younger_than_the_grace_period_is_not_a_candidate(store, shards) -> None:
    store.put("wal/uploaded-not-committed-yet", b"z")
    report = run_scan(store, [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)],
                      config=ScanConfig(grace_period_ms=GRACE_MS), now_ms=later(GRACE_MS // 2))
    assert report.ok and report.candidates == 0 and report.deleted == []
    assert store.head("wal/uploaded-not-committed-yet") is not None


def test_the_oldest_live_file_of_a_shard_holds_the_threshold_back(store, shards) -> None:
    committed_file(shards[1], store, "wal/live")
    shards[1].state.db.execute("UPDATE files SET created_at_ms = created_at_ms - ?", (10 * GRACE_MS,))
    store.put("wal/orphan", b"o")
    report = run_scan(store, [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)],
                      config=ScanConfig(grace_period_ms=GRACE_MS), now_ms=later(2 * GRACE_MS))
    assert report.threshold_ms < later(0) - 10 * GRACE_MS
    assert report.candidates == 0 and store.head("wal/orphan") is not None


def test_a_file_only_the_second_shard_knows_survives(store, shards) -> None:
    committed_file(shards[1], store, "wal/second")
    age(store, "wal/second", ms=5 * GRACE_MS)
    report = run_scan(store, [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)],
                      config=ScanConfig(grace_period_ms=GRACE_MS), now_ms=later(2 * GRACE_MS))
    assert report.ok and report.known == 1 and report.deleted == []


@pytest.mark.parametrize("fail_on", ["oldest", "describe"])
def test_a_shard_that_cannot_answer_stops_the_scan_before_any_delete(store, shards, fail_on) -> None:
    store.put("wal/orphan", b"o")
    views = [CoreShard(shards[0], "dc-0"), Unreachable(shards[1], "dc-1", fail_on=fail_on)]
    report = run_scan(store, views, config=ScanConfig(grace_period_ms=GRACE_MS), now_ms=later(2 * GRACE_MS))
    assert report.failure == "shard_unavailable" and "dc-1" in report.failure_detail
    assert report.deleted == [] and store.head("wal/orphan") is not None


def test_no_shard_at_all_deletes_nothing(store) -> None:
    store.put("wal/orphan", b"o")
    report = run_scan(store, [], config=ScanConfig(grace_period_ms=GRACE_MS), now_ms=later(2 * GRACE_MS))
    assert report.failure == "shard_unavailable" and store.head("wal/orphan") is not None


def test_a_dry_run_reports_orphans_and_deletes_nothing(store, shards) -> None:
    for i in range(3):
        store.put(f"wal/orphan-{i}", b"o")
    report = run_scan(store, [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)],
                      config=ScanConfig(grace_period_ms=GRACE_MS), now_ms=later(2 * GRACE_MS), dry_run=True)
    assert report.ok and report.orphans == 3 and report.deleted == []
    assert len(list(store.list(prefix="wal/"))) == 3


def test_the_listing_is_described_in_batches_with_progress_after_each(store, shards) -> None:
    for i in range(5):
        store.put(f"wal/orphan-{i}", b"o")
    seen: list[int] = []
    report = run_scan(store, [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)],
                      config=ScanConfig(grace_period_ms=GRACE_MS, describe_batch=2), now_ms=later(2 * GRACE_MS),
                      progress=lambda r: seen.append(r.candidates))
    assert seen == [2, 4, 5] and len(report.deleted) == 5 and list(store.list(prefix="wal/")) == []


def test_only_keys_under_the_prefix_are_scanned(store, shards) -> None:
    store.put("wal/orphan", b"o")
    store.put("other/thing", b"t")
    report = run_scan(store, [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)],
                      config=ScanConfig(grace_period_ms=GRACE_MS, prefix="wal/"), now_ms=later(2 * GRACE_MS))
    assert report.deleted == ["wal/orphan"] and store.head("other/thing") is not None


def test_a_non_positive_grace_period_is_refused() -> None:
    with pytest.raises(ValueError, match="grace period"):
        ScanConfig(grace_period_ms=0)
