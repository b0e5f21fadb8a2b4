"""The orphan scanner service (issue 14) on a real local cluster: redis-server, replicas, two
coordinator shards and the scanner, each its own process; files in the cluster's real object store."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from lowtide.localcluster import ClusterConfig
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.scanner.support import (
    SCANNER_ENV,
    metric,
    scanner_client,
    store_of,
    upload,
    wait_past_grace,
)

# A broker process as far as the orphan scanner can see it: it uploads a WAL file, says so, and
# would commit it next; the test kills it (SIGKILL) before it does.
BROKER_SCRIPT = """
import os, sys, time
from lowtide.objectstore import open_object_store
store = open_object_store(sys.argv[1])
store.put(sys.argv[2], os.urandom(4096))
print("uploaded", flush=True)
time.sleep(3600)  # the commit would follow here
"""


@pytest.fixture(scope="module")
def scan_cluster(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("orphans"), replicas=3, coordinators=2,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG), extra_env=dict(SCANNER_ENV))
    yield from running_cluster(request, config)


def unique(name: str) -> str:
    return f"wal/{name}-{uuid.uuid4().hex[:10]}"


def test_a_file_uploaded_by_hand_with_no_commit_is_removed_after_the_grace_period_and_not_before(scan_cluster):
    store, scanner = store_of(scan_cluster), scanner_client(scan_cluster)
    key = unique("by-hand")
    uploaded = time.monotonic()
    upload(store, key)

    early = scanner.scan_now()
    assert early.ok, early
    assert key not in early.deleted_keys and store.head(key) is not None
    assert early.skipped >= 1

    wait_past_grace(uploaded)
    late = scanner.scan_now()
    assert late.ok, late
    assert key in late.deleted_keys and store.head(key) is None
    assert late.deleted >= 1 and late.deleted_bytes >= 256
    assert metric(scan_cluster, "lowtide_orphan_files_deleted_total") >= 1
    assert metric(scan_cluster, "lowtide_orphan_scans_total", result="success") >= 2


def test_a_file_left_by_a_broker_killed_between_upload_and_commit_is_removed_after_the_grace_period(scan_cluster):
    store, scanner = store_of(scan_cluster), scanner_client(scan_cluster)
    key = unique("killed-broker")
    broker = subprocess.Popen([sys.executable, "-c", BROKER_SCRIPT, scan_cluster.object_store_url, key],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert broker.stdout.readline().strip() == "uploaded"
        uploaded = time.monotonic()  # the upload finished (its mtime is earlier)
    finally:
        broker.send_signal(signal.SIGKILL)
        broker.wait(10)
    assert broker.returncode == -signal.SIGKILL
    assert store.head(key) is not None

    before = scanner.scan_now()
    assert before.ok and store.head(key) is not None, before

    wait_past_grace(uploaded)
    after = scanner.scan_now()
    assert after.ok and key in after.deleted_keys and store.head(key) is None, after


def test_a_dry_run_reports_the_orphans_and_deletes_nothing(scan_cluster):
    store, scanner = store_of(scan_cluster), scanner_client(scan_cluster)
    keys = [unique("dry") for _ in range(3)]
    started = time.monotonic()
    for key in keys:
        upload(store, key)
    wait_past_grace(started)

    report = scanner.scan_now(dry_run=True)
    assert report.ok and report.dry_run, report
    assert set(keys) <= set(report.orphan_keys) and report.deleted == 0 and report.deleted_keys == ()
    assert all(store.head(k) is not None for k in keys)

    real = scanner.scan_now()
    assert set(keys) <= set(real.deleted_keys) and all(store.head(k) is None for k in keys)


def test_a_shard_stopped_before_a_scan_makes_it_delete_nothing(scan_cluster):
    store, scanner = store_of(scan_cluster), scanner_client(scan_cluster)
    key = unique("paused-shard")
    started = time.monotonic()
    upload(store, key)
    wait_past_grace(started)
    failures_before = metric(scan_cluster, "lowtide_orphan_scan_failures_total", reason="shard_unavailable")
    errors_before = metric(scan_cluster, "lowtide_orphan_scans_total", result="error")

    scan_cluster.pause("coordinator-1")
    try:
        report = scanner.scan_now()
    finally:
        scan_cluster.resume("coordinator-1")

    assert report.failure == "shard_unavailable" and "coordinator-1" in report.failure_detail, report
    assert report.deleted == 0 and store.head(key) is not None
    assert metric(scan_cluster, "lowtide_orphan_scan_failures_total", reason="shard_unavailable") == failures_before + 1
    assert metric(scan_cluster, "lowtide_orphan_scans_total", result="error") == errors_before + 1

    deadline = time.monotonic() + 30
    while True:  # the resumed shard may need to renew its lease before it answers again
        again = scanner.scan_now()
        if again.ok or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert again.ok and key in again.deleted_keys and store.head(key) is None, again


def test_a_shard_stopped_during_a_scan_stops_the_deletes_at_once(scan_cluster):
    store, scanner = store_of(scan_cluster), scanner_client(scan_cluster)
    prefix = unique("mid-scan")
    keys = [f"{prefix}/{i:05d}" for i in range(3000)]  # 30 DescribeFiles batches of 100
    for key in keys:
        store.put(key, b"x" * 64)
    wait_past_grace(time.monotonic())  # every object, the last one put included, is past the grace

    result: dict = {}
    scan = threading.Thread(target=lambda: result.update(report=scanner.scan_now()))
    scan.start()
    deleted_at_pause = None
    try:
        deadline = time.monotonic() + 30
        while deleted_at_pause is None and time.monotonic() < deadline:
            status = scanner.status()
            if status.running and status.current is not None and status.current.deleted >= 200:
                scan_cluster.pause("coordinator-0")
                deleted_at_pause = scanner.status().current.deleted
            time.sleep(0.005)
        scan.join(60)
    finally:
        scan_cluster.resume("coordinator-0")
    assert deleted_at_pause is not None, "the scan finished before the shard could be stopped"
    report = result["report"]
    assert report.failure == "shard_unavailable" and "coordinator-0" in report.failure_detail, report
    remaining = sum(1 for _ in store.list(prefix=prefix + "/"))
    # Deleted after the stop, at most: the batch that was being deleted when the progress was
    # reported (deletes run one batch behind the DescribeFiles) and the batch whose answers were
    # all in when the shard stopped. Every one of them was confirmed unknown to both shards.
    assert deleted_at_pause <= report.deleted <= deleted_at_pause + 200
    assert remaining == len(keys) - report.deleted > 0


def test_the_scanner_refuses_a_grace_period_a_commit_in_flight_could_outlast(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "lowtide.cli.main", "serve", "orphan-scanner", "--object-store", str(tmp_path),
         "--grace-period-ms", "10000", "--append-timeout-ms", "10000", "--commit-interval-ms", "250",
         "--commit-timeout-ms", "5000",
         "--grpc-addr", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "--grace-period-ms 10000 is too short" in run.stderr and "10250 ms" in run.stderr


def lowtide_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lowtide.cli.main", *args], capture_output=True, text=True,
                          timeout=120)


def test_the_cli_scans_lists_what_it_found_and_deletes_only_without_dry_run(scan_cluster):
    store = store_of(scan_cluster)
    key = unique("cli")
    started = time.monotonic()
    upload(store, key)
    wait_past_grace(started)

    # The bootstrap server alone: the front door forwards to the scanner registered in the cluster.
    dry = lowtide_cli("orphans", "scan", "--bootstrap-server", scan_cluster.bootstrap, "--dry-run", "--output", "json")
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert doc["dry_run"] and key in doc["orphan_keys"] and doc["deleted"] == 0 and store.head(key) is not None
    assert {"listed", "skipped", "candidates", "known", "orphans", "deleted", "deleted_bytes"} <= doc.keys()

    # --scanner-address still overrides it.
    real = lowtide_cli("orphans", "scan", "--bootstrap-server", "127.0.0.1:1",
                       "--scanner-address", scan_cluster.service("orphan-scanner-0").grpc)
    assert real.returncode == 0, real.stderr
    assert f"deleted {key}" in real.stdout and store.head(key) is None


def test_the_cli_says_no_scanner_is_registered_when_none_runs(scan_cluster):
    scan_cluster.stop_service("orphan-scanner-0")  # it deregisters as it stops
    try:
        run = lowtide_cli("orphans", "scan", "--bootstrap-server", scan_cluster.bootstrap, "--output", "json")
    finally:
        scan_cluster.start_service("orphan-scanner-0")
    assert run.returncode == 1, run.stdout
    error = json.loads(run.stdout)["error"]
    assert error["code"] == "COORDINATOR_NOT_AVAILABLE", error
    assert "no orphan scanner is registered" in error["message"] and "--scanner-address" in error["message"]
