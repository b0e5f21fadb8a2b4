"""Group configs (Kafka's GROUP config resource): the ops on a group's keys, byte for byte as
stored, and their compare-and-set in a real etcd."""

from __future__ import annotations

import json

import pytest

from lowtide.errors import InvalidConfig, InvalidRequest
from lowtide.messages.admin import ConfigOp, ConfigOpType
from lowtide.messages.group_configs import apply_group_config_ops, group_resource, parse_group_resource
from lowtide.metadata.group_configs import GroupConfigs
from lowtide.metadata.sections import section


def set_(key: str, value: str | None) -> ConfigOp:
    return ConfigOp(key=key, op=ConfigOpType.SET, value=value)


def delete(key: str) -> ConfigOp:
    return ConfigOp(key=key, op=ConfigOpType.DELETE, value=None)


def test_a_set_checks_the_value_and_stores_it_normalised():
    got = apply_group_config_ops({}, [set_("share.auto.offset.reset", " EARLIEST "),
                                      set_("share.record.lock.duration.ms", "015000")])
    assert got == {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "15000"}


def test_a_delete_returns_the_key_to_its_default_and_keeps_the_others():
    current = {"share.auto.offset.reset": "earliest", "share.session.timeout.ms": "6000"}
    assert apply_group_config_ops(current, [delete("share.auto.offset.reset")]) == {"share.session.timeout.ms": "6000"}


def test_replace_makes_the_sets_the_whole_config():
    current = {"share.auto.offset.reset": "earliest"}
    assert apply_group_config_ops(current, [set_("share.heartbeat.interval.ms", "500")], replace=True) == {
        "share.heartbeat.interval.ms": "500"}


@pytest.mark.parametrize("op, message", [
    (set_("share.auto.offset.reset", "middle"), "must be one of latest, earliest"),
    (set_("share.record.lock.duration.ms", "10"), "in [1000, 3600000]"),
    (set_("share.record.lock.duration.ms", "ten"), "whole number of milliseconds"),
    (set_("share.isolation.level", "serializable"), "must be one of read_uncommitted, read_committed"),
    (set_("retention.ms", "1"), "unknown group config 'retention.ms'"),
    (ConfigOp(key="share.auto.offset.reset", op=ConfigOpType.APPEND, value="x"), "list configs only"),
])
def test_a_bad_op_is_invalid_config_and_changes_nothing(op, message):
    current = {"share.auto.offset.reset": "earliest"}
    with pytest.raises(InvalidConfig, match=message.replace("[", r"\[").replace("]", r"\]")):
        apply_group_config_ops(current, [set_("share.heartbeat.interval.ms", "500"), op])
    assert current == {"share.auto.offset.reset": "earliest"}


def test_a_set_without_a_value_is_invalid_request():
    with pytest.raises(InvalidRequest, match="SET needs a value"):
        apply_group_config_ops({}, [set_("share.auto.offset.reset", None)])


def test_group_resource_names_round_trip_and_other_names_are_not_groups():
    assert group_resource("queue-1") == "group:queue-1"
    assert parse_group_resource("group:queue-1") == "queue-1"
    assert parse_group_resource("orders") is None
    assert parse_group_resource("broker:1") is None


def test_configs_are_stored_as_sorted_json_and_removed_when_emptied(metadata_store):
    metadata_store.cluster_id()
    configs = GroupConfigs(metadata_store)
    assert configs.of("q") == {}
    assert configs.value("q", "share.auto.offset.reset") == "latest"
    assert configs.value("q", "share.auto.offset.reset", default="earliest") == "earliest"
    configs.update("q", [set_("share.session.timeout.ms", "6000"), set_("share.auto.offset.reset", "earliest")])
    entry = section(metadata_store, "group_configs").get("q")
    assert entry is not None
    assert entry.value == b'{"share.auto.offset.reset": "earliest", "share.session.timeout.ms": "6000"}'
    assert configs.value("q", "share.auto.offset.reset", default="latest") == "earliest"
    configs.update("q", [delete("share.session.timeout.ms"), delete("share.auto.offset.reset")])
    assert section(metadata_store, "group_configs").get("q") is None


def test_a_dry_run_and_a_refused_op_write_nothing(metadata_store):
    metadata_store.cluster_id()
    configs = GroupConfigs(metadata_store)
    assert configs.update("q", [set_("share.auto.offset.reset", "earliest")], dry_run=True) == {
        "share.auto.offset.reset": "earliest"}
    assert configs.of("q") == {}
    configs.update("q", [set_("share.auto.offset.reset", "earliest")])
    with pytest.raises(InvalidConfig):
        configs.update("q", [set_("share.auto.offset.reset", "latest"), set_("share.bogus", "1")])
    stored = section(metadata_store, "group_configs").get("q")
    assert json.loads(stored.value) == {"share.auto.offset.reset": "earliest"}
