"""Bad input gets a clear error and nothing pretends: unimplemented features are refused, an
unknown topic fails every command that names it, `consume` escapes binary data in text mode, and
`retention run --dry-run` says what it would delete. Against an in-process front door and the
real replica servers of ``replica_set`` (see ``tests.unit.frontdoor.harness``)."""

from __future__ import annotations

import io
import json

import pytest

from lowtide.cli.data_cmd import escape_bytes
from lowtide.cli.main import main
from lowtide.client import Admin, Producer
from tests.unit.cli.conftest import run_json


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()

# --- topic configs and flags that are not implemented -----------------------------------------


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete, compact"])
def test_a_cleanup_policy_with_compact_creates_a_compacted_topic_now_that_the_cleaner_exists(cluster, capsys, store,
                                                                                          policy):
    address, _ = cluster
    code, docs = run_json(capsys, "topics", "create", "--bootstrap-server", address, "--topic", "t",
                          "--replication-factor", "1", "--config", f"cleanup.policy={policy}")
    assert (code, docs[0]["topic"]) == (0, "t")
    assert "compact" in store.topics()["t"].config["cleanup.policy"].split(",")


def test_a_diskless_topic_is_refused_when_no_coordinator_shard_is_registered(cluster, capsys, store):
    address, _ = cluster
    code, docs = run_json(capsys, "topics", "create", "--bootstrap-server", address, "--topic", "d", "--diskless")
    assert code == 1
    assert docs[0]["error"]["code"] == "COORDINATOR_NOT_AVAILABLE" and "coordinator" in docs[0]["error"]["message"]
    assert "d" not in store.topics()


def test_an_unknown_topic_config_key_is_invalid_config_naming_the_key(cluster, capsys):
    address, _ = cluster
    code, docs = run_json(capsys, "topics", "create", "--bootstrap-server", address, "--topic", "t",
                          "--config", "retention.msec=1000")
    assert code == 1
    assert docs[0]["error"]["code"] == "INVALID_CONFIG" and "'retention.msec'" in docs[0]["error"]["message"]


def test_a_topic_config_key_given_twice_is_refused_rather_than_guessed(cluster, capsys, store):
    address, _ = cluster
    code, docs = run_json(capsys, "topics", "create", "--bootstrap-server", address, "--topic", "t",
                          "--config", "retention.ms=1", "--config", "retention.ms=2")
    assert code == 1 and docs[0]["error"]["code"] == "INVALID_CONFIG"
    assert "'retention.ms'" in docs[0]["error"]["message"]


def test_a_delete_policy_topic_is_still_created(cluster, capsys):
    address, _ = cluster
    code, docs = run_json(capsys, "topics", "create", "--bootstrap-server", address, "--topic", "t",
                          "--replication-factor", "1", "--config", "cleanup.policy=delete")
    assert (code, docs[0]["topic"]) == (0, "t")


# --- unknown topics -----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["topics", "describe", "--topic", "nosuch"],
    ["topics", "delete", "--topic", "nosuch"],
    ["produce", "--topic", "nosuch", "--num-records", "1"],
    ["produce", "--topic", "nosuch", "--num-records", "0"],
    ["consume", "--topic", "nosuch", "--timeout-ms", "100"],
    ["consume", "--topic", "nosuch", "--partition", "0", "--offset", "0", "--timeout-ms", "100"],
    ["consume", "--topic", "nosuch", "--group", "g", "--timeout-ms", "100"],
    ["offsets", "--topic", "nosuch"],
    ["retention", "run", "--topic", "nosuch"],
    ["retention", "run", "--topic", "nosuch", "--dry-run"],
], ids=lambda argv: " ".join(argv[:3]))
def test_every_command_that_names_an_unknown_topic_fails_with_unknown_topic_or_partition(cluster, capsys, argv):
    address, _ = cluster
    code, docs = run_json(capsys, *argv, "--bootstrap-server", address)
    assert code == 1
    assert docs[-1]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION" and "nosuch" in docs[-1]["error"]["message"]


def test_producing_nothing_from_stdin_to_an_unknown_topic_still_fails(cluster, capsys, monkeypatch):
    address, _ = cluster
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    code, docs = run_json(capsys, "produce", "--bootstrap-server", address, "--topic", "nosuch")
    assert code == 1 and docs[0]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_delete_records_for_an_unknown_topic_reports_it_per_partition_and_exits_non_zero(cluster, capsys, tmp_path):
    address, _ = cluster
    path = tmp_path / "offsets.json"
    path.write_text(json.dumps({"partitions": [{"topic": "nosuch", "partition": 0, "offset": 1}], "version": 1}))
    code, docs = run_json(capsys, "delete-records", "--bootstrap-server", address, "--offset-json-file", str(path))
    assert code == 1
    assert docs[0]["partitions"] == [{"topic": "nosuch", "partition": 0, "error": "UNKNOWN_TOPIC_OR_PARTITION"}]


# --- consume: binary data in text mode ----------------------------------------------------------


@pytest.mark.parametrize("data, shown", [
    (b"plain text", "plain text"),
    ("café ☕".encode(), "café ☕"),                              # printable UTF-8 stays readable
    (b"a\tb\nc\r", "a\\tb\\nc\\r"),
    (b"\x00\x1b[31mred\x7f", "\\x00\\x1b[31mred\\x7f"),          # no terminal escape sequence gets through
    (b"\xff\xfe", "\\xff\\xfe"),                                 # not UTF-8: the bytes
    ("\u0085\u202e".encode(), "\\u0085\\u202e"),                 # unprintable characters: code points
    (b"back\\slash", "back\\\\slash"),                           # so "\x00" in the data is not a NUL
    (None, "null"),
    (b"", ""),
])
def test_binary_keys_and_values_are_escaped_python_style(data, shown):
    assert escape_bytes(data) == shown


def test_text_mode_consume_never_writes_control_characters_or_invalid_utf8(cluster, capsys, store):
    address, _ = cluster
    store.create_topic(name="bin", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    with Producer(address) as producer:
        producer.produce_values("bin", [b"\x1b]0;owned\x07\xff", None, b"ok"], keys=[b"k\x00", b"k2", None])
    assert main(["consume", "--bootstrap-server", address, "--topic", "bin", "--print-key", "--timeout-ms", "200"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == ["k\\x00\t\\x1b]0;owned\\x07\\xff", "k2\tnull", "null\tok"]
    assert all(c in "\t\n" or c.isprintable() for c in out)


def test_consume_help_documents_the_escaping(capsys):
    assert main(["consume", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "escaped Python-style: \\xNN for a byte that is not UTF-8" in help_text
    assert "--print-key" in help_text


# --- retention run --dry-run --------------------------------------------------------------------


def test_retention_dry_run_reports_start_target_records_and_the_groups_that_set_the_minimum(cluster, capsys,
                                                                                            store):
    address, replica = cluster
    store.create_topic(name="inter", partitions=3, replication_factor=1, config={},
                       assignment=[[0], [0], [0]])
    with Producer(address) as producer:
        for p in range(3):
            producer.produce_values("inter", [b"x"] * 100, partition=p)
    with Admin(address) as admin:
        assert admin.delete_records({("inter", 1): 30})[("inter", 1)].error is None  # already trimmed to 30
        deletes = replica.calls(0, "DeleteRecords")
        admin.commit_offsets("fast", {("inter", 0): 90, ("inter", 1): 80, ("inter", 2): 100})
        admin.commit_offsets("slow", {("inter", 0): 40, ("inter", 1): 20})
        admin.commit_offsets("mid", {("inter", 0): 40, ("inter", 1): 50, ("inter", 2): 60})

    code, docs = run_json(capsys, "retention", "run", "--bootstrap-server", address, "--topic", "inter", "--dry-run")
    assert code == 0
    doc = docs[0]
    assert doc["dry_run"] is True and doc["groups"] == ["fast", "mid", "slow"]
    rows = {r["partition"]: r for r in doc["partitions"]}
    assert rows[0] == {"topic": "inter", "partition": 0, "log_start_offset": 0, "delete_before": 40, "records": 40,
                       "min_groups": ["mid", "slow"], "committed": {"fast": 90, "mid": 40, "slow": 40}}
    assert rows[1]["log_start_offset"] == 30 and rows[1]["delete_before"] == 20 and rows[1]["records"] == 0
    assert rows[1]["min_groups"] == ["slow"] and "already starts at 30" in rows[1]["skipped"]
    assert rows[2]["delete_before"] == -1 and rows[2]["min_groups"] == ["slow"]
    assert rows[2]["committed"]["slow"] is None and "slow" in rows[2]["skipped"]
    assert replica.calls(0, "DeleteRecords") == deletes  # a dry run deletes nothing

    assert main(["retention", "run", "--bootstrap-server", address, "--topic", "inter", "--dry-run"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "Dry run: nothing was deleted."
    assert text[1] == ("partition: inter-0\tlog_start_offset: 0\ttarget: 40 (set by mid, slow)\t"
                       "would delete 40 records (offsets 0..39)")
    assert "skipped: nothing new to delete" in text[2] and "skipped: group slow has no committed offset" in text[3]
    assert replica.calls(0, "DeleteRecords") == deletes


def test_a_real_retention_run_reports_the_same_plan_and_the_new_low_watermark(cluster, capsys, store):
    address, replica = cluster
    store.create_topic(name="inter", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    with Producer(address) as producer:
        producer.produce_values("inter", [b"x"] * 100)
    with Admin(address) as admin:
        admin.commit_offsets("a", {("inter", 0): 70})
        admin.commit_offsets("b", {("inter", 0): 55})
    deletes = replica.calls(0, "DeleteRecords")
    code, docs = run_json(capsys, "retention", "run", "--bootstrap-server", address, "--topic", "inter")
    assert code == 0
    [row] = docs[0]["partitions"]
    assert (row["delete_before"], row["records"], row["min_groups"], row["low_watermark"]) == (55, 55, ["b"], 55)
    assert docs[0]["dry_run"] is False
    assert replica.calls(0, "DeleteRecords") == deletes + 1
    assert replica.describe(0, "inter", 0).log_start_offset == 55
