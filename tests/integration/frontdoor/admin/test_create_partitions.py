"""More partitions on a running cluster (Kafka's CreatePartitions): the new partitions are served
by their replicas at once, keyed producers map keys over the new count after a metadata refresh,
diskless topics grow on their coordinator shards, and the CLI says so in Kafka's words."""

from __future__ import annotations

import pytest

from lowtide.client import Admin, Consumer, Producer
from lowtide.client.partitioner import partition_for_key
from lowtide.errors import InvalidPartitions
from lowtide.messages import TopicPartition
from tests import waiting
from tests.integration import support as s


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def refresh(producer: Producer, topic: str, count: int) -> None:
    """What metadata.max.age.ms (or a restart) does for a Kafka producer: a fresh view of ``topic``.
    (Refreshes within 50 ms of the last one are coalesced, hence the wait.)"""
    waiting.wait_until(lambda: len(producer.cluster.refresh().topic(topic).partitions) == count,
                       timeout_s=10, what=f"the producer seeing {count} partitions of {topic}")


def read_back(cluster, topic: str, partitions: int, expected: int) -> list:
    records: list = []
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        waiting.wait_until(lambda: records.extend(consumer.poll(max_wait_ms=200)) or len(records) >= expected,
                           timeout_s=30, what=f"{expected} records of {topic}")
    return records


def test_new_partitions_take_acks_all_writes_at_once_and_old_ones_keep_their_records(cluster):
    with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, acks=-1) as producer:
        admin.create_topic("grow-classic", partitions=2, replication_factor=3)
        for p in (0, 1):
            producer.send("grow-classic", f"old-{p}".encode(), partition=p)
        producer.flush()
        assert admin.create_partitions({"grow-classic": 5}) == {"grow-classic": None}
        refresh(producer, "grow-classic", 5)
        for p in range(5):
            producer.send("grow-classic", f"new-{p}".encode(), partition=p)
        producer.flush()  # acks=all: every new partition's ISR (all three replicas) has it
    by_partition: dict[int, list[bytes]] = {}
    for record in read_back(cluster, "grow-classic", 5, 7):
        by_partition.setdefault(record.partition, []).append(record.value)
    assert by_partition == {0: [b"old-0", b"new-0"], 1: [b"old-1", b"new-1"], 2: [b"new-2"], 3: [b"new-3"],
                            4: [b"new-4"]}
    states = s.store(cluster).partition_states("grow-classic")
    assert all(len(st.replicas) == 3 and sorted(st.isr) == [0, 1, 2] for st in states)


def test_a_keyed_producer_maps_keys_over_the_new_count_after_a_metadata_refresh(cluster):
    keys = [f"key-{i}".encode() for i in range(60)]
    with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, acks=-1) as producer:
        admin.create_topic("grow-keyed", partitions=2, replication_factor=2)
        for key in keys:
            producer.send("grow-keyed", b"before", key=key)
        producer.flush()
        admin.create_partitions({"grow-keyed": 6})
        refresh(producer, "grow-keyed", 6)
        for key in keys:
            producer.send("grow-keyed", b"after", key=key)
        producer.flush()
    records = read_back(cluster, "grow-keyed", 6, 120)
    for record in records:
        count = 2 if record.value == b"before" else 6
        assert record.partition == partition_for_key(record.key, count), record
    assert {r.partition for r in records if r.value == b"after"} - {0, 1}  # some keys moved to new partitions


def test_a_diskless_topic_grows_on_its_coordinator_shards(cluster):
    with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, acks=-1) as producer:
        admin.create_topic("grow-diskless", partitions=1, diskless=True)
        assert admin.create_partitions({"grow-diskless": 4}) == {"grow-diskless": None}
        refresh(producer, "grow-diskless", 4)
        for p in range(4):
            producer.send("grow-diskless", f"d-{p}".encode(), partition=p)
        producer.flush()
    assert sorted((r.partition, r.value) for r in read_back(cluster, "grow-diskless", 4, 4)) == [
        (p, f"d-{p}".encode()) for p in range(4)]
    info = s.store(cluster).topic("grow-diskless")
    assert info.partitions == 4 and len(info.diskless_shards) == 4


def test_the_cli_grows_a_topic_and_refuses_to_shrink_it_in_kafkas_words(cluster):
    b = cluster.bootstrap
    s.cli_json("topics", "create", "--bootstrap-server", b, "--topic", "grow-cli", "--partitions", "1",
               "--replication-factor", "3")
    assert s.cli_json("topics", "alter", "--bootstrap-server", b, "--topic", "grow-cli", "--partitions", "3",
                      "--replica-assignment", "2:0:1,1:2:0") == {"topic": "grow-cli", "partitions": 3,
                                                                  "validate_only": False}
    assert [st.replicas for st in s.store(cluster).partition_states("grow-cli")][1:] == [(2, 0, 1), (1, 2, 0)]
    refused = s.cli_json("topics", "alter", "--bootstrap-server", b, "--topic", "grow-cli", "--partitions", "2",
                         ok=False)
    assert refused["error"] == {"code": "INVALID_PARTITIONS", "message":
                                "Topic currently has 3 partitions, which is higher than the requested 2."}


def test_growing_to_the_same_count_is_invalid_partitions(cluster):
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("grow-same", partitions=2, replication_factor=1)
        error = admin.create_partitions({"grow-same": 2})["grow-same"]
    assert isinstance(error, InvalidPartitions) and error.message == "Topic already has 2 partitions."
