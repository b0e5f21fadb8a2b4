"""Issue 47's consume figures: Kafka's own consumer tools against lowtide and against Apache Kafka 4.1
on this box. Reports; never asserts.

On the shared bench cluster (3 replicas RF 3, the replicas' Kafka listeners) and on a Kafka 4.1
cluster of its own (KRaft, one controller and three brokers: ``kafka_scale.KafkaCluster``), the same
topic is written the same way: 3 partitions RF 3, ``records`` 1 KiB records (full 500,000, about
512 MB; quick 100,000) by Kafka's ``ProducerPerformance`` (its payload: one random A-Z line, the
same for every record; 256 KiB batches so the writing is quick), then read back, each read
``ROUNDS`` times (quick: ``QUICK_ROUNDS``) after one uncounted warm-up round of both reads, the
median reported:

* ``ctools_consumer_perf_mbs`` / ``ctools_kafka_consumer_perf_mbs``: Kafka's ``ConsumerPerformance``
  (``kafka-consumer-perf-test``, its defaults: a fresh consumer group, ``--fetch-size`` 1 MiB),
  ``--messages records``: its ``fetch.MB.sec`` column, the rate from the group's assignment to the
  last record. Its ``MB.sec`` (from its start, the group's join included) is in the note: the join
  waits ``group.initial.rebalance.delay.ms``, Kafka's default of 3 s in lowtide, but 0 in Kafka's
  stock ``server.properties`` (which ``KafkaCluster`` follows), so it says nothing of either's
  cost per request;
* ``ctools_cli_consume_mbs``: ``lowtide consume --topic T --max-records records`` (text output, one
  value a line) with its stdout a pipe that this process drains, wall clock from the command's start
  to its exit, beside ``ctools_kafka_console_consumer_mbs``: Kafka's ``kafka-console-consumer
  --from-beginning --max-messages records`` reading Kafka 4.1 into a pipe the same way. Both print
  the same bytes (the payload is ASCII, so lowtide's escaping leaves it as it is). MB/s is of the
  records' payload (records x 1024 bytes).
* ``ctools_consumer_perf_vs_kafka`` and ``ctools_cli_consume_vs_console``: lowtide's figure over
  Kafka's, the goals of issue 47 (>= 1.5x and >= 2x).

With ``LOWTIDE_BENCH_SKIP_KAFKA=1`` (``run.py --baseline`` sets it for the old checkout's pass) the
Kafka 4.1 side is left out: the ratios of the old checkout are then taken against this run's Kafka.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.common import Bench, Figure, say
from tests.bench.idempotence import SUMMARY, TOOL
from tests.bench.kafka_scale import KafkaCluster, kafka_lib

RECORD = 1024
ROUNDS = 5  # counted rounds of each read (quick: QUICK_ROUNDS), the median reported
QUICK_ROUNDS = 3
# Uncounted first rounds: the first read after the write ran ~45 % slower than the next ones on
# both systems in one run (docs/testing.md), and one such round among three moved the median
# ratio by up to 0.4.
WARM_UP_ROUNDS = 1
SKIP_KAFKA_ENV = "LOWTIDE_BENCH_SKIP_KAFKA"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
# lowtide's figure -> (Kafka's figure, the ratio figure, its goal): the goals of issue 47.
RATIOS = {"ctools_consumer_perf_mbs": ("ctools_kafka_consumer_perf_mbs", "ctools_consumer_perf_vs_kafka", 1.5),
          "ctools_cli_consume_mbs": ("ctools_kafka_console_consumer_mbs", "ctools_cli_consume_vs_console", 2.0)}


def _write_topic(bootstrap: str, topic: str, records: int) -> None:
    argv = [str(TOOL), "--topic", topic, "--num-records", str(records), "--record-size", str(RECORD),
            "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all",
            "batch.size=262144", "linger.ms=5"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    found = SUMMARY.findall(done.stdout)
    if done.returncode != 0 or not found or int(found[-1][0]) != records:
        raise RuntimeError(f"ProducerPerformance exited {done.returncode}: {done.stdout[-500:]} {done.stderr[-500:]}")


def _consumer_perf(lib: Path, bootstrap: str, topic: str, records: int, group: str) -> tuple[float, float]:
    """One ConsumerPerformance run: (MB.sec, fetch.MB.sec) as the tool prints them."""
    done = subprocess.run(["java", "-Xms256m", "-Xmx1g", "-cp", f"{lib}/*", CONSUMER_PERF, "--bootstrap-server",
                           bootstrap, "--topic", topic, "--messages", str(records), "--group", group,
                           "--timeout", "30000"], capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.count(",") >= 9]
    if done.returncode != 0 or len(lines) < 2:
        raise RuntimeError(f"ConsumerPerformance exited {done.returncode}: {done.stdout[-500:]} {done.stderr[-800:]}")
    row = dict(zip((c.strip() for c in lines[0].split(",")), (v.strip() for v in lines[-1].split(",")),
                   strict=False))
    if int(row["data.consumed.in.nMsg"]) < records:
        raise RuntimeError(f"ConsumerPerformance read {row['data.consumed.in.nMsg']} of {records} records")
    # The tool's MB is 2^20 bytes; the figures here are 10^6 bytes (as ProducerPerformance's MB/s).
    return float(row["MB.sec"]) * 1.048576, float(row["fetch.MB.sec"]) * 1.048576


def _to_pipe(argv: list[str], records: int, env: dict[str, str] | None = None) -> float:
    """Run ``argv`` with stdout a pipe this process drains; the MB/s of ``records`` 1 KiB records over
    the command's wall clock (start to exit). Fails unless every record's line came through."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    got = 0
    fd = proc.stdout.fileno()
    while chunk := os.read(fd, 1 << 20):
        got += len(chunk)
    err = proc.stderr.read().decode(errors="replace")
    proc.wait(timeout=60)
    seconds = time.perf_counter() - began
    if proc.returncode != 0 or got < records * (RECORD + 1):
        raise RuntimeError(f"{Path(argv[0]).name} {argv[1:3]} exited {proc.returncode} after {got} bytes of "
                           f"{records * (RECORD + 1)}: {err[-500:]}")
    return records * RECORD / 1e6 / seconds


def _measure(lib: Path, *, kafka_bootstrap: str, topic: str, records: int, cli: list[str] | None,
             label: str, rounds: int) -> dict[str, list[float]]:
    """``rounds`` rounds of both reads after one uncounted warm-up round (module doc: why)."""
    runs: dict[str, list[float]] = {"fetch": [], "perf": [], "pipe": []}
    pipe = cli if cli is not None else ["java", "-Xms256m", "-Xmx1g", "-cp", f"{lib}/*", CONSOLE_CONSUMER,
                                        "--bootstrap-server", kafka_bootstrap, "--topic", topic,
                                        "--from-beginning", "--max-messages", str(records)]
    for r in range(WARM_UP_ROUNDS + rounds):
        mbs, fetch_mbs = _consumer_perf(lib, kafka_bootstrap, topic, records, f"ctools-{label}-{r}-{time.time_ns()}")
        pipe_mbs = _to_pipe(pipe, records)
        counted = r >= WARM_UP_ROUNDS
        say(f"consume tools, {label}, {f'round {r - WARM_UP_ROUNDS + 1}' if counted else 'warm-up (not counted)'}: "
            f"ConsumerPerformance fetch {fetch_mbs:.1f} MB/s ({mbs:.1f} with the join), "
            f"{'lowtide consume' if cli else 'console consumer'} to a pipe {pipe_mbs:.1f} MB/s")
        if counted:
            runs["perf"].append(mbs)
            runs["fetch"].append(fetch_mbs)
            runs["pipe"].append(pipe_mbs)
    return runs


def _figures(prefix: str, system: str, runs: dict[str, list[float]], params: dict, pipe_tool: str) -> list[Figure]:
    each = ", ".join(f"{x:.1f}" for x in runs["fetch"])
    return [
        Figure(f"ctools_{prefix}consumer_perf_mbs", f"Kafka's ConsumerPerformance reading {system}, 3 partitions RF 3",
               round(statistics.median(runs["fetch"]), 1), "MB/s", params=params,
               note=f"fetch.MB.sec, median of {len(runs['fetch'])} runs ({each}); MB.sec (from the tool's start, "
                    f"the group's join included) median {statistics.median(runs['perf']):.1f}"),
        Figure(f"ctools_{prefix}{'console_consumer' if prefix else 'cli_consume'}_mbs",
               f"{pipe_tool} reading {system} into a pipe", round(statistics.median(runs["pipe"]), 1), "MB/s",
               params=params, note=f"median of {len(runs['pipe'])} runs ("
                                   + ", ".join(f"{x:.1f}" for x in runs["pipe"]) + "); wall clock, start to exit"),
    ]


def relate(figures: list[Figure]) -> list[Figure]:
    """The ratio figures of issue 47 (lowtide over Kafka 4.1), from the figures of both sides."""
    by_key = {f.key: f for f in figures}
    out = []
    for ours, (theirs, key, goal) in RATIOS.items():
        a, b = by_key.get(ours), by_key.get(theirs)
        if a is None or b is None or not a.value or not b.value:
            continue
        name = {"ctools_consumer_perf_vs_kafka": "Kafka's ConsumerPerformance: lowtide over Apache Kafka 4.1",
                "ctools_cli_consume_vs_console": "CLI consume to a pipe: lowtide consume (lowtide) over Kafka's "
                                                 "console consumer (Apache Kafka 4.1)"}[key]
        out.append(Figure(key, name, round(a.value / b.value, 2), "×",
                          target=f">= {goal:g}x Apache Kafka 4.1 (issue 47)", target_value=goal, better="higher",
                          note=f"{a.value:.1f} MB/s against {b.value:.1f} MB/s, same box, same run",
                          params={"ours": a.key, "theirs": b.key}).judge())
    return out


def consume_tools_figures(bench: Bench, data_dir: Path, *, quick: bool) -> list[Figure]:
    if not TOOL.exists():
        raise RuntimeError(f"{TOOL} is missing: run 'make kafka-tools'")
    lib = kafka_lib()
    records = 100_000 if quick else 500_000
    rounds = QUICK_ROUNDS if quick else ROUNDS
    params = {"records": records, "record_bytes": RECORD, "partitions": 3, "rf": 3, "rounds": rounds,
              "warm_up_rounds": WARM_UP_ROUNDS}
    topic = f"ctools-{int(time.time())}"
    bench.create_topic(topic, partitions=3, rf=3)
    bench.wait_leaders(topic, 3)
    listeners = ",".join(s.kafka for s in bench.replicas.values() if s.kafka)
    _write_topic(listeners, topic, records)
    cli = [sys.executable, "-m", "lowtide.cli.main", "consume", "--bootstrap-server", bench.cluster.bootstrap,
           "--topic", topic, "--max-records", str(records), "--timeout-ms", "10000"]
    figures = _figures("", "lowtide", _measure(lib, kafka_bootstrap=listeners, topic=topic, records=records, cli=cli,
                                                label="lowtide", rounds=rounds), params, "lowtide consume")
    bench.delete_topic(topic)
    if os.environ.get(SKIP_KAFKA_ENV) == "1":
        return figures
    from confluent_kafka.admin import AdminClient, NewTopic

    kafka = KafkaCluster(data_dir / "kafka", lib)
    try:
        # log_level 0: librdkafka's connection-refused lines while the brokers start are expected.
        kafka.up(lambda bootstrap: AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}))
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
        admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(60)
        _write_topic(kafka.bootstrap, topic, records)
        figures += _figures("kafka_", "Apache Kafka 4.1", _measure(lib, kafka_bootstrap=kafka.bootstrap, topic=topic,
                                                                    records=records, cli=None, label="kafka",
                                                                    rounds=rounds),
                            params, "Kafka's console consumer")
    finally:
        kafka.down()
    return figures + relate(figures)
