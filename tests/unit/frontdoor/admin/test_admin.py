"""Topic administration on a real Redis: validation, placement, listing and metadata."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from lowtide.auth.acl import ANONYMOUS_PRINCIPAL, AclBinding, Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.errors import (
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicationFactor,
    InvalidTopic,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.admin.topic_config import validate_topic_config
from lowtide.messages.admin import TopicRequest
from tests.unit.frontdoor.harness import kill_broker, register_broker


@pytest.fixture
def admin(store):
    pool = ThreadPoolExecutor(4)
    yield TopicAdmin(store=store, authorizer=Authorizer(store=AclStore(metadata=store), enabled=False),
                     replicas=ReplicaClient(), pool=pool, rng=random.Random(7))
    pool.shutdown()


def create(admin, name="orders", partitions=3, rf=2, config=None):
    return admin.create_topic(TopicRequest(name=name, partitions=partitions, replication_factor=rf,
                                           config=config or {}))


def test_replicas_are_placed_on_live_brokers_only(admin, store):
    for b in (0, 1, 2):
        register_broker(store, b)
    kill_broker(store, 1)
    create(admin, partitions=4, rf=2)
    states = store.partition_states("orders")
    assert len(states) == 4
    for s in states:
        assert set(s.replicas) == {0, 2}
        assert s.leader == s.replicas[0] and s.isr == s.replicas and s.leader_epoch == 0


def test_replication_factor_above_live_brokers_is_invalid(admin, store):
    register_broker(store, 0)
    register_broker(store, 1)
    with pytest.raises(InvalidReplicationFactor):
        create(admin, rf=3)
    assert store.topics() == {}


def test_default_replication_factor_is_at_most_three(admin, store):
    for b in range(4):
        register_broker(store, b)
    info = create(admin, rf=0)
    assert info.replication_factor == 3


def test_zero_partitions_are_invalid(admin, store):
    register_broker(store, 0)
    with pytest.raises(InvalidPartitions):
        create(admin, partitions=0, rf=1)


def test_bad_topic_name_is_invalid(admin, store):
    register_broker(store, 0)
    with pytest.raises(InvalidTopic):
        create(admin, name="no spaces", rf=1)


def test_existing_topic_cannot_be_created_again(admin, store):
    register_broker(store, 0)
    create(admin, rf=1)
    with pytest.raises(TopicAlreadyExists):
        create(admin, rf=1)


@pytest.mark.parametrize("config, named", [
    ({"retention.msec": "1"}, "retention.msec"),
    ({"cleanup.policy": "shred"}, "cleanup.policy"),
    ({"retention.ms": "soon"}, "retention.ms"),
    ({"min.cleanable.dirty.ratio": "2"}, "min.cleanable.dirty.ratio"),
    ({"segment.bytes": "10"}, "segment.bytes"),
])
def test_bad_config_is_rejected_naming_the_key(admin, store, config, named):
    register_broker(store, 0)
    with pytest.raises(InvalidConfig, match=named.replace(".", r"\.")):
        create(admin, rf=1, config=config)
    assert store.topics() == {}


def test_known_kafka_and_kip68_configs_are_accepted():
    config = validate_topic_config({"cleanup.policy": "compact, delete", "retention.ms": "-1",
                                    "consumed.retention.ms": "60000", "consumed.retention.groups": "a,b",
                                    "message.timestamp.type": "LogAppendTime", "min.insync.replicas": "2"})
    assert config["cleanup.policy"] == "compact,delete"


def test_min_insync_replicas_above_replication_factor_is_invalid(admin, store):
    register_broker(store, 0)
    with pytest.raises(InvalidConfig, match="min.insync.replicas"):
        create(admin, rf=1, config={"min.insync.replicas": "2"})


def test_validate_only_creates_nothing(admin, store):
    register_broker(store, 0)
    outcomes = admin.create_topics(principal="User:ANONYMOUS", validate_only=True,
                                   requests=[TopicRequest(name="t", partitions=1, replication_factor=1)])
    assert outcomes[0].error is None
    assert store.topics() == {}


def test_internal_topics_are_listed_only_when_asked(admin, store):
    register_broker(store, 0)
    create(admin, name="orders", rf=1)
    create(admin, name="__diskless_metadata", rf=1)
    assert admin.list_topics(principal=ANONYMOUS_PRINCIPAL) == ["orders"]
    assert admin.list_topics(principal=ANONYMOUS_PRINCIPAL, include_internal=True) == ["__diskless_metadata", "orders"]


def test_metadata_reports_broker_liveness_and_unknown_topics(admin, store):
    register_broker(store, 0, "127.0.0.1:7000")
    register_broker(store, 1, "127.0.0.1:7001")
    create(admin, rf=2, partitions=2)
    kill_broker(store, 1)
    view = admin.describe_cluster(principal=ANONYMOUS_PRINCIPAL, topics=["orders", "missing"])
    assert [(b.id, b.live) for b in view.brokers] == [(0, True), (1, False)]
    orders, missing = view.topics
    assert [s.partition for s in orders.partitions] == [0, 1]
    assert isinstance(missing.error, UnknownTopicOrPartition)
    assert view.cluster_id == admin.describe_cluster(principal=ANONYMOUS_PRINCIPAL).cluster_id


def test_deleted_topic_is_gone_and_deleting_again_fails(admin, store):
    register_broker(store, 0)
    create(admin, rf=1)
    assert admin.delete_topics(principal="User:x", names=["orders"])[0].error is None
    again = admin.delete_topics(principal="User:x", names=["orders"])[0]
    assert isinstance(again.error, UnknownTopicOrPartition)


def test_with_auth_on_topics_and_metadata_show_only_what_the_caller_may_describe(store):
    acls = AclStore(metadata=store)
    acls.add([AclBinding("User:alice", "TOPIC", "orders", "LITERAL", "READ", "ALLOW"),
              AclBinding("User:alice", "TOPIC", "pay", "PREFIXED", "DESCRIBE", "ALLOW")])
    pool = ThreadPoolExecutor(2)
    admin = TopicAdmin(store=store, authorizer=Authorizer(store=acls, enabled=True), replicas=ReplicaClient(),
                       pool=pool)
    register_broker(store, 0)
    for name in ("orders", "payments", "secret"):
        create(admin, name=name, partitions=1, rf=1)
    assert admin.list_topics(principal="User:alice") == ["orders", "payments"]  # READ implies DESCRIBE
    assert admin.list_topics(principal="User:bob") == []
    assert [t.name for t in admin.describe_cluster(principal="User:alice").topics] == ["orders", "payments"]
    named = admin.describe_cluster(principal="User:alice", topics=["secret", "missing", "orders"]).topics
    # refused before existence is looked at: a caller cannot probe which names exist
    assert [type(t.error).__name__ if t.error else None for t in named] == [
        "TopicAuthorizationFailed", "TopicAuthorizationFailed", None]
    assert named[0].partitions == () and named[2].partitions[0].partition == 0
    pool.shutdown()
