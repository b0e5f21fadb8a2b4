"""Committed offsets of consumer groups in a real Redis, with and without authorization."""

from __future__ import annotations

import json

import pytest

from lowtide.auth.acl import AclBinding, Authorizer
from lowtide.auth.store import AclStore
from lowtide.errors import GroupAuthorizationFailed, GroupIdNotFound, InvalidGroupId, UnknownTopicOrPartition
from lowtide.frontdoor.groups import GroupCoordinator, GroupStore, OffsetCommit
from tests.unit.frontdoor.harness import register_broker


def build_groups(store, *, auth=False):
    authorizer = Authorizer(store=AclStore(redis=store.redis), enabled=auth, refresh_interval_s=0)
    return GroupCoordinator(store=GroupStore(redis=store.redis), metadata=store, authorizer=authorizer)


@pytest.fixture
def orders(store):
    register_broker(store, 0)
    store.create_topic(name="orders", partitions=2, replication_factor=1, config={}, assignment=[[0], [0]])


def test_committed_offsets_are_stored_in_the_documented_layout(store, orders):
    groups = build_groups(store)
    results = groups.commit_offsets(principal="User:a", group_id="etl",
                                    commits=[OffsetCommit("orders", 0, 10000, "m")])
    assert results[0][1] is None
    assert store.redis.smembers("lowtide:groups") == {b"etl"}
    doc = json.loads(store.redis.hget("lowtide:groups:etl", "orders\x000"))
    assert doc["offset"] == 10000 and doc["metadata"] == "m" and doc["commit_ms"] > 0
    fetched = groups.fetch_offsets(principal="User:a", group_id="etl", partitions=[("orders", 0), ("orders", 1)])
    assert [(c.partition, c.offset) for c in fetched] == [(0, 10000), (1, -1)]


def test_unknown_partitions_fail_alone(store, orders):
    groups = build_groups(store)
    results = groups.commit_offsets(principal="User:a", group_id="etl", commits=[
        OffsetCommit("orders", 1, 5), OffsetCommit("orders", 2, 5), OffsetCommit("nope", 0, 5)])
    assert [type(e) if e else None for _, e in results] == [None, UnknownTopicOrPartition, UnknownTopicOrPartition]
    assert [c.partition for c in groups.fetch_offsets(principal="User:a", group_id="etl")] == [1]


def test_groups_are_listed_described_and_deleted(store, orders):
    groups = build_groups(store)
    groups.commit_offsets(principal="User:a", group_id="g1", commits=[OffsetCommit("orders", 0, 1)])
    groups.commit_offsets(principal="User:a", group_id="g2", commits=[OffsetCommit("orders", 1, 2)])
    assert groups.list_groups(principal="User:a") == ["g1", "g2"]
    described = groups.describe_groups(principal="User:a", group_ids=["g1", "missing"])
    assert [(c.topic, c.partition, c.offset) for c in described[0].offsets] == [("orders", 0, 1)]
    assert isinstance(described[1].error, GroupIdNotFound)
    deleted = groups.delete_groups(principal="User:a", group_ids=["g1", "g1"])
    assert deleted[0].error is None and isinstance(deleted[1].error, GroupIdNotFound)
    assert groups.list_groups(principal="User:a") == ["g2"]


def test_empty_group_id_is_invalid(store, orders):
    with pytest.raises(InvalidGroupId):
        build_groups(store).commit_offsets(principal="User:a", group_id="", commits=[])


def test_commit_needs_read_on_the_group_and_on_the_topic(store, orders):
    groups = build_groups(store, auth=True)
    acls = AclStore(redis=store.redis)
    with pytest.raises(GroupAuthorizationFailed):
        groups.commit_offsets(principal="User:alice", group_id="etl", commits=[OffsetCommit("orders", 0, 1)])
    acls.add([AclBinding("User:alice", "GROUP", "etl", "LITERAL", "READ", "ALLOW")])
    results = groups.commit_offsets(principal="User:alice", group_id="etl", commits=[OffsetCommit("orders", 0, 1)])
    assert results[0][1].name == "TOPIC_AUTHORIZATION_FAILED"
    acls.add([AclBinding("User:alice", "TOPIC", "orders", "LITERAL", "READ", "ALLOW")])
    results = groups.commit_offsets(principal="User:alice", group_id="etl", commits=[OffsetCommit("orders", 0, 1)])
    assert results[0][1] is None
