"""The applier: a child process (or a thread) that owns the SQLite writes of a shard, and the
cache mirroring that keeps the shard's reading copy exact (coordinator.applier, state.CacheChanges).

The process tests start the real child (``python -m lowtide.coordinator.applier``) on a database
in the test's directory and talk to it over its pipes."""

from __future__ import annotations

import io
import os
import pickle
import random
import signal
import time

import pytest

from lowtide.coordinator.applier import FRAME, ProcessApplier, ThreadApplier, _read_frame, _write_frame
from lowtide.coordinator.records import FileCommitted, PartitionCreated, decode_record
from lowtide.coordinator.state import CoordinatorState
from lowtide.errors import KafkaStorageError, RequestTimedOut
from tests.unit.coordinator.test_rebuild import serve_a_mixed_workload


def _keys(log: list[bytes]) -> tuple[set, set]:
    """Every (topic id, partition) and (topic id, partition, producer id) the log names."""
    partitions, producers = set(), set()
    for value in log:
        record = decode_record(value)
        if isinstance(record, PartitionCreated):
            partitions.add((record.topic_id, record.partition_index))
        elif isinstance(record, FileCommitted):
            for b in record.batches:
                partitions.add((b.topic_id, b.partition_index))
                if b.producer_id >= 0:
                    producers.add((b.topic_id, b.partition_index, b.producer_id))
    return partitions, producers


def _reads(state: CoordinatorState, partitions: set, producers: set) -> dict:
    return {**{k: state.partition(*k) for k in partitions}, **{k: state.producer(*k) for k in producers}}


def _entries(log: list[bytes], start: int, end: int) -> list[tuple[bytes, int]]:
    return [(log[o], o) for o in range(start, end)]


@pytest.mark.parametrize("mirror", [True, False])
def test_a_reading_copy_that_mirrors_the_writers_cache_changes_reads_what_sqlite_holds(shard, tmp_path, mirror):
    serve_a_mixed_workload(shard, random.Random(7), files=40)
    partitions, producers = _keys(shard.log)
    path = tmp_path / "db.sqlite"
    writer = CoordinatorState(path, coordinator_id=0)
    reader = CoordinatorState(path, coordinator_id=0)
    stale_reads = 0
    try:
        for start in range(0, len(shard.log), 7):
            _reads(reader, partitions, producers)  # fills the reader's caches before the writer moves on
            end = min(start + 7, len(shard.log))
            writer.apply_all((decode_record(v), o) for v, o in _entries(shard.log, start, end))
            changes = writer.take_cache_changes()
            if mirror:
                reader.mirror_cache_changes(changes)
            fresh = CoordinatorState(path, coordinator_id=0)  # no cache: what SQLite holds
            try:
                expected = _reads(fresh, partitions, producers)
            finally:
                fresh.close()
            if mirror:
                assert _reads(reader, partitions, producers) == expected, f"after offsets {start}..{end - 1}"
            else:
                stale_reads += _reads(reader, partitions, producers) != expected
    finally:
        writer.close()
        reader.close()
    # Without the mirror the reader must go stale: else this test could not fail.
    assert mirror or stale_reads > 0


def test_a_frame_is_a_big_endian_length_and_a_pickle():
    out = io.BytesIO()
    _write_frame(out, ("ok", 3))
    payload = pickle.dumps(("ok", 3), protocol=5)
    assert out.getvalue() == len(payload).to_bytes(4, "big") + payload
    assert FRAME.size == 4
    assert _read_frame(io.BytesIO(out.getvalue())) == ("ok", 3)
    assert _read_frame(io.BytesIO(out.getvalue()[:-1])) is None  # a torn frame reads as the end
    assert _read_frame(io.BytesIO(b"")) is None


@pytest.mark.parametrize("kind", [ProcessApplier, ThreadApplier])
def test_the_applier_builds_the_state_the_log_describes_row_for_row(shard, tmp_path, kind):
    serve_a_mixed_workload(shard, random.Random(3), files=30)
    applier = kind(db_path=tmp_path / "db.sqlite", shard=0)
    try:
        result = applier.apply(_entries(shard.log, 0, 10))
        assert (result.applied, result.applied_offset) == (10, 9)
        result = applier.apply(_entries(shard.log, 5, len(shard.log)), contiguous=True)  # 5..9 already applied
        assert (result.applied, result.applied_offset) == (len(shard.log) - 10, len(shard.log) - 1)
    finally:
        applier.close()
    built = CoordinatorState(tmp_path / "db.sqlite", coordinator_id=0)
    try:
        assert built.dump() == shard.state.dump()
    finally:
        built.close()


@pytest.mark.parametrize("kind", [ProcessApplier, ThreadApplier])
def test_an_apply_that_would_leave_a_hole_is_refused_and_changes_nothing(shard, tmp_path, kind):
    serve_a_mixed_workload(shard, random.Random(5), files=10)
    applier = kind(db_path=tmp_path / "db.sqlite", shard=0)
    try:
        applier.apply(_entries(shard.log, 0, 4))
        with pytest.raises(RequestTimedOut, match="follow a failed apply"):
            applier.apply(_entries(shard.log, 6, 8), contiguous=True)
        assert applier.apply(_entries(shard.log, 4, 6), contiguous=True).applied_offset == 5
    finally:
        applier.close()


def test_a_dead_applier_process_raises_a_storage_error_and_is_not_alive(shard, tmp_path):
    serve_a_mixed_workload(shard, random.Random(9), files=5)
    applier = ProcessApplier(db_path=tmp_path / "db.sqlite", shard=0)
    try:
        assert applier.alive()
        os.kill(applier._proc.pid, signal.SIGKILL)
        applier._proc.wait(timeout=10)
        assert not applier.alive()
        with pytest.raises(KafkaStorageError, match="applier process"):
            applier.apply(_entries(shard.log, 0, 3))
    finally:
        applier.close()


def test_closing_the_applier_ends_its_process(tmp_path):
    applier = ProcessApplier(db_path=tmp_path / "db.sqlite", shard=0)
    pid = applier._proc.pid
    applier.close()
    assert not applier.alive()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)  # reaped by close(): the pid is gone (or reused, not by our child)
    assert applier._proc.returncode == 0
