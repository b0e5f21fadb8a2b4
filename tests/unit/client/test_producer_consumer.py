"""Producer and Consumer against a real in-process front door and the real replica servers of
``replica_set`` (offset assignment, whole-batch fetches, a moved leader; see
``tests.unit.frontdoor.harness``)."""

from __future__ import annotations

import pytest

from lowtide.client import Admin, Consumer, Producer
from lowtide.client.consumer import column_cells
from lowtide.client.partitioner import partition_for_key
from lowtide.errors import OffsetOutOfRange, UnknownTopicOrPartition
from tests.unit.frontdoor.harness import move_leader
from tests.waiting import wait_until


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()


@pytest.fixture
def cluster(front_door, replica_set, store):
    """Topic ``orders`` with 3 partitions, all led by replica 0."""
    store.create_topic(name="orders", partitions=3, replication_factor=1, config={}, assignment=[[0]] * 3)
    replica_set.wait_for_leaders("orders")
    return front_door, replica_set


def records_of(replicas, partition):
    return replicas.records("orders", partition)


def test_keyed_records_go_to_the_murmur2_partition(cluster):
    front_door, replica = cluster
    keys = [f"key-{i}".encode() for i in range(30)]
    with Producer(front_door.address) as producer:
        report = producer.produce_values("orders", [b"v"] * 30, keys=keys)
    assert report.records == 30
    for p in range(3):
        assert [r.key for r in records_of(replica, p)] == [k for k in keys if partition_for_key(k, 3) == p]


def test_unkeyed_batches_spread_round_robin_and_report_base_offsets(cluster):
    front_door, replica = cluster
    value = b"x" * 1000
    with Producer(front_door.address, batch_bytes=10_000) as producer:
        report = producer.produce_values("orders", [value] * 90)
    assert report.batches >= 9
    counts = [len(records_of(replica, p)) for p in range(3)]
    assert sum(counts) == 90 and all(c >= 27 for c in counts)
    for bases in report.base_offsets().values():
        assert bases[0] == 0 and bases == sorted(bases)


def test_not_leader_is_retried_after_a_metadata_refresh(cluster, store):
    front_door, replicas = cluster
    store.create_topic(name="moving", partitions=1, replication_factor=2, config={}, assignment=[[0, 1]])
    replicas.wait_for_leaders("moving")
    with Producer(front_door.address) as producer:
        producer.produce_values("moving", [b"first"], partition=0)  # the producer now routes to replica 0
        move_leader(store, "moving", 0, to=1)
        wait_until(lambda: replicas.describe(0, "moving", 0).role == "follower"
                   and replicas.describe(1, "moving", 0).role == "leader",
                   timeout_s=20, what="replica 1 to lead moving-0")
        before = [replicas.calls(b, "Produce") for b in (0, 1)]
        producer.produce_values("moving", [b"a", b"b"], partition=0)
    # Refused by the old leader (NOT_LEADER_OR_FOLLOWER), appended at the new one after a refresh.
    assert [replicas.calls(b, "Produce") - before[b] for b in (0, 1)] == [1, 1]
    assert [r.value for r in replicas.records("moving", 0)] == [b"first", b"a", b"b"]


def test_producing_to_a_missing_partition_fails(cluster):
    front_door, _ = cluster
    with Producer(front_door.address) as producer, pytest.raises(UnknownTopicOrPartition):
        producer.produce_values("orders", [b"a"], partition=7)


def test_consumer_skips_records_below_the_position_of_a_whole_batch(cluster):
    front_door, _ = cluster
    with Producer(front_door.address) as producer:
        producer.produce_values("orders", [str(i).encode() for i in range(10)], partition=0)
    with Consumer(front_door.address) as consumer:
        consumer.assign([("orders", 0)])
        consumer.seek(("orders", 0), 4)
        records = consumer.poll(max_wait_ms=10)
    assert [r.offset for r in records] == [4, 5, 6, 7, 8, 9]
    assert [r.value for r in records] == [b"4", b"5", b"6", b"7", b"8", b"9"]


def test_consumer_with_a_group_starts_at_the_commit_and_commits_its_position(cluster):
    front_door, _ = cluster
    with Producer(front_door.address) as producer:
        producer.produce_values("orders", [b"a", b"b", b"c"], partition=2)
    with Consumer(front_door.address, group_id="etl") as consumer:
        consumer.assign([("orders", 2)])
        assert [r.value for r in consumer.poll(max_wait_ms=10, max_records=2)] == [b"a", b"b"]
        consumer.commit()
        assert consumer.committed([("orders", 2)]) == {("orders", 2): 2}
    with Consumer(front_door.address, group_id="etl") as consumer:
        consumer.assign([("orders", 2)])
        assert [r.value for r in consumer.poll(max_wait_ms=10)] == [b"c"]


def test_poll_columns_with_max_records_returns_the_rest_at_the_next_poll_and_commits_what_it_gave(cluster):
    front_door, _ = cluster
    with Producer(front_door.address) as producer:
        for p in (0, 1):
            producer.produce_values("orders", [f"{p}-{i}".encode() for i in range(3)], partition=p)
    got: dict[int, list[bytes]] = {0: [], 1: []}

    def take(polled) -> int:
        for (_, partition), columns in polled:
            got[partition] += column_cells(columns.values, columns.count)
        return sum(columns.count for _, columns in polled)

    with Consumer(front_door.address, group_id="cols") as consumer:
        consumer.assign([("orders", 0), ("orders", 1)])
        taken = 0
        for _ in range(50):
            taken += take(consumer.poll_columns(max_wait_ms=50, max_records=4 - taken))
            if taken == 4:
                break
        assert taken == 4
        consumer.commit()
        assert sum(consumer.committed([("orders", 0), ("orders", 1)]).values()) == 4
        for _ in range(50):
            if take(consumer.poll_columns(max_wait_ms=50)) and sum(map(len, got.values())) == 6:
                break
    assert got == {p: [f"{p}-{i}".encode() for i in range(3)] for p in (0, 1)}


def test_seeking_below_the_log_start_offset_is_out_of_range(cluster):
    front_door, _ = cluster
    with Producer(front_door.address) as producer:
        producer.produce_values("orders", [b"a", b"b", b"c"], partition=0)
    with Admin(front_door.address) as admin:
        assert admin.delete_records({("orders", 0): 2})[("orders", 0)].low_watermark == 2
    with Consumer(front_door.address) as consumer:
        consumer.assign([("orders", 0)])
        consumer.seek(("orders", 0), 0)
        with pytest.raises(OffsetOutOfRange):
            consumer.poll(max_wait_ms=10)
