"""Committed offsets live in ``__consumer_offsets`` on real processes: they survive ``cluster down``
+ ``cluster up`` and a kill -9 of redis-server, and a second front door sees another's commits.

One cluster (2 front doors) serves the module, each test with groups of its own: a cluster start is
seconds of CPU. The tests that fault it come last: the kill -9 of redis-server (and a front door,
which the cluster restarts), then ``cluster down`` + ``cluster up``, the very last."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from lowtide.client.admin import Admin
from lowtide.coordinator.metadata_log import METADATA_TOPIC
from lowtide.errors import InvalidTopic
from lowtide.groups import (
    OFFSETS_TOPIC,
    OffsetKey,
    OffsetValue,
    decode_offset_key,
    decode_offset_value,
    encode_offset_key,
    encode_offset_value,
    partition_for_group,
)
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.record import Record, decode_batches
from lowtide_pb import admin_pb2
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.support import admin as admin_stub
from tests.integration.support import create_topic, fetch, produce, store, wait_until

TRANSACTION_STATE_TOPIC = "__transaction_state"
PARTITIONS = 3  # of __consumer_offsets (LOWTIDE_OFFSETS_TOPIC_PARTITIONS), so the test reads a few


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """3 replicas, 2 front doors, PARTITIONS partitions of __consumer_offsets, a topic "orders" (2 partitions)."""
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("offsets"), replicas=3, frontdoors=2,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG),
                           extra_env={"LOWTIDE_OFFSETS_TOPIC_PARTITIONS": str(PARTITIONS)})
    for running in running_cluster(request, config):
        create_topic(running, "orders", partitions=2)
        yield running


def read_all_records(cluster: LocalCluster, topic: str, *, partition: int) -> list[Record]:
    """Every record below the HW of one partition, keys and null values included."""
    out: list[Record] = []
    offset = 0
    while True:
        answer = fetch(cluster, topic, offset, partition=partition)
        assert answer.error_code == 0, answer
        batches = decode_batches(answer.records)
        out += [r for _, records in batches for r in records if r.offset >= offset]
        if not batches or batches[-1][0].next_offset >= answer.high_watermark:
            return out
        offset = batches[-1][0].next_offset


def committed(cluster: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    with Admin(cluster.bootstrap) as admin:
        return {tp: c.offset for tp, c in admin.fetch_offsets(group).items()}


def test_commits_are_records_of_a_compacted_replicated_topic(cluster):
    with Admin(cluster.bootstrap) as admin:
        assert admin.commit_offsets("etl", {("orders", 0): 5, ("orders", 1): 7}) == {("orders", 0): None,
                                                                                    ("orders", 1): None}
    info = store(cluster).topic(OFFSETS_TOPIC)
    assert (info.partitions, info.replication_factor, info.config["cleanup.policy"]) == (PARTITIONS, 3, "compact")
    records = read_all_records(cluster, OFFSETS_TOPIC, partition=partition_for_group("etl", partitions=PARTITIONS))
    keys = [decode_offset_key(r.key) for r in records]
    assert [(k.partition, decode_offset_value(r.value).offset) for k, r in zip(keys, records, strict=True)
            if k.group == "etl"] == [(0, 5), (1, 7)]


def test_a_second_front_door_sees_the_commits_made_through_the_first(cluster):
    with Admin(cluster.service("frontdoor-0").grpc) as admin:
        admin.commit_offsets("seen-by-both", {("orders", 1): 9})
    with Admin(cluster.service("frontdoor-1").grpc) as other:
        wait_until(lambda: other.fetch_offsets("seen-by-both").get(("orders", 1)) is not None
                   and other.fetch_offsets("seen-by-both")[("orders", 1)].offset == 9,
                   what="commit seen by frontdoor-1")


def test_a_grpc_produce_to_any_internal_topic_is_invalid_topic_while_their_coordinators_write_them(cluster):
    with Admin(cluster.bootstrap) as admin:
        admin.commit_offsets("rewound", {("orders", 0): 5})
    # a diskless topic's first commit makes its coordinator shard create and append __diskless_metadata
    resp = admin_stub(cluster).CreateTopics(admin_pb2.CreateTopicsRequest(topics=[admin_pb2.TopicSpec(
        name="disk", partitions=1, replication_factor=3, diskless=True)]))
    assert resp.topics[0].error_code == 0, resp
    wait_until(lambda: produce(cluster, "disk", [b"d"], leader=0).error_code == 0, timeout_s=30,
               what="a diskless commit")
    create_topic(cluster, TRANSACTION_STATE_TOPIC)  # the transaction coordinator's, once it keeps one
    # a commit record in Kafka's own format rewinding the group, sent to the partition's leader
    forged = produce(cluster, OFFSETS_TOPIC, [encode_offset_value(OffsetValue(offset=0, metadata="",
                                                                              commit_timestamp=0))],
                     keys=[encode_offset_key(OffsetKey("rewound", "orders", 0))],
                     partition=partition_for_group("rewound", partitions=PARTITIONS))
    assert (forged.error_code, forged.base_offset) == (InvalidTopic.code, -1)
    assert forged.error_message == f"Cannot append to internal topic {OFFSETS_TOPIC}"
    for topic in (METADATA_TOPIC, TRANSACTION_STATE_TOPIC):
        assert produce(cluster, topic, [b"v"], keys=[b"k"]).error_code == InvalidTopic.code
    assert committed(cluster, "rewound") == {("orders", 0): 5}
    # the group coordinator still writes its topic
    with Admin(cluster.bootstrap) as admin:
        admin.commit_offsets("rewound", {("orders", 0): 6})
    assert committed(cluster, "rewound") == {("orders", 0): 6}


def test_offsets_survive_a_kill_9_of_redis_server(cluster):
    with Admin(cluster.bootstrap) as admin:
        admin.commit_offsets("killed", {("orders", 0): 21})
    # Committed just before the kill: Redis (AOF, fsync every second) may lose its last second of
    # writes, but the offsets are on the replicas' disks, acknowledged with acks=all.
    with Admin(cluster.bootstrap) as admin:
        admin.commit_offsets("killed", {("orders", 1): 22})
    cluster.kill("redis", signal.SIGKILL)
    cluster.start_service("redis")
    # a front door restarted after the kill rebuilds its state from the topic alone
    cluster.kill("frontdoor-0", signal.SIGKILL)
    cluster.start_service("frontdoor-0")
    wait_until(lambda: committed(cluster, "killed") == {("orders", 0): 21, ("orders", 1): 22},
               what="offsets read back after redis kill -9", timeout_s=60)


def test_offsets_survive_cluster_down_and_up(cluster):
    # The module's last test: the cluster stays down afterwards (its fixture's down is idempotent).
    with Admin(cluster.bootstrap) as admin:
        admin.commit_offsets("restarted", {("orders", 0): 11, ("orders", 1): 12})
        admin.commit_offsets("restarted-audit", {("orders", 0): 3})
        admin.commit_offsets("restarted-gone", {("orders", 1): 1})
        assert admin.delete_groups(["restarted-gone"]) == {"restarted-gone": None}
        groups_before = admin.list_groups()
    assert {"restarted", "restarted-audit"} <= set(groups_before) and "restarted-gone" not in groups_before
    cluster.down(timeout_s=10.0)
    again = LocalCluster.load(cluster.data_dir)
    again.up(detach=True)
    try:
        with Admin(again.bootstrap) as admin:
            assert admin.list_groups() == groups_before  # the deleted group stays deleted
        assert committed(again, "restarted") == {("orders", 0): 11, ("orders", 1): 12}
        assert committed(again, "restarted-audit") == {("orders", 0): 3}
    finally:
        again.down(timeout_s=10.0)
