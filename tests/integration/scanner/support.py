"""Helpers of the orphan scanner's integration tests: the cluster settings they share, the
scanner's client, its metrics, and a WAL file uploaded the way a broker uploads one."""

from __future__ import annotations

import os
import time
import urllib.request

from lowtide.client.scanner import ScannerClient
from lowtide.localcluster import LocalCluster
from lowtide.objectstore import ObjectStore, open_object_store

GRACE_MS = 3000
APPEND_TIMEOUT_MS = 2000
COMMIT_INTERVAL_MS = 250
# Short grace for tests, still obeying the scanner's rule (grace > commit interval + max(commit
# timeout, append timeout)): the coordinators get the same append timeout through the same variable.
SCANNER_ENV = {
    "LOWTIDE_GRACE_PERIOD_MS": str(GRACE_MS),
    "LOWTIDE_APPEND_TIMEOUT_MS": str(APPEND_TIMEOUT_MS),
    "LOWTIDE_COMMIT_INTERVAL_MS": str(COMMIT_INTERVAL_MS),
    "LOWTIDE_COMMIT_TIMEOUT_MS": str(APPEND_TIMEOUT_MS),
    "LOWTIDE_SCAN_INTERVAL_MS": "3600000",  # scans only when a test asks (ScanNow)
    "LOWTIDE_SHARD_TIMEOUT_MS": "1500",
    "LOWTIDE_DESCRIBE_BATCH": "100",
    "LOWTIDE_FILE_DELETE_GRACE_MS": "500",
    "LOWTIDE_FILE_LIFETIME_INTERVAL_MS": "200",
}


def scanner_client(cluster: LocalCluster) -> ScannerClient:
    return ScannerClient(cluster.service("orphan-scanner-0").grpc)


def store_of(cluster: LocalCluster) -> ObjectStore:
    return open_object_store(cluster.object_store_url)


def metric(cluster: LocalCluster, name: str, **labels: str) -> float:
    """One sample of the scanner's /metrics (0 when the series does not exist yet)."""
    with urllib.request.urlopen(cluster.service("orphan-scanner-0").metrics_url, timeout=5) as response:
        text = response.read().decode()
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def upload(store: ObjectStore, key: str, size: int = 256) -> bytes:
    """Put a WAL file as a broker does (the bytes are random: they are only read back)."""
    data = os.urandom(size)
    store.put(key, data)
    return data


def wait_past_grace(started_monotonic: float, *, extra_s: float = 0.3) -> None:
    """Sleep until the grace period has passed since ``started_monotonic`` (an upload's start)."""
    remaining = started_monotonic + GRACE_MS / 1000 + extra_s - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
