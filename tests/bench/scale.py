"""What a cluster costs per partition at rest (issue 48's scale curve, lowtide's side). Reports;
never asserts.

At each size (quick: 300; full: 300, 3,000 and 10,000 partitions RF 3), on a cluster of its own
(3 replicas, one front door, one etcd member, no coordinators), one topic of that many partitions
is created through the front door, then the bench waits ``settle_s`` and measures over
``window_s``:

* ``scale_<n>_idle_cpu_pct``: CPU of every server process summed (replicas, front door, etcd,
  Redis), in % of one core, from /proc (utime + stime);
* ``scale_<n>_replica_rss_mib`` / ``scale_<n>_replica_fds``: the largest replica's resident memory
  and open file descriptors at the end of the window;
* ``scale_<n>_create_s``: CreateTopics until the store holds every partition;

then, after the window:

* ``scale_<n>_produce_all_s``: one acks=all record to every partition, one Produce per leader
  (raw gRPC, the three leaders in parallel), until every leader answered without error;
* ``scale_<n>_delete_records_s``: DeleteRecords of every partition up to offset 1 in one call
  through the front door, until it answered without error.

Apache Kafka 4.1's side of the curve (the same sizes and rows on this box) is the ``kafka_scale``
section (kafka_scale.py); run together, ``run.py`` gives each of these figures its ratio to Kafka's.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.metadata.store import MetadataStore
from lowtide.record import encode_batch
from tests.bench.common import Bench, Figure, check_delete, say

TOPIC = "scale-bench"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (``TICKS`` per second), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def scale_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    sizes = (300,) if quick else (300, 3000, 10000)
    settle_s, window_s = (10.0, 10.0) if quick else (60.0, 60.0)
    figures: list[Figure] = []
    for partitions in sizes:
        figures += _measure_size(data_dir / f"p{partitions}", partitions=partitions, settle_s=settle_s,
                                 window_s=window_s)
    return figures


def _measure_size(data_dir: Path, *, partitions: int, settle_s: float, window_s: float) -> list[Figure]:
    cluster = LocalCluster(ClusterConfig(data_dir=data_dir, replicas=3, coordinators=0, orphan_scanners=0))
    cluster.up(detach=True, progress=lambda m: say(f"  scale cluster: {m}"))
    store = MetadataStore.from_url(cluster.metadata_url)
    bench = Bench(cluster)
    try:
        store.start()
        began = time.monotonic()
        bench.create_topic(TOPIC, partitions, 3)
        while len(store.partition_states(TOPIC)) < partitions:
            if time.monotonic() - began > 300:
                raise TimeoutError(f"{partitions} partitions not created within 300 s")
            time.sleep(0.1)
        create_s = time.monotonic() - began
        bench.close()
        time.sleep(settle_s)
        pids = {e.name: e.pid for e in cluster.services() if e.pid}
        start = {name: cpu_ticks(pid) for name, pid in pids.items()}
        t0 = time.monotonic()
        time.sleep(window_s)
        elapsed = time.monotonic() - t0
        cpu = {name: (cpu_ticks(pid) - start[name]) / TICKS / elapsed * 100 for name, pid in pids.items()}
        replicas = [pid for name, pid in pids.items() if name.startswith("replica-")]
        rss = max(rss_mib(pid) for pid in replicas)
        fds = max(open_fds(pid) for pid in replicas)
        say(f"scale: {partitions} partitions RF 3: idle CPU {sum(cpu.values()):.1f}% of a core "
            f"({', '.join(f'{n} {c:.1f}%' for n, c in sorted(cpu.items()))}); replica RSS {rss:.0f} MiB, "
            f"{fds} fds")
        bench = Bench(cluster)
        produce_s = _produce_all(bench, partitions)
        say(f"scale: one acks=all record to each of {partitions} partitions in {produce_s:.2f}s")
        began = time.monotonic()
        resp = bench.delete_records_frontdoor([(TOPIC, p, 1) for p in range(partitions)], timeout_ms=60000)
        delete_s = time.monotonic() - began
        check_delete(resp)
        if len(resp.partitions) != partitions:
            raise RuntimeError(f"DeleteRecords: {len(resp.partitions)} results for {partitions} partitions")
        say(f"scale: DeleteRecords of {partitions} partitions in one call: {delete_s:.2f}s")
    finally:
        bench.close()
        store.close()
        cluster.down(timeout_s=10.0)
    params = {"partitions": partitions, "rf": 3, "replicas": 3, "settle_s": settle_s, "window_s": window_s}
    idle_target = ("<= 25 % of one core at 10,000 partitions RF 3 (issue 48)" if partitions == 10000 else None)
    return [
        Figure(f"scale_{partitions}_create_s", f"CreateTopics, {partitions} partitions RF 3", create_s, "s",
               params=params),
        Figure(f"scale_{partitions}_idle_cpu_pct", f"idle CPU, all server processes, {partitions} partitions RF 3",
               sum(cpu.values()), "% of a core", target=idle_target, target_value=25.0 if idle_target else None,
               better="lower" if idle_target else None, params=params).judge(),
        Figure(f"scale_{partitions}_replica_rss_mib", f"replica RSS, {partitions} partitions RF 3", rss, "MiB",
               params=params),
        Figure(f"scale_{partitions}_replica_fds", f"replica open descriptors, {partitions} partitions RF 3", fds,
               "fds", params=params),
        Figure(f"scale_{partitions}_produce_all_s", f"one acks=all record to every partition, {partitions} "
               "partitions RF 3", produce_s, "s", params={**params, "producer": "raw gRPC, one Produce per leader"}),
        Figure(f"scale_{partitions}_delete_records_s", f"DeleteRecords of every partition in one call, {partitions} "
               "partitions RF 3", delete_s, "s", params=params),
    ]


def _produce_all(bench: Bench, partitions: int) -> float:
    """Seconds for one acks=all record to every partition: one Produce per leader, in parallel."""
    leaders = bench.leaders(TOPIC)
    by_leader: dict[str, dict[int, bytes]] = {}
    for p, addr in leaders.items():
        by_leader.setdefault(addr, {})[p] = encode_batch([b"lowtide-scale-%d" % p])
    for addr in by_leader:
        bench.replica_stub(addr)  # channels open before the clock starts
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(by_leader)) as pool:
        for f in [pool.submit(bench.produce_once, addr, TOPIC, items, -1) for addr, items in by_leader.items()]:
            f.result()
    return time.monotonic() - began
