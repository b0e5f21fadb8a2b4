"""Topic config validation of the KIP-68 keys the broker-side consumed retention reads."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidConfig
from lowtide.frontdoor.admin.topic_config import (
    drop_unchanged_diskless_enable,
    take_diskless_enable,
    validate_topic_config,
)
from lowtide.messages.admin import ConfigOp, ConfigOpType
from lowtide.metadata.config_defaults import format_diskless_shards


def test_consumed_retention_mode_and_inactivity_are_accepted():
    config = validate_topic_config({"consumed.retention.ms": "0", "consumed.retention.mode": "any",
                                    "consumed.retention.group.inactive.ms": " 60000 "})
    assert config["consumed.retention.mode"] == "any" and config["consumed.retention.group.inactive.ms"] == "60000"


@pytest.mark.parametrize(("key", "value"), [("consumed.retention.mode", "some"),
                                            ("consumed.retention.group.inactive.ms", "-2"),
                                            ("consumed.retention.group.inactive.ms", "soon")])
def test_a_bad_consumed_retention_value_is_invalid_config_naming_the_key(key, value):
    with pytest.raises(InvalidConfig, match=key):
        validate_topic_config({key: value})


# -- diskless.enable (topic_config.take_diskless_enable / drop_unchanged_diskless_enable) ------------
def test_diskless_enable_at_creation_makes_the_topic_diskless_and_leaves_the_config():
    assert take_diskless_enable({"diskless.enable": " TRUE ", "retention.ms": "5"}, diskless=False) == (
        True, {"retention.ms": "5"})
    assert take_diskless_enable({"diskless.enable": "false"}, diskless=False) == (False, {})
    assert take_diskless_enable({"retention.ms": "5"}, diskless=True) == (True, {"retention.ms": "5"})


@pytest.mark.parametrize("config, diskless, message", [
    ({"diskless.enable": "yes"}, False,
     "invalid value 'yes' for topic config 'diskless.enable': must be true or false"),
    ({"diskless.enable": "false"}, True, "diskless.enable=false contradicts the request's diskless flag"),
])
def test_diskless_enable_refuses_anything_but_a_plain_true_or_false(config, diskless, message):
    with pytest.raises(InvalidConfig, match=message):
        take_diskless_enable(config, diskless=diskless)


def test_an_alteration_may_restate_diskless_enable_but_never_change_it():
    keep = [ConfigOp(key="diskless.enable", op=ConfigOpType.SET, value="true"),
            ConfigOp(key="retention.ms", op=ConfigOpType.SET, value="9")]
    assert drop_unchanged_diskless_enable(keep, diskless=True, topic="d") == keep[1:]
    assert drop_unchanged_diskless_enable([ConfigOp(key="diskless.enable", op=ConfigOpType.DELETE)],
                                          diskless=False, topic="c") == []
    for ops, diskless in (([ConfigOp(key="diskless.enable", op=ConfigOpType.SET, value="false")], True),
                          ([ConfigOp(key="diskless.enable", op=ConfigOpType.DELETE)], True),
                          ([ConfigOp(key="diskless.enable", op=ConfigOpType.SET, value="true")], False)):
        with pytest.raises(InvalidConfig, match="diskless.enable cannot be changed on an existing topic"):
            drop_unchanged_diskless_enable(ops, diskless=diskless, topic="t")


def test_the_coordinator_shards_of_a_diskless_topic_are_read_only_but_may_be_restated():
    shards = (1, 0, 1)
    restated = [ConfigOp(key="diskless.coordinator.shards", op=ConfigOpType.SET, value="0:1,1:0,2:1"),
                ConfigOp(key="retention.ms", op=ConfigOpType.SET, value="9")]
    assert drop_unchanged_diskless_enable(restated, diskless=True, topic="d", shards=shards) == restated[1:]
    assert drop_unchanged_diskless_enable([ConfigOp(key="diskless.coordinator.shards", op=ConfigOpType.DELETE)],
                                          diskless=False, topic="c") == []
    for ops, diskless in (([ConfigOp(key="diskless.coordinator.shards", op=ConfigOpType.SET, value="0:0,1:0,2:1")],
                           True),
                          ([ConfigOp(key="diskless.coordinator.shards", op=ConfigOpType.DELETE)], True),
                          ([ConfigOp(key="diskless.coordinator.shards", op=ConfigOpType.SET, value="0:0")], False)):
        with pytest.raises(InvalidConfig, match="diskless.coordinator.shards is read-only"):
            drop_unchanged_diskless_enable(ops, diskless=diskless, topic="t", shards=shards)


def test_the_coordinator_shards_are_shown_as_partition_shard_pairs():
    assert format_diskless_shards([1, 0, 1]) == "0:1,1:0,2:1"
    assert format_diskless_shards([]) == ""
