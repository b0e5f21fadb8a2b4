"""The scanner service around one scan: its periodic loop, its reports and metrics, and a shard
list that cannot be built (a missing shard) counted as a failed scan that deletes nothing.
Real local object store and real coordinator domain cores (tests/unit/coordinator/shard.py)."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY

from lowtide.scanner.scan import ScanConfig, ScanFailure
from lowtide.scanner.service import ScannerConfig, ScannerService
from tests.unit.scanner.test_scan import CoreShard, age, committed_file, shards, store  # noqa: F401 - fixtures

GRACE_MS = 60_000


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def service_of(store, views, *, interval_ms: int = 3_600_000) -> ScannerService:  # noqa: F811
    return ScannerService(store=store, config=ScannerConfig(scan=ScanConfig(grace_period_ms=GRACE_MS, prefix="wal/"),
                                                            scan_interval_ms=interval_ms),
                          find_shards=lambda: views)


def test_the_periodic_loop_deletes_an_old_orphan_and_keeps_a_committed_file(store, shards):  # noqa: F811
    committed_file(shards[0], store, "wal/committed")
    store.put("wal/orphan", b"o" * 10)
    for key in ("wal/committed", "wal/orphan"):
        age(store, key, ms=3 * GRACE_MS)
    # The committed file's row is younger than the objects: move the shard's view of it back too.
    views = [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)]
    views[0].oldest_file_created_ms = lambda: int(time.time() * 1000) - 2 * GRACE_MS
    deleted_before = sample("lowtide_orphan_files_deleted_total")
    service = service_of(store, views, interval_ms=50)
    service.start()
    try:
        deadline = time.monotonic() + 10
        while store.head("wal/orphan") is not None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        service.stop()
    assert store.head("wal/orphan") is None and store.head("wal/committed") is not None
    assert sample("lowtide_orphan_files_deleted_total") >= deleted_before + 1
    assert service.state().last is not None and service.state().last.ok


def test_a_missing_shard_makes_a_failed_scan_that_deletes_nothing(store):  # noqa: F811
    store.put("wal/orphan", b"o")
    age(store, "wal/orphan", ms=3 * GRACE_MS)

    def find_shards():
        raise ScanFailure("shards_missing", "1 of 2 coordinator shards registered; missing [1]")

    errors_before = sample("lowtide_orphan_scans_total", result="error")
    missing_before = sample("lowtide_orphan_scan_failures_total", reason="shards_missing")
    service = ScannerService(store=store, config=ScannerConfig(scan=ScanConfig(grace_period_ms=GRACE_MS),
                                                               scan_interval_ms=3_600_000), find_shards=find_shards)
    report, _, names = service.scan()
    assert report.failure == "shards_missing" and names == () and store.head("wal/orphan") is not None
    assert sample("lowtide_orphan_scans_total", result="error") == errors_before + 1
    assert sample("lowtide_orphan_scan_failures_total", reason="shards_missing") == missing_before + 1


def test_a_dry_run_reports_the_orphans_it_would_delete(store, shards):  # noqa: F811
    store.put("wal/orphan", b"o" * 7)
    age(store, "wal/orphan", ms=3 * GRACE_MS)
    report, _, names = service_of(store, [CoreShard(s, f"dc-{i}") for i, s in enumerate(shards)]).scan(dry_run=True)
    assert report.ok and report.orphan_keys == ["wal/orphan"] and report.deleted_count == 0
    assert names == ("dc-0", "dc-1") and store.head("wal/orphan") is not None
