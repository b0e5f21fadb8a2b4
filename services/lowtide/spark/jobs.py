"""The Spark jobs of the pipeline (docs/spark.md#the-jobs): producer, consumer (commits its group), retention caller.

``spark-jobs/*.py`` are thin ``argparse`` wrappers over these functions, and ``lowtide demo`` calls
them on one SparkSession. Each returns a plain dict report (printed as JSON by the wrappers).

* ``run_producer``: ``spark.range`` → key ``k<id>`` and a ``record_size``-byte value → format lowtide
  (acks=all).
* ``run_consumer``: a streaming read with ``Trigger.AvailableNow`` from the group's committed offsets
  (the checkpoint lives under ``checkpoint_dir``), a transformation (value length and upper-cased
  key), written to a result topic or to Parquet files; every finished micro-batch's end offsets are
  committed to the group. ``max_batches`` makes a deliberately slow consumer stop early: the query
  is given the end offsets its first ``max_batches`` micro-batches reach (``endingOffsets``) and ends
  there by itself. (Stopping it with ``query.stop()`` cancelled the micro-batch then running: Spark
  printed the cancelled tasks' stack traces and the Python side's tracebacks — the worker daemon's
  BrokenPipeError, the accumulator server's EOFError — which a newcomer reads as a failure.)
* ``run_retention``: KIP-68 on the client side: min committed offset over the groups per partition
  → DeleteRecords, computed on the driver (the groups' offsets are tiny), reported per partition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from lowtide.client.admin import Admin, OffsetSpec
from lowtide.client.retention import plan_consumed_retention, run_consumed_retention
from lowtide.spark.options import EARLIEST, Connection, Subscription, parse_offsets
from lowtide.spark.planning import (
    commit_group,
    from_json_offsets,
    limit_offsets,
    list_offsets,
    open_admin,
    resolve_offsets,
    resolve_partitions,
    to_json_offsets,
)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _options(connection: Connection) -> dict[str, str]:
    out = {"bootstrap.servers": connection.bootstrap}
    if connection.token:
        out["lowtide.auth.token"] = connection.token
    if connection.tls is not None:
        out.update({"lowtide." + k: v for k, v in connection.tls.to_properties().items() if k.startswith("ssl.")})
    return out


def run_producer(spark, connection: Connection, *, topic: str, records: int, record_size: int = 1024,
                 partitions: int | None = None, batch_bytes: int | None = None,
                 progress: Progress = _quiet) -> dict:
    """Write ``records`` generated rows into ``topic``; returns records, bytes, seconds, MB/s.
    ``batch_bytes`` caps a record batch (it must fit the topic's segment.bytes and max.message.bytes)."""
    from pyspark.sql import functions as F

    slices = partitions or spark.sparkContext.defaultParallelism
    # A 64-hex-char digest repeated to the record size: distinct per row, generated inside the JVM.
    repeat = -(-record_size // 64)
    df = (spark.range(0, records, numPartitions=slices)
          .select(F.concat(F.lit("k"), F.col("id").cast("string")).cast("binary").alias("key"),
                  F.substring(F.repeat(F.sha2(F.col("id").cast("string"), 256), repeat), 1, record_size)
                  .cast("binary").alias("value")))
    progress(f"Spark producer: {records:,} records of {record_size} B into '{topic}' ({slices} tasks)")
    t0 = time.perf_counter()
    writer = df.write.format("lowtide").options(**_options(connection)).option("topic", topic).mode("append")
    if batch_bytes:
        writer = writer.option("lowtide.batch.bytes", str(batch_bytes))
    writer.save()
    seconds = time.perf_counter() - t0
    nbytes = records * record_size
    return {"topic": topic, "records": records, "bytes": nbytes, "seconds": round(seconds, 3),
            "mb_per_s": round(nbytes / seconds / 1e6, 1)}


WORKER_START_ATTEMPTS = 3


def _is_worker_start_timeout(failure) -> bool:
    """Whether a streaming query failed because Spark's Python worker did not connect back in time."""
    return "Python worker failed to connect back" in str(failure)


def run_consumer(spark, connection: Connection, *, topic: str, group: str, checkpoint_dir: str,
                 output_topic: str | None = None, output_path: str | None = None,
                 max_offsets_per_trigger: int | None = None, max_batches: int | None = None,
                 progress: Progress = _quiet) -> dict:
    """Consume ``topic`` as ``group`` until caught up (or ``max_batches`` micro-batches), commit."""
    from pyspark.sql import functions as F

    if (output_topic is None) == (output_path is None):
        raise ValueError("give exactly one of output_topic / output_path")
    with open_admin(connection) as admin:
        starting = _committed_or_earliest(admin, group, topic)
        ending = (_end_of_batches(admin, topic, starting, batches=max_batches, per_batch=max_offsets_per_trigger)
                  if max_batches is not None and max_offsets_per_trigger else None)
    reader = (spark.readStream.format("lowtide").options(**_options(connection))
              .option("subscribe", topic).option("startingOffsets", starting)
              .option("lowtide.group.id", group))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    stopped_early = False
    if ending is not None:
        reader = reader.option("endingOffsets", json.dumps(to_json_offsets(ending[0])))
        stopped_early = ending[0] != ending[1]
    transformed = reader.load().select(
        F.upper(F.col("key").cast("string")).cast("binary").alias("key"),
        F.concat_ws(":", F.col("partition").cast("string"), F.col("offset").cast("string"),
                    F.length("value").cast("string")).cast("binary").alias("value"))
    writer = transformed.writeStream.option("checkpointLocation", checkpoint_dir).trigger(availableNow=True)
    if output_topic is not None:
        writer = writer.format("lowtide").options(**_options(connection)).option("topic", output_topic)
    else:
        writer = writer.format("parquet").option("path", output_path)
    t0 = time.perf_counter()
    rows = 0
    seen: set[int] = set()
    query = None

    def report_new_batches() -> None:
        nonlocal rows
        for p in query.recentProgress:
            if p["batchId"] not in seen:
                seen.add(p["batchId"])
                rows += p["numInputRows"]
                if p["numInputRows"]:
                    progress(f"Spark consumer '{group}': micro-batch {p['batchId']}: {p['numInputRows']:,} records")

    for attempt in range(1, WORKER_START_ATTEMPTS + 1):
        query = writer.start()
        try:
            while query.isActive:
                report_new_batches()
                time.sleep(0.2)
        finally:
            if query.isActive:
                query.stop()
        failure = query.exception()
        if failure is None:
            break
        if not _is_worker_start_timeout(failure) or attempt == WORKER_START_ATTEMPTS:
            raise RuntimeError(f"consumer query for group {group} failed: {failure}")
        # Spark gives a Python worker a fixed 10 s to connect back; a loaded machine can miss it
        # before any micro-batch ran. The query restarts from its checkpoint, as a Spark user
        # restarts a failed streaming query, so nothing is read or written twice.
        report_new_batches()
        progress(f"Spark consumer '{group}': a Python worker did not start in time; "
                 f"restarting the query from its checkpoint (attempt {attempt + 1})")
    report_new_batches()
    # The source commits a finished micro-batch when Spark plans the next one; a query that did not
    # plan one (stopped from outside) has its last finished batch committed here, from the query's
    # own record of what it completed.
    last = _last_end_offsets(query)
    if last:
        with open_admin(connection) as admin:
            commit_group(admin, group, last)
    with open_admin(connection) as admin:
        committed = {p: c.offset for (t, p), c in admin.fetch_offsets(group, []).items() if t == topic}
    return {"topic": topic, "group": group, "records": rows, "micro_batches": len(seen),
            "stopped_early": stopped_early, "seconds": round(time.perf_counter() - t0, 3),
            "committed": dict(sorted(committed.items()))}


def _end_of_batches(admin: Admin, topic: str, starting: str, *, batches: int,
                    per_batch: int) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """(where the first ``batches`` micro-batches of at most ``per_batch`` records from ``starting``
    end, the topic's latest offsets): the source's own maxOffsetsPerTrigger rule, applied ahead."""
    tps = resolve_partitions(admin, Subscription(topics=(topic,)))
    latest = list_offsets(admin, tps, OffsetSpec.LATEST)
    end = resolve_offsets(admin, tps, parse_offsets(starting, name="startingOffsets", default=EARLIEST))
    for _ in range(batches):
        end = limit_offsets(end, latest, per_batch)
    return end, latest


def _last_end_offsets(query) -> dict[tuple[str, int], int]:
    done = [p for p in query.recentProgress if p["sources"]]
    if not done:
        return {}
    end = done[-1]["sources"][0].get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return from_json_offsets(end) if end else {}


def _committed_or_earliest(admin: Admin, group: str, topic: str) -> str:
    committed = {p: c.offset for (t, p), c in admin.fetch_offsets(group, []).items() if t == topic and c.offset >= 0}
    if not committed:
        return "earliest"
    return json.dumps({topic: {str(p): o for p, o in committed.items()}})


def run_retention(connection: Connection, *, topic: str, groups: Sequence[str] | None = None,
                  timeout_ms: int = 30_000, progress: Progress = _quiet) -> dict:
    """KIP-68 client side: DeleteRecords up to min committed offset over ``groups`` (default: every
    group that committed offsets for ``topic``); a group without an offset for a partition means
    nothing is deleted there."""
    with open_admin(connection) as admin:
        plan = plan_consumed_retention(admin, topic, groups=list(groups) if groups else None)
        progress(f"retention caller: groups {', '.join(plan.groups) or '(none)'} on '{topic}'")
        t0 = time.perf_counter()
        results = run_consumed_retention(admin, plan, timeout_ms=timeout_ms)
        millis = (time.perf_counter() - t0) * 1000
    rows = []
    for (t, p), target in sorted(plan.targets.items()):
        res = results.get((t, p))
        rows.append({"topic": t, "partition": p, "delete_before": target,
                     "low_watermark": res.low_watermark if res is not None and res.error is None else None,
                     "error": res.error.name if res is not None and res.error is not None else None,
                     "reason": plan.reasons.get((t, p))})
    return {"topic": topic, "groups": plan.groups, "delete_records_ms": round(millis, 2), "partitions": rows}


def render_retention(report: dict) -> str:
    head = f"{'topic':<16} {'part':>4} {'delete before':>13} {'low watermark':>13}  note"
    lines = [head, "-" * len(head)]
    for r in report["partitions"]:
        lw = "-" if r["low_watermark"] is None else str(r["low_watermark"])
        note = r["error"] or r["reason"] or ""
        lines.append(f"{r['topic']:<16} {r['partition']:>4} {r['delete_before']:>13} {lw:>13}  {note}")
    groups = ", ".join(report["groups"]) or "(none)"
    lines.append(f"groups: {groups}; DeleteRecords took {report['delete_records_ms']} ms")
    return "\n".join(lines)

