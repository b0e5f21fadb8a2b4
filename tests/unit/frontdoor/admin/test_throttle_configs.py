"""KIP-73 throttle configs at the front door, on a real etcd: the topic keys
``leader/follower.replication.throttled.replicas`` (validated, list-typed), and the dynamic broker
configs ``leader/follower.replication.throttled.rate`` per broker id and cluster-wide through
Admin.AlterConfigs (``TopicConfigAdmin`` with ``broker:<id>`` resources; ``MetadataStore``'s
broker-config region): SET/DELETE, the no-op DELETE the reassignment tool sends, refusals, ACLs on
the CLUSTER, and the metadata change replicas re-read their rates on."""

from __future__ import annotations

import pytest

from lowtide.auth.acl import AclBinding, Authorizer
from lowtide.auth.store import AclStore
from lowtide.errors import (
    ClusterAuthorizationFailed,
    InvalidConfig,
    InvalidRequest,
    PolicyViolation,
)
from lowtide.frontdoor.admin.config_admin import TopicConfigAdmin
from lowtide.frontdoor.admin.topic_config import validate_topic_config
from lowtide.messages.admin import ConfigChange, ConfigOp, ConfigOpType
from lowtide.metadata.config_defaults import broker_resource
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.model import BrokerInfo
from lowtide.metadata.store import MetadataStore
from tests.waiting import wait_until

SET, DELETE, APPEND, SUBTRACT = ConfigOpType.SET, ConfigOpType.DELETE, ConfigOpType.APPEND, ConfigOpType.SUBTRACT
LEADER_RATE, FOLLOWER_RATE = "leader.replication.throttled.rate", "follower.replication.throttled.rate"
LEADER_LIST, FOLLOWER_LIST = "leader.replication.throttled.replicas", "follower.replication.throttled.replicas"


@pytest.fixture
def configs(store):
    for broker in (0, 1):
        store.register_broker(BrokerInfo(id=broker, host="127.0.0.1", port=9092 + broker), incarnation="x",
                              session_timeout_ms=60000)
    return TopicConfigAdmin(store=store, authorizer=Authorizer(store=AclStore(metadata=store), enabled=False))


def alter(configs, resource, *ops, validate_only=False, replace=False, principal="User:ANONYMOUS"):
    [outcome] = configs.alter_configs(principal=principal, validate_only=validate_only,
                                      changes=[ConfigChange(topic=resource, ops=tuple(ops), replace=replace)])
    return outcome


# -- topic keys -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["*", "0:1", "0:1,0:2,3:0", " 0:1 , 1:2 ", ""])
def test_throttled_replica_lists_accept_star_and_partition_broker_pairs(value):
    assert validate_topic_config({LEADER_LIST: value})[LEADER_LIST] == value.replace(" ", "")


@pytest.mark.parametrize("value", ["0-1", "0:", ":1", "*,0:1", "a:b", "0:1,,1:2", "all"])
def test_throttled_replica_lists_refuse_anything_else(value):
    with pytest.raises(InvalidConfig, match=FOLLOWER_LIST):
        validate_topic_config({FOLLOWER_LIST: value})


def test_throttled_replica_lists_are_set_appended_and_subtracted_through_alter_configs(configs, store):
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={}, assignment=[[0, 1], [1, 0]])
    assert alter(configs, "orders", ConfigOp(LEADER_LIST, SET, "0:0,1:1")).error is None
    assert alter(configs, "orders", ConfigOp(LEADER_LIST, APPEND, "0:1"),
                 ConfigOp(FOLLOWER_LIST, APPEND, "*")).error is None
    assert store.topic("orders").config == {LEADER_LIST: "0:0,1:1,0:1", FOLLOWER_LIST: "*"}
    assert alter(configs, "orders", ConfigOp(FOLLOWER_LIST, SUBTRACT, "*")).error is None
    assert store.topic("orders").config == {LEADER_LIST: "0:0,1:1,0:1"}  # the empty list is the default
    assert isinstance(alter(configs, "orders", ConfigOp(LEADER_LIST, SET, "0to1")).error, InvalidConfig)


def test_a_diskless_topic_refuses_throttled_replicas(configs, store):
    store.create_topic(name="dl", partitions=1, replication_factor=1, config={}, assignment=[], diskless=True)
    assert isinstance(alter(configs, "dl", ConfigOp(LEADER_LIST, SET, "*")).error, InvalidConfig)


# -- broker rates -----------------------------------------------------------------------------------
def test_rates_are_set_per_broker_and_cluster_wide_and_the_broker_overrides_the_default(configs, store):
    outcome = alter(configs, broker_resource("0"), ConfigOp(LEADER_RATE, SET, "1000000"))
    assert outcome.error is None and outcome.config == {LEADER_RATE: "1000000"}
    assert outcome.topic == "broker:0"
    assert alter(configs, broker_resource(""), ConfigOp(LEADER_RATE, SET, "50"),
                 ConfigOp(FOLLOWER_RATE, SET, " 70 ")).error is None
    assert store.broker_configs() == {"0": {LEADER_RATE: "1000000"}, "": {LEADER_RATE: "50", FOLLOWER_RATE: "70"}}
    assert store.effective_broker_config(0) == {LEADER_RATE: "1000000", FOLLOWER_RATE: "70"}
    assert store.effective_broker_config(1) == {LEADER_RATE: "50", FOLLOWER_RATE: "70"}
    assert store.effective_broker_config(7) == {LEADER_RATE: "50", FOLLOWER_RATE: "70"}


def test_delete_returns_a_rate_to_unlimited_and_the_tools_log_dirs_delete_is_a_no_op(configs, store):
    alter(configs, broker_resource("1"), ConfigOp(LEADER_RATE, SET, "10"), ConfigOp(FOLLOWER_RATE, SET, "20"))
    # What kafka-reassign-partitions --verify sends to every broker.
    outcome = alter(configs, broker_resource("1"), ConfigOp(LEADER_RATE, DELETE),
                    ConfigOp(FOLLOWER_RATE, DELETE),
                    ConfigOp("replica.alter.log.dirs.io.max.bytes.per.second", DELETE))
    assert outcome.error is None and outcome.config == {}
    assert store.broker_configs() == {}  # the entry is gone, not left empty
    assert alter(configs, broker_resource("1"), ConfigOp(LEADER_RATE, DELETE)).error is None  # unset: fine


def test_legacy_alter_configs_replaces_the_brokers_whole_dynamic_set(configs, store):
    alter(configs, broker_resource("0"), ConfigOp(LEADER_RATE, SET, "10"), ConfigOp(FOLLOWER_RATE, SET, "20"))
    assert alter(configs, broker_resource("0"), ConfigOp(FOLLOWER_RATE, SET, "30"), replace=True).error is None
    assert store.broker_config("0") == {FOLLOWER_RATE: "30"}


@pytest.mark.parametrize(("op", "error"), [
    (ConfigOp("log.retention.ms", SET, "5"), PolicyViolation),
    (ConfigOp("num.partitions", DELETE), PolicyViolation),
    (ConfigOp("replica.alter.log.dirs.io.max.bytes.per.second", SET, "5"), PolicyViolation),
    (ConfigOp(LEADER_RATE, SET, "fast"), InvalidConfig),
    (ConfigOp(LEADER_RATE, SET, "-1"), InvalidConfig),
    (ConfigOp(LEADER_RATE, APPEND, "5"), InvalidConfig),
    (ConfigOp(LEADER_RATE, SET, None), InvalidRequest),
])
def test_bad_broker_ops_are_refused_and_change_nothing(configs, store, op, error):
    alter(configs, broker_resource("0"), ConfigOp(FOLLOWER_RATE, SET, "20"))
    good = ConfigOp(FOLLOWER_RATE, SET, "10")  # in the same request: refused with it
    outcome = alter(configs, broker_resource("0"), good, op)
    assert isinstance(outcome.error, error), outcome.error
    assert store.broker_config("0") == {FOLLOWER_RATE: "20"}


def test_static_broker_keys_stay_refused_naming_what_is_dynamic(configs):
    outcome = alter(configs, broker_resource("0"), ConfigOp("log.retention.ms", SET, "5"))
    assert isinstance(outcome.error, PolicyViolation) and "static" in outcome.error.message
    assert LEADER_RATE in outcome.error.message


@pytest.mark.parametrize("broker", ["9", "x", "-1"])
def test_an_unknown_broker_is_invalid_request(configs, store, broker):
    assert isinstance(alter(configs, broker_resource(broker), ConfigOp(LEADER_RATE, SET, "5")).error, InvalidRequest)
    assert store.broker_configs() == {}


def test_validate_only_changes_nothing_and_no_ops_reads_the_current_config_back(configs, store):
    alter(configs, broker_resource("0"), ConfigOp(LEADER_RATE, SET, "10"))
    would = alter(configs, broker_resource("0"), ConfigOp(FOLLOWER_RATE, SET, "5"), validate_only=True)
    assert would.error is None and would.config == {LEADER_RATE: "10", FOLLOWER_RATE: "5"}
    assert store.broker_config("0") == {LEADER_RATE: "10"}
    assert alter(configs, broker_resource("0"), validate_only=True).config == {LEADER_RATE: "10"}


def test_a_rate_change_moves_the_metadata_version_and_reaches_the_replicas(configs, store):
    replica = MetadataStore(client=EtcdClient(store.client.endpoints), root=store.root)  # another process
    heard: list[str] = []
    try:
        replica.start()
        replica.listen(heard.extend)  # changes after its load
        before = store.version()
        alter(configs, broker_resource(""), ConfigOp(LEADER_RATE, SET, "1000"))
        after = store.version()
        assert after > before
        wait_until(lambda: replica.effective_broker_config(1) == {LEADER_RATE: "1000"}, what="the rate at the replica")
        # Listeners run on the image's listener thread, after the image applied the change.
        wait_until(lambda: heard, what="the replica's listener called")
        assert heard == [store._k("broker_configs", "default")]
        alter(configs, broker_resource(""), ConfigOp(LEADER_RATE, SET, "1000"))  # no change: nothing written
        assert store.client.revision() == after
    finally:
        replica.close()


def test_broker_configs_need_alter_configs_on_the_cluster_and_reading_them_describe_configs(store):
    store.register_broker(BrokerInfo(id=0, host="127.0.0.1", port=9092), incarnation="x", session_timeout_ms=60000)
    acls = AclStore(metadata=store)

    def admin():
        return TopicConfigAdmin(store=store, authorizer=Authorizer(store=acls, enabled=True))

    def grant(operation: str) -> None:
        acls.add([AclBinding(principal="User:ops", resource_type="CLUSTER", resource_name="kafka-cluster",
                             pattern_type="LITERAL", operation=operation, permission="ALLOW")])

    change = ConfigOp(LEADER_RATE, SET, "5")
    assert isinstance(alter(admin(), broker_resource("0"), change, principal="User:ops").error,
                      ClusterAuthorizationFailed)
    assert isinstance(alter(admin(), broker_resource("0"), validate_only=True, principal="User:ops").error,
                      ClusterAuthorizationFailed)
    grant("DESCRIBE_CONFIGS")
    assert alter(admin(), broker_resource("0"), validate_only=True, principal="User:ops").error is None
    assert isinstance(alter(admin(), broker_resource("0"), change, principal="User:ops").error,
                      ClusterAuthorizationFailed)
    grant("ALTER_CONFIGS")
    assert alter(admin(), broker_resource("0"), change, principal="User:ops").error is None
    assert store.broker_config("0") == {LEADER_RATE: "5"}
