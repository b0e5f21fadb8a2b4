"""The ``diskless_scaling`` section of ``tests.bench.run`` (issue 32): does diskless produce scale
with the requests in flight?

One cluster of its own (3 replicas, 2 coordinator shards, local object store). In the same run:
diskless produce (acks=all; answered once the WAL file holding the batch is committed) with 1, 4,
16 and 64 concurrent producers, each a thread sending one 256 KiB pre-built batch at a time and
waiting for the answer (closed loop), round-robin over the replicas and 6 partitions; then classic
produce RF 3 acks=all by 16 producers the same way. Each run lasts a fixed time (a producer that
waits a commit interval per request would take minutes to send a fixed byte count alone).
A producer retries a retriable error after 100 ms (Kafka's retry.backoff.ms), to the same
replica; its latency runs from the first send. A broker refuses a diskless produce at once when 48
are already waiting for commits there (lowtide.diskless.produce: the handler threads they hold are
also what the commits need), and closed-loop producers cycling over the replicas drift to the
slowest one, so at 64 producers a few retries are expected; they are counted.
Reported per run: MB/s, p50/p99 produce latency, retries, CPU ms per MB of every process (utime +
stime, /proc/PID/stat). Judged: diskless at 16+ producers >= 0.5 x classic; p99 <= commit interval + 250 ms.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from lowtide.client import Admin
from lowtide.client.replica import ReplicaClient
from lowtide.diskless.produce import DisklessConfig
from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.bench.common import Bench, Figure, KiB, build_batch, cpu_per_unit, cpu_snapshot, percentile, say

REQUEST_BYTES = 256 * KiB
PARTITIONS = 6
PRODUCERS = (1, 4, 16, 64)
CLASSIC_PRODUCERS = 16
# The brokers run with the default diskless.commit.interval.ms (the cluster passes none).
COMMIT_INTERVAL_MS = DisklessConfig(broker_id=0).commit_interval_ms
RETRY_BACKOFF_S = 0.1


def _targets(cluster: LocalCluster, topic: str, *, diskless: bool) -> list[tuple[str, int]]:
    """(replica address, partition) pairs to cycle through: a diskless partition takes produce on
    any replica; a classic one only on its leader (waited for)."""
    addresses = [s.grpc for s in cluster.services("replica")]
    if diskless:
        return [(addresses[i % len(addresses)], i % PARTITIONS) for i in range(len(addresses) * PARTITIONS)]
    deadline = time.monotonic() + 60
    with Admin(cluster.bootstrap) as admin:
        while True:
            snap = admin.describe_cluster([topic])
            parts = snap.topic(topic).partitions
            if len(parts) == PARTITIONS and all(p.leader in snap.brokers for p in parts):
                return [(f"{snap.brokers[p.leader].host}:{snap.brokers[p.leader].port}", p.partition)
                        for p in parts]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no leaders for {topic}")
            time.sleep(0.2)


def _run(cluster: LocalCluster, topic: str, producers: int,
         seconds: float) -> tuple[float, list[float], dict[str, float], int]:
    """``producers`` closed-loop threads for ``seconds``: (MB/s, latencies in s, CPU ms per MB,
    retries)."""
    batch, _ = build_batch(REQUEST_BYTES)
    targets = _targets(cluster, topic, diskless="diskless" in topic)
    client = ReplicaClient()
    latencies: list[float] = []
    sent = [0]
    retries = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker(k: int) -> None:
        i = k
        mine: list[float] = []
        again = 0
        while time.perf_counter() < stop_at:
            began = time.perf_counter()
            address, partition = targets[i % len(targets)]
            while True:
                [answer] = client.produce(address, [(topic, partition, batch)], acks=-1, timeout_ms=30000,
                                          deadline_s=40)
                if answer.error is None:
                    break
                assert answer.error.retriable, answer.error
                again += 1
                time.sleep(RETRY_BACKOFF_S)
            mine.append(time.perf_counter() - began)
            i += 1
        with lock:
            latencies.extend(mine)
            sent[0] += len(mine) * len(batch)
            retries[0] += again

    pids = {s.name: s.pid for s in cluster.services()} | {"bench (load generator)": os.getpid()}
    before = cpu_snapshot(pids)
    began = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(producers)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    took = time.perf_counter() - began
    after = cpu_snapshot(pids)
    client.close()
    mb = sent[0] / 1e6
    return (mb / took, latencies, {n: ms for n, ms in cpu_per_unit(before, after, mb).items() if ms > 0},
            retries[0])


def diskless_scaling_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    config = ClusterConfig(data_dir=data_dir, replicas=3, coordinators=2, orphan_scanners=0)
    cluster = LocalCluster(config)
    say(f"diskless_scaling: starting a cluster with 2 coordinator shards in {data_dir}")
    cluster.up(detach=True)
    seconds = 6.0 if quick else 20.0
    runs: dict[str, tuple[float, list[float], dict[str, float], int]] = {}
    try:
        admin = Admin(cluster.bootstrap)
        admin.create_topic("bench-dscale-diskless", partitions=PARTITIONS, diskless=True)
        admin.create_topic("bench-dscale-classic", partitions=PARTITIONS, replication_factor=3)
        admin.close()
        # A just-created partition's metadata may name a leader before it hosts the log: wait until
        # every replica of the classic topic hosts it (the diskless one lives with the shards).
        bench = Bench(cluster)
        bench.wait_replicated("bench-dscale-classic")
        bench.close()
        _run(cluster, "bench-dscale-classic", 4, 1.0)  # warm-up: connections, leaders known
        _run(cluster, "bench-dscale-diskless", 4, 1.0)
        runs["classic"] = _run(cluster, "bench-dscale-classic", CLASSIC_PRODUCERS, seconds)
        for n in PRODUCERS:
            runs[f"diskless {n}"] = _run(cluster, "bench-dscale-diskless", n, seconds)
        runs["classic again"] = _run(cluster, "bench-dscale-classic", CLASSIC_PRODUCERS, seconds)
    finally:
        cluster.down(timeout_s=10.0)
    # The median of the two classic runs (before and after the diskless ones: a neighbour's load
    # on the shared machine falls on both kinds).
    classic = (runs["classic"][0] + runs["classic again"][0]) / 2
    figures = []
    for name, (mbs, lat, cpu, retried) in runs.items():
        p50, p99 = percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3
        cpu_text = ", ".join(f"{n} {ms:.1f}" for n, ms in cpu.items())
        say(f"diskless_scaling: {name}: {mbs:.1f} MB/s, p50 {p50:.0f} ms p99 {p99:.0f} ms, {retried} retries; "
            f"CPU ms/MB: {cpu_text}")
        key = name.replace(" ", "_")
        common = dict(unit="MB/s", params={"p50_ms": p50, "p99_ms": p99, "requests": len(lat), "retries": retried,
                                           "request_bytes": REQUEST_BYTES, "cpu_ms_per_mb": cpu,
                                           "commit_interval_ms": COMMIT_INTERVAL_MS, "seconds": seconds})
        note = (f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, {retried} retries of {len(lat)} requests; 256 KiB requests, "
                f"closed loop; CPU ms/MB: {cpu_text}")
        if name.startswith("diskless"):
            n = int(name.split()[1])
            judged = n >= 16
            figures.append(Figure(key=f"dscale_{key}_mbs", name=f"diskless produce, {n} producers", value=mbs,
                                  target=">= 0.5 x classic RF 3 acks=all" if judged else None,
                                  target_value=0.5 * classic if judged else None,
                                  better="higher" if judged else None,
                                  note=note + f"; classic {classic:.1f} MB/s", **common).judge())
            figures.append(Figure(key=f"dscale_{key}_p99_ms", name=f"diskless produce p99, {n} producers", value=p99,
                                  unit="ms", target=(f"p99 <= commit interval + 250 ms ({COMMIT_INTERVAL_MS + 250} ms)"
                                          if judged else None),
                                  target_value=COMMIT_INTERVAL_MS + 250 if judged else None,
                                  better="lower" if judged else None, note=f"p50 {p50:.0f} ms").judge())
        else:
            figures.append(Figure(key=f"dscale_{key}_mbs", name=f"{name} produce RF 3 acks=all, 16 producers",
                                  value=mbs, note=note, **common).judge())
    return figures
