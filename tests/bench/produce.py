"""Produce and consume throughput (docs/testing.md#targets: produce ≥ 50 % of disk write ÷ 3;
consume ≥ 2× produce).

Produce: a topic of ``partitions`` partitions (leaders spread over the replicas) per variant
(replication factor × acks × batch size), 1 KiB records. ``processes`` worker processes with
``threads`` threads each send raw ``Replica.Produce`` requests, each carrying one pre-built
RecordBatch v2 of the variant's size, to the partitions' leaders, round-robin, as fast as they are
acknowledged. Bytes are the RecordBatch bytes acknowledged during the measured window (after a
warm-up). Raw batches keep client-side per-record encoding out of the figure; a ``client``
variant runs ``lowtide.client.Producer.produce_values`` (which encodes per record on the client)
for comparison.

Consume: consumer ``Replica.Fetch`` (replica_id -1) from the leaders of the RF 3 acks=all topic,
every partition from its log start to its high watermark in parallel (one worker per partition),
4 MiB per fetch. The data was just written, so the page cache is warm (as for a consumer keeping
up with producers).

Replica CPU per produced MiB: utime + stime of each replica process (``/proc/PID/stat``, all its
threads) read at the start and the end of every variant's measured window, divided by the MiB
acknowledged in that window (each batch counted once, not once per replica); in every variant's
``params`` (``replica_cpu_ms_per_mib``) and, for RF 3 acks=all with 1 MiB batches, as one figure
per replica plus their sum. It is what the servers spend per MiB whatever the machine's core count
(the throughput figures on few cores are bounded by it); compare with the same measure for the
plain-socket transport ceiling (``ceiling.py``), which does the same replication with no gRPC.
"""

from __future__ import annotations

import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from tests.bench import workers
from tests.bench.common import (
    Bench,
    Figure,
    KiB,
    MiB,
    build_batch,
    cpu_figures,
    cpu_per_mib,
    cpu_snapshot,
    failed,
    say,
    summary_ms,
)

RECORD_SIZE = KiB
CPU_VARIANT_BATCH = MiB  # the RF 3 acks=all batch size whose replica CPU per MiB is reported as figures


@dataclass(frozen=True)
class Variant:
    rf: int
    acks: int
    batch_bytes: int
    mode: str = "raw"  # raw | client

    @property
    def label(self) -> str:
        acks = "all" if self.acks == -1 else str(self.acks)
        size = f"{self.batch_bytes // MiB} MiB" if self.batch_bytes >= MiB else f"{self.batch_bytes // KiB} KiB"
        extra = ", client Producer" if self.mode == "client" else ""
        return f"RF {self.rf}, acks={acks}, batch {size}{extra}"

    @property
    def key(self) -> str:
        acks = "all" if self.acks == -1 else str(self.acks)
        return f"rf{self.rf}_acks{acks}_b{self.batch_bytes // KiB}k" + ("_client" if self.mode == "client" else "")


def variants(quick: bool, with_client: bool) -> list[Variant]:
    if quick:
        out = [Variant(1, 1, 256 * KiB), Variant(3, 1, 256 * KiB), Variant(3, -1, 64 * KiB),
               Variant(3, -1, 256 * KiB), Variant(3, -1, MiB)]
    else:
        out = [Variant(rf, acks, b) for rf in (1, 3) for acks in (1, -1) for b in (64 * KiB, 256 * KiB, MiB)]
    if with_client:
        out.append(Variant(3, -1, 256 * KiB, mode="client"))
    return out


class ProduceBench:
    """Runs the produce variants and then the consume figure on one cluster."""

    def __init__(self, bench: Bench, pool: Executor, *, quick: bool, processes: int, threads: int,
                 partitions: int = 3) -> None:
        self.bench = bench
        self.pool = pool
        self.quick = quick
        self.processes = processes
        self.threads = threads
        self.partitions = partitions
        self.warmup_s = 1.0 if quick else 2.0
        self.duration_s = 3.0 if quick else 8.0
        self.consume_topic: str | None = None
        self.consume_ref: Figure | None = None

    def _run_variant(self, v: Variant, topic: str) -> dict[str, Any]:
        start_at = time.time() + 0.5
        common = {"acks": v.acks, "start_at": start_at, "warmup_s": self.warmup_s, "duration_s": self.duration_s}
        if v.mode == "client":
            specs = [{**common, "bootstrap": self.bench.bootstrap, "topic": topic, "batch_bytes": v.batch_bytes,
                      "record_size": RECORD_SIZE, "values_per_call": max(1, 4 * v.batch_bytes // RECORD_SIZE)}
                     for _ in range(self.processes)]
            futures = [self.pool.submit(workers.produce_client, s) for s in specs]
        else:
            batch, count = build_batch(v.batch_bytes, RECORD_SIZE)
            leaders = self.bench.leaders(topic)
            targets = [(leaders[p], topic, p) for p in sorted(leaders)]
            specs = [{**common, "targets": targets[k:] + targets[:k], "batch": batch, "records_per_batch": count,
                      "threads": self.threads} for k in range(self.processes)]
            futures = [self.pool.submit(workers.produce_raw, s) for s in specs]
        # Replica CPU over exactly the measured window (the workers count what completes in it).
        pids = {s.name: s.pid for s in self.bench.replicas.values()}
        win_start = start_at + self.warmup_s
        time.sleep(max(0.0, win_start - time.time()))
        cpu_before = cpu_snapshot(pids)
        time.sleep(max(0.0, win_start + self.duration_s - time.time()))
        cpu_after = cpu_snapshot(pids)
        results = [f.result(timeout=self.warmup_s + self.duration_s + 120) for f in futures]
        latencies = [x for r in results for x in r["latencies"]]
        nbytes = sum(r["bytes"] for r in results)
        return {"bytes": nbytes, "records": sum(r["records"] for r in results),
                "errors": sum(r["errors"] for r in results),
                "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
                "latency": summary_ms(latencies), "cpu": cpu_per_mib(cpu_before, cpu_after, nbytes)}

    def run(self, disk_write_mbs: float | None, with_client: bool) -> list[Figure]:
        figures: list[Figure] = []
        cpu_figs: list[Figure] = []
        ref = disk_write_mbs / 3 if disk_write_mbs else None
        keep = Variant(3, -1, 256 * KiB)
        for v in variants(self.quick, with_client):
            topic = f"bench-produce-{v.key}"
            name = f"produce {v.label}"
            try:
                self.bench.create_topic(topic, self.partitions, v.rf)
                say(f"produce: {v.label}: {self.processes} processes x {self.threads} threads, "
                    f"{self.warmup_s:.0f}s warm-up + {self.duration_s:.0f}s")
                out = self._run_variant(v, topic)
            except Exception as exc:  # noqa: BLE001 - one variant failing must not stop the suite
                say(f"produce: {v.label} failed: {exc!r}")
                figures.append(failed(f"produce_{v.key}_mbs", name, "MB/s", None, exc))
                continue
            mbs = out["bytes"] / self.duration_s / 1e6
            rps = out["records"] / self.duration_s
            lat = out["latency"]
            cpu = out["cpu"]
            say(f"produce: {v.label}: {mbs:.1f} MB/s, {rps:,.0f} records/s, request p50 "
                f"{lat.get('p50_ms', float('nan')):.1f} ms p99 {lat.get('p99_ms', float('nan')):.1f} ms, "
                f"errors {out['errors']}{out['first_error'] and ' '}{out['first_error']}; replica CPU "
                + (", ".join(f"{n} {ms:.1f}" for n, ms in cpu.items()) + " ms/MiB" if cpu else "unknown"))
            params = {"rf": v.rf, "acks": v.acks, "batch_bytes": v.batch_bytes, "record_bytes": RECORD_SIZE,
                      "partitions": self.partitions, "processes": self.processes,
                      "threads_per_process": self.threads if v.mode == "raw" else 1, "mode": v.mode,
                      "warmup_s": self.warmup_s, "duration_s": self.duration_s, "errors": out["errors"],
                      "first_error": out["first_error"], "records_per_s": rps, "request_latency": lat,
                      "replica_cpu_ms_per_mib": cpu}
            fig = Figure(key=f"produce_{v.key}_mbs", name=name, value=mbs, unit="MB/s", params=params)
            if ref and v.mode == "raw":
                fig.ratio, fig.ratio_of = mbs / ref, "disk write bandwidth / 3"
            figures.append(fig.judge())
            figures.append(Figure(key=f"produce_{v.key}_rps", name=f"{name} (records/s)", value=rps,
                                  unit="records/s", params={"see": fig.key}))
            if (v.rf, v.acks, v.batch_bytes, v.mode) == (3, -1, CPU_VARIANT_BATCH, "raw"):
                cpu_figs = self._cpu_figures(v, fig, cpu, out["bytes"])
            if v == keep:
                self.consume_topic, self.consume_ref = topic, fig
            else:
                self.bench.delete_topic(topic)
        return [*self._headline(figures, ref), *figures, *cpu_figs]

    def _cpu_figures(self, v: Variant, fig: Figure, cpu: dict[str, float], nbytes: int) -> list[Figure]:
        """Replica CPU ms per produced MiB of variant ``v``: one figure per replica and the sum."""
        key = f"replica_cpu_{v.key}"
        name = f"replica CPU per produced MiB (RF 3 acks=all, batch {v.batch_bytes // MiB} MiB)"
        if not cpu:
            return [failed(f"{key}_sum_ms_mib", f"{name}: sum", "ms/MiB", None,
                           "no CPU reading (no bytes acknowledged or a replica process gone)")]
        return cpu_figures(key, name, cpu, {
            "see": fig.key, "batch_bytes": v.batch_bytes, "window_s": self.duration_s, "produced_mib": nbytes / MiB,
            "source": "utime+stime of each replica pid from /proc/PID/stat over the measured window"})

    @staticmethod
    def _headline(figures: list[Figure], ref: float | None) -> list[Figure]:
        """The §11 produce target: the best RF 3 acks=all raw variant against disk write / 3."""
        name = "produce RF 3, acks=all, 1 KiB records (best batch size)"
        candidates = [f for f in figures if f.unit == "MB/s" and f.value is not None
                      and f.params.get("rf") == 3 and f.params.get("acks") == -1 and f.params.get("mode") == "raw"]
        if not candidates:
            return [failed("produce_rf3_acksall_mbs", name, "MB/s", ">= 50% of disk write / 3", "no variant ran")]
        best = max(candidates, key=lambda f: f.value or 0.0)
        fig = Figure(key="produce_rf3_acksall_mbs", name=name, value=best.value, unit="MB/s",
                     target=">= 50% of disk write / 3", ratio=best.ratio, ratio_of=best.ratio_of, ratio_target=0.5,
                     note=f"best of {len(candidates)}: {best.name}", params={"see": best.key, **best.params})
        if ref is None:
            fig.note += "; no disk reference in this run"
        return [fig.judge()]

    def consume(self) -> list[Figure]:
        """Consume the kept RF 3 acks=all topic from its leaders; ratio to its produce MB/s."""
        name = "consume (Fetch from leaders, RF 3 topic)"
        if self.consume_topic is None or self.consume_ref is None or not self.consume_ref.value:
            return [failed("consume_mbs", name, "MB/s", ">= 2x produce", "no produced topic to consume")]
        topic = self.consume_topic
        try:
            leaders = self.bench.leaders(topic)
            best: dict[str, Any] | None = None
            for attempt in range(2):  # the first pass warms channels and the page cache
                start_at = time.time() + 0.3
                specs = []
                for p, addr in sorted(leaders.items()):
                    lso = self.bench.list_offsets(addr, topic, p, -2)
                    hw = self.bench.list_offsets(addr, topic, p, -1)
                    specs.append({"address": addr, "topic": topic, "partition": p, "start": lso, "end": hw,
                                  "partition_max_bytes": 4 * MiB, "start_at": start_at})
                results = [f.result(timeout=300) for f in
                           [self.pool.submit(workers.consume_raw, s) for s in specs]]
                errors = [r["error"] for r in results if r["error"]]
                total = sum(r["bytes"] for r in results)
                seconds = max(r["seconds"] for r in results)
                out = {"bytes": total, "seconds": seconds, "fetches": sum(r["fetches"] for r in results),
                       "errors": errors, "pass": attempt}
                say(f"consume: pass {attempt + 1}: {total / 1e6:.0f} MB in {seconds:.2f}s = "
                    f"{total / seconds / 1e6:.0f} MB/s {errors or ''}")
                if best is None or total / seconds > best["bytes"] / best["seconds"]:
                    best = out
        except Exception as exc:  # noqa: BLE001
            say(f"consume failed: {exc!r}")
            return [failed("consume_mbs", name, "MB/s", ">= 2x produce", exc)]
        finally:
            self.bench.delete_topic(topic)
        assert best is not None
        mbs = best["bytes"] / best["seconds"] / 1e6
        produce = self.consume_ref.value
        fig = Figure(key="consume_mbs", name=name, value=mbs, unit="MB/s", target=">= 2x produce (RF 3, acks=all)",
                     ratio=mbs / produce, ratio_of=f"produce MB/s of {self.consume_ref.name}", ratio_target=2.0,
                     params={"topic_partitions": len(leaders), "partition_max_bytes": 4 * MiB,
                             "workers": len(leaders), "page_cache": "warm (just produced)", **best})
        return [fig.judge()]
