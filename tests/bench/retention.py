"""Broker-side consumed retention (KIP-68, issue 12): the cost of one retention pass over 1,000
partitions.

A 1,000-partition RF 3 topic with ``consumed.retention.ms=0`` (leaders spread over the 3 replicas),
one small batch produced to each partition, then two groups commit the high watermark of every
partition. Each replica's retention pass (every ``log.retention.check.interval.ms``) reads the
group offsets from ``__consumer_offsets`` (fetching from its leaders), decides per led partition
and raises the log start offsets. The replicas report each pass in
``lowtide_consumed_retention_last_pass_{seconds,partitions,raised}``; the bench polls them.

* ``consumed_retention_pass_ms``: a steady pass (nothing new to delete: offsets re-read, every
  partition decided), summed over the three replicas, i.e. the cost of looking at all 1,000.
* ``consumed_retention_deleting_pass_ms``: the passes that raised the log start offsets of all
  1,000 partitions (each raise is made durable before it is taken, as for DeleteRecords), summed.
"""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from lowtide.client.admin import Admin
from tests.bench.common import Bench, Figure, KiB, build_batch, failed, say

TOPIC = "bench-consumed-wide"
GROUPS = ("bench-fast", "bench-slow")


def _pass_stats(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("lowtide_consumed_retention_") and "topic" not in sample.labels:
                out[sample.name.removeprefix("lowtide_consumed_retention_")] = sample.value
    return out


def retention_pass_cost(bench: Bench, partitions: int = 1000, *, timeout_s: float = 120.0) -> list[Figure]:
    key, name = "consumed_retention_pass_ms", f"broker-side consumed retention pass over {partitions:,} partitions"
    try:
        began = time.monotonic()
        bench.create_topic(TOPIC, partitions, 3, {"consumed.retention.ms": "0"})
        batch, count = build_batch(10 * (KiB + 8))
        bench.produce_all(TOPIC, {p: batch for p in range(partitions)}, acks=-1)
        bench.wait_replicated(TOPIC, timeout_s=120)
        # Counted from before the commits: a replica's first pass after them may come at once.
        urls = {s.name: s.metrics_url for s in bench.cluster.services("replica")}
        seen = {n: _pass_stats(u).get("passes_total", 0.0) for n, u in urls.items()}
        with Admin(bench.cluster.bootstrap) as admin:
            for group in GROUPS:
                errors = admin.commit_offsets(group, {(TOPIC, p): count for p in range(partitions)})
                bad = [e for e in errors.values() if e is not None]
                if bad:
                    raise RuntimeError(f"commit of {group} failed: {bad[0]}")
        say(f"retention: {partitions} partitions filled and committed in {time.monotonic() - began:.1f}s")
        deleting: dict[str, list[float]] = {n: [] for n in urls}
        steady: dict[str, list[float]] = {n: [] for n in urls}
        raised = dict.fromkeys(urls, 0.0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not (sum(raised.values()) >= partitions
                                                    and all(len(v) >= 2 for v in steady.values())):
            for n, url in urls.items():
                stats = _pass_stats(url)
                if stats.get("passes_total", 0.0) <= seen[n]:
                    continue
                seen[n] = stats["passes_total"]
                if stats.get("last_pass_raised", 0.0) > 0:
                    deleting[n].append(stats["last_pass_seconds"])
                    raised[n] += stats["last_pass_raised"]
                elif raised[n] > 0:  # after this replica's deleting pass: nothing new to delete
                    steady[n].append(stats["last_pass_seconds"])
            time.sleep(0.2)
        if sum(raised.values()) < partitions or not all(steady.values()):
            raise RuntimeError(f"passes did not finish in {timeout_s:.0f}s: raised {raised}, steady {steady}")
    except Exception as exc:  # noqa: BLE001
        say(f"retention: failed: {exc!r}")
        return [failed(key, name, "ms", None, exc)]
    finally:
        bench.delete_topic(TOPIC)
    steady_ms = sum(min(v) for v in steady.values()) * 1e3
    deleting_ms = sum(sum(v) for v in deleting.values()) * 1e3
    per_replica = {n: round(min(v) * 1e3, 1) for n, v in steady.items()}
    say(f"retention: steady pass {steady_ms:.1f} ms over {partitions} partitions ({per_replica}); "
        f"deleting passes {deleting_ms:.1f} ms")
    return [
        Figure(key=key, name=name, value=steady_ms, unit="ms",
               note=f"nothing new to delete; sum over the 3 replicas of their best pass ({per_replica} ms), "
                    f"each leading ~{partitions // 3}", params={"partitions": partitions, "per_replica_ms": per_replica,
                                                                "samples_s": steady}),
        Figure(key="consumed_retention_deleting_pass_ms", name=f"consumed retention passes raising {partitions:,} "
                                                                "log start offsets", value=deleting_ms, unit="ms",
               note="sum over the replicas of the passes that raised log start offsets (durable LSO writes)",
               params={"partitions": partitions, "samples_s": deleting}),
    ]
