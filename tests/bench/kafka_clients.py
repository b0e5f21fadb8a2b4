"""Produce and consume MB/s through the Kafka protocol listener (issue 18), with two real Kafka
clients: confluent-kafka (librdkafka, C) and kafka-python (pure Python). acks=all, idempotent, RF 3,
3 partitions, 1 KiB records; consume reads the same bytes back from offset 0. Compare with the gRPC
path's ``produce_mbs``/``consume_mbs`` and the machine ceilings in the same report: the client
library itself is often the limit (kafka-python encodes records in Python)."""

from __future__ import annotations

import os
import time

from tests.bench.common import Bench, Figure, MiB, say

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
    return figures
