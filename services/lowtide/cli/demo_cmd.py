"""`lowtide demo`: the main job (docs/spark.md#the-main-job-make-demo) on a local cluster of real
processes and local Spark.

Starts a cluster (redis-server, 3 replicas, front door), creates an intermediate topic (RF 3,
small segments) and a results topic, then runs the pipeline's Spark jobs on one local-mode
SparkSession (``lowtide.spark.jobs``, the code behind ``spark-jobs/*.py``): the producer writes
the intermediate topic through format "lowtide"; the consumer job runs for two groups — "fast"
reads everything, "slow" stops after a few small micro-batches — each transforming the records into
the results topic and committing its group; then the retention caller (KIP-68 client side: min
committed offset over both groups → DeleteRecords). It prints, per partition, LSO / HW / LW and
bytes on disk on every replica before and after, with the DeleteRecords latency: only what both
groups consumed is deleted, and its segment files are gone from every replica. Then the queue step
(``cli/demo_queue.py``): two workers of a KIP-932 share group take a topic's records as a queue, and
its disk drains on every replica as they acknowledge. (The diskless topic joins when diskless
topics exist.)

What it leaves behind: nothing, by default (its temporary data directory is removed once the
cluster is down). A ``--data-dir`` the user chose is kept and named at the end; ``--keep`` keeps
the cluster running and its directory. Metrics URLs are offered as live only while they are: in
the progress output while the cluster runs, and at the end only with ``--keep`` (otherwise they
are listed as "served during the run"). The summary states what the numbers show, not what was
hoped: a failed DeleteRecords or a replica whose disk did not shrink is said so, and exits 1.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from lowtide.cli.demo_queue import QUEUE, render_queue_step, run_queue_step, snapshot_topic
from lowtide.cli.output import emit, progress
from lowtide.client.admin import Admin
from lowtide.localcluster import ClusterConfig, LocalCluster

TOPIC = "intermediate"
RESULTS = "results"
STEPS = 8


def register(subparsers: argparse._SubParsersAction) -> None:
    from lowtide.cli.main import add_output_flag

    p = subparsers.add_parser("demo", help="run the main job on a local cluster and show what deletion does")
    p.add_argument("--data-dir", help="cluster directory, kept afterwards (default: a new temporary one, "
                                      "removed at the end)")
    p.add_argument("--records", type=int, default=60_000, help="records the Spark producer writes (1 KiB each)")
    p.add_argument("--slow-batches", type=int, default=2,
                   help="micro-batches the slow group's consumer job runs before it stops")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--queue-records", type=int, default=0,
                   help="records of the queue step's topic (default: a quarter of --records)")
    p.add_argument("--segment-bytes", type=int, default=1024 * 1024, help="segment size of the topic")
    p.add_argument("--keep", action="store_true", help="leave the cluster (and its directory) running at the end")
    add_output_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    keep_dir = bool(args.data_dir) or args.keep
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="lowtide-demo-"))
    try:
        # A real Prometheus (with the alert rules) when the machine has one: `make setup` installs it.
        cluster = LocalCluster(ClusterConfig(data_dir=data_dir, replicas=3,
                                             replica_config={"segment.bytes": str(args.segment_bytes)},
                                             with_prometheus=shutil.which("prometheus") is not None))
        progress(args, f"[1/{STEPS}] starting a local cluster in {data_dir} (redis-server, 3 replicas, front door)")
        cluster.up(detach=True, progress=lambda m: progress(args, "      " + m))
        try:
            progress(args, "      metrics (Prometheus text), live while the demo runs:")
            for entry in cluster.services():
                if entry.metrics_url:
                    progress(args, f"        {entry.name:<12} {entry.metrics_url}")
            if cluster.state.prometheus:
                progress(args, f"      Prometheus (scraping all of them, alert rules loaded): "
                               f"{cluster.state.prometheus['url']}")
            with Admin(cluster.bootstrap) as admin:
                doc = _run_demo(args, cluster, admin)
        finally:
            if args.keep:
                progress(args, f"cluster left running: lowtide cluster down --data-dir {data_dir}")
            else:
                progress(args, f"[{STEPS}/{STEPS}] stopping everything the demo started")
                cluster.down()
    finally:
        if not keep_dir:
            # Only a directory the demo made itself, and only once nothing runs in it any more.
            shutil.rmtree(data_dir, ignore_errors=True)
    doc["metrics_live"] = bool(args.keep)
    doc["data_dir"] = str(data_dir) if keep_dir else None
    doc["cluster"] = str(data_dir / "cluster.json") if keep_dir else None
    # Printed after the cluster stopped (unless --keep), so nothing below claims a live service.
    emit(args, doc, _render(doc))
    queue_ok = doc["queue"]["drained"] and not doc["queue"]["errors"]
    return 0 if doc["deleted_as_expected"] and doc["disk_freed_on_every_replica"] and queue_ok else 1


def _run_demo(args: argparse.Namespace, cluster: LocalCluster, admin: Admin) -> dict:
    from lowtide.spark import build_session
    from lowtide.spark.jobs import run_consumer, run_producer, run_retention
    from lowtide.spark.options import Connection

    connection = Connection(bootstrap=cluster.bootstrap)
    progress(args, f"[2/{STEPS}] creating topic '{TOPIC}' ({args.partitions} partitions, RF 3, "
                   f"{args.segment_bytes // 1024} KiB segments) and '{RESULTS}' for the consumers' output")
    admin.create_topic(TOPIC, partitions=args.partitions, replication_factor=3)
    admin.create_topic(RESULTS, partitions=args.partitions, replication_factor=3)
    time.sleep(0.5)
    progress(args, f"[3/{STEPS}] starting Spark (local mode) and running the producer job")
    spark = build_session("lowtide-demo")
    checkpoints = Path(tempfile.mkdtemp(prefix="lowtide-demo-ckpt-"))
    say = lambda m: progress(args, "      " + m)  # noqa: E731
    try:
        # A batch must fit in a segment (Kafka rejects larger ones with RECORD_LIST_TOO_LARGE too).
        produced = run_producer(spark, connection, topic=TOPIC, records=args.records, record_size=1024,
                                batch_bytes=min(512 * 1024, args.segment_bytes // 4), progress=say)
        say(f"{produced['records']:,} records in {produced['seconds']} s ({produced['mb_per_s']} MB/s)")
        before = snapshot_topic(cluster, admin, TOPIC)
        per_batch = max(1, args.records // 10)
        progress(args, f"[4/{STEPS}] Spark consumer job, group 'fast': reads everything into '{RESULTS}'")
        fast = run_consumer(spark, connection, topic=TOPIC, group="fast", checkpoint_dir=str(checkpoints / "fast"),
                            output_topic=RESULTS, max_offsets_per_trigger=per_batch * 4, progress=say)
        progress(args, f"[5/{STEPS}] Spark consumer job, group 'slow': {args.slow_batches} micro-batches of "
                       f"{per_batch:,} records, then it stops")
        slow = run_consumer(spark, connection, topic=TOPIC, group="slow", checkpoint_dir=str(checkpoints / "slow"),
                            output_topic=RESULTS, max_offsets_per_trigger=per_batch, max_batches=args.slow_batches,
                            progress=say)
        progress(args, f"[6/{STEPS}] Spark retention caller: min committed offset over both groups -> DeleteRecords")
        retention = run_retention(connection, topic=TOPIC, groups=["fast", "slow"], progress=say)
    finally:
        spark.stop()
        shutil.rmtree(checkpoints, ignore_errors=True)
    time.sleep(0.2)
    after = snapshot_topic(cluster, admin, TOPIC)
    progress(args, f"[7/{STEPS}] queue: two workers of a share group take '{QUEUE}'; its disk drains as they "
                   "acknowledge")
    queue = run_queue_step(cluster=cluster, admin=admin, records=args.queue_records or max(1, args.records // 4),
                           partitions=args.partitions, say=say)
    delete_ms = retention["delete_records_ms"]
    results = {r["partition"]: r for r in retention["partitions"]}
    produce_s = produced["seconds"]
    fast_committed = {int(p): o for p, o in fast["committed"].items()}
    slow_committed = {int(p): o for p, o in slow["committed"].items()}

    rows = []
    for p in sorted(before):
        res = results.get(p, {})
        rows.append({
            "partition": p, "committed_fast": fast_committed.get(p, -1), "committed_slow": slow_committed.get(p, -1),
            "delete_before": res.get("delete_before", -1),
            "before": {k: before[p][k] for k in ("lso", "hw", "lw")},
            "after": {k: after[p][k] for k in ("lso", "hw", "lw")},
            "bytes_before": before[p]["bytes"], "bytes_after": after[p]["bytes"],
            "error": res.get("error"),
        })
    return {"topic": TOPIC, "records": args.records, "produce_seconds": round(produce_s, 3),
            "spark": {"producer": produced, "fast": fast, "slow": slow}, "queue": queue,
            "delete_records_ms": round(delete_ms, 2), "partitions": rows,
            "deleted_as_expected": all(r["error"] is None and r["after"]["lw"] == r["committed_slow"] for r in rows),
            "disk_freed_on_every_replica": all(r["bytes_after"].get(k, 0) < b for r in rows
                                               for k, b in r["bytes_before"].items()),
            "metrics": [e.metrics_url for e in cluster.services() if e.metrics_url],
            "prometheus": cluster.state.prometheus.get("url")}


def _render(doc: dict) -> str:
    mib = 1024 * 1024
    lines = [f"topic '{doc['topic']}': {doc['records']:,} records produced in {doc['produce_seconds']} s; "
             f"DeleteRecords over all partitions took {doc['delete_records_ms']} ms", ""]
    head = (f"{'part':>4} {'fast':>7} {'slow':>7} | {'LSO':>7} {'HW':>7} {'LW':>7} | "
            f"{'LSO':>7} {'HW':>7} {'LW':>7} | disk MiB per replica before -> after")
    lines += [f"{'':>4} {'committed':>15} | {'before':^23} | {'after':^23} |", head, "-" * len(head)]
    for r in doc["partitions"]:
        b, a = r["before"], r["after"]
        disk = "  ".join(f"{k[-1]}: {r['bytes_before'][k] / mib:5.1f} -> {r['bytes_after'].get(k, 0) / mib:5.1f}"
                         for k in sorted(r["bytes_before"]))
        lines.append(f"{r['partition']:>4} {r['committed_fast']:>7} {r['committed_slow']:>7} | {b['lso']:>7} "
                     f"{b['hw']:>7} {b['lw']:>7} | {a['lso']:>7} {a['hw']:>7} {a['lw']:>7} | {disk}"
                     + (f"  ERROR {r['error']}" if r["error"] else ""))
    lines.append("")
    if doc["deleted_as_expected"]:
        lines.append("Only records both groups had consumed (below the slow group's offsets) were deleted.")
    else:
        lines.append("NOT AS EXPECTED: on some partitions DeleteRecords failed or the low watermark is not the "
                     "slow group's offset (see ERROR / LW above).")
    if doc["disk_freed_on_every_replica"]:
        lines.append("Every replica holds fewer bytes: the segment files wholly below the new log start offset "
                     "are gone.")
    else:
        lines.append("NOT AS EXPECTED: some replica's bytes on disk did not shrink (see the disk column).")
    lines.append("")
    lines += render_queue_step(doc["queue"])
    lines.append("")
    if doc["metrics_live"]:
        lines.append("Metrics (Prometheus text), live until `lowtide cluster down --data-dir "
                     f"{doc['data_dir']}`:")
    else:
        lines.append("Metrics (Prometheus text) were served during the run at these addresses; the cluster "
                     "is stopped now (--keep leaves it running):")
    lines += [f"  {u}" for u in doc["metrics"]]
    if doc.get("prometheus"):
        lines.append(f"Prometheus {'at' if doc['metrics_live'] else 'was at'} {doc['prometheus']} (alert rules "
                     "loaded; Grafana dashboards in charts/lowtide/dashboards/*.json).")
    lines.append("In Kubernetes, Prometheus scrapes them through the chart's annotations (charts/lowtide).")
    if doc["data_dir"]:
        lines.append(f"The cluster's directory (data, logs, cluster.json) is kept in {doc['data_dir']}.")
    else:
        lines.append("The demo's temporary directory was removed.")
    return "\n".join(lines)
