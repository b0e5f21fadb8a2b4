"""`lowtide topics alter` against an in-process front door: JSON shape, typed errors, and that
nothing changes when any part of the change is bad."""

from __future__ import annotations

from lowtide.cli.main import main
from tests.unit.cli.conftest import run_json


def test_topics_alter_sets_and_deletes_keys_and_prints_the_new_config(cluster, capsys, store):
    address, _ = cluster
    store.create_topic(name="orders", partitions=1, replication_factor=1,
                       config={"retention.ms": "1000", "segment.bytes": "4096"}, assignment=[[0]])
    code, docs = run_json(capsys, "topics", "alter", "--bootstrap-server", address, "--topic", "orders",
                          "--add-config", "cleanup.policy=compact,delete", "--add-config", "retention.bytes=100",
                          "--delete-config", "retention.ms")
    assert code == 0
    assert docs == [{"topic": "orders", "validate_only": False,
                     "config": {"cleanup.policy": "compact,delete", "retention.bytes": "100", "segment.bytes": "4096"}}]
    assert store.sync()  # this process's image follows etcd by a watch: catch up before reading
    assert store.topic("orders").config == docs[0]["config"]


def test_topics_alter_appends_to_and_subtracts_from_cleanup_policy(cluster, capsys, store):
    address, _ = cluster
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    code, docs = run_json(capsys, "topics", "alter", "--bootstrap-server", address, "--topic", "orders",
                          "--append-config", "cleanup.policy=compact")
    assert code == 0 and docs[0]["config"] == {"cleanup.policy": "delete,compact"}
    code, docs = run_json(capsys, "topics", "alter", "--bootstrap-server", address, "--topic", "orders",
                          "--subtract-config", "cleanup.policy=delete")
    assert code == 0 and docs[0]["config"] == {"cleanup.policy": "compact"}


def test_topics_alter_with_a_bad_value_is_invalid_config_and_changes_nothing(cluster, capsys, store):
    address, _ = cluster
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={"retention.ms": "1000"},
                       assignment=[[0]])
    code, docs = run_json(capsys, "topics", "alter", "--bootstrap-server", address, "--topic", "orders",
                          "--add-config", "segment.bytes=4096", "--add-config", "retention.ms=soon")
    assert code == 1 and docs[0]["error"]["code"] == "INVALID_CONFIG" and "retention.ms" in docs[0]["error"]["message"]
    assert store.sync()
    assert store.topic("orders").config == {"retention.ms": "1000"}


def test_topics_alter_validate_only_changes_nothing(cluster, capsys, store):
    address, _ = cluster
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    code, docs = run_json(capsys, "topics", "alter", "--bootstrap-server", address, "--topic", "orders",
                          "--add-config", "retention.ms=5", "--validate-only")
    assert code == 0 and docs[0] == {"topic": "orders", "validate_only": True, "config": {"retention.ms": "5"}}
    assert store.sync()
    assert store.topic("orders").config == {}


def test_topics_alter_of_an_unknown_topic_is_unknown_topic_or_partition(cluster, capsys):
    address, _ = cluster
    code, docs = run_json(capsys, "topics", "alter", "--bootstrap-server", address, "--topic", "nosuch",
                          "--add-config", "retention.ms=5")
    assert code == 1 and docs[0]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_topics_alter_without_a_change_is_invalid_request(capsys):
    code, docs = run_json(capsys, "topics", "alter", "--bootstrap-server", "127.0.0.1:1", "--topic", "orders")
    assert code == 1 and docs[0]["error"]["code"] == "INVALID_REQUEST"


def test_topics_alter_text_output_names_the_topic_and_its_configs(cluster, capsys, store):
    address, _ = cluster
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    assert main(["topics", "alter", "--bootstrap-server", address, "--topic", "orders",
                 "--add-config", "retention.ms=5"]) == 0
    assert capsys.readouterr().out == "Altered topic orders. Configs: retention.ms=5\n"
