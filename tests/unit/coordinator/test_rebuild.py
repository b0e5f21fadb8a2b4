"""The state is a function of the metadata log: rebuilt from the records (all of them, or a
snapshot plus the tail) it equals the state built while serving, row for row."""

from __future__ import annotations

import random

from lowtide.coordinator.records import decode_record
from lowtide.coordinator.snapshots import latest_snapshot, restore_snapshot
from lowtide.coordinator.state import CoordinatorState, snapshot_offset
from lowtide.messages.coordinator import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
    DeleteTopicsRequest,
)
from tests.unit.coordinator.shard import batch, commit, create_topic


def serve_a_mixed_workload(shard, rng: random.Random, *, files: int, start: int = 0) -> None:
    topics = [create_topic(shard, f"t{start}-{i}", 3) for i in range(3)]
    for f in range(start, start + files):
        shard.clock.now += rng.randint(1, 50)
        batches = [batch(rng.choice(topics), rng.randrange(3), records=rng.randint(1, 5), max_ts=rng.randint(0, 10**6),
                         ts_type=rng.randint(0, 1)) for _ in range(rng.randint(1, 8))]
        batches.append(batch(topics[0], 0, producer_id=9, epoch=0, seq=f))
        shard.append(shard.core.commit_file(commit(f"wal/{f}", batches, owners=rng.choice([(0,), (0, 1), (1, 0)]))))
        if rng.random() < 0.3:
            tid, p = rng.choice(topics), rng.randrange(3)
            hw = shard.core.pending.partition(tid, p).high_watermark
            shard.append(shard.core.delete_records(DeleteRecordsRequest(topics=[DeleteRecordsTopic(
                topic_id=tid, partitions=[DeleteRecordsPartition(partition_index=p, offset=rng.randint(0, hw))])])))
        if rng.random() < 0.5:
            shard.replicate()  # sometimes two or three requests are pipelined before replication
    shard.replicate()
    shard.run(shard.core.delete_topics(DeleteTopicsRequest(topic_ids=[topics[2]])))


def rebuild(path, log, *, start: int = 0, state: CoordinatorState | None = None) -> CoordinatorState:
    state = state or CoordinatorState(path, coordinator_id=0)
    state.apply_all((decode_record(value), offset) for offset, value in enumerate(log) if offset >= start)
    return state


def test_a_state_rebuilt_from_the_log_equals_the_served_one_row_for_row(shard, tmp_path):
    serve_a_mixed_workload(shard, random.Random(7), files=60)
    served = shard.state.dump()
    assert served["batches"] and served["producers"] and any(r[8] == "deletable" for r in served["files"])
    rebuilt = rebuild(tmp_path / "rebuilt.sqlite", shard.log)
    assert rebuilt.dump() == served
    assert rebuilt.applied_offset == len(shard.log) - 1


def test_applying_a_log_tail_twice_changes_nothing(shard, tmp_path):
    serve_a_mixed_workload(shard, random.Random(3), files=20)
    rebuilt = rebuild(tmp_path / "r.sqlite", shard.log)
    rebuild(tmp_path / "r.sqlite", shard.log, start=5, state=rebuilt)
    assert rebuilt.dump() == shard.state.dump()


def test_newest_snapshot_plus_the_log_tail_equals_the_served_state(shard, tmp_path):
    rng = random.Random(11)
    serve_a_mixed_workload(shard, rng, files=30)
    shard.state.snapshot(tmp_path / "snapshots")
    serve_a_mixed_workload(shard, rng, files=10, start=30)
    second = shard.state.snapshot(tmp_path / "snapshots")
    serve_a_mixed_workload(shard, rng, files=20, start=40)
    (tmp_path / "snapshots" / "snapshot-00000000000099999999.sqlite.tmp").write_bytes(b"half-written")

    newest = latest_snapshot(tmp_path / "snapshots")
    assert newest == second
    restored = restore_snapshot(newest, tmp_path / "restored.sqlite", coordinator_id=0)
    assert restored.applied_offset == snapshot_offset(newest)
    rebuild(tmp_path / "restored.sqlite", shard.log, start=restored.applied_offset + 1, state=restored)
    assert restored.dump() == shard.state.dump()


def test_restoring_replaces_whatever_database_was_there(shard, tmp_path):
    serve_a_mixed_workload(shard, random.Random(5), files=5)
    snap = shard.state.snapshot(tmp_path / "s")
    stale = CoordinatorState(tmp_path / "db.sqlite", coordinator_id=0)
    stale.db.execute("INSERT INTO partitions VALUES (99, x'00', 'junk', 0, 0, 0, -1, -1)")
    stale.close()
    restored = restore_snapshot(snap, tmp_path / "db.sqlite", coordinator_id=0)
    assert restored.dump() == shard.state.dump()


def test_files_and_deletions_applied_in_one_transaction_leave_the_rows_of_one_transaction_each(shard, tmp_path):
    # The partition rows several files move are written once, at the end of the transaction; a
    # DeleteRecords between them must still see the high watermark the files before it left.
    tid = create_topic(shard, "one-txn", 2)
    for f in range(4):
        shard.append(shard.core.commit_file(commit(f"wal/t{f}", [batch(tid, 0, records=3, max_ts=10 * f),
                                                                 batch(tid, 1, records=2, max_ts=5)])))
        if f == 1:
            shard.append(shard.core.delete_records(DeleteRecordsRequest(topics=[DeleteRecordsTopic(
                topic_id=tid, partitions=[DeleteRecordsPartition(partition_index=0, offset=-1)])])))
    shard.replicate()
    together = rebuild(tmp_path / "together.sqlite", shard.log)
    assert together.dump() == shard.state.dump()
    assert together.partition(tid, 0)[4:] == (6, 12, 30, 11)  # log start, hw, max timestamp, its offset
