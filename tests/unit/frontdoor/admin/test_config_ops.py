"""Kafka's IncrementalAlterConfigs / AlterConfigs semantics on a topic config (pure functions), and
the defaults DescribeConfigs reports agreeing with the ones lowtide really runs with."""

from __future__ import annotations

import dataclasses

import pytest

from lowtide.errors import InvalidConfig, InvalidRequest
from lowtide.frontdoor.admin import admin as frontdoor_admin
from lowtide.frontdoor.admin.topic_config import TOPIC_CONFIG_VALIDATORS, apply_config_ops, check_diskless_config_change
from lowtide.log.cleaner.config import CleanerSettings, CompactionConfig
from lowtide.log.partition_log import LogConfig
from lowtide.messages.admin import ConfigOp, ConfigOpType
from lowtide.metadata.config_defaults import (
    BROKER_SYNONYMS,
    TOPIC_CONFIG_DEFAULTS,
    broker_config_defaults,
)
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.consumed_retention import ConsumedRetentionConfig

SET, DELETE, APPEND, SUBTRACT = ConfigOpType.SET, ConfigOpType.DELETE, ConfigOpType.APPEND, ConfigOpType.SUBTRACT


def test_set_changes_one_key_and_keeps_the_others():
    out = apply_config_ops({"retention.ms": "1000", "segment.bytes": "4096"}, [ConfigOp("retention.ms", SET, " 5 ")])
    assert out == {"retention.ms": "5", "segment.bytes": "4096"}


def test_delete_returns_a_key_to_its_default_and_deleting_an_unset_key_is_fine():
    out = apply_config_ops({"retention.ms": "1000"}, [ConfigOp("retention.ms", DELETE),
                                                     ConfigOp("retention.bytes", DELETE, "")])
    assert out == {}


def test_append_starts_from_the_default_when_the_key_is_unset():
    assert apply_config_ops({}, [ConfigOp("cleanup.policy", APPEND, "compact")]) == {
        "cleanup.policy": "delete,compact"}


def test_append_drops_duplicates_and_subtract_removes_items():
    current = {"cleanup.policy": "compact"}
    assert apply_config_ops(current, [ConfigOp("cleanup.policy", APPEND, "compact,delete")]) == {
        "cleanup.policy": "compact,delete"}
    assert apply_config_ops({"cleanup.policy": "compact,delete"}, [ConfigOp("cleanup.policy", SUBTRACT, "delete")]) \
        == {"cleanup.policy": "compact"}


def test_subtracting_the_last_group_returns_the_group_list_to_its_default():
    out = apply_config_ops({"consumed.retention.groups": "etl"}, [ConfigOp("consumed.retention.groups", SUBTRACT,
                                                                           "etl")])
    assert out == {}


def test_subtracting_every_cleanup_policy_is_invalid_config():
    with pytest.raises(InvalidConfig, match="cleanup.policy"):
        apply_config_ops({"cleanup.policy": "delete"}, [ConfigOp("cleanup.policy", SUBTRACT, "delete")])


def test_append_to_a_key_that_is_not_a_list_is_invalid_config():
    with pytest.raises(InvalidConfig, match="list configs only.*retention.ms"):
        apply_config_ops({}, [ConfigOp("retention.ms", APPEND, "5")])


@pytest.mark.parametrize("op", [ConfigOp("retention.msec", SET, "5"), ConfigOp("retention.msec", DELETE),
                                ConfigOp("retention.ms", SET, "soon"), ConfigOp("retention.ms", SET, "-2"),
                                ConfigOp("cleanup.policy", SET, "archive")])
def test_an_unknown_key_or_a_bad_value_is_invalid_config_naming_the_key(op):
    with pytest.raises(InvalidConfig, match=op.key.replace(".", r"\.")):
        apply_config_ops({"retention.ms": "1000"}, [ConfigOp("segment.bytes", SET, "4096"), op])


@pytest.mark.parametrize("ops", [
    [ConfigOp("retention.ms", SET, "1"), ConfigOp("retention.ms", DELETE)],  # twice
    [ConfigOp("retention.ms", SET, None)],  # no value
    [ConfigOp("retention.ms", 9, "1")],  # no such operation
])
def test_a_malformed_request_is_invalid_request(ops):
    with pytest.raises(InvalidRequest):
        apply_config_ops({}, ops)


def test_replace_makes_the_given_keys_the_whole_config():
    out = apply_config_ops({"retention.ms": "1000", "segment.bytes": "4096"},
                           [ConfigOp("cleanup.policy", SET, "compact")], replace=True)
    assert out == {"cleanup.policy": "compact"}


def test_replace_accepts_set_only():
    with pytest.raises(InvalidRequest, match="IncrementalAlterConfigs"):
        apply_config_ops({}, [ConfigOp("retention.ms", DELETE)], replace=True)


def test_a_diskless_topic_accepts_retention_changes_and_removing_any_key():
    check_diskless_config_change({"segment.bytes": "4096"}, {"retention.ms": "5", "retention.bytes": "10",
                                                             "max.message.bytes": "100", "cleanup.policy": "delete"})


@pytest.mark.parametrize(("key", "value"), [("segment.bytes", "4096"), ("min.insync.replicas", "2"),
                                            ("cleanup.policy", "compact"), ("cleanup.policy", "delete,compact"),
                                            ("consumed.retention.ms", "0")])
def test_a_diskless_topic_refuses_keys_it_does_not_act_on(key, value):
    with pytest.raises(InvalidConfig, match="diskless"):
        check_diskless_config_change({}, {key: value})


# -- the defaults DescribeConfigs reports are the real ones ---------------------------------------
def test_every_validated_topic_key_has_a_default():
    assert set(TOPIC_CONFIG_DEFAULTS) == set(TOPIC_CONFIG_VALIDATORS)


def test_topic_defaults_agree_with_the_log_config():
    log = LogConfig()
    fields = {key: field for key, (field, _) in LogConfig._KEYS.items() if field is not None}
    for key, field in fields.items():
        assert TOPIC_CONFIG_DEFAULTS[key] == str(getattr(log, field)), key
    assert TOPIC_CONFIG_DEFAULTS["cleanup.policy"] == log.cleanup_policy
    assert LogConfig.from_topic_config(TOPIC_CONFIG_DEFAULTS) == log


def test_topic_defaults_agree_with_compaction_and_consumed_retention():
    assert CompactionConfig.from_topic_config(TOPIC_CONFIG_DEFAULTS) == CompactionConfig()
    assert ConsumedRetentionConfig.from_topic_config(TOPIC_CONFIG_DEFAULTS) == ConsumedRetentionConfig()


def test_broker_defaults_agree_with_the_replica_and_the_front_door():
    replica = {f.name: f.default for f in dataclasses.fields(ReplicaConfig)}
    broker = broker_config_defaults(live_brokers=5)
    assert broker["min.insync.replicas"] == str(replica["min_insync_replicas"])
    assert broker["log.retention.check.interval.ms"] == str(replica["retention_check_interval_ms"])
    expiry_check = replica["producer_id_expiration_check_interval_ms"]
    assert broker["producer.id.expiration.check.interval.ms"] == str(expiry_check)
    assert broker["producer.id.expiration.ms"] == str(LogConfig().producer_id_expiration_ms)
    assert broker["replica.lag.time.max.ms"] == str(replica["replica_lag_time_max_ms"])
    assert broker["log.cleaner.backoff.ms"] == str(CleanerSettings().backoff_ms)
    assert broker["default.replication.factor"] == str(frontdoor_admin.DEFAULT_MAX_REPLICATION_FACTOR)
    assert broker_config_defaults(live_brokers=2)["default.replication.factor"] == "2"
    assert broker["log.retention.ms"] == TOPIC_CONFIG_DEFAULTS["retention.ms"]
    assert broker["auto.create.topics.enable"] == "false"
    assert set(BROKER_SYNONYMS) <= set(TOPIC_CONFIG_DEFAULTS)
