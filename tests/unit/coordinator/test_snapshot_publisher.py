"""A shard's snapshot publishing (coordinator/snapshot_publisher.py): a snapshot found at start-up
is published again, so a kill between a snapshot and the log truncation after it heals without a
new snapshot, and without a second copy in the object store."""

from __future__ import annotations

import random

from lowtide.coordinator.snapshot_publisher import SnapshotPublisher
from lowtide.coordinator.snapshot_store import SnapshotStore
from lowtide.coordinator.snapshots import SnapshotPolicy
from lowtide.coordinator.state import snapshot_offset
from lowtide.objectstore import LocalObjectStore
from tests.unit.coordinator.test_rebuild import serve_a_mixed_workload


class TruncationLog:
    """The one MetadataLog call a publisher makes, recorded: the offsets it deleted below.

    A stand-in for the replicated metadata log because the state under test, a kill landing between
    a snapshot and its truncation, cannot be produced on demand with real processes;
    tests/integration/coordinator/test_coordinator_crash.py checks the truncation on a real cluster
    after a kill -9 wherever it lands."""

    def __init__(self) -> None:
        self.deleted_below: list[int] = []

    def delete_below(self, offset: int) -> int:
        self.deleted_below.append(offset)
        return offset


def publisher_after_restart(shard, tmp_path, store: SnapshotStore | None) -> tuple[SnapshotPublisher, TruncationLog]:
    log = TruncationLog()
    publisher = SnapshotPublisher(snapshot_dir=tmp_path / "snapshots", policy=SnapshotPolicy(every_records=10**9),
                                  metadata_log=log, snapshot_store=store,
                                  applied_offset=lambda: shard.state.applied_offset,
                                  write_snapshot=shard.state.snapshot)
    return publisher, log


def test_a_snapshot_whose_truncation_a_kill_cut_off_truncates_the_log_after_a_restart(shard, tmp_path):
    serve_a_mixed_workload(shard, random.Random(1), files=10)
    path = shard.state.snapshot(tmp_path / "snapshots")  # then the kill: the log was not truncated
    store = SnapshotStore(store=LocalObjectStore(tmp_path / "objects"), shard=0, keep=2)
    store.upload(path)

    publisher, log = publisher_after_restart(shard, tmp_path, store)
    publisher.maybe_snapshot()

    assert log.deleted_below == [snapshot_offset(path) + 1]
    assert [s.offset for s in store.list()] == [snapshot_offset(path)]
    assert len(list(store.store.list(prefix=store.prefix))) == 2, "uploaded a second copy"
    publisher.maybe_snapshot()
    assert log.deleted_below == [snapshot_offset(path) + 1], "published twice"


def test_a_snapshot_a_kill_kept_from_the_store_is_uploaded_before_the_log_is_truncated(shard, tmp_path):
    serve_a_mixed_workload(shard, random.Random(2), files=10)
    path = shard.state.snapshot(tmp_path / "snapshots")
    store = SnapshotStore(store=LocalObjectStore(tmp_path / "objects"), shard=0, keep=2)

    publisher, log = publisher_after_restart(shard, tmp_path, store)
    publisher.maybe_snapshot()

    assert [s.offset for s in store.list()] == [snapshot_offset(path)]
    assert log.deleted_below == [snapshot_offset(path) + 1]


def test_without_an_object_store_the_snapshot_found_at_start_truncates_the_log(shard, tmp_path):
    serve_a_mixed_workload(shard, random.Random(3), files=10)
    path = shard.state.snapshot(tmp_path / "snapshots")

    publisher, log = publisher_after_restart(shard, tmp_path, None)
    publisher.maybe_snapshot()

    assert log.deleted_below == [snapshot_offset(path) + 1]
