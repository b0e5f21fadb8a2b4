"""The pure parts of the running coordinator: snapshot policy and pruning, the orphan scanner's
fields of DescribeFiles, applying a pipelined group of records at once (the shard lease and
registry: test_leadership.py)."""

from __future__ import annotations

import sqlite3

import pytest

from lowtide.coordinator.pipeline import seconds_until_send
from lowtide.coordinator.records import decode_record, encode_record
from lowtide.coordinator.snapshots import SnapshotPolicy, latest_snapshot, prune_snapshots
from lowtide.coordinator.state import snapshot_offset
from lowtide.messages.coordinator import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
    DescribeFilesRequest,
)
from tests.unit.coordinator.shard import batch, commit, create_topic


def test_a_snapshot_is_due_after_enough_records_or_enough_time_but_never_with_nothing_new():
    policy = SnapshotPolicy(every_records=100, every_ms=60_000)
    assert policy.is_due(applied=150, last_offset=49, seconds_since=1)
    assert not policy.is_due(applied=148, last_offset=49, seconds_since=1)
    assert policy.is_due(applied=50, last_offset=49, seconds_since=61)
    assert not policy.is_due(applied=49, last_offset=49, seconds_since=10_000)
    assert not SnapshotPolicy(every_records=100, every_ms=0).is_due(applied=50, last_offset=49, seconds_since=1e9)
    with pytest.raises(ValueError):
        SnapshotPolicy(every_records=0)


def test_pruning_keeps_the_newest_snapshots_and_drops_half_written_ones(shard, tmp_path):
    directory = tmp_path / "snapshots"
    tid = create_topic(shard, "t")
    for i in range(4):
        shard.run(shard.core.commit_file(commit(f"wal/{i}", [batch(tid)])))
        shard.state.snapshot(directory)
    (directory / "snapshot-00000000000000000099.sqlite.tmp").write_bytes(b"half")
    gone = prune_snapshots(directory, keep=2)
    assert len(gone) == 3
    left = sorted(p.name for p in directory.iterdir())
    assert len(left) == 2 and latest_snapshot(directory).name == left[-1]
    assert snapshot_offset(latest_snapshot(directory)) == shard.state.applied_offset


def test_describe_files_says_which_keys_the_shard_knows_and_its_oldest_file(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("wal/old", [batch(tid)])))
    shard.clock.now += 1000
    shard.run(shard.core.commit_file(commit("wal/new", [batch(tid)])))
    shard.run(shard.core.delete_records(DeleteRecordsRequest(topics=[DeleteRecordsTopic(
        topic_id=tid, partitions=[DeleteRecordsPartition(partition_index=0, offset=1)])])))  # wal/old: deletable
    shard.append(shard.core.commit_file(commit("wal/pending", [batch(tid)])))  # not replicated yet

    reply = shard.core.describe_files(DescribeFilesRequest(object_keys=["wal/old", "wal/new", "wal/pending",
                                                                         "wal/never"]))
    assert [(f.object_key, f.known, f.has_live_batches) for f in reply.files] == [
        ("wal/old", True, False), ("wal/new", True, True), ("wal/pending", True, True), ("wal/never", False, False)]
    assert reply.oldest_file_created_at_ms == shard.clock.now - 1000


def test_a_shard_without_files_reports_no_oldest_file(shard):
    assert shard.core.describe_files(DescribeFilesRequest(object_keys=[])).oldest_file_created_at_ms == -1


def test_applying_a_pipelined_group_at_once_clears_exactly_those_pending_records(shard):
    tid = create_topic(shard, "t")
    first = shard.core.commit_file(commit("wal/a", [batch(tid, records=3)]))
    second = shard.core.commit_file(commit("wal/b", [batch(tid, records=2)]))
    third = shard.core.commit_file(commit("wal/c", [batch(tid, records=1)]))
    assert shard.core.pending.pending_count == 3
    records = [decode_record(encode_record(r)) for d in (first, second) for r in d.records]
    shard.core.apply_all([(r, 100 + i) for i, r in enumerate(records)])
    assert shard.core.pending.pending_count == 1
    assert shard.state.applied_offset == 101
    assert third.response.batches[0].assigned_base_offset == 5
    assert shard.core.pending.partition(tid, 0).high_watermark == 6


def test_the_first_append_goes_at_once_and_a_second_waits_for_the_linger_or_the_first():
    def until(*, queued_at, in_flight, now):
        return seconds_until_send(oldest_queued_at=queued_at, in_flight=in_flight, max_in_flight=2,
                                  linger_s=0.005, now=now)

    assert until(queued_at=100.0, in_flight=0, now=100.0) == 0.0  # idle: no linger
    assert until(queued_at=100.0, in_flight=1, now=100.002) == pytest.approx(0.003)
    assert until(queued_at=100.0, in_flight=1, now=100.005) == 0.0
    assert until(queued_at=100.0, in_flight=1, now=101.0) == 0.0
    assert until(queued_at=100.0, in_flight=2, now=101.0) == 0.5  # both slots taken: re-check later
    assert until(queued_at=None, in_flight=0, now=100.0) == 0.5  # nothing to send


def test_a_busy_shard_lingers_its_first_append_too():
    def until(*, in_flight, now):
        return seconds_until_send(oldest_queued_at=100.0, in_flight=in_flight, max_in_flight=2,
                                  linger_s=0.005, now=now, busy=True)

    assert until(in_flight=0, now=100.001) == pytest.approx(0.004)
    assert until(in_flight=0, now=100.005) == 0.0
    assert until(in_flight=1, now=100.002) == pytest.approx(0.003)
    assert until(in_flight=2, now=101.0) == 0.5



class _CommitsDuringBackup:
    """The snapshot's source connection, with another connection's commit landing as the backup
    starts (the applier is another process with its own connection)."""

    def __init__(self, db: sqlite3.Connection, other: sqlite3.Connection) -> None:
        self._db, self._other = db, other

    def backup(self, target: sqlite3.Connection, **kwargs) -> None:
        self._other.execute("UPDATE applied SET metadata_offset = metadata_offset + 5 WHERE id = 0")
        self._other.commit()
        self._db.backup(target, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._db, name)


def test_a_snapshot_is_named_after_the_offset_its_copy_holds_when_another_connection_commits_meanwhile(
        shard, tmp_path):
    # Named after the offset read before the copy, it said 63 for a copy holding 64, and a restore
    # from the object store refused it (SnapshotCorrupt) for good.
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("wal/0", [batch(tid)])))
    before = shard.state.applied_offset
    other = sqlite3.connect(shard.state.path)
    shard.state._open_snapshot_source = lambda: _CommitsDuringBackup(sqlite3.connect(shard.state.path), other)
    try:
        path = shard.state.snapshot(tmp_path / "snapshots")
    finally:
        del shard.state._open_snapshot_source
        other.close()
    copy = sqlite3.connect(path)
    held = copy.execute("SELECT metadata_offset FROM applied WHERE id = 0").fetchone()[0]
    copy.close()
    assert held == before + 5 and snapshot_offset(path) == held
    assert [p.name for p in (tmp_path / "snapshots").iterdir()] == [path.name]  # no .tmp left


class _Unusable:
    def __getattr__(self, name: str):
        raise AssertionError(f"the snapshot used the shard's shared reading connection ({name})")


def test_a_snapshot_reads_through_a_connection_of_its_own_so_the_shard_lock_is_not_needed(shard, tmp_path):
    # The shared reading connection is the checks' and reads', under the shard lock; a snapshot
    # through it held that lock for its whole copy (~300 ms for a large state: every commit waited).
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("wal/0", [batch(tid)])))
    applied = shard.state.applied_offset
    real, shard.state.db = shard.state.db, _Unusable()
    try:
        path = shard.state.snapshot(tmp_path / "snapshots")
    finally:
        shard.state.db = real
    assert snapshot_offset(path) == applied

