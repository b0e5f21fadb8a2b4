"""Snapshot-restore onto an empty disk (issue 32 "Must show"): a coordinator shard with 100,000
batches in its tables, its data directory gone, restored from the object store.

Two parts:

* in process, to show where the time goes: a state of 100,000 batches (1,000 files of 100 batches
  over 100 partitions, idempotent producers) built with the shard's own apply, snapshotted (SQLite
  backup API), uploaded (``coordinator.snapshot_store``), then restored into an empty directory:
  download in ranges with sha256, the checks (``PRAGMA integrity_check``, schema, offset), the
  copy into ``state.sqlite`` (``state.restore_snapshot``); on the local store, and on moto's S3
  server (a real HTTP server process) when it is installed;
* end to end, real processes: a local cluster (3 replicas, 1 coordinator shard snapshotting every
  250 records) takes 1,000 CommitFiles of 100 batches over gRPC; the shard is stopped, its data
  directory deleted, and started again: the time from the start until it leads the shard (process
  start, lease, download, checks, restore, reading the log tail), and the shard's own load time
  from its log line.

Reports; never asserts on time.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from pathlib import Path

from lowtide.coordinator.records import CommittedBatch, FileCommitted, PartitionCreated
from lowtide.coordinator.snapshot_store import SnapshotStore, verify_database
from lowtide.coordinator.snapshots import restore_snapshot
from lowtide.coordinator.state import CoordinatorState
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.objectstore import ObjectStore, open_object_store
from tests import s3server
from tests.bench.common import Figure, failed, say

BATCHES = 100_000
PER_FILE = 100
PARTITIONS = 100
SNAPSHOT_EVERY = 250  # records, end to end


def build_state(path: Path, *, batches: int) -> CoordinatorState:
    """A shard state holding ``batches`` batches: one topic of PARTITIONS partitions, files of
    PER_FILE batches, one per partition, each partition written by its own idempotent producer."""
    state = CoordinatorState(path, coordinator_id=0, background_checkpoints=True)
    tid = uuid.uuid4().bytes
    offset = 0
    state.apply_all((PartitionCreated(topic_id=tid, name="snap", partition_index=p), offset + p)
                    for p in range(PARTITIONS))
    offset += PARTITIONS
    now = 1_700_000_000_000
    files = batches // PER_FILE
    chunk = []
    for f in range(files):
        out = []
        for i in range(PER_FILE):
            p = (f * PER_FILE + i) % PARTITIONS
            n = (f * PER_FILE + i) // PARTITIONS  # the partition's n-th batch
            out.append(CommittedBatch(tid, p, 2, i * 1000, 1000, n * 10, n * 10 + 9, now + f, now + f, 0,
                                      1000 + p, 0, n * 10, n * 10 + 9))
        chunk.append((FileCommitted(object_key=f"wal/{f:032x}", object_format=1, file_size=PER_FILE * 1000,
                                    uploader_broker_id=0, committed_at_ms=now + f, owner_ids=(0,),
                                    batches=tuple(out)), offset))
        offset += 1
        if len(chunk) == 50:
            state.apply_all(chunk)
            state.checkpoint()
            state.restart_wal()
            chunk = []
    if chunk:
        state.apply_all(chunk)
    state.checkpoint()
    return state


def _restore(stored: SnapshotStore, target: Path) -> dict[str, float]:
    """Restore the store's newest snapshot into the empty directory ``target``: seconds per step."""
    began = time.perf_counter()
    newest = stored.newest()
    local = stored.download(newest, directory=target / "snapshots")  # includes the checks
    downloaded = time.perf_counter()
    state = restore_snapshot(local, target / "state.sqlite", coordinator_id=0)
    try:
        assert state.count_batches() >= BATCHES - PER_FILE, state.count_batches()
    finally:
        state.close()
    done = time.perf_counter()
    return {"download_and_check_s": downloaded - began, "restore_s": done - downloaded, "total_s": done - began}


def _in_process(data_dir: Path, store: ObjectStore, backend: str, snapshot: Path) -> list[Figure]:
    stored = SnapshotStore(store=store, shard=0, keep=2)
    began = time.perf_counter()
    stored.upload(snapshot)
    upload_s = time.perf_counter() - began
    target = data_dir / f"empty-{backend}"
    shutil.rmtree(target, ignore_errors=True)
    steps = _restore(stored, target)
    check_began = time.perf_counter()
    verify_database(snapshot, offset=stored.newest().offset, key="(local copy)")
    check_s = time.perf_counter() - check_began
    size_mb = snapshot.stat().st_size / 1e6
    return [Figure(
        key=f"snapshot_restore_inproc_{backend}_s",
        name=f"snapshot restore onto an empty disk, 100,000 batches, {backend} store (in process)",
        value=steps["total_s"], unit="s",
        params={"batches": BATCHES, "snapshot_mb": round(size_mb, 1), "upload_s": round(upload_s, 3),
                "download_and_check_s": round(steps["download_and_check_s"], 3),
                "integrity_check_s": round(check_s, 3), "restore_s": round(steps["restore_s"], 3)},
        note=(f"{size_mb:.1f} MB snapshot: download + sha256 + checks {steps['download_and_check_s']:.2f} s "
              f"(the checks alone, measured apart: {check_s:.2f} s, mostly PRAGMA integrity_check), copy into "
              f"state.sqlite {steps['restore_s']:.2f} s; upload {upload_s:.2f} s"))]


def _s3_store(data_dir: Path, stack) -> ObjectStore:
    endpoint = stack.enter_context(s3server.moto_server(data_dir))
    store = open_object_store(f"s3://snapshots/bench?endpoint={endpoint}", access_key_id="testing",
                              secret_access_key="testing")
    deadline = time.monotonic() + 30
    while True:
        try:
            store.create_bucket()
            return store
        except Exception:  # noqa: BLE001 - the server is still starting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _commit_load(cluster: LocalCluster, *, files: int) -> None:
    from tests.integration.coordinator.dc import (  # the coordinator tests' request builders
        call_retrying,
        commit_request,
        create_partitions,
        new_topic_id,
        shard_stub,
    )

    stub = shard_stub(cluster, 0)
    tid = new_topic_id()
    create_partitions(stub, tid, "snap", list(range(PARTITIONS)))
    errors: list[BaseException] = []

    def worker(first: int) -> None:
        try:
            for f in range(first, files, 4):
                reply = call_retrying(stub.CommitFile, commit_request(f"wal/snap-{f}", tid, partition=f % PARTITIONS,
                                                                      batches=PER_FILE, records=1))
                assert all(b.error_code == 0 for b in reply.batches), reply
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _load_seconds(log_path: Path) -> float | None:
    """The shard's own "leading the shard" load time, from its last such log line."""
    found = None
    for line in log_path.read_text(errors="replace").splitlines():
        if '"leading the shard"' in line:
            try:
                found = json.loads(line).get("load_seconds")
            except ValueError:
                continue
    return found


def _end_to_end(data_dir: Path) -> Figure:
    key = "snapshot_restore_e2e_s"
    name = "snapshot restore onto an empty disk, 100,000 batches: shard start to leading (real processes)"
    config = ClusterConfig(data_dir=data_dir, replicas=3, coordinators=1, orphan_scanners=0,
                           extra_env={"LOWTIDE_SNAPSHOT_INTERVAL_RECORDS": str(SNAPSHOT_EVERY)})
    cluster = LocalCluster(config)
    say(f"snapshot: starting 3 replicas + 1 coordinator shard in {data_dir}")
    cluster.up(detach=True)
    try:
        began = time.monotonic()
        _commit_load(cluster, files=BATCHES // PER_FILE)
        say(f"snapshot: {BATCHES:,} batches committed in {time.monotonic() - began:.1f}s")
        stored = SnapshotStore(store=open_object_store(cluster.object_store_url, instrumented=False), shard=0,
                               keep=2)
        deadline = time.monotonic() + 60
        while (newest := stored.newest()) is None or newest.offset < BATCHES // PER_FILE - SNAPSHOT_EVERY:
            if time.monotonic() > deadline:
                raise AssertionError(f"no recent snapshot in the object store: {stored.list()}")
            time.sleep(0.2)
        entry = cluster.service("coordinator-0")
        data = Path(entry.data_dir)
        cluster.stop_service("coordinator-0")
        size_mb = sum(p.stat().st_size for p in (data / "snapshots").glob("*.sqlite")) / 1e6 / 2
        shutil.rmtree(data)
        began = time.perf_counter()
        cluster.start_service("coordinator-0")  # returns once it leads the shard
        seconds = time.perf_counter() - began
        load = _load_seconds(Path(entry.log))
        restored = sorted((data / "snapshots").glob("*.sqlite"))
        assert restored, "the shard started without restoring a snapshot"
        # The same restart with the disk kept, for reference: what the restore adds.
        cluster.stop_service("coordinator-0")
        began = time.perf_counter()
        cluster.start_service("coordinator-0")
        kept_s = time.perf_counter() - began
        kept_load = _load_seconds(Path(entry.log))
        return Figure(key=key, name=name, value=seconds, unit="s",
                      params={"batches": BATCHES, "files": BATCHES // PER_FILE, "snapshot_offset": newest.offset,
                              "shard_load_s": load, "snapshot_mb": round(size_mb, 1),
                              "disk_kept_restart_s": round(kept_s, 3), "disk_kept_load_s": kept_load},
                      note=(f"process start to leading the shard; the shard's own load (download, checks, "
                            f"restore, log tail) {load} s; snapshot at offset {newest.offset}, ~{size_mb:.0f} MB; "
                            f"the same restart with the disk kept: {kept_s:.2f} s (load {kept_load} s)"))
    except Exception as exc:  # noqa: BLE001 - reported as an error figure
        return failed(key, name, "s", None, exc)
    finally:
        cluster.down(timeout_s=10)


def snapshot_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    from contextlib import ExitStack

    data_dir.mkdir(parents=True, exist_ok=True)
    say(f"snapshot: building a shard state of {BATCHES:,} batches")
    began = time.perf_counter()
    state = build_state(data_dir / "state.sqlite", batches=BATCHES)
    say(f"snapshot: built in {time.perf_counter() - began:.1f}s")
    try:
        began = time.perf_counter()
        snapshot = state.snapshot(data_dir / "snapshots")
        snapshot_s = time.perf_counter() - began
    finally:
        state.close()
    figures = [Figure(key="snapshot_take_s", name="take a local snapshot, 100,000 batches (SQLite backup API)",
                      value=snapshot_s, unit="s", params={"mb": round(snapshot.stat().st_size / 1e6, 1)})]
    figures += _in_process(data_dir, open_object_store((data_dir / "objects").as_uri()), "local", snapshot)
    if s3server.is_available():
        with ExitStack() as stack:
            figures += _in_process(data_dir, _s3_store(data_dir, stack), "s3", snapshot)
    else:
        figures.append(failed("snapshot_restore_inproc_s3_s", "snapshot restore, S3", "s", None, s3server.MISSING))
    figures.append(_end_to_end(data_dir / "cluster"))
    return [f.judge() for f in figures]
