"""CreatePartitions on a real Redis: what may grow, where the new replicas go, what is refused."""

from __future__ import annotations

import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from lowtide.auth.acl import AclBinding, Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    TopicAuthorizationFailed,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.admin.partitions import PartitionCreator
from lowtide.messages.admin import PartitionsRequest, TopicRequest
from lowtide.metadata.model import BrokerInfo
from tests.unit.frontdoor.harness import kill_broker, register_broker


@pytest.fixture
def brokers(store):
    for b in (0, 1, 2):
        register_broker(store, b)


@pytest.fixture
def topics(store, brokers):
    pool = ThreadPoolExecutor(2)
    admin = TopicAdmin(store=store, authorizer=Authorizer(store=AclStore(metadata=store), enabled=False),
                       replicas=ReplicaClient(), pool=pool, rng=random.Random(7))
    admin.create_topic(TopicRequest(name="orders", partitions=2, replication_factor=2))
    yield admin
    pool.shutdown()


def creator(store, *, enabled: bool = False) -> PartitionCreator:
    return PartitionCreator(store=store, authorizer=Authorizer(store=AclStore(metadata=store), enabled=enabled),
                            diskless=None, rng=random.Random(3))


def grow(store, count, *, name="orders", assignments=(), validate_only=False, principal="User:alice"):
    [outcome] = creator(store).create_partitions(principal=principal, validate_only=validate_only, requests=[
        PartitionsRequest(name=name, count=count, assignments=tuple(tuple(a) for a in assignments))])
    if outcome.error is not None:
        raise outcome.error
    return store.partition_states(name)


def test_new_partitions_are_added_after_the_old_ones_with_the_topics_replication_factor(store, topics):
    before = store.partition_states("orders")
    states = grow(store, 5)
    assert states[:2] == before  # the old partitions are untouched
    assert [s.partition for s in states] == [0, 1, 2, 3, 4]
    for s in states[2:]:
        assert len(s.replicas) == 2 and len(set(s.replicas)) == 2 and set(s.replicas) <= {0, 1, 2}
        assert s.leader == s.replicas[0] and s.isr == s.replicas and s.leader_epoch == 0
    assert store.topic("orders").partitions == 5
    # round-robin: three new partitions over three brokers lead once each
    assert sorted(s.leader for s in states[2:]) == [0, 1, 2]


def test_an_explicit_assignment_is_used_as_given(store, topics):
    states = grow(store, 4, assignments=[(2, 0), (1, 2)])
    assert [s.replicas for s in states[2:]] == [(2, 0), (1, 2)]


@pytest.mark.parametrize("count, message", [
    (2, "Topic already has 2 partitions."),
    (1, "Topic currently has 2 partitions, which is higher than the requested 1."),
    (10_001, "more than the 10000"),
])
def test_a_count_that_does_not_grow_the_topic_is_invalid_partitions(store, topics, count, message):
    with pytest.raises(InvalidPartitions, match=message):
        grow(store, count)
    assert store.topic("orders").partitions == 2


@pytest.mark.parametrize("assignments, message", [
    ([(0, 1)], "by 2 but 1 assignments provided"),
    ([(0, 1), (0,)], "1 replicas given, the topic's replication factor is 2"),
    ([(0, 1), (1, 1)], "duplicate brokers"),
    ([(0, 1), (0, 9)], r"unknown broker ids \[9\]"),
])
def test_a_bad_assignment_is_invalid_replica_assignment_and_changes_nothing(store, topics, assignments, message):
    with pytest.raises(InvalidReplicaAssignment, match=message):
        grow(store, 4, assignments=assignments)
    assert len(store.partition_states("orders")) == 2 and store.topic("orders").partitions == 2


def test_too_few_live_brokers_for_the_replication_factor_is_refused(store, topics):
    kill_broker(store, 0)
    kill_broker(store, 1)
    with pytest.raises(InvalidReplicationFactor):
        grow(store, 3)


def test_validate_only_checks_without_writing(store, topics):
    grow(store, 9, validate_only=True)
    assert store.topic("orders").partitions == 2 and len(store.partition_states("orders")) == 2
    with pytest.raises(InvalidPartitions):
        grow(store, 1, validate_only=True)


def test_an_unknown_topic_is_unknown_topic_or_partition(store, topics):
    with pytest.raises(UnknownTopicOrPartition):
        grow(store, 3, name="nope")


def test_each_topic_gets_its_own_outcome_and_a_repeated_topic_is_refused(store, topics):
    outcomes = creator(store).create_partitions(principal="User:alice", requests=[
        PartitionsRequest(name="orders", count=3), PartitionsRequest(name="nope", count=3),
        PartitionsRequest(name="orders", count=4)])
    assert [type(o.error).__name__ if o.error else None for o in outcomes] == [
        None, "UnknownTopicOrPartition", "InvalidPartitions"]
    assert store.topic("orders").partitions == 3


def test_adding_partitions_needs_alter_on_the_topic(store, topics):
    authorizing = creator(store, enabled=True)
    request = [PartitionsRequest(name="orders", count=3)]
    [refused] = authorizing.create_partitions(principal="User:alice", requests=request)
    assert isinstance(refused.error, TopicAuthorizationFailed)
    AclStore(metadata=store).add([AclBinding("User:alice", "TOPIC", "orders", "LITERAL", "ALTER", "ALLOW")])
    # (a new authorizer: the first one's ACL snapshot is refreshed only every 0.2 s)
    [allowed] = creator(store, enabled=True).create_partitions(principal="User:alice", requests=request)
    assert allowed.error is None and store.topic("orders").partitions == 3


def test_a_concurrent_change_of_the_topic_record_is_not_overwritten(store, topics):
    raw, topic = store.topic_record("orders")
    assert store.add_partitions(expected=raw, topic=topic, assignment=[[0, 1]]) is not None
    # a second writer that read the same record loses the compare-and-set and writes nothing
    assert store.add_partitions(expected=raw, topic=topic, assignment=[[1, 2]]) is None
    states = store.partition_states("orders")
    assert len(states) == 3 and states[2].replicas == (0, 1)


def test_topics_and_new_partitions_spread_over_racks_when_brokers_have_them(store):
    racks = {0: "zone-a", 1: "zone-a", 2: "zone-b", 3: "zone-b"}
    for b, rack in racks.items():
        store.register_broker(BrokerInfo(id=b, host="127.0.0.1", port=1, rack=rack), incarnation=uuid.uuid4().hex,
                              session_timeout_ms=60_000)
    pool = ThreadPoolExecutor(1)
    admin = TopicAdmin(store=store, authorizer=Authorizer(store=AclStore(metadata=store), enabled=False),
                       replicas=ReplicaClient(), pool=pool, rng=random.Random(1))
    admin.create_topic(TopicRequest(name="zoned", partitions=4, replication_factor=2))
    grow(store, 8, name="zoned")
    pool.shutdown()
    for state in store.partition_states("zoned"):
        assert {racks[b] for b in state.replicas} == {"zone-a", "zone-b"}, state


def test_new_partitions_take_the_replication_factor_a_reassignment_gave_partition_0(store, topics):
    # Kafka's controller takes the replica count of partition 0, not the one the topic was created with.
    cur = store.partition_state("orders", 0)
    assert store.compare_and_set_partition(cur, replace(cur, replicas=(0, 1, 2), isr=(0, 1, 2)))
    states = grow(store, 3)
    assert len(states[2].replicas) == 3
