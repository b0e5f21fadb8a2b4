"""Issue 49's figures for share groups (KIP-932): share-consume throughput next to classic consume
in the same run, and the time from the last acknowledgement to the disk freed. Reports; never
asserts on time.

A cluster of its own (3 replicas, front door, the replicas' Kafka listeners). Each share group
starts at the log start: its ``share.auto.offset.reset`` group config is set to earliest first
(what ``kafka-configs --entity-type groups`` sets; ShareConsumerPerformance sets none).

**Throughput.** A topic of 3 partitions RF 3 holds ``records`` 1 KiB records (quick 50,000, about
51 MB; full 500,000, about 512 MB) written by Kafka's ``ProducerPerformance`` (256 KiB batches).
Then, ``rounds`` times in alternation (quick 1, full 5), the same records are read by Kafka 4.4's
own tools, unchanged, from the jars of ``make kafka-tools`` (``.tools/kafka-tools-newest.json``),
each in a fresh group, with their defaults:

* ``org.apache.kafka.tools.ConsumerPerformance`` (a classic consumer group): its ``fetch.MB.sec``
  and ``fetch.nMsg.sec``, from the group's assignment to the last record (the join waits the
  front door's ``group.initial.rebalance.delay.ms``, 3 s);
* ``org.apache.kafka.tools.ShareConsumerPerformance`` (a share group, one member, implicit
  acknowledgement: every record acknowledged, accept, on the next poll; ``--show-detailed-stats``
  every 100 ms): the rate from its first records (its first progress row) to the last, the
  comparable of ``fetch.MB.sec``; its own ``MB.sec``, from its start (the JVM's warm-up and the
  share group's join included), is in the note.

``share_consume_mbs`` / ``share_consume_records_s`` against ``share_classic_consume_mbs`` /
``share_classic_consume_records_s``, medians of the rounds; ``share_consume_vs_classic`` is the
median of the rounds' ratios of the MB/s (the two runs of a round are close in time: the box's
load moves them together). MB is 10^6 bytes (the tools print 2^20: converted).

**Last acknowledgement → disk freed.** ``rounds`` rounds (quick 3, full 10), each on a fresh topic
of 3 partitions RF 3 with ``segment.bytes`` 256 KiB, ``consumed.retention.ms=0`` and
``consumed.retention.groups=share:<group>`` (KIP-68 consumed retention naming a share group), holding
``per_partition`` bytes of 1 KiB records per partition (quick 1 MiB, full 4 MiB: 4 and 16 segments),
produced over raw gRPC and replicated before the round starts. A ``ShareConsumerPerformance`` of a
fresh group reads every record and exits (its close acknowledges the last records). Meanwhile this
process polls every replica's partition directories (every 2 ms) and the replicas' log start
offsets (``DescribeLogs``, every ~10 ms). Measured, per round:

* **the last acknowledgement**: the write timestamp of the first ``__share_group_state`` snapshot of
  each share-partition whose start offset is the partition's end, the latest of the 3 partitions
  (read back after the round, over raw gRPC Fetch from the state topic's leaders). The snapshot is
  stamped by the share-partition's leader just before its acks=all write, so the figure includes
  that write (a few ms): it overstates the time from "durable" to "freed" by that much, never
  understates it;
* **disk freed**: the first poll that finds no segment file below the end on any replica of any of
  the 3 partitions, with every replica's log start offset at the end. ``share_freed_p50_ms`` and
  ``share_freed_max_ms`` over the rounds (the goal of issue 49: within a second), beside the time the last leader's
  log start offset reached the end (``share_freed_leader_lso_ms``, p50).

Alone, on a fresh local cluster: ``python -m tests.bench.share [--quick]``; in the suite:
``python -m tests.bench.run --only share [--quick]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from lowtide.client import Admin
from lowtide.share.codec import SHARE_STATE_TOPIC
from lowtide.share.persist import decode_records
from lowtide_pb import replica_pb2
from tests.bench.common import (
    Bench,
    Figure,
    KiB,
    MiB,
    build_batch,
    dir_log_bytes,
    failed,
    next_offset_after,
    percentile,
    running_cluster,
    say,
)
from tests.bench.idempotence import TOOL
from tests.bench.request_cost import _write_topic

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / ".tools" / "kafka-tools-newest.json"  # scripts/kafka_tools.sh --newest (Kafka 4.4)
SHARE_PERF = "org.apache.kafka.tools.ShareConsumerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"
RECORD = 1024
PARTITIONS = 3
SEGMENT_BYTES = 256 * KiB


def start_at_earliest(bench: Bench, group: str) -> None:
    """The group's share.auto.offset.reset config set to earliest (Kafka's IncrementalAlterConfigs
    of the GROUP resource, through the front door's Admin)."""
    with Admin(bench.bootstrap) as admin:
        admin.alter_group_config(group, set_config={"share.auto.offset.reset": "earliest"})
SEGMENT_FILE = re.compile(r"^(\d{20})\.log")
MB_PER_TOOL_MB = 1.048576  # the tools' MB is 2^20 bytes; the figures' is 10^6
FREED_TIMEOUT_S = 120.0
FREED_GOAL_MS = 1000.0


def kafka_lib() -> Path:
    """The jars of Kafka's newest tools (``make kafka-tools``: 4.4.0), which have ShareConsumerPerformance."""
    try:
        manifest = json.loads(MANIFEST.read_text())
        lib = Path(manifest["lib"])
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeError(f"Kafka's newest tools are not installed ({MANIFEST}: {exc}); run 'make kafka-tools'") \
            from exc
    if not list(lib.glob("kafka-tools-*.jar")):
        raise RuntimeError(f"no kafka-tools jar in {lib}; run 'make kafka-tools'")
    major, minor = (int(x) for x in str(manifest.get("kafka_version", "0.0")).split(".")[:2])
    if (major, minor) < (4, 1):
        raise RuntimeError(f"Kafka {manifest.get('kafka_version')}'s tools have no share consumer (4.1+ needed)")
    return lib


def _java(lib: Path) -> list[str]:
    """A JVM for a tool that is measured: the full JIT (no class archive, no C1-only), 1 GiB of heap,
    as request_cost.py runs ConsumerPerformance; both tools get the same."""
    return ["java", "-Xms256m", "-Xmx1g", "-cp", f"{lib}/*"]


def _tool_rows(done: subprocess.CompletedProcess, what: str) -> list[dict[str, str]]:
    """The rows of ConsumerPerformance / ShareConsumerPerformance as ``{column: value}``, in order;
    the last is the summary (ShareConsumerPerformance's progress rows end "for share consumer N")."""
    lines = [line for line in done.stdout.splitlines() if line.count(",") >= 5]
    header = next((line for line in lines if "MB.sec" in line and "start.time" in line), None)
    rows = [line for line in lines if header is not None and line is not header
            and line.count(",") == header.count(",")]
    if done.returncode != 0 or header is None or not rows or "for share consumer" in rows[-1]:
        raise RuntimeError(f"{what} exited {done.returncode}: {done.stdout[-600:]} {done.stderr[-900:]}")
    columns = [c.strip() for c in header.split(",")]
    return [dict(zip(columns, (v.strip() for v in row.split(",")), strict=False)) for row in rows]


def _when(stamp: str) -> float:
    """The tools' time column (``yyyy-MM-dd HH:mm:ss:SSS``, local time) as seconds since the epoch."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S:%f").timestamp()


def _classic(lib: Path, bootstrap: str, topic: str, records: int) -> dict[str, float]:
    argv = [*_java(lib), CONSUMER_PERF, "--bootstrap-server", bootstrap, "--topic", topic, "--num-records",
            str(records), "--group", f"classic-{time.time_ns()}", "--timeout", "30000"]
    row = _tool_rows(subprocess.run(argv, capture_output=True, text=True, timeout=600), "ConsumerPerformance")[-1]
    if int(row["data.consumed.in.nMsg"]) < records:
        raise RuntimeError(f"ConsumerPerformance read {row['data.consumed.in.nMsg']} of {records} records")
    return {"mbs": float(row["fetch.MB.sec"]) * MB_PER_TOOL_MB, "records_s": float(row["fetch.nMsg.sec"]),
            "mbs_whole": float(row["MB.sec"]) * MB_PER_TOOL_MB, "to_first_s": float(row["rebalance.time.ms"]) / 1e3}


def _share(lib: Path, bootstrap: str, topic: str, records: int, group: str) -> dict[str, float]:
    """One ShareConsumerPerformance run. Its own MB.sec counts from its start, the JVM's warm-up and
    the share group's join included; its progress rows (every 100 ms with records) say when the
    first records came, so the rate from there to the last record is the one comparable with
    ConsumerPerformance's fetch.MB.sec (from the group's assignment)."""
    argv = [*_java(lib), SHARE_PERF, "--bootstrap-server", bootstrap, "--topic", topic, "--num-records",
            str(records), "--group", group, "--timeout", "30000", "--show-detailed-stats",
            "--reporting-interval", "100"]
    rows = _tool_rows(subprocess.run(argv, capture_output=True, text=True, timeout=600), "ShareConsumerPerformance")
    total = rows[-1]
    if int(total["data.consumed.in.nMsg"]) < records:
        raise RuntimeError(f"ShareConsumerPerformance read {total['data.consumed.in.nMsg']} of {records} records")
    first = rows[0] if len(rows) > 1 else total
    seconds = _when(total["end.time"]) - _when(first["end.time"])
    mb = float(total["data.consumed.in.MB"]) - float(first["data.consumed.in.MB"])
    n = int(total["data.consumed.in.nMsg"]) - int(first["data.consumed.in.nMsg"])
    if seconds <= 0 or first is total:
        mbs, records_s = float(total["MB.sec"]), float(total["nMsg.sec"])
    else:
        mbs, records_s = mb / seconds, n / seconds
    return {"mbs": mbs * MB_PER_TOOL_MB, "records_s": records_s, "mbs_whole": float(total["MB.sec"]) * MB_PER_TOOL_MB,
            "to_first_s": _when(first["end.time"]) - _when(total["start.time"])}


def throughput_figures(bench: Bench, lib: Path, *, quick: bool) -> list[Figure]:
    if not TOOL.exists():
        raise RuntimeError(f"{TOOL} is missing: run 'make kafka-tools'")
    records = 50_000 if quick else 500_000
    rounds = 1 if quick else 5
    bootstrap = ",".join(s.kafka for s in bench.replicas.values() if s.kafka)
    topic = f"share-tput-{int(time.time())}"
    bench.create_topic(topic, partitions=PARTITIONS, rf=3)
    _write_topic(bootstrap, topic, records)
    bench.wait_replicated(topic)
    classic: list[dict[str, float]] = []
    share: list[dict[str, float]] = []
    for r in range(rounds):
        # Alternate which goes first, so neither always reads a colder page cache or a busier minute.
        order = ("classic", "share") if r % 2 == 0 else ("share", "classic")
        for which in order:
            if which == "classic":
                classic.append(_classic(lib, bootstrap, topic, records))
            else:
                group = f"share-tput-{r}-{time.time_ns()}"
                start_at_earliest(bench, group)
                share.append(_share(lib, bootstrap, topic, records, group))
        say(f"share: throughput round {r + 1}: classic ConsumerPerformance {classic[-1]['mbs']:.1f} MB/s "
            f"({classic[-1]['records_s']:,.0f} records/s; {classic[-1]['mbs_whole']:.1f} MB/s from its start, "
            f"assigned after {classic[-1]['to_first_s']:.1f} s), ShareConsumerPerformance {share[-1]['mbs']:.1f} MB/s "
            f"({share[-1]['records_s']:,.0f} records/s; {share[-1]['mbs_whole']:.1f} MB/s from its start, first "
            f"records after {share[-1]['to_first_s']:.1f} s)")
    bench.delete_topic(topic)

    def med(runs: list[dict[str, float]], what: str) -> float:
        return statistics.median(x[what] for x in runs)

    params = {"records": records, "record_bytes": RECORD, "partitions": PARTITIONS, "rf": 3, "rounds": rounds,
              "tools": "Kafka 4.4.0 ConsumerPerformance / ShareConsumerPerformance, defaults, one consumer each",
              "classic": classic, "share": share}
    each_c = ", ".join(f"{x['mbs']:.1f}" for x in classic)
    each_s = ", ".join(f"{x['mbs']:.1f}" for x in share)
    share_mbs, classic_mbs = med(share, "mbs"), med(classic, "mbs")
    # Each round's two runs are a minute apart at most: their ratio is less at the mercy of the box's
    # load (other work shares its 2 cores) than the ratio of the medians.
    ratios = [s["mbs"] / c["mbs"] for s, c in zip(share, classic, strict=True) if c["mbs"]]
    return [
        Figure("share_classic_consume_mbs", "classic consumer group: Kafka's ConsumerPerformance, 3 partitions RF 3",
               round(classic_mbs, 1), "MB/s", params=params,
               note=f"fetch.MB.sec (from the group's assignment to the last record), median of {rounds} ({each_c}); "
                    f"from the tool's start (the join waits 3 s) {med(classic, 'mbs_whole'):.1f}"),
        Figure("share_classic_consume_records_s", "classic consumer group: ConsumerPerformance records/s",
               round(med(classic, "records_s")), "records/s", params=params, note="fetch.nMsg.sec, median"),
        Figure("share_consume_mbs", "share group: Kafka's ShareConsumerPerformance, 3 partitions RF 3, one member",
               round(share_mbs, 1), "MB/s", params=params,
               note=f"from the first records to the last (implicit acknowledgement: each poll accepts the last), "
                    f"median of {rounds} ({each_s}); from the tool's start (JVM warm-up and join included) "
                    f"{med(share, 'mbs_whole'):.1f}"),
        Figure("share_consume_records_s", "share group: ShareConsumerPerformance records/s",
               round(med(share, "records_s")), "records/s", params=params, note="from the first records, median"),
        Figure("share_consume_vs_classic", "share-consume MB/s over classic consume MB/s (same topic, same run)",
               round(statistics.median(ratios), 2) if ratios else None, "×", params=params,
               note=f"median of the rounds' ratios ({', '.join(f'{x:.2f}' for x in ratios)}); medians "
                    f"{share_mbs:.1f} MB/s against {classic_mbs:.1f} MB/s"),
    ]


# ----------------------------------------------------------------------------- deleted once delivered

class _StateTopic:
    """Reads ``__share_group_state`` over raw gRPC Fetch from its leaders, incrementally: every
    snapshot as (group, topic id, partition, start offset, write timestamp ms)."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.position: dict[int, int] = {}

    def read(self) -> list[tuple[str, str, int, int, int]]:
        out = []
        for partition, address in self.bench.leaders(SHARE_STATE_TOPIC).items():
            stub = self.bench.replica_stub(address)
            while True:
                pos = self.position.get(partition, 0)
                resp = stub.Fetch(replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, partitions=[
                    replica_pb2.FetchPartition(topic=SHARE_STATE_TOPIC, partition=partition, fetch_offset=pos,
                                               partition_max_bytes=4 * MiB)]), timeout=30)
                r = resp.partitions[0]
                if r.error_code:
                    raise RuntimeError(f"Fetch {SHARE_STATE_TOPIC}-{partition}: error {r.error_code} "
                                       f"{r.error_message}")
                nxt = next_offset_after(r.records) if r.records else None
                if nxt is None or nxt <= pos:
                    break
                for rec in decode_records(r.records, pos):
                    if rec.value is not None and not rec.value.is_update:
                        out.append((rec.key.group_id, rec.key.topic_id, rec.key.partition, rec.value.start_offset,
                                    rec.value.write_timestamp_ms))
                self.position[partition] = nxt
                if nxt >= r.high_watermark:
                    break
        return out


def _segments_below(path: Path, end: int) -> list[int]:
    return [int(m.group(1)) for n in dir_log_bytes(path) if (m := SEGMENT_FILE.match(n)) and int(m.group(1)) < end]


def _fill(bench: Bench, topic: str, per_partition: int) -> dict[int, int]:
    """``per_partition`` bytes of 1 KiB records to each partition (acks=all, 64 KiB batches, up to
    1 MiB per request); every replica caught up. Returns ``{partition: end offset}``."""
    batch, count = build_batch(64 * KiB)
    per_request = max(1, MiB // len(batch))
    batches = max(1, per_partition // len(batch))
    sent = 0
    while sent < batches:
        n = min(per_request, batches - sent)
        bench.produce_all(topic, {p: batch * n for p in range(PARTITIONS)})
        sent += n
    bench.wait_replicated(topic)
    return {p: batches * count for p in range(PARTITIONS)}


def _freed_round(bench: Bench, lib: Path, state: _StateTopic, r: int, per_partition: int) -> dict[str, float]:
    stamp = time.time_ns()
    topic, group = f"share-freed-{r}-{stamp}", f"share-freed-{r}-{stamp}"
    bench.create_topic(topic, PARTITIONS, 3, config={
        "segment.bytes": str(SEGMENT_BYTES), "consumed.retention.ms": "0",
        "consumed.retention.groups": f"share:{group}"})
    start_at_earliest(bench, group)
    try:
        ends = _fill(bench, topic, per_partition)
        replicas = bench.replica_sets(topic)
        leaders = bench.leaders(topic)
        dirs = {p: [Path(bench.replicas[i].data_dir) / f"{topic}-{p}" for i in replicas[p]] for p in ends}
        segments = {p: len(_segments_below(dirs[p][0], ends[p])) for p in ends}
        if min(segments.values()) < 2:
            raise RuntimeError(f"too few segments to free: {segments}")
        bootstrap = ",".join(s.kafka for s in bench.replicas.values() if s.kafka)
        total = sum(ends.values())
        argv = [*_java(lib), SHARE_PERF, "--bootstrap-server", bootstrap, "--topic", topic, "--num-records",
                str(total), "--group", group, "--timeout", "30000"]
        consumer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            leader_lso_at = freed_at = None
            addrs = {a for a in leaders.values()} | {bench.replicas[i].grpc for rs in replicas.values() for i in rs}
            deadline = time.monotonic() + FREED_TIMEOUT_S
            polls = 0
            while freed_at is None:
                now = time.time()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"segments below the ends {ends} still on disk after {FREED_TIMEOUT_S:.0f} s: "
                                       + str({p: [(d.parent.name, _segments_below(d, ends[p])) for d in dirs[p]]
                                              for p in ends}))
                if consumer.poll() not in (None, 0):
                    raise RuntimeError(f"ShareConsumerPerformance exited {consumer.returncode}: "
                                       f"{consumer.stderr.read()[-800:]}")
                on_disk = any(_segments_below(d, ends[p]) for p in ends for d in dirs[p])
                if not on_disk or (leader_lso_at is None and polls % 5 == 0):
                    lso = {(log.partition, addr): log.log_start_offset for addr in addrs
                           for log in bench.describe_logs(addr, topic)}
                    if leader_lso_at is None and all(lso.get((p, leaders[p])) == ends[p] for p in ends):
                        leader_lso_at = now
                    if not on_disk and all(lso.get((p, bench.replicas[i].grpc)) == ends[p]
                                           for p in ends for i in replicas[p]):
                        freed_at = now
                polls += 1
                time.sleep(0.002)
            out, err = consumer.communicate(timeout=60)
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
        if consumer.returncode != 0:
            raise RuntimeError(f"ShareConsumerPerformance exited {consumer.returncode}: {out[-400:]} {err[-800:]}")
        # The last acknowledgement: the first snapshot of each share-partition at its end, the latest of them.
        done_ms: dict[int, int] = {}
        for g, _tid, p, start, written in state.read():
            if g == group and p in ends and start >= ends[p]:
                done_ms[p] = min(done_ms.get(p, written), written)
        if set(done_ms) != set(ends):
            raise RuntimeError(f"no snapshot at the end for partitions {sorted(set(ends) - set(done_ms))} of {group}")
        acked_at = max(done_ms.values()) / 1000
        return {"freed_ms": (freed_at - acked_at) * 1e3,
                "leader_lso_ms": ((leader_lso_at or freed_at) - acked_at) * 1e3,
                "segments": sum(segments.values()), "records": total}
    finally:
        bench.delete_topic(topic)


def freed_figures(bench: Bench, lib: Path, *, quick: bool) -> list[Figure]:
    rounds = 3 if quick else 10
    per_partition = (1 if quick else 4) * MiB
    state = _StateTopic(bench)
    runs = []
    for r in range(rounds):
        got = _freed_round(bench, lib, state, r, per_partition)
        runs.append(got)
        say(f"share: freed round {r + 1}: {got['segments']} segments of {SEGMENT_BYTES // KiB} KiB below the ends; "
            f"last acknowledgement -> every leader's log start at the end {got['leader_lso_ms']:.0f} ms, -> every "
            f"replica's segments gone {got['freed_ms']:.0f} ms")
    freed = [x["freed_ms"] for x in runs]
    params = {"rounds": rounds, "partitions": PARTITIONS, "rf": 3, "segment_bytes": SEGMENT_BYTES,
              "bytes_per_partition": per_partition, "record_bytes": RECORD, "poll_interval_ms": 2,
              "samples_ms": [round(x, 1) for x in freed],
              "leader_lso_samples_ms": [round(x["leader_lso_ms"], 1) for x in runs],
              "consumer": "Kafka 4.4.0 ShareConsumerPerformance (implicit acknowledgement)"}
    each = ", ".join(f"{x:.0f}" for x in freed)
    return [
        Figure("share_freed_p50_ms", "share group: last acknowledgement to the segments gone on every replica, p50",
               round(percentile(freed, 50), 1), "ms", target="within a second (issue 49)",
               target_value=FREED_GOAL_MS, better="lower", params=params,
               note=f"{rounds} rounds ({each} ms); consumed.retention.groups=share:<group>, 3 partitions RF 3, "
                    "from the snapshot's write timestamp (before its acks=all write)").judge(),
        Figure("share_freed_max_ms", "share group: last acknowledgement to the segments gone on every replica, max",
               round(max(freed), 1), "ms", target="within a second (issue 49)", target_value=FREED_GOAL_MS,
               better="lower", params=params, note=f"worst of {rounds} rounds").judge(),
        Figure("share_freed_leader_lso_ms", "share group: last acknowledgement to every leader's log start offset "
               "at the end, p50", round(percentile([x["leader_lso_ms"] for x in runs], 50), 1), "ms", params=params,
               note="polled every ~10 ms (DescribeLogs)"),
    ]


def share_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    """Both parts on one cluster of their own; a part that fails becomes an error figure."""
    lib = kafka_lib()
    figures: list[Figure] = []
    with running_cluster(data_dir / "cluster") as bench:
        if not all(s.kafka for s in bench.replicas.values()):
            raise RuntimeError("the cluster's replicas have no Kafka listener")
        for part, fn, key, name, unit, target in (
                ("throughput", throughput_figures, "share_consume_mbs", "share-consume throughput", "MB/s", None),
                ("freed", freed_figures, "share_freed_max_ms", "share group: last acknowledgement to disk freed",
                 "ms", "within a second (issue 49)")):
            began = time.monotonic()
            try:
                figures += fn(bench, lib, quick=quick)
            except Exception as exc:  # noqa: BLE001 - report, the other part goes on
                say(f"share: {part} failed: {exc!r}")
                figures.append(failed(key, name, unit, target, exc))
            say(f"share: {part} done in {time.monotonic() - began:.1f}s")
    return figures


def main() -> None:
    """``python -m tests.bench.share [--quick]``: both parts on a fresh local cluster; prints the figures."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sharebench-") as tmp:
        for f in share_figures(Path(tmp), quick=args.quick):
            say(f"{f.key} = {f.value} {f.unit} {f.note}")


if __name__ == "__main__":
    main()
