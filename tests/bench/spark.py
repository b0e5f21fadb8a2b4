"""Spark through the "lowtide" data source, beside the plain Python client (issue 10).

Write: a generated DataFrame of 1 KiB values (built in the JVM) → ``df.write.format("lowtide")``
(acks=all, RF 3, 3 partitions), local[2]. Read: ``spark.read.format("lowtide")`` of that topic into
Spark's ``noop`` sink (every row materialized as Arrow and handed to the JVM, nothing written).
Each is run once to warm up (JVM JIT, Python workers, channels) and then measured. The plain client
figures are ``Producer.produce_values`` / ``Consumer.poll`` in this process over the same sizes.
"""

from __future__ import annotations

import os
import time

from tests.bench.common import Bench, Figure, failed, say

RECORD = 1024


def _client_figures(bench: Bench, topic: str, records: int) -> tuple[float, float]:
    from lowtide.client import Consumer, Producer

    payload = os.urandom(RECORD)
    t0 = time.perf_counter()
    with Producer(bench.bootstrap, acks=-1, batch_bytes=512 * 1024) as producer:
        for start in range(0, records, 20_000):
            producer.produce_values(topic, [payload] * min(20_000, records - start))
    produce_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = 0
    with Consumer(bench.bootstrap, max_wait_ms=100) as consumer:
        consumer.subscribe(topic)
        while got < records:
            got += len(consumer.poll(max_records=50_000))
    consume_s = time.perf_counter() - t0
    return records * RECORD / produce_s / 1e6, records * RECORD / consume_s / 1e6


def spark_throughput(bench: Bench, *, quick: bool) -> list[Figure]:
    records = 100_000 if quick else 300_000
    try:
        from pyspark.sql import functions as F

        from lowtide.spark import build_session
    except ImportError as exc:
        return [failed("spark_write_mbs", "Spark write", "MB/s", None, exc)]
    spark = build_session("lowtide-bench", master="local[2]")
    try:
        opts = {"bootstrap.servers": bench.bootstrap}

        def frame(n: int):
            return (spark.range(0, n, numPartitions=2)
                    .select(F.substring(F.repeat(F.sha2(F.col("id").cast("string"), 256), RECORD // 64 + 1), 1,
                                        RECORD).cast("binary").alias("value")))

        results: dict[str, float] = {}
        for topic in ("spark-bench", "client-bench"):
            bench.create_topic(topic, partitions=3, rf=3)
            bench.wait_leaders(topic, 3)
        frame(records).write.format("noop").mode("overwrite").save()  # warm the generator
        for label, n in (("warm-up", records // 10), ("measured", records)):
            t0 = time.perf_counter()
            frame(n).write.format("lowtide").options(**opts).option("topic", "spark-bench").mode("append").save()
            seconds = time.perf_counter() - t0
            say(f"spark write ({label}): {n * RECORD / 1e6:.0f} MB in {seconds:.2f}s = "
                f"{n * RECORD / seconds / 1e6:.1f} MB/s")
        results["write"] = records * RECORD / seconds / 1e6
        total = records + records // 10
        for label in ("warm-up", "measured"):
            t0 = time.perf_counter()
            spark.read.format("lowtide").options(**opts).option("subscribe", "spark-bench").load() \
                .write.format("noop").mode("overwrite").save()
            seconds = time.perf_counter() - t0
            say(f"spark read ({label}): {total * RECORD / 1e6:.0f} MB in {seconds:.2f}s = "
                f"{total * RECORD / seconds / 1e6:.1f} MB/s")
        results["read"] = total * RECORD / seconds / 1e6
        client_produce, client_consume = _client_figures(bench, "client-bench", records)
        say(f"plain client: produce {client_produce:.1f} MB/s, consume {client_consume:.1f} MB/s")
    except Exception as exc:  # noqa: BLE001
        say(f"spark bench failed: {exc!r}")
        return [failed("spark_write_mbs", "Spark write", "MB/s", None, exc)]
    finally:
        spark.stop()
        for topic in ("spark-bench", "client-bench"):
            try:
                bench.delete_topic(topic)
            except Exception:  # noqa: BLE001 (cleanup only)
                pass
    params = {"records": records, "record_bytes": RECORD, "spark_master": "local[2]", "topic_partitions": 3,
              "rf": 3, "acks": "all"}
    return [
        Figure(key="spark_write_mbs", name="Spark write, format lowtide (RF 3, acks=all)", value=results["write"],
               unit="MB/s", ratio=results["write"] / client_produce,
               ratio_of=f"plain client produce {client_produce:.1f} MB/s", params=params).judge(),
        Figure(key="spark_read_mbs", name="Spark batch read, format lowtide (noop sink)", value=results["read"],
               unit="MB/s", ratio=results["read"] / client_consume,
               ratio_of=f"plain client Consumer.poll {client_consume:.1f} MB/s", params=params).judge(),
        Figure(key="client_produce_mbs", name="plain client produce (same sizes, one thread)", value=client_produce,
               unit="MB/s", params=params).judge(),
        Figure(key="client_consume_mbs", name="plain client Consumer.poll (same sizes)", value=client_consume,
               unit="MB/s", params=params).judge(),
    ]
