"""Committed offsets of consumer groups in ``__consumer_offsets`` (on the real replica servers of
``replica_set``; real Redis for the metadata), with and without authorization, and the one-time
move of offsets from the old Redis layout."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from lowtide.auth.acl import AclBinding, Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.errors import GroupAuthorizationFailed, GroupIdNotFound, InvalidGroupId, UnknownTopicOrPartition
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.groups.groups import GroupCoordinator, GroupStore
from lowtide.frontdoor.groups.offsets_migration import MIGRATED_KEY, migrate_legacy_offsets
from lowtide.frontdoor.groups.offsets_topic import OffsetsTopic, OffsetsTopicConfig
from lowtide.groups import (
    OFFSETS_TOPIC,
    OffsetKey,
    decode_offset_key,
    decode_offset_value,
    partition_for_group,
)
from lowtide.messages.admin import OffsetCommit
from tests.waiting import wait_until

PARTITIONS = 4


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()


@pytest.fixture
def replica(replica_set):
    return replica_set


@pytest.fixture
def offsets_topics(store, replica):
    """Factory of started OffsetsTopic instances (as many front doors would hold); all stopped at the end."""
    made, pool, client = [], ThreadPoolExecutor(max_workers=4), ReplicaClient()

    def start(*, partitions: int = PARTITIONS) -> OffsetsTopic:
        authorizer = Authorizer(store=AclStore(metadata=store), enabled=False)
        topic = OffsetsTopic(store=store, replicas=client, config=OffsetsTopicConfig(
            partitions=partitions, tail_interval_s=0.05, load_timeout_s=5),
            topics=TopicAdmin(store=store, authorizer=authorizer, replicas=client, pool=pool))
        topic.start()
        made.append(topic)
        return topic

    yield start
    for topic in made:
        topic.stop()
    pool.shutdown()
    client.close()


def build_groups(store, offsets_topics, *, auth=False, topic=None):
    authorizer = Authorizer(store=AclStore(metadata=store), enabled=auth)
    return GroupCoordinator(store=GroupStore(topic=topic or offsets_topics()), metadata=store, authorizer=authorizer)


@pytest.fixture
def orders(store, replica):
    store.create_topic(name="orders", partitions=2, replication_factor=1, config={}, assignment=[[0], [0]])


def records_in(replica, partition):
    return replica.records(OFFSETS_TOPIC, partition)


def test_commits_are_written_to_consumer_offsets_in_kafkas_format(store, orders, replica, offsets_topics):
    groups = build_groups(store, offsets_topics)
    results = groups.commit_offsets(principal="User:a", group_id="etl",
                                    commits=[OffsetCommit("orders", 0, 10000, "m")])
    assert results[0][1] is None
    info = store.topic(OFFSETS_TOPIC)
    # RF = min(3, live brokers): both replicas of the set.
    assert (info.partitions, info.replication_factor, info.config["cleanup.policy"]) == (PARTITIONS, 2, "compact")
    [record] = records_in(replica, partition_for_group("etl", partitions=PARTITIONS))
    assert decode_offset_key(record.key) == OffsetKey("etl", "orders", 0)
    value = decode_offset_value(record.value)
    assert (value.offset, value.metadata, value.leader_epoch) == (10000, "m", -1) and value.commit_timestamp > 0
    # Written with acks=all: acknowledged only once the follower holds it too.
    partition = partition_for_group("etl", partitions=PARTITIONS)
    follower = 1 - replica.leader_of(OFFSETS_TOPIC, partition)
    assert replica.describe(follower, OFFSETS_TOPIC, partition).log_end_offset == 1
    fetched = groups.fetch_offsets(principal="User:a", group_id="etl", partitions=[("orders", 0), ("orders", 1)])
    assert [(c.partition, c.offset) for c in fetched] == [(0, 10000), (1, -1)]


def test_deleting_a_group_writes_a_tombstone_per_committed_offset(store, orders, replica, offsets_topics):
    groups = build_groups(store, offsets_topics)
    groups.commit_offsets(principal="User:a", group_id="etl",
                          commits=[OffsetCommit("orders", 0, 1), OffsetCommit("orders", 1, 2)])
    assert groups.delete_groups(principal="User:a", group_ids=["etl"])[0].error is None
    records = records_in(replica, partition_for_group("etl", partitions=PARTITIONS))
    assert [(decode_offset_key(r.key).partition, r.value) for r in records[2:]] == [(0, None), (1, None)]
    assert groups.list_groups(principal="User:a") == []


def test_a_new_instance_rebuilds_the_offsets_from_the_topic(store, orders, offsets_topics):
    first = build_groups(store, offsets_topics)
    first.commit_offsets(principal="User:a", group_id="g1", commits=[OffsetCommit("orders", 0, 7)])
    first.commit_offsets(principal="User:a", group_id="g1", commits=[OffsetCommit("orders", 0, 8)])
    first.commit_offsets(principal="User:a", group_id="g2", commits=[OffsetCommit("orders", 1, 3)])
    first.delete_groups(principal="User:a", group_ids=["g2"])
    second = build_groups(store, offsets_topics)
    assert second.list_groups(principal="User:a") == ["g1"]
    assert second.fetch_offsets(principal="User:a", group_id="g1")[0].offset == 8


def test_commits_through_another_instance_become_visible_through_the_tail(store, orders, offsets_topics):
    one, two = build_groups(store, offsets_topics), build_groups(store, offsets_topics)
    assert two.list_groups(principal="User:a") == []
    one.commit_offsets(principal="User:a", group_id="etl", commits=[OffsetCommit("orders", 1, 42)])
    wait_until(lambda: two.list_groups(principal="User:a") == ["etl"], timeout_s=5)
    assert two.fetch_offsets(principal="User:a", group_id="etl")[0].offset == 42


def test_a_write_the_leader_refuses_fails_every_accepted_partition_and_changes_nothing(store, orders, replica,
                                                                                       offsets_topics):
    groups = build_groups(store, offsets_topics)
    groups.commit_offsets(principal="User:a", group_id="etl", commits=[OffsetCommit("orders", 0, 1)])
    # A real refusal: the leader refuses batches over the topic's max.message.bytes (MESSAGE_TOO_LARGE).
    partition = partition_for_group("etl", partitions=PARTITIONS)
    with replica.config_adopted(replica.leader_of(OFFSETS_TOPIC, partition), OFFSETS_TOPIC):
        store.update_topic_config(OFFSETS_TOPIC, lambda info: {**info.config, "max.message.bytes": "64"})
    results = groups.commit_offsets(principal="User:a", group_id="etl", commits=[
        OffsetCommit("orders", 0, 5), OffsetCommit("orders", 9, 5)])
    assert [e.name for _, e in results] == ["MESSAGE_TOO_LARGE", "UNKNOWN_TOPIC_OR_PARTITION"]
    assert groups.fetch_offsets(principal="User:a", group_id="etl")[0].offset == 1


def test_offsets_in_the_old_redis_layout_move_into_the_topic_once(store, orders, offsets_topics, redis_client):
    redis_client.sadd("lowtide:groups", "old", "both")
    redis_client.hset("lowtide:groups:old", mapping={
        "orders\x000": json.dumps({"offset": 11, "metadata": "x", "commit_ms": 1234}),
        "orders\x001": json.dumps({"offset": 12, "metadata": "", "commit_ms": 1235})})
    redis_client.hset("lowtide:groups:both", "orders\x000", json.dumps({"offset": 1, "metadata": "", "commit_ms": 1}))
    topic = offsets_topics()
    groups = build_groups(store, offsets_topics, topic=topic)
    groups.commit_offsets(principal="User:a", group_id="both", commits=[OffsetCommit("orders", 0, 99)])
    assert migrate_legacy_offsets(redis=redis_client, topic=topic) is True
    assert json.loads(redis_client.get(MIGRATED_KEY))["offsets"] == 2  # "both" kept its newer commit
    after = build_groups(store, offsets_topics)  # a fresh instance reads it back from the topic
    assert [(c.partition, c.offset, c.commit_ms) for c in after.fetch_offsets(principal="User:a", group_id="old")] \
        == [(0, 11, 1234), (1, 12, 1235)]
    assert after.fetch_offsets(principal="User:a", group_id="both")[0].offset == 99
    redis_client.hset("lowtide:groups:old", "orders\x000", json.dumps({"offset": 500, "commit_ms": 1}))
    assert migrate_legacy_offsets(redis=redis_client, topic=topic) is True  # marker set: nothing moves again
    assert sorted(e.value.offset for e in topic.entries("old")) == [11, 12]


def test_a_front_door_moves_the_old_offsets_on_its_own_at_start(orders, front_door_factory, redis_client):
    redis_client.sadd("lowtide:groups", "old")
    redis_client.hset("lowtide:groups:old", "orders\x001", json.dumps({"offset": 3, "metadata": "", "commit_ms": 5}))
    fd = front_door_factory()
    wait_until(lambda: redis_client.exists(MIGRATED_KEY), timeout_s=10)
    offsets = fd.parts.front.groups.fetch_offsets(principal="User:a", group_id="old")
    assert [(c.topic, c.partition, c.offset) for c in offsets] == [("orders", 1, 3)]


def test_unknown_partitions_fail_alone(store, orders, offsets_topics):
    groups = build_groups(store, offsets_topics)
    results = groups.commit_offsets(principal="User:a", group_id="etl", commits=[
        OffsetCommit("orders", 1, 5), OffsetCommit("orders", 2, 5), OffsetCommit("nope", 0, 5)])
    assert [type(e) if e else None for _, e in results] == [None, UnknownTopicOrPartition, UnknownTopicOrPartition]
    assert [c.partition for c in groups.fetch_offsets(principal="User:a", group_id="etl")] == [1]


def test_groups_are_listed_described_and_deleted(store, orders, offsets_topics):
    groups = build_groups(store, offsets_topics)
    groups.commit_offsets(principal="User:a", group_id="g1", commits=[OffsetCommit("orders", 0, 1)])
    groups.commit_offsets(principal="User:a", group_id="g2", commits=[OffsetCommit("orders", 1, 2)])
    assert groups.list_groups(principal="User:a") == ["g1", "g2"]
    described = groups.describe_groups(principal="User:a", group_ids=["g1", "missing"])
    assert [(c.topic, c.partition, c.offset) for c in described[0].offsets] == [("orders", 0, 1)]
    assert isinstance(described[1].error, GroupIdNotFound)
    deleted = groups.delete_groups(principal="User:a", group_ids=["g1", "g1"])
    assert deleted[0].error is None and isinstance(deleted[1].error, GroupIdNotFound)
    assert groups.list_groups(principal="User:a") == ["g2"]


def test_empty_group_id_is_invalid(store, orders, offsets_topics):
    with pytest.raises(InvalidGroupId):
        build_groups(store, offsets_topics).commit_offsets(principal="User:a", group_id="", commits=[])


def test_commit_needs_read_on_the_group_and_on_the_topic(store, orders, offsets_topics):
    groups = build_groups(store, offsets_topics, auth=True)
    acls = AclStore(metadata=store)
    with pytest.raises(GroupAuthorizationFailed):
        groups.commit_offsets(principal="User:alice", group_id="etl", commits=[OffsetCommit("orders", 0, 1)])
    acls.add([AclBinding("User:alice", "GROUP", "etl", "LITERAL", "READ", "ALLOW")])
    results = groups.commit_offsets(principal="User:alice", group_id="etl", commits=[OffsetCommit("orders", 0, 1)])
    assert results[0][1].name == "TOPIC_AUTHORIZATION_FAILED"
    acls.add([AclBinding("User:alice", "TOPIC", "orders", "LITERAL", "READ", "ALLOW")])
    results = groups.commit_offsets(principal="User:alice", group_id="etl", commits=[OffsetCommit("orders", 0, 1)])
    assert results[0][1] is None
