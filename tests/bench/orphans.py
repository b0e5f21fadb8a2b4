"""Orphan scan benchmark (docs/testing.md#targets: 100,000 objects in <= 10 s on the local store).

A local cluster with two real coordinator shards (1 replica, no front-door traffic) vouches for
nothing: every object is an orphan, the worst case (list, ask both shards over gRPC in batches of
1,000, delete every object). Objects are written beforehand with their modification time set an
hour back, so all are older than the threshold. The scan is the scanner service's own code
(``run_scan`` with the gRPC shard views it uses), run in the bench process. Then the same on
moto's S3 server (a real HTTP server process): reported, no target.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.metadata.store import MetadataStore
from lowtide.objectstore import ObjectStore, open_object_store
from lowtide.rpc.channels import ChannelPool
from lowtide.scanner.scan import ScanConfig, run_scan
from lowtide.scanner.shards import discover_shards
from tests import s3server
from tests.bench.common import Figure, failed, say

HOUR_S = 3600


def _fill_local(root: Path, count: int) -> None:
    wal = root / "wal"
    wal.mkdir(parents=True, exist_ok=True)
    old = time.time() - HOUR_S
    for i in range(count):
        path = wal / f"{i:032x}"
        path.write_bytes(b"w" * 64)
        os.utime(path, (old, old))


def _fill_s3(store: ObjectStore, count: int) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.put(f"wal/{i:032x}", b"w" * 64), range(count)))


def _scan(store: ObjectStore, registry: MetadataStore, *, now_ms: int) -> tuple[float, object]:
    channels = ChannelPool()
    try:
        shards = discover_shards(registry, expected=2, channels=channels, metadata=(), timeout_s=30)
        began = time.perf_counter()
        report = run_scan(store, shards, config=ScanConfig(grace_period_ms=60_000, prefix="wal/"), now_ms=now_ms)
        return time.perf_counter() - began, report
    finally:
        channels.close()


def orphan_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    local_count = 100_000
    s3_count = 5_000 if quick else 100_000
    config = ClusterConfig(data_dir=data_dir, replicas=1, coordinators=2, orphan_scanners=0)
    cluster = LocalCluster(config)
    figures: list[Figure] = []
    say(f"orphans: starting 1 replica + 2 coordinator shards in {data_dir}")
    cluster.up(detach=True)
    try:
        root = data_dir / "objects"
        say(f"orphans: writing {local_count:,} objects to the local store")
        _fill_local(root, local_count)
        # The scan's threshold is now - grace; every object is an hour old, so all are candidates.
        seconds, report = _scan(open_object_store(root.as_uri()), cluster.metadata_store(),
                                now_ms=int(time.time() * 1000))
        assert report.ok and report.deleted_count == local_count, report
        figures.append(Figure(
            key="orphan_scan_s", name="orphan scan of 100,000 objects, local store (all orphans, deleted)",
            value=seconds, unit="s", target="<= 10 s", target_value=10.0, better="lower",
            params={"objects": local_count, "shards": 2, "describe_batch": 1000},
            note=f"{local_count / seconds:,.0f} objects/s: list + DescribeFiles to 2 shards over gRPC + delete"))
        figures.append(_s3_figure(data_dir, cluster.metadata_store(), s3_count))
    finally:
        cluster.down(timeout_s=10)
    return [f.judge() for f in figures]


def _s3_figure(data_dir: Path, registry: MetadataStore, count: int) -> Figure:
    key, name = "orphan_scan_s3_s", f"orphan scan of {count:,} objects, moto S3 server (all orphans, deleted)"
    if not s3server.is_available():
        return failed(key, name, "s", None, s3server.MISSING)
    with s3server.moto_server(data_dir) as endpoint:
        store = open_object_store(f"s3://orphans/bench?endpoint={endpoint}",
                                  access_key_id="testing", secret_access_key="testing")
        deadline = time.monotonic() + 30
        while True:
            try:
                store.create_bucket()
                break
            except Exception:  # noqa: BLE001 - the server is still starting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        say(f"orphans: writing {count:,} objects to moto's S3 server")
        _fill_s3(store, count)
        # S3 stamps objects itself: the scan's clock is moved forward instead of the objects back.
        seconds, report = _scan(store, registry, now_ms=int(time.time() * 1000) + 2 * HOUR_S * 1000)
        assert report.ok and report.deleted_count == count, report
        return Figure(key=key, name=name, value=seconds, unit="s", params={"objects": count, "shards": 2},
                      note=f"{count / seconds:,.0f} objects/s (DeleteObjects, 1,000 keys a request)")
