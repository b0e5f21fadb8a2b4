"""kill -9 of a diskless coordinator during a stream of commits (issue 13 "Must show"): after the
restart its SQLite tables equal, row for row, a state rebuilt from scratch from its metadata
partition, and every acknowledged batch reads back; the same when snapshots were taken and the
log below them deleted. Real processes throughout; the kill is a real SIGKILL."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from lowtide.coordinator.snapshots import latest_snapshot
from lowtide.coordinator.state import snapshot_offset
from tests.integration.coordinator.dc import (
    call_retrying,
    commit_request,
    create_partitions,
    find_batches,
    metadata_log,
    new_topic_id,
    rebuilt_state,
    settled_state,
    shard_stub,
)

WRITERS = 4
BATCHES, RECORDS = 3, 2


@dataclass
class Writer:
    """Commits files for one partition as idempotent producer ``partition``; remembers what was
    acknowledged and the one commit whose outcome the crash left unknown."""

    partition: int
    acked: list[tuple[str, list[int]]] = field(default_factory=list)
    unknown: object = None
    sequence: int = 0

    def request(self, tid: bytes, n: int):
        return commit_request(f"wal/crash-{self.partition}-{n}", tid, partition=self.partition, batches=BATCHES,
                              records=RECORDS, producer_id=100 + self.partition, epoch=0,
                              first_sequence=self.sequence)

    def run(self, stub, tid: bytes, stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            request = self.request(tid, n)
            try:
                reply = stub.CommitFile(request, timeout=10)
            except grpc.RpcError:
                self.unknown = request  # the coordinator died with this one in flight
                return
            self._record(request, reply)
            n += 1

    def _record(self, request, reply) -> None:
        assert all(b.error_code == 0 for b in reply.batches), reply
        self.acked.append((request.object_key, [b.assigned_base_offset for b in reply.batches]))
        self.sequence = request.batches[-1].last_sequence + 1

    def finish(self, stub) -> None:
        """Retry the commit the crash interrupted: a duplicate if it made it, accepted if not."""
        if self.unknown is not None:
            self._record(self.unknown, call_retrying(stub.CommitFile, self.unknown))


def stream_commits_and_kill(cluster, *, seconds: float) -> tuple[bytes, list[Writer]]:
    stub = shard_stub(cluster, 0)
    tid = new_topic_id()
    create_partitions(stub, tid, "crash", list(range(WRITERS)))
    writers = [Writer(p) for p in range(WRITERS)]
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stub, tid, stop), daemon=True) for w in writers]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    cluster.kill("coordinator-0")
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert sum(len(w.acked) for w in writers) > 20, "too few commits before the kill to mean anything"
    cluster.start_service("coordinator-0")
    stub = shard_stub(cluster, 0)
    for writer in writers:
        writer.finish(stub)
    return tid, writers


def assert_every_acknowledged_batch_reads_back(cluster, tid: bytes, writers: list[Writer]) -> None:
    stub = shard_stub(cluster, 0)
    for writer in writers:
        found = find_batches(stub, tid, writer.partition, 0)
        have = {(b.object_key, b.base_offset) for b in found.batches}
        want = {(key, base) for key, bases in writer.acked for base in bases}
        assert want <= have, f"partition {writer.partition}: acknowledged but missing {sorted(want - have)[:5]}"
        assert found.high_watermark == len(writer.acked) * BATCHES * RECORDS  # no gap, nothing twice




def test_after_a_kill_9_during_commits_the_state_equals_a_rebuild_from_the_metadata_log(cluster_factory, tmp_path):
    cluster = cluster_factory(coordinators=1, extra_env={"LOWTIDE_LEASE_MS": "2000"})
    tid, writers = stream_commits_and_kill(cluster, seconds=2.0)

    served = settled_state(cluster, 0, tmp_path)
    assert served["batches"] and served["producers"]
    assert served == rebuilt_state(cluster, 0, tmp_path)
    assert_every_acknowledged_batch_reads_back(cluster, tid, writers)


def test_after_snapshots_and_log_truncation_a_kill_9_restart_equals_snapshot_plus_log_tail(cluster_factory,
                                                                                           tmp_path):
    cluster = cluster_factory(coordinators=1, extra_env={"LOWTIDE_LEASE_MS": "2000",
                                                         "LOWTIDE_SNAPSHOT_INTERVAL_RECORDS": "25"})
    tid, writers = stream_commits_and_kill(cluster, seconds=2.0)

    served = settled_state(cluster, 0, tmp_path)
    snapshots = Path(cluster.service("coordinator-0").data_dir) / "snapshots"
    log = metadata_log(cluster, 0)
    try:
        # The log below a snapshot is deleted after the snapshot is taken (and stored), not with
        # it: the newest snapshot may be a moment ahead of the deletion.
        deadline = time.monotonic() + 30
        while True:
            newest = latest_snapshot(snapshots)
            assert newest is not None
            start = log.read(snapshot_offset(newest) + 1).log_start_offset
            if start == snapshot_offset(newest) + 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        log.replicas.close()
    assert start == snapshot_offset(newest) + 1, "the metadata log below the newest snapshot was not deleted"
    assert served == rebuilt_state(cluster, 0, tmp_path, from_snapshot=True)
    assert_every_acknowledged_batch_reads_back(cluster, tid, writers)
