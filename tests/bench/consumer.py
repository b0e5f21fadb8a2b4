"""The Python consumer in process (issue 11's consume figures): ``Consumer.poll`` (a Python object per
record) and ``Consumer.poll_columns`` (the batch API: columns cut in C, nothing per record) over a
3-partition RF 3 topic, and ``poll`` over one partition holding the same bytes, so the cost of a
group-style multi-leader assignment shows as a ratio. Page cache warm (just produced)."""

from __future__ import annotations

import os
import time

from tests.bench.common import Bench, Figure, failed, say

RECORD = 1024


def _fill(bench: Bench, topic: str, partitions: int, records: int) -> None:
    from lowtide.client import Producer

    bench.create_topic(topic, partitions=partitions, rf=3)
    bench.wait_leaders(topic, partitions)
    payload = os.urandom(RECORD)
    with Producer(bench.bootstrap, acks=-1, batch_bytes=512 * 1024) as producer:
        for start in range(0, records, 20_000):
            producer.produce_values(topic, [payload] * min(20_000, records - start))


def _read(bench: Bench, topic: str, records: int, *, columns: bool) -> float:
    from lowtide.client import Consumer

    best = 0.0
    for _ in range(2):  # the first pass warms channels
        got = 0
        t0 = time.perf_counter()
        with Consumer(bench.bootstrap, max_wait_ms=500) as consumer:
            consumer.subscribe(topic)
            while got < records:
                if columns:
                    got += sum(c.count for _, c in consumer.poll_columns())
                else:
                    got += len(consumer.poll())
        best = max(best, records * RECORD / (time.perf_counter() - t0) / 1e6)
    return best


def consumer_figures(bench: Bench, *, quick: bool) -> list[Figure]:
    records = 100_000 if quick else 300_000
    try:
        _fill(bench, "consume-3", 3, records)
        _fill(bench, "consume-1", 1, records)
        poll3 = _read(bench, "consume-3", records, columns=False)
        cols3 = _read(bench, "consume-3", records, columns=True)
        poll1 = _read(bench, "consume-1", records, columns=False)
        say(f"consumer: poll 3 partitions {poll3:.0f} MB/s, poll_columns {cols3:.0f} MB/s, "
            f"poll 1 partition {poll1:.0f} MB/s")
    except Exception as exc:  # noqa: BLE001
        return [failed("consumer_poll_mbs", "Consumer.poll", "MB/s", ">= 135 MB/s", exc)]
    finally:
        for topic in ("consume-3", "consume-1"):
            try:
                bench.delete_topic(topic)
            except Exception:  # noqa: BLE001 (cleanup only)
                pass
    params = {"records": records, "record_bytes": RECORD, "rf": 3, "page_cache": "warm"}
    return [
        Figure(key="consumer_poll_mbs", name="Consumer.poll in process, 3 partitions on 3 leaders", value=poll3,
               unit="MB/s", target=">= 135 MB/s (Kafka's consumer on this box)", target_value=135, better="higher",
               params=params).judge(),
        Figure(key="consumer_columns_mbs", name="Consumer.poll_columns (batch API), 3 partitions", value=cols3,
               unit="MB/s", target=">= 250 MB/s", target_value=250, better="higher", params=params).judge(),
        Figure(key="consumer_single_mbs", name="Consumer.poll, 1 partition, same bytes", value=poll1, unit="MB/s",
               ratio=poll3 / poll1, ratio_of="3-partition poll / 1-partition poll (target within 20 %)",
               ratio_target=0.8, params=params).judge(),
    ]
