"""Produce and consume MB/s through the Kafka protocol listener (issue 18), with two real Kafka
clients: confluent-kafka (librdkafka, C) and kafka-python (pure Python). acks=all, idempotent, RF 3,
3 partitions, 1 KiB records; consume reads the same bytes back from offset 0. Compare with the gRPC
path's ``produce_mbs``/``consume_mbs`` and the machine ceilings in the same report: the client
library itself is often the limit (kafka-python encodes records in Python).

Then (issue 32) Kafka's own ``ProducerPerformance`` with the Java producer's defaults (16 KiB
batches, linger 5 ms, acks=all, idempotence on, 5 requests in flight), 300,000 records of 1 KiB, 3
partitions RF 3, through the replicas' Kafka listeners: MB/s, p99 and the CPU time (utime + stime
from /proc) of every cluster process per 16 KiB batch, median of 3 runs on fresh topics. Alone, on
a fresh local cluster: ``python -m tests.bench.kafka_clients [--rounds 3] [--records 300000]``."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.bench.common import (
    Bench,
    Figure,
    MiB,
    cpu_per_unit,
    cpu_snapshot,
    machine_speed,
    running_cluster,
    say,
)
from tests.bench.idempotence import SUMMARY, TOOL

RECORD = 1024


def _confluent(bootstrap: str, topic: str, records: int) -> tuple[float, float]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    payload = os.urandom(RECORD)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "batch.size": 512 * 1024, "queue.buffering.max.messages": 1_000_000})
    t0 = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, payload, partition=i % 3)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise RuntimeError("confluent-kafka: records left unacknowledged")
    produce_s = time.perf_counter() - t0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False,
                         "fetch.max.bytes": 50 * MiB, "max.partition.fetch.bytes": 8 * MiB})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got, t0 = 0, time.perf_counter()
    while got < records:
        for message in consumer.consume(10_000, 1.0):
            if message.error() is None:
                got += 1
    consume_s = time.perf_counter() - t0
    consumer.close()
    return produce_s, consume_s


def _kafka_python(bootstrap: str, topic: str, records: int) -> tuple[float, float]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    payload = os.urandom(RECORD)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                             batch_size=512 * 1024)
    t0 = time.perf_counter()
    for i in range(records):
        producer.send(topic, payload, partition=i % 3)
    producer.flush(timeout=120)
    produce_s = time.perf_counter() - t0
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_bytes=50 * MiB,
                             max_partition_fetch_bytes=8 * MiB, consumer_timeout_ms=30_000)
    consumer.assign([TopicPartition(topic, p) for p in range(3)])
    consumer.seek_to_beginning()
    got, t0 = 0, time.perf_counter()
    for _ in consumer:
        got += 1
        if got >= records:
            break
    consume_s = time.perf_counter() - t0
    consumer.close()
    if got < records:
        raise RuntimeError(f"kafka-python read {got} of {records} records")
    return produce_s, consume_s


PERF_DEFAULTS_RECORDS = 300_000
# The Java producer's defaults (Kafka 4.1): batch.size 16384, linger.ms 5, acks=all, idempotence on,
# 5 requests in flight. Only the bootstrap is given, so what the issue measures is what a Kafka user
# gets without tuning anything.
PERF_DEFAULTS_PROPS: dict[str, str] = {}


def _perf_defaults_run(bench: Bench, topic: str, records: int) -> dict[str, float]:
    """One ProducerPerformance run with the producer's defaults: MB/s, p99 ms, Produce requests
    acknowledged (from the replicas' own counts when they have them, else estimated from 16 KiB
    batches) and CPU ms per 16 KiB batch of every cluster process."""
    replica_listeners = [s.kafka for s in bench.replicas.values() if s.kafka]
    bootstrap = ",".join(replica_listeners + ([bench.cluster.kafka_bootstrap] if bench.cluster.kafka_bootstrap else []))
    pids = {f"replica{s.index}": s.pid for s in bench.replicas.values()}
    for kind in ("frontdoor",):
        for s in bench.cluster.services(kind):
            pids[f"{kind}{s.index}"] = s.pid
    argv = [str(TOOL), "--topic", topic, "--num-records", str(records), "--record-size", "1024",
            "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}",
            *(f"{k}={v}" for k, v in PERF_DEFAULTS_PROPS.items())]
    rounds0 = _replication_rounds(bench)
    before = cpu_snapshot(pids)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    after = cpu_snapshot(pids)
    rounds = _replication_rounds(bench) - rounds0
    found = SUMMARY.findall(done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"kafka-producer-perf-test exited {done.returncode}: {done.stdout[-800:]} "
                           f"{done.stderr[-800:]}")
    sent, rate, _mbs, _avg, _max, _p50, _p95, p99 = found[-1]
    if int(sent) != records:
        raise RuntimeError(f"kafka-producer-perf-test acknowledged {sent} of {records} records")
    # 16 records of 1 KiB fill a default 16 KiB batch (the 17th does not fit with the batch header),
    # and ProducerPerformance sends round-robin over partitions in sticky batches: one batch per
    # request per partition at most, so "per 16 KiB batch" is the cost of the smallest unit a
    # default producer sends.
    batches = records / 15
    cpu = cpu_per_unit(before, after, batches)
    return {"mbs": float(rate) * 1024 / 1e6, "p99_ms": float(p99), "rounds_per_batch": rounds / batches,
            **{f"cpu_{k}": v for k, v in cpu.items()}}


def _replication_rounds(bench: Bench) -> float:
    """Follower fetch rounds the replicas answered so far (``lowtide_replication_rounds``), summed;
    NaN when a replica's metrics cannot be read."""
    total = 0.0
    for s in bench.replicas.values():
        try:
            with urllib.request.urlopen(s.metrics_url, timeout=10) as answer:
                text = answer.read().decode()
        except (OSError, ValueError):
            return float("nan")
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("lowtide_replication_rounds_total{"))
    return total


def kafka_perf_defaults_figures(bench: Bench, *, quick: bool, rounds: int | None = None,
                                records: int | None = None) -> list[Figure]:
    """Issue 32: Kafka's ProducerPerformance with the producer's defaults (16 KiB batches, linger
    5 ms, idempotence on, acks=all), 1 KiB records, 3 partitions RF 3, through the replicas' Kafka
    listeners: MB/s, p99 and CPU per 16 KiB batch of each process, median of the rounds."""
    if not TOOL.exists():
        raise RuntimeError(f"{TOOL} is missing: run 'make kafka-tools'")
    records = records or (100_000 if quick else PERF_DEFAULTS_RECORDS)
    rounds = rounds or (1 if quick else 3)
    runs = []
    speed = machine_speed()  # this minute's machine, to read the figures against (common.machine_speed)
    for r in range(rounds):
        topic = f"kperf-defaults-{r}-{int(time.time())}"
        bench.create_topic(topic, partitions=3, rf=3, config={"min.insync.replicas": "2"})
        bench.wait_leaders(topic, 3)
        got = _perf_defaults_run(bench, topic, records)
        runs.append(got)
        cpu = ", ".join(f"{k[4:]} {v * 1000:.0f}" for k, v in sorted(got.items()) if k.startswith("cpu_"))
        say(f"ProducerPerformance defaults, round {r + 1}: {got['mbs']:.1f} MB/s, p99 {got['p99_ms']:.0f} ms; "
            f"CPU µs per 16 KiB batch: {cpu}; replication rounds per batch {got['rounds_per_batch']:.2f}")
        bench.delete_topic(topic)

    def median(what: str) -> float:
        return statistics.median(x.get(what, float("nan")) for x in runs)

    params = {"records": records, "record_bytes": 1024, "partitions": 3, "rf": 3, "rounds": rounds,
              "tool": "ProducerPerformance (Kafka 4.1)", "producer_props": "defaults (batch.size 16384, linger.ms 5, "
              "acks=all, enable.idempotence=true, 5 in flight)"}
    procs = sorted(k[4:] for k in runs[0] if k.startswith("cpu_") and k != "cpu_sum")
    each = "; ".join(f"{x['mbs']:.1f} MB/s p99 {x['p99_ms']:.0f} ms" for x in runs)
    figures = [
        Figure("kafka_perf_defaults_mbs", "ProducerPerformance, the producer's defaults (16 KiB batches, linger 5 ms, "
               "idempotent), RF 3", round(median("mbs"), 1), "MB/s", target=">= 15 MB/s (issue 32)", target_value=15.0,
               better="higher", params={**params, "machine_speed": speed},
               note=f"median of {rounds} runs: {each}; machine speed before them: {speed['python_ms']:.0f} ms Python "
                    f"reference, {speed['round_trip_us']:.0f} µs per process round trip").judge(),
        Figure("kafka_perf_defaults_p99_ms", "ProducerPerformance defaults: p99 latency", round(median("p99_ms")),
               "ms", target="<= 1000 ms (issue 32)", target_value=1000.0, better="lower", params=params).judge(),
    ]
    figures.append(Figure("kafka_perf_defaults_replication_rounds_per_batch", "ProducerPerformance defaults: "
                          "follower fetch rounds per 16 KiB batch (both followers)",
                          round(median("rounds_per_batch"), 2), "rounds", params=params,
                          note="2 when every batch has a round of its own per follower"))
    for p in [*procs, "sum"]:
        figures.append(Figure(f"kafka_perf_defaults_cpu_{p}_us", f"ProducerPerformance defaults: CPU per 16 KiB "
                              f"batch, {p if p != 'sum' else 'sum of the cluster processes'}",
                              round(median(f"cpu_{p}") * 1000), "µs", params=params,
                              note="utime+stime from /proc over the run, per 16 KiB batch (records / 15)"))
    return figures


def kafka_client_figures(bench: Bench, *, quick: bool) -> list[Figure]:
    kafka = bench.cluster.kafka_bootstrap
    if not kafka:
        raise RuntimeError("the cluster has no Kafka listener")
    figures = []
    for name, fn, records in (("confluent-kafka", _confluent, 50_000 if quick else 300_000),
                              ("kafka-python", _kafka_python, 20_000 if quick else 100_000)):
        topic = f"kbench-{name}"
        bench.create_topic(topic, partitions=3, rf=3)
        bench.wait_leaders(topic, 3)
        produce_s, consume_s = fn(kafka, topic, records)
        mb = records * RECORD / 1e6
        key = name.replace("-", "_")
        params = {"records": records, "record_bytes": RECORD, "partitions": 3, "rf": 3, "acks": "all",
                  "idempotent": True}
        figures.append(Figure(f"kafka_{key}_produce_mbs", f"Kafka listener produce, {name}", round(mb / produce_s, 1),
                              "MB/s", params=params))
        figures.append(Figure(f"kafka_{key}_consume_mbs", f"Kafka listener consume, {name}", round(mb / consume_s, 1),
                              "MB/s", params=params))
        say(f"kafka {name}: produce {mb / produce_s:.1f} MB/s, consume {mb / consume_s:.1f} MB/s")
    # Issue 32: Kafka's own producer benchmark with the producer's defaults (needs make kafka-tools).
    if TOOL.exists():
        figures += kafka_perf_defaults_figures(bench, quick=quick)
    else:
        say(f"kafka: {TOOL} is missing ('make kafka-tools'): no ProducerPerformance defaults figures")
    return figures


def main() -> None:
    """``python -m tests.bench.kafka_clients [--rounds 3] [--records N]``: the ProducerPerformance
    defaults run alone, on a fresh local cluster; prints the figures."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=PERF_DEFAULTS_RECORDS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kperf-") as tmp, running_cluster(Path(tmp) / "cluster") as bench:
        for f in kafka_perf_defaults_figures(bench, quick=False, rounds=args.rounds, records=args.records):
            say(f"{f.key} = {f.value} {f.unit}")


if __name__ == "__main__":
    main()
