"""Altering topic configs on a real etcd (``TopicConfigAdmin`` and ``MetadataStore.update_topic_config``):
per-topic results, all-or-nothing per topic, validate_only, ACLs, and the
metadata change replicas react to. The gRPC path (servicer + client) is checked against an
in-process front door."""

from __future__ import annotations

import threading

import pytest

from lowtide.auth.acl import AclBinding, AclOperation, Authorizer, ResourceType
from lowtide.auth.store import AclStore
from lowtide.client import Admin
from lowtide.errors import (
    InvalidConfig,
    InvalidRequest,
    TopicAuthorizationFailed,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.admin.config_admin import TopicConfigAdmin
from lowtide.messages.admin import ConfigChange, ConfigOp, ConfigOpType
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.store import MetadataStore
from tests.waiting import wait_until

SET, DELETE = ConfigOpType.SET, ConfigOpType.DELETE


@pytest.fixture
def configs(store):
    return TopicConfigAdmin(store=store, authorizer=Authorizer(store=AclStore(metadata=store), enabled=False))


def make_topic(store, name="orders", config=None, rf=1, diskless=False):
    return store.create_topic(name=name, partitions=1, replication_factor=rf, config=dict(config or {}),
                              assignment=[] if diskless else [[0]], diskless=diskless)


def alter(configs, topic, *ops, validate_only=False, principal="User:ANONYMOUS"):
    [outcome] = configs.alter_configs(principal=principal, validate_only=validate_only,
                                      changes=[ConfigChange(topic=topic, ops=tuple(ops))])
    return outcome


def test_a_set_is_stored_and_returned(configs, store):
    make_topic(store, config={"segment.bytes": "4096"})
    outcome = alter(configs, "orders", ConfigOp("retention.ms", SET, "60000"))
    assert outcome.error is None and outcome.config == {"segment.bytes": "4096", "retention.ms": "60000"}
    assert store.topic("orders").config == {"segment.bytes": "4096", "retention.ms": "60000"}


def test_an_invalid_op_changes_nothing_of_that_topic_but_the_next_topic_still_changes(configs, store):
    make_topic(store, "a", config={"retention.ms": "1000"})
    make_topic(store, "b")
    outcomes = configs.alter_configs(principal="User:ANONYMOUS", changes=[
        ConfigChange(topic="a", ops=(ConfigOp("segment.bytes", SET, "4096"), ConfigOp("retention.ms", SET, "soon"))),
        ConfigChange(topic="b", ops=(ConfigOp("retention.ms", SET, "5"),))])
    assert isinstance(outcomes[0].error, InvalidConfig) and outcomes[0].error.code == 40
    assert store.topic("a").config == {"retention.ms": "1000"}
    assert outcomes[1].error is None and store.topic("b").config == {"retention.ms": "5"}


def test_an_unknown_topic_is_unknown_topic_or_partition(configs):
    assert isinstance(alter(configs, "nosuch", ConfigOp("retention.ms", SET, "5")).error, UnknownTopicOrPartition)


def test_validate_only_answers_the_new_config_and_changes_nothing(configs, store):
    make_topic(store, config={"retention.ms": "1000"})
    version = store.version()
    outcome = alter(configs, "orders", ConfigOp("retention.ms", DELETE), ConfigOp("cleanup.policy", SET, "compact"),
                    validate_only=True)
    assert outcome.error is None and outcome.config == {"cleanup.policy": "compact"}
    assert store.topic("orders").config == {"retention.ms": "1000"} and store.version() == version


def test_a_topic_named_twice_in_one_request_is_invalid_request_for_both(configs, store):
    make_topic(store)
    outcomes = configs.alter_configs(principal="User:ANONYMOUS", changes=[
        ConfigChange(topic="orders", ops=(ConfigOp("retention.ms", SET, "5"),)),
        ConfigChange(topic="orders", ops=(ConfigOp("retention.ms", SET, "6"),))])
    assert all(isinstance(o.error, InvalidRequest) for o in outcomes)
    assert store.topic("orders").config == {}


def test_min_insync_replicas_above_the_replication_factor_is_invalid_config(configs, store):
    make_topic(store, rf=2)
    assert isinstance(alter(configs, "orders", ConfigOp("min.insync.replicas", SET, "3")).error, InvalidConfig)
    assert alter(configs, "orders", ConfigOp("min.insync.replicas", SET, "2")).error is None


def test_a_diskless_topic_refuses_compaction(configs, store):
    make_topic(store, diskless=True)
    assert isinstance(alter(configs, "orders", ConfigOp("cleanup.policy", SET, "compact")).error, InvalidConfig)
    assert alter(configs, "orders", ConfigOp("retention.ms", SET, "5")).error is None


def test_a_change_moves_the_metadata_version_and_reaches_other_processes(configs, store):
    make_topic(store)
    replica = MetadataStore(client=EtcdClient(store.client.endpoints), root=store.root)  # another process
    heard: list[str] = []
    try:
        replica.start()
        replica.listen(heard.extend)  # changes after its load
        version = store.version()
        alter(configs, "orders", ConfigOp("retention.ms", SET, "5"))
        assert store.version() > version
        wait_until(lambda: replica.topic("orders").config == {"retention.ms": "5"}, what="the change at the replica")
        # Listeners run on the image's listener thread, after the image applied the change.
        wait_until(lambda: store._k("topics", "orders") in heard, what="the replica's listener called")
    finally:
        replica.close()


def test_a_change_that_changes_nothing_does_not_bump_the_version(configs, store):
    make_topic(store, config={"retention.ms": "5"})
    version = store.version()
    assert alter(configs, "orders", ConfigOp("retention.ms", SET, "5")).error is None
    assert store.version() == version


def test_concurrent_changes_of_different_keys_all_land(configs, store):
    make_topic(store)
    keys = [("retention.ms", "5"), ("retention.bytes", "100"), ("segment.bytes", "4096"), ("delete.retention.ms", "7"),
            ("min.compaction.lag.ms", "3"), ("segment.ms", "1000")]
    start = threading.Barrier(len(keys))

    def change(key: str, value: str) -> None:
        start.wait()
        for _ in range(5):
            assert alter(configs, "orders", ConfigOp(key, SET, value)).error is None

    threads = [threading.Thread(target=change, args=kv) for kv in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.topic("orders").config == dict(keys)


def test_altering_needs_alter_configs_on_the_topic(store):
    make_topic(store)
    acls = AclStore(metadata=store)
    configs = TopicConfigAdmin(store=store, authorizer=Authorizer(store=acls, enabled=True))
    refused = alter(configs, "orders", ConfigOp("retention.ms", SET, "5"), principal="User:alice")
    assert isinstance(refused.error, TopicAuthorizationFailed)
    # refused before existence is looked at, so a refused caller cannot probe topic names
    assert isinstance(alter(configs, "nosuch", ConfigOp("retention.ms", SET, "5"), principal="User:alice").error,
                      TopicAuthorizationFailed)
    acls.add([AclBinding(principal="User:alice", resource_type="TOPIC", resource_name="orders", pattern_type="LITERAL",
                         operation="ALTER", permission="ALLOW")])
    configs = TopicConfigAdmin(store=store, authorizer=Authorizer(store=acls, enabled=True))
    assert isinstance(alter(configs, "orders", ConfigOp("retention.ms", SET, "5"), principal="User:alice").error,
                      TopicAuthorizationFailed)  # ALTER is not ALTER_CONFIGS, as in Kafka
    acls.add([AclBinding(principal="User:alice", resource_type="TOPIC", resource_name="orders", pattern_type="LITERAL",
                         operation="ALTER_CONFIGS", permission="ALLOW")])
    configs = TopicConfigAdmin(store=store, authorizer=Authorizer(store=acls, enabled=True))
    assert alter(configs, "orders", ConfigOp("retention.ms", SET, "5"), principal="User:alice").error is None
    assert Authorizer(store=acls, enabled=True).authorize(
        principal="User:alice", operation=AclOperation.DESCRIBE_CONFIGS, resource_type=ResourceType.TOPIC,
        resource_name="orders")  # Kafka: ALTER_CONFIGS implies DESCRIBE_CONFIGS


def test_the_client_alters_through_the_front_door(front_door, store):
    make_topic(store, config={"retention.ms": "1000"})
    with Admin(front_door.address) as admin:
        config = admin.alter_topic_config("orders", set_config={"segment.bytes": "4096"},
                                          delete_config=["retention.ms"], append_config={"cleanup.policy": "compact"})
        assert config == {"segment.bytes": "4096", "cleanup.policy": "delete,compact"}
        assert admin.describe_topics(["orders"])["orders"].config == config
        with pytest.raises(InvalidConfig, match="retention.ms"):
            admin.alter_topic_config("orders", set_config={"retention.ms": "soon"})
        with pytest.raises(UnknownTopicOrPartition):
            admin.alter_topic_config("nosuch", set_config={"retention.ms": "5"})
    assert store.topic("orders").config == config
