"""A coordinator shard whose whole data directory is lost (a new pod, a deleted volume) comes back
from the object store (issue 32): snapshots taken and the metadata log deleted below them, the
shard stopped, its data directory removed, started again: it restores the newest snapshot from the
store plus the log tail, and its tables equal the ones before, row for row. Real processes, on the
local object store and on S3 (moto's server process)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from lowtide.coordinator.snapshot_store import SnapshotStore
from lowtide.coordinator.snapshots import latest_snapshot
from lowtide.coordinator.state import snapshot_offset
from lowtide.errors import OffsetOutOfRange
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.objectstore import open_object_store
from lowtide.objectstore.s3 import S3Config, S3ObjectStore
from tests import s3server
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.coordinator.dc import (
    call_retrying,
    commit_request,
    create_partitions,
    delete_records,
    find_batches,
    metadata_log,
    new_topic_id,
    rebuilt_state,
    settled_state,
    shard_stub,
)

pytestmark = pytest.mark.integration

SNAPSHOT_EVERY = 25  # records
PARTITIONS = 3
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


# What a new leadership term may move by itself: the shard's first append of a term (its epoch
# record, with epoch fencing) raises the applied offset and the epoch. Every other table must come
# back row for row; the whole state, these included, must equal a rebuild from snapshot + log.
TERM_TABLES = ("applied", "epoch")


def data_tables(state: dict) -> dict:
    return {table: rows for table, rows in state.items() if table not in TERM_TABLES}




def commit_files(stub, tid: bytes, first: int, count: int) -> None:
    for n in range(first, first + count):
        reply = call_retrying(stub.CommitFile, commit_request(f"wal/restore-{n}", tid, partition=n % PARTITIONS,
                                                              batches=3, records=2, producer_id=500 + n % PARTITIONS,
                                                              epoch=0, first_sequence=(n // PARTITIONS) * 6))
        assert all(b.error_code == 0 for b in reply.batches), reply


def lose_the_disk_and_restart(cluster: LocalCluster, tmp_path: Path) -> None:
    """The whole scenario; ``cluster`` has one coordinator shard snapshotting every 25 records."""
    store = SnapshotStore(store=open_object_store(cluster.object_store_url, instrumented=False), shard=0, keep=2)
    stub = shard_stub(cluster, 0)
    tid = new_topic_id()
    create_partitions(stub, tid, "restore", list(range(PARTITIONS)))
    commit_files(stub, tid, 0, 3 * SNAPSHOT_EVERY)
    assert delete_records(stub, tid, 1, 4).error_code == 0
    # Wait for a snapshot past all that, in the store, and the log deleted below it.
    deadline = time.monotonic() + 30
    while (newest := store.newest()) is None or newest.offset < 2 * SNAPSHOT_EVERY:
        assert time.monotonic() < deadline, f"no snapshot in the object store: {store.list()}"
        time.sleep(0.2)
    log = metadata_log(cluster, 0)
    try:
        deadline = time.monotonic() + 30
        start = 0
        while start == 0:
            assert time.monotonic() < deadline, "the metadata log below the snapshot was never deleted"
            try:
                start = log.read(store.newest().offset + 1).log_start_offset
            except OffsetOutOfRange:
                pass  # a newer snapshot came and the log went below it in between: read at that one
            if start == 0:
                time.sleep(0.2)
    finally:
        log.replicas.close()
    assert start > 0
    commit_files(stub, tid, 3 * SNAPSHOT_EVERY, 7)  # the tail after the newest snapshot
    before = settled_state(cluster, 0, tmp_path)
    reads_before = [find_batches(stub, tid, p, 0) for p in range(PARTITIONS)]
    assert before["batches"] and before["producers"] and before["files"]
    assert len(store.list()) <= 2, f"old snapshots were not pruned from the store: {store.list()}"

    data_dir = Path(cluster.service("coordinator-0").data_dir)
    cluster.stop_service("coordinator-0")
    shutil.rmtree(data_dir)
    cluster.start_service("coordinator-0")

    after = settled_state(cluster, 0, tmp_path)
    assert data_tables(after) == data_tables(before)
    assert after["applied"][0][1] >= before["applied"][0][1]
    restored = latest_snapshot(data_dir / "snapshots")
    assert restored is not None and snapshot_offset(restored) == store.newest().offset >= start - 1
    # The same as a rebuild from that snapshot plus the log, and the same answers.
    assert after == rebuilt_state(cluster, 0, tmp_path, from_snapshot=True)
    stub = shard_stub(cluster, 0)
    assert [find_batches(stub, tid, p, 0) for p in range(PARTITIONS)] == reads_before
    # And it goes on: commits, and the next snapshot lands in the store.
    commit_files(stub, tid, 3 * SNAPSHOT_EVERY + 7, SNAPSHOT_EVERY)
    deadline = time.monotonic() + 30
    while store.newest().offset <= snapshot_offset(restored):
        assert time.monotonic() < deadline, "no snapshot after the restore"
        time.sleep(0.2)


def test_a_shard_whose_data_directory_is_lost_restores_from_the_local_object_store(cluster_factory, tmp_path):
    cluster = cluster_factory(coordinators=1, extra_env={"LOWTIDE_SNAPSHOT_INTERVAL_RECORDS": str(SNAPSHOT_EVERY)})
    lose_the_disk_and_restart(cluster, tmp_path)


def test_the_log_is_not_deleted_below_a_snapshot_the_object_store_does_not_have(cluster_factory, tmp_path):
    """The order that keeps a lost disk from losing state: upload, then DeleteRecords. With the
    store refusing the upload (a file where the ``_coordinator/`` directory must be: a real put
    failing), snapshots are taken locally but the metadata log keeps its start at 0; once the store
    takes them, the log is deleted below the one uploaded."""
    cluster = cluster_factory(coordinators=1, extra_env={"LOWTIDE_SNAPSHOT_INTERVAL_RECORDS": str(SNAPSHOT_EVERY)})
    root = Path(cluster.object_store_url.removeprefix("file://"))
    blocker = root / "_coordinator"
    blocker.write_bytes(b"not a directory")
    store = SnapshotStore(store=open_object_store(cluster.object_store_url, instrumented=False), shard=0, keep=2)
    stub = shard_stub(cluster, 0)
    tid = new_topic_id()
    create_partitions(stub, tid, "blocked", list(range(PARTITIONS)))
    commit_files(stub, tid, 0, 2 * SNAPSHOT_EVERY)
    snapshots = Path(cluster.service("coordinator-0").data_dir) / "snapshots"
    deadline = time.monotonic() + 30
    while latest_snapshot(snapshots) is None:
        assert time.monotonic() < deadline, "no local snapshot was taken"
        time.sleep(0.2)
    # Two refused uploads (each logged by the shard, retried with backoff): were the order wrong,
    # the log would be deleted by now.
    shard_log = Path(cluster.service("coordinator-0").log)
    deadline = time.monotonic() + 30
    while shard_log.read_text(errors="replace").count("snapshot not in the object store yet") < 2:
        assert time.monotonic() < deadline, "the shard never retried the refused upload"
        time.sleep(0.2)
    log = metadata_log(cluster, 0)
    try:
        assert log.read(0).log_start_offset == 0, "the log was deleted below a snapshot the store never took"
        blocker.unlink()
        deadline = time.monotonic() + 60
        while (newest := store.newest()) is None:
            assert time.monotonic() < deadline, "the snapshot never reached the store once it could"
            time.sleep(0.2)
        deadline = time.monotonic() + 30
        while (start := log.read(newest.offset + 1).log_start_offset) == 0:
            assert time.monotonic() < deadline, "the log was not deleted once the snapshot was in the store"
            time.sleep(0.2)
        assert start <= store.newest().offset + 1
    finally:
        log.replicas.close()


@pytest.fixture
def s3_cluster(request, tmp_path_factory):
    if not s3server.is_available():
        pytest.skip(s3server.MISSING)
    with s3server.moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        S3ObjectStore(S3Config(bucket="lowtide-snapshots", endpoint_url=endpoint, access_key_id="testing",
                               secret_access_key="testing")).create_bucket()
        config = ClusterConfig(data_dir=tmp_path_factory.mktemp("s3cluster"), replicas=3, coordinators=1,
                               orphan_scanners=0, replica_config=dict(DEFAULT_REPLICA_CONFIG),
                               object_store=f"s3://lowtide-snapshots/cluster-a?endpoint={endpoint}",
                               extra_env={**AWS, "LOWTIDE_SNAPSHOT_INTERVAL_RECORDS": str(SNAPSHOT_EVERY)})
        yield from running_cluster(request, config)


def test_a_shard_whose_data_directory_is_lost_restores_from_s3(s3_cluster, tmp_path, monkeypatch):
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)  # this process's own S3 client (the store checks below)
    lose_the_disk_and_restart(s3_cluster, tmp_path)
