"""Consumer.poll on real replicas: what is ready is returned, whatever the other leaders do."""

from __future__ import annotations

import time

import pytest

from lowtide.client import Consumer, Producer
from tests.integration import support as s


@pytest.fixture
def cluster(shared_cluster):
    """Every test here writes only topics named for itself and faults nothing: the worker's shared
    cluster serves them all (tests/integration/conftest.py)."""
    return shared_cluster


def test_a_caught_up_partition_on_one_leader_does_not_hold_back_records_another_leader_sent(cluster):
    s.create_topic(cluster, "spread", partitions=3, rf=3)
    leaders = {p: s.leader_of(cluster, "spread", p) for p in range(3)}
    busy = 0
    idle = next(p for p in range(3) if leaders[p] != leaders[busy])
    with Consumer(cluster.bootstrap, max_wait_ms=20_000) as consumer:
        consumer.assign([("spread", busy), ("spread", idle)])
        assert consumer.poll(max_wait_ms=50) == []  # positions set; both leaders now long-poll
        with Producer(cluster.bootstrap) as producer:
            producer.produce_values("spread", [b"a", b"b", b"c"], partition=busy)
        began = time.monotonic()
        got: list[bytes] = []
        while len(got) < 3 and time.monotonic() - began < 15:
            got += [r.value for r in consumer.poll()]
        waited = time.monotonic() - began
    assert got == [b"a", b"b", b"c"]
    # The idle leader's fetch would hold a poll for its full 20 s long-poll; the records came first.
    assert waited < 10, f"poll waited {waited:.1f}s on the caught-up partition"


def test_a_seek_while_a_fetch_is_in_flight_is_honoured(cluster):
    s.create_topic(cluster, "reseek", partitions=1, rf=3)
    with Producer(cluster.bootstrap) as producer:
        producer.produce_values("reseek", [str(i).encode() for i in range(10)], partition=0)
    with Consumer(cluster.bootstrap, max_wait_ms=200) as consumer:
        consumer.assign([("reseek", 0)])
        assert [r.offset for r in consumer.poll()] == list(range(10))
        consumer.poll(max_wait_ms=10)   # leaves a long-poll at offset 10 in flight
        consumer.seek(("reseek", 0), 3)
        got: list[int] = []
        deadline = time.monotonic() + 10
        while len(got) < 7 and time.monotonic() < deadline:
            got += [r.offset for r in consumer.poll()]
    assert got == list(range(3, 10))


def test_the_batch_level_poll_returns_the_same_records_as_columns(cluster):
    from lowtide.client.consumer import records_from_columns

    s.create_topic(cluster, "columns", partitions=2, rf=3)
    with Producer(cluster.bootstrap) as producer:
        producer.produce_values("columns", [f"v{i}".encode() for i in range(500)],
                                keys=[f"k{i}".encode() if i % 3 else None for i in range(500)])
    with Consumer(cluster.bootstrap, max_wait_ms=200) as bulk, Consumer(cluster.bootstrap, max_wait_ms=200) as one:
        bulk.subscribe("columns")
        one.subscribe("columns")
        from_columns, from_poll = [], []
        deadline = time.monotonic() + 15
        while (len(from_columns) < 500 or len(from_poll) < 500) and time.monotonic() < deadline:
            for (topic, partition), columns in bulk.poll_columns():
                from_columns += records_from_columns(columns, topic=topic, partition=partition)
            from_poll += one.poll()
    key = lambda r: (r.partition, r.offset)  # noqa: E731
    assert sorted(from_columns, key=key) == sorted(from_poll, key=key)
    assert sorted(r.value for r in from_columns) == sorted(f"v{i}".encode() for i in range(500))
