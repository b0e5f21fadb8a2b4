"""The control plane on etcd (issue 51): what a metadata change costs, and failover and restart
with many partitions. Reports; never asserts.

On a cluster of its own (3 replicas, one etcd member), with one topic of ``partitions`` partitions
RF 3 (quick: 60, full: 3,000, as Apache Kafka 4.1 was measured on this box: failover 7.5 s,
restart to a full ISR 19.9 s, docs/testing.md):

* ``metadata_isr_change_p50_ms`` / ``_p99_ms``: an ISR change as a leader writes it (AlterPartition:
  a compare-and-set on the partition's key in one etcd transaction), from the call until the
  writer's image shows it; sequential, on a partition of its own;
* ``metadata_election_p50_ms`` / ``_p99_ms``: per partition, from the moment the killed broker's
  session ended (etcd deleted its ``alive`` key: seen by the bench's own watch) to the moment its
  new leader is in the metadata (the controller's election write, seen the same way);
* ``failover_kill9_s``: kill -9 of one replica until every partition it led is led elsewhere
  (includes the session timeout, as Kafka's figure includes its own);
* ``restart_full_isr_s``: that replica started again until every partition's ISR is full.
"""

from __future__ import annotations

import time
from pathlib import Path

from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.metadata.store import MetadataStore
from tests.bench.common import Figure, percentile, say

TOPIC = "metadata-bench"


def _wait(predicate, *, timeout_s: float, what: str, interval_s: float = 0.02) -> float:
    began = time.monotonic()
    while not predicate():
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"{what} not within {timeout_s:.0f}s")
        time.sleep(interval_s)
    return time.monotonic() - began


def metadata_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    partitions = 60 if quick else 3000
    changes = 50 if quick else 300
    cluster = LocalCluster(ClusterConfig(data_dir=data_dir, replicas=3, coordinators=0, orphan_scanners=0))
    cluster.up(detach=True, progress=lambda m: say(f"  metadata cluster: {m}"))
    store = MetadataStore.from_url(cluster.metadata_url)
    try:
        store.start()
        return _measure(cluster, store, partitions=partitions, changes=changes)
    finally:
        store.close()
        cluster.down(timeout_s=10.0)


def _measure(cluster: LocalCluster, store: MetadataStore, *, partitions: int, changes: int) -> list[Figure]:
    from tests.bench.common import Bench

    bench = Bench(cluster)
    try:
        began = time.monotonic()
        bench.create_topic(TOPIC, partitions, 3)
        bench.create_topic(TOPIC + "-isr", 1, 3)
        _wait(lambda: len(store.partition_states(TOPIC)) == partitions, timeout_s=300, what="topic created")
        say(f"metadata: {partitions} partitions created in {time.monotonic() - began:.1f}s")

        isr_ms = []
        for _ in range(changes):
            state = store.partition_state(TOPIC + "-isr", 0)
            t0 = time.perf_counter()
            store.update_isr(topic=state.topic, partition=0, leader=state.leader, leader_epoch=state.leader_epoch,
                             isr=state.isr)
            isr_ms.append((time.perf_counter() - t0) * 1000)

        victim = 0
        led = {s.partition for s in store.partition_states(TOPIC) if s.leader == victim}
        seen: dict[int, float] = {}
        session_end: list[float] = []

        def on_change(keys: list[str]) -> None:
            now = time.monotonic()
            if not session_end and victim not in store.live_broker_ids():
                session_end.append(now)
            for s in store.partition_states(TOPIC):
                if s.partition in led and s.partition not in seen and s.leader not in (victim, -1):
                    seen[s.partition] = now

        store.listen(on_change)
        killed = time.monotonic()
        cluster.kill(f"replica-{victim}")
        failover_s = _wait(lambda: len(seen) == len(led), timeout_s=300, what="every partition led elsewhere")
        elections = [(t - session_end[0]) * 1000 for t in seen.values()] if session_end else []
        say(f"metadata: failover of {len(led)} partitions in {failover_s:.1f}s")

        started = time.monotonic()
        cluster.start_service(f"replica-{victim}")
        restart_s = _wait(lambda: all(len(s.isr) == 3 for s in store.partition_states(TOPIC)), timeout_s=600,
                          what="every ISR full", interval_s=0.2)
        restart_s = time.monotonic() - started
        say(f"metadata: restart to a full ISR in {restart_s:.1f}s (killed {started - killed:.1f}s before)")
    finally:
        bench.close()
    params = {"partitions": partitions, "rf": 3, "changes": changes}
    return [
        Figure("metadata_isr_change_p50_ms", "metadata change on etcd: ISR change p50", percentile(isr_ms, 50), "ms",
               params=params),
        Figure("metadata_isr_change_p99_ms", "metadata change on etcd: ISR change p99", percentile(isr_ms, 99), "ms",
               params=params),
        Figure("metadata_election_p50_ms", "metadata change on etcd: election after a session ends, p50",
               percentile(elections, 50) if elections else None, "ms", params=params),
        Figure("metadata_election_p99_ms", "metadata change on etcd: election after a session ends, p99",
               percentile(elections, 99) if elections else None, "ms", params=params),
        Figure("failover_kill9_s", f"failover after kill -9, {partitions} partitions RF 3", failover_s, "s",
               target="at or under Apache Kafka 4.1 (7.5 s at 3,000 partitions)", params=params),
        Figure("restart_full_isr_s", f"restart to a full ISR, {partitions} partitions RF 3", restart_s, "s",
               target="at or under Apache Kafka 4.1 (19.9 s at 3,000 partitions)", params=params),
    ]

