"""Replica memory over a produce/delete soak (docs/testing.md#targets: replica RSS flat, ±10 %, over 10 minutes).

A worker process produces to an RF 3 topic of 3 partitions (1 MiB segments) as fast as acks=all
allows, 64 KiB batches; every ``delete_every_s`` the driver deletes every partition up to its high
watermark (``DeleteRecords`` offset -1 through the front door), so segments keep being created and
removed. Every second the driver samples ``VmRSS`` of each replica process from
``/proc/PID/status``. "start" is the first sample after the warm-up (the first 10 % of the soak,
at least 5 s: imports, gRPC pools and page-cache-sized buffers settle there), "end" is the mean of
the last three samples, "peak" the maximum after warm-up. The figure is the worst replica's
|end / start - 1|.
"""

from __future__ import annotations

import time
from concurrent.futures import Executor
from typing import Any

from tests.bench import workers
from tests.bench.common import Bench, Figure, KiB, MiB, build_batch, failed, rss_bytes, say


def rss_soak(bench: Bench, pool: Executor, seconds: float, processes: int, delete_every_s: float = 2.0) -> list[Figure]:
    topic = "bench-soak"
    key, name = "replica_rss_drift_pct", f"replica RSS drift over a {seconds:.0f} s produce/delete soak (worst)"
    try:
        bench.create_topic(topic, 3, 3, {"segment.bytes": str(MiB)})
        leaders = bench.leaders(topic)
    except Exception as exc:  # noqa: BLE001
        return [failed(key, name, "%", "flat (±10 %)", exc)]
    batch, count = build_batch(64 * KiB)
    targets = [(leaders[p], topic, p) for p in sorted(leaders)]
    start_at = time.time() + 0.5
    specs = [{"targets": targets[k:] + targets[:k], "batch": batch, "records_per_batch": count, "acks": -1,
              "threads": 2, "start_at": start_at, "warmup_s": 0.0, "duration_s": seconds} for k in range(processes)]
    futures = [pool.submit(workers.produce_raw, s) for s in specs]
    pids = {s.name: s.pid for s in bench.replicas.values()}
    samples: dict[str, list[tuple[float, int]]] = {n: [] for n in pids}
    deletes = delete_errors = 0
    say(f"soak: {seconds:.0f}s produce ({processes} processes) + DeleteRecords(-1) every {delete_every_s:.0f}s, "
        f"sampling replica RSS every second")
    began = time.monotonic()
    next_delete = began + delete_every_s
    next_report = began + 10
    while (now := time.monotonic()) - began < seconds:
        for n, pid in pids.items():
            rss = rss_bytes(pid)
            if rss is not None:
                samples[n].append((now - began, rss))
        if now >= next_delete:
            next_delete += delete_every_s
            try:
                resp = bench.delete_records_frontdoor([(topic, p, -1) for p in leaders], timeout_ms=10000)
                deletes += 1
                delete_errors += sum(1 for r in resp.partitions if r.error_code)
            except Exception:  # noqa: BLE001 - keep soaking; counted
                delete_errors += 1
        if now >= next_report:
            next_report += 30
            rss_now = ", ".join(f"{n} {s[-1][1] / MiB:.0f} MiB" for n, s in samples.items() if s)
            say(f"soak: t={now - began:.0f}s RSS {rss_now}")
        time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    load = [f.result(timeout=120) for f in futures]
    produced = sum(r["bytes"] for r in load)
    bench.delete_topic(topic)
    warm_s = max(5.0, seconds * 0.1)
    per_replica: dict[str, dict[str, Any]] = {}
    worst = 0.0
    for n, s in samples.items():
        after = [v for t, v in s if t >= warm_s]
        if len(after) < 4:
            continue
        start, end, peak = after[0], sum(after[-3:]) / 3, max(after)
        drift = (end / start - 1) * 100
        worst = max(worst, abs(drift))
        per_replica[n] = {"start_mib": start / MiB, "end_mib": end / MiB, "peak_mib": peak / MiB,
                          "end_over_start": end / start, "samples": len(s),
                          "series_mib": [round(v / MiB, 1) for _t, v in s]}
    if not per_replica:
        return [failed(key, name, "%", "flat (±10 %)", "not enough RSS samples")]
    for n, r in per_replica.items():
        say(f"soak: {n}: start {r['start_mib']:.0f} MiB, end {r['end_mib']:.0f} MiB, peak {r['peak_mib']:.0f} MiB, "
            f"end/start {r['end_over_start']:.3f}")
    params = {"seconds": seconds, "warmup_s": warm_s, "producer_processes": processes, "batch_bytes": len(batch),
              "acks": -1, "segment_bytes": MiB, "delete_every_s": delete_every_s, "deletes": deletes,
              "delete_errors": delete_errors, "produced_mb": produced / 1e6,
              "produce_errors": sum(r["errors"] for r in load), "replicas": per_replica}
    figs = [Figure(key=key, name=name, value=worst, unit="%", target="flat (±10 %)", target_value=10.0,
                   better="flat", params=params).judge()]
    for n, r in sorted(per_replica.items()):
        figs.append(Figure(key=f"rss_{n}_mib", name=f"{n} RSS start / end / peak", value=r["end_mib"], unit="MiB",
                           note=f"start {r['start_mib']:.0f}, end {r['end_mib']:.0f}, peak {r['peak_mib']:.0f} MiB; "
                                f"end/start {r['end_over_start']:.3f}",
                           params={k: v for k, v in r.items() if k != "series_mib"}))
    return figs
