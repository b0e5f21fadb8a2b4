"""Run the benchmark suite: ``python -m tests.bench.run [--quick] [--out DIR] [--soak-seconds S]``.

Order: physical disk references (before any service runs), the transport ceiling (the produce
RF 3 acks=all load over plain sockets between three plain-Python processes, no cluster running),
the log cleaner's MB/s and log recovery time (in process), then one local cluster of 3 replicas +
front door + Redis: loopback gRPC round trip, DeleteRecords on an idle and a busy partition, disk
space freed after DeleteRecords, produce variants and consume, the RSS soak, DeleteRecords over
1,000 partitions, one broker-side consumed retention (KIP-68) pass over 1,000 partitions; then sections
with clusters of their own (diskless, orphans, snapshot: a coordinator shard restored onto an
empty disk, tls: plaintext against TLS, reassign: partition copies with and without a throttle, share:
KIP-932 share-consume next to classic consume and the last acknowledgement to disk freed).
The cluster and the ceiling's processes are always torn down. Writes ``results.json`` and ``RESULTS.md`` into ``--out``
(default ``tests/bench``). Reports; never asserts on time. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import lowtide
from tests.bench import baseline as bench_baseline
from tests.bench import ceiling, delete, physical, produce, report, soak, workers
from tests.bench.common import Figure, MiB, failed, running_cluster, say, settle_disk


class _SectionModule:
    """A section's module, imported when the section first runs: ``--baseline`` runs this harness
    on an older checkout's ``lowtide``, where a newer section's imports (``lowtide.share`` for
    ``share``) do not exist; only the sections asked for may be imported there."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


bench_cleaner = _SectionModule("tests.bench.cleaner")
bench_consumer = _SectionModule("tests.bench.consumer")
bench_diskless = _SectionModule("tests.bench.diskless")
bench_diskless_scaling = _SectionModule("tests.bench.diskless_scaling")
bench_idempotence = _SectionModule("tests.bench.idempotence")
bench_kafka = _SectionModule("tests.bench.kafka_clients")
bench_kafka_scale = _SectionModule("tests.bench.kafka_scale")
bench_metadata = _SectionModule("tests.bench.metadata")
bench_orphans = _SectionModule("tests.bench.orphans")
bench_reassign = _SectionModule("tests.bench.reassign")
bench_recovery = _SectionModule("tests.bench.recovery")
bench_request_cost = _SectionModule("tests.bench.request_cost")
bench_retention = _SectionModule("tests.bench.retention")
bench_scale = _SectionModule("tests.bench.scale")
bench_scale_fault = _SectionModule("tests.bench.scale_fault")
bench_share = _SectionModule("tests.bench.share")
bench_snapshot = _SectionModule("tests.bench.snapshot")
bench_spark = _SectionModule("tests.bench.spark")
bench_standby = _SectionModule("tests.bench.standby")
bench_tls = _SectionModule("tests.bench.tls_cost")

REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parent
SECTIONS = ("physical", "ceiling", "cleaner", "recovery", "rtt", "delete", "produce", "consumer", "kafka", "spark",
            "soak", "wide", "retention", "diskless", "orphans", "idempotence", "tls", "reassign",
            "snapshot", "standby", "diskless_scaling", "metadata", "scale", "kafka_scale", "scale_fault",
            "request_cost", "share")
# The sections that run on the shared cluster (the others start clusters of their own, or none).
CLUSTER_SECTIONS = {"rtt", "delete", "produce", "consumer", "kafka", "idempotence", "spark", "soak", "wide",
                    "retention", "request_cost"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts, fewer variants (< 3 minutes)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where results.json and RESULTS.md go (default tests/bench for a full run; "
                             "tests/bench/out/quick for --quick, so a quick run never overwrites the "
                             "committed full results)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="cluster data directory (default tests/bench/out/run-TIMESTAMP, removed afterwards)")
    parser.add_argument("--keep-data", action="store_true", help="keep the cluster data directory")
    parser.add_argument("--soak-seconds", type=float, default=None, help="RSS soak length (quick 20, full 600)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})")
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="also run the same sections on a checkout of REV (e.g. issue 47's fe36f24), in "
                             "this run, and show each figure beside its old value (tests/bench/baseline.py)")
    parser.add_argument("--no-client", action="store_true", help="skip the client Producer variant")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = BENCH_DIR / "out" / "quick" if args.quick else BENCH_DIR
    return args


def _section(name: str, figures: list[Figure], fn: Callable[[], list[Figure]], key: str, title: str,
             unit: str) -> None:
    """Run one section; an unexpected failure becomes an error figure, the suite goes on."""
    settled = settle_disk()
    if settled > 1:
        say(f"{name}: waited {settled:.1f}s for the previous sections' disk writeback")
    began = time.monotonic()
    try:
        figures += fn()
    except Exception as exc:  # noqa: BLE001 - report, never abort the whole run
        say(f"{name}: failed: {exc!r}")
        figures.append(failed(key, title, unit, None, exc))
    say(f"{name}: done in {time.monotonic() - began:.1f}s")


def _relate_latencies(figures: list[Figure]) -> None:
    """DeleteRecords latencies as multiples of the loopback gRPC round trip (the ratio column) and
    of the checkpoint-style fsync'd file replace (in the note): docs/design/kip-107-delete-records.md
    promises "about two round trips"."""
    by_key = {f.key: f for f in figures}
    rtt = by_key.get("grpc_rtt_p50_ms")
    rtt99 = by_key.get("grpc_rtt_p99_ms")
    fsync = by_key.get("fsync_replace_p50_ms")
    for f in figures:
        if not (f.key.startswith(("delete_idle_", "delete_busy_")) and f.value is not None):
            continue
        ref = rtt99 if f.key.endswith("_p99_ms") else rtt
        if ref is not None and ref.value:
            f.ratio, f.ratio_of = f.value / ref.value, f"loopback gRPC round trip {ref.key.split('_')[2]}"
        if fsync is not None and fsync.value:
            times = f.value / fsync.value
            f.note = (f.note + "; " if f.note else "") + f"= {times:.1f}x a fsync'd checkpoint replace p50"


def _relate_ceiling(figures: list[Figure]) -> None:
    """Produce RF 3 acks=all figures as fractions of the transport ceiling of the same batch size
    (in the note: their ratio column is the disk's), the §11 headline against the ceiling of its
    best batch; the replicas' CPU per MiB as a multiple of the ceiling servers' (the ratio column)."""
    by_key = {f.key: f for f in figures}
    for f in figures:
        if f.value is None or f.unit != "MB/s" or not f.key.startswith("produce_rf3_acksall"):
            continue
        if f.params.get("mode") != "raw" or "batch_bytes" not in f.params:
            continue
        ref = by_key.get(ceiling.key(int(f.params["batch_bytes"])))
        if ref is None or not ref.value:
            continue
        times = f.value / ref.value
        f.params["ceiling_ratio"] = times
        f.note = (f.note + "; " if f.note else "") + (
            f"= {times:.2f}x the transport ceiling (plain sockets, Python) at batch "
            f"{ceiling.size_label(int(ref.params['batch_bytes']))}, {ref.value:.0f} MB/s")
    for f in figures:
        if f.value is None or not (f.key.startswith("replica_cpu_") and f.key.endswith("_ms_mib")):
            continue
        ref = by_key.get(ceiling.cpu_key(int(f.params.get("batch_bytes", 0))) + "_sum_ms_mib")
        if ref is None or not ref.value:
            continue
        if f.key.endswith("_sum_ms_mib"):
            f.ratio, f.ratio_of = f.value / ref.value, "transport ceiling servers' CPU per MiB (sum)"
        else:
            per_server = ref.value / ceiling.SERVERS
            f.ratio, f.ratio_of = f.value / per_server, "transport ceiling servers' CPU per MiB (sum / 3)"


# lowtide's scale figure -> Apache Kafka's figure of the same size (kafka_scale) it is read against.
_KAFKA_SCALE_PAIRS = {"create_s": "create_s", "idle_cpu_pct": "idle_cpu_pct", "replica_rss_mib": "broker_rss_mib",
                      "replica_fds": "broker_fds", "produce_all_s": "produce_all_s",
                      "delete_records_s": "delete_records_s"}


def _relate_kafka_scale(figures: list[Figure]) -> None:
    """lowtide's scale figures as multiples of Apache Kafka 4.1's at the same size (the ratio
    column), when the scale and kafka_scale sections ran together."""
    by_key = {f.key: f for f in figures}
    for f in figures:
        if f.value is None or f.ratio is not None or not f.key.startswith("scale_"):
            continue
        size, _, metric = f.key.removeprefix("scale_").partition("_")
        ref = by_key.get(f"kafka_scale_{size}_{_KAFKA_SCALE_PAIRS.get(metric, '-')}")
        if ref is None or not ref.value:
            continue
        f.ratio, f.ratio_of = f.value / ref.value, f"Apache Kafka 4.1 on this box ({ref.value:.3g} {ref.unit})"


def _run_baseline(args: argparse.Namespace, only: list[str], figures: list[Figure], *, quick: bool) -> list[Figure]:
    """``--baseline REV``: the sections again on REV's code (tests/bench/baseline.py); adds no figure,
    writes the old values into the current ones."""
    work = (args.data_dir or BENCH_DIR / "out").resolve() / f"baseline-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        sha, old = bench_baseline.run_sections(args.baseline, only, work, quick=quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bench_baseline.relate(figures, sha, old)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results-old-main.json").write_text(json.dumps({"rev": sha, "figures": old}, indent=2) + "\n")
    return []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    quick = args.quick
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    soak_s = args.soak_seconds if args.soak_seconds is not None else (20.0 if quick else 600.0)
    processes = 2 if quick else 3
    threads = 4
    data_dir = (args.data_dir or BENCH_DIR / "out" / f"run-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    mode = "quick" if quick else "full"
    say(f"lowtide bench, mode {mode}, data dir {data_dir}")
    machine = physical.machine_info(data_dir, REPO, mode)
    # Which checkout's code the cluster runs (--baseline's child runs an older one).
    code = Path(lowtide.__file__).resolve().parents[2]
    if code != REPO:
        machine["git_commit"] = f"{physical.git_commit(code)} (lowtide from {code})"
    say(f"lowtide code from {code}, commit {machine['git_commit']}")
    figures: list[Figure] = []
    disk_write: float | None = None

    if "physical" in only:
        _section("speed", figures, physical.speed_reference, "speed_python_ms", "machine speed", "ms")
        size = 256 * MiB if quick else 1024 * MiB
        _section("physical", figures, lambda: physical.disk_bandwidth(data_dir / "disk", size),
                 "disk_write_mbs", "sequential disk write", "MB/s")
        disk_write = next((f.value for f in figures if f.key == "disk_write_mbs"), None)
        _section("fsync", figures, lambda: physical.checkpoint_write_latency(data_dir / "disk", 200 if quick else 1000),
                 "fsync_replace_p50_ms", "checkpoint-style file replace", "ms")

    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=max(processes, 3), mp_context=ctx)
    try:
        for f in [pool.submit(workers.noop) for _ in range(max(processes, 3))]:
            f.result(timeout=120)
        if "ceiling" in only:
            _section("ceiling", figures,
                     lambda: ceiling.transport_ceiling(data_dir / "ceiling", pool, quick=quick, processes=processes,
                                                       threads=threads, disk_write_mbs=disk_write),
                     ceiling.key(ceiling.HEADLINE_BATCH), ceiling.name(ceiling.HEADLINE_BATCH), "MB/s")
        if "cleaner" in only:
            _section("cleaner", figures,
                     lambda: bench_cleaner.cleaner_throughput(data_dir, quick=quick, disk_write_mbs=disk_write),
                     "cleaner_mbs", "log cleaner (compaction, KIP-534 delete horizon) throughput", "MB/s")
        if "recovery" in only:  # issue 34: opening a log with producer-state snapshots and without
            _section("recovery", figures, lambda: bench_recovery.recovery_figures(data_dir, quick=quick),
                     "recovery_open_snapshot_ms", "open a log with producer-state snapshots", "ms")
        with running_cluster(data_dir / "cluster") if only & CLUSTER_SECTIONS else nullcontext() as bench:
            if "rtt" in only:
                replica0 = bench.replicas[min(bench.replicas)].grpc
                _section("rtt", figures, lambda: physical.grpc_rtt(replica0, 1000 if quick else 5000),
                         "grpc_rtt_p50_ms", "loopback gRPC round trip", "ms")
            if "delete" in only:
                n = 50 if quick else 200
                _section("delete idle", figures, lambda: delete.idle_latency(bench, n),
                         "delete_idle_frontdoor_p99_ms", "DeleteRecords idle", "ms")
                _section("delete busy", figures, lambda: delete.busy_latency(bench, pool, n, data_dir),
                         "delete_busy_frontdoor_p99_ms", "DeleteRecords busy", "ms")
                _section("delete space", figures,
                         lambda: delete.space_freed(bench, (2 if quick else 8) * MiB, 3 if quick else 5),
                         "delete_space_freed_ms", "space freed", "ms")
            if "produce" in only:
                pb = produce.ProduceBench(bench, pool, quick=quick, processes=processes, threads=threads)
                with_client = not args.no_client and importlib.util.find_spec("lowtide.client.producer") is not None
                _section("produce", figures, lambda: pb.run(disk_write, with_client), "produce_mbs", "produce",
                         "MB/s")
                _section("consume", figures, pb.consume, "consume_mbs", "consume", "MB/s")
            if "consumer" in only:
                _section("consumer", figures, lambda: bench_consumer.consumer_figures(bench, quick=quick),
                         "consumer_poll_mbs", "Consumer.poll", "MB/s")
            if "kafka" in only:
                _section("kafka", figures, lambda: bench_kafka.kafka_client_figures(bench, quick=quick),
                         "kafka_confluent_kafka_produce_mbs", "Kafka listener produce", "MB/s")
            if "request_cost" in only:  # issue 47: Kafka's consumer tools, lowtide against Apache Kafka 4.1
                _section("request_cost", figures,
                         lambda: bench_request_cost.consume_tools_figures(bench, data_dir / "request_cost",
                                                                          quick=quick),
                         "ctools_consumer_perf_mbs", "Kafka's ConsumerPerformance reading lowtide", "MB/s")
            if "idempotence" in only:  # issue 34: the sequence check's cost, Kafka's ProducerPerformance on/off
                _section("idempotence", figures, lambda: bench_idempotence.idempotence_figures(bench, quick=quick),
                         "kafka_perf_idempotence_cost_pct", "idempotent produce cost", "%")
            if "spark" in only:
                _section("spark", figures, lambda: bench_spark.spark_throughput(bench, quick=quick),
                         "spark_write_mbs", "Spark write/read", "MB/s")
            if "soak" in only:
                _section("soak", figures, lambda: soak.rss_soak(bench, pool, soak_s, processes),
                         "replica_rss_drift_pct", "replica RSS soak", "%")
            if "wide" in only:
                _section("delete wide", figures, lambda: delete.many_partitions(bench, 1000, 2 if quick else 4),
                         "delete_wide_ms", "DeleteRecords over 1,000 partitions", "ms")
            if "retention" in only:
                _section("retention", figures, lambda: bench_retention.retention_pass_cost(bench, 1000),
                         "consumed_retention_pass_ms", "broker-side consumed retention pass over 1,000 partitions",
                         "ms")
        if "share" in only:  # issue 49: its own cluster (share groups start at the log start); Kafka 4.4's tools
            _section("share", figures, lambda: bench_share.share_figures(data_dir / "share", quick=quick),
                     "share_consume_mbs", "share-consume throughput", "MB/s")
        if "diskless" in only:  # its own cluster: two coordinator shards (the main one has none)
            _section("diskless", figures, lambda: bench_diskless.diskless_figures(data_dir / "diskless", quick=quick),
                     "dc_commitfile_batches_s", "DC CommitFile batches/s per shard", "batches/s")
        if "diskless_scaling" in only:  # issue 32: its own cluster; diskless at 1-64 producers next to classic
            _section("diskless_scaling", figures,
                     lambda: bench_diskless_scaling.diskless_scaling_figures(data_dir / "diskless_scaling",
                                                                             quick=quick),
                     "dscale_diskless_16_mbs", "diskless produce, 16 producers", "MB/s")
        if "metadata" in only:  # issue 51: its own cluster; metadata changes on etcd, failover and restart
            _section("metadata", figures, lambda: bench_metadata.metadata_figures(data_dir / "metadata", quick=quick),
                     "failover_kill9_s", "failover after kill -9", "s")
        if "scale" in only:  # issue 48: a cluster of its own per size; what partitions cost at rest
            _section("scale", figures, lambda: bench_scale.scale_figures(data_dir / "scale", quick=quick),
                     "scale_300_idle_cpu_pct", "idle CPU, 300 partitions RF 3", "% of a core")
        if "kafka_scale" in only:  # issue 48: Apache Kafka 4.1 (KRaft, 1 controller + 3 brokers) at the same sizes
            _section("kafka_scale", figures,
                     lambda: bench_kafka_scale.kafka_scale_figures(data_dir / "kafka_scale", quick=quick),
                     "kafka_scale_300_idle_cpu_pct", "Kafka 4.1: idle CPU, 300 partitions RF 3", "% of a core")
        if "scale_fault" in only:  # issue 48: its own cluster; kill -9 and restart under acks=all to every partition
            _section("scale_fault", figures,
                     lambda: bench_scale_fault.scale_fault_figures(data_dir / "scale_fault", quick=quick),
                     "scale_fault_lost", "fault test at scale: acknowledged records lost", "records")
        if "orphans" in only:  # its own cluster: two coordinator shards vouching for the scan
            _section("orphans", figures, lambda: bench_orphans.orphan_figures(data_dir / "orphans", quick=quick),
                     "orphan_scan_s", "orphan scan of 100,000 objects (local store)", "s")
        if "snapshot" in only:  # issue 32: a coordinator shard restored from the object store onto an empty disk
            _section("snapshot", figures, lambda: bench_snapshot.snapshot_figures(data_dir / "snapshot", quick=quick),
                     "snapshot_restore_e2e_s", "snapshot restore onto an empty disk, 100,000 batches", "s")
        if "standby" in only:  # issue 32: a cluster of its own, coordinators standing by for each other
            _section("standby", figures, lambda: bench_standby.standby_figures(data_dir / "standby", quick=quick),
                     "standby_takeover_s", "warm standby takeover after kill -9, first CommitFile answered", "s")
        if "tls" in only:  # issue 33: two clusters of its own, plaintext and TLS, loaded in alternation
            _section("tls", figures,
                     lambda: bench_tls.tls_figures(data_dir / "tls", pool, quick=quick, processes=processes,
                                                   threads=threads),
                     "tls_produce_cpu_cost_s_gib", "cost of TLS, produce CPU per GiB", "CPU s/GiB")
        if "reassign" in only:  # issue 31: a 4-replica cluster of its own, copies with and without a throttle
            _section("reassign", figures,
                     lambda: bench_reassign.reassign_figures(data_dir / "reassign", quick=quick,
                                                             disk_write_mbs=disk_write),
                     "reassign_copy_mbs", "reassignment copy rate", "MB/s")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        if not args.keep_data and args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    if args.baseline:  # the same sections on an older checkout, after this run's, before the data dir goes
        _section("baseline", figures, lambda: _run_baseline(args, sorted(only), figures, quick=quick),
                 "baseline", f"the same sections on {args.baseline}", "")
    _relate_latencies(figures)
    _relate_ceiling(figures)
    _relate_kafka_scale(figures)
    if only & {"diskless", "orphans"}:  # a section run alone (--only) gets no other section's placeholders
        figures += report.placeholders({f.key for f in figures})
    elapsed = time.monotonic() - began
    json_path, md_path = report.write_results(args.out, machine, figures, elapsed_s=elapsed, argv=argv)
    say(f"wrote {json_path} and {md_path} ({elapsed:.0f}s)")
    for f in figures:
        if f.target is not None:
            value = "—" if f.value is None else f"{f.value:.3g} {f.unit}"
            print(f"{f.status:>14}  {f.name}: {value} (target {f.target})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
