"""`lowtide topics|produce|consume|offsets|groups` against an in-process front door and the real
replica servers of ``replica_set`` (see ``tests.unit.frontdoor.harness``)."""

from __future__ import annotations

import base64
import io

import pytest

from lowtide.cli.data_cmd import parse_time_spec, read_line_chunks
from lowtide.cli.main import build_parser
from lowtide.cli.output import CliError
from lowtide.cli.topics_cmd import parse_config_pairs
from lowtide.client import Admin
from tests.unit.cli.conftest import run_json


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()


def test_every_command_takes_output_and_command_config():
    parser = build_parser()
    for argv in (["topics", "list"], ["topics", "describe"], ["produce", "--topic", "t"],
                 ["consume", "--topic", "t"], ["offsets", "--topic", "t"], ["groups", "list"],
                 ["delete-records", "--offset-json-file", "f"]):
        args = parser.parse_args([*argv, "--bootstrap-server", "h:1", "--output", "json", "--command-config", "c"])
        assert args.output == "json" and args.command_config == "c"


def test_config_pairs_and_time_specs_are_parsed():
    assert parse_config_pairs(["cleanup.policy=compact", "retention.ms = 5"]) == {
        "cleanup.policy": "compact", "retention.ms": "5"}
    with pytest.raises(CliError):
        parse_config_pairs(["novalue"])
    assert [parse_time_spec(t) for t in ("earliest", "latest", "max-timestamp", "1700")] == [-2, -1, -3, 1700]
    with pytest.raises(CliError):
        parse_time_spec("yesterday")


def test_stdin_lines_become_keyed_records_with_a_separator():
    chunks = list(read_line_chunks(io.BytesIO(b"k1\tv1\nplain\n"), key_separator="\t"))
    assert chunks == [([b"v1", b"plain"], [b"k1", None])]


def test_topics_create_describe_list_delete_json_shapes(cluster, capsys):
    address, _ = cluster
    code, docs = run_json(capsys, "topics", "create", "--bootstrap-server", address, "--topic", "orders",
                          "--partitions", "2", "--replication-factor", "1", "--config", "retention.ms=1000")
    assert (code, docs) == (0, [{"topic": "orders", "partitions": 2, "replication_factor": 1}])
    code, docs = run_json(capsys, "topics", "describe", "--bootstrap-server", address, "--topic", "orders")
    topic = docs[0]["topics"][0]
    assert topic["name"] == "orders" and topic["config"] == {"retention.ms": "1000"} and not topic["diskless"]
    first = topic["partitions"][0]  # placed on one of the two live replicas
    assert set(first) == {"partition", "leader", "leader_epoch", "replicas", "isr", "adding_replicas",
                          "removing_replicas"}
    assert (first["adding_replicas"], first["removing_replicas"]) == ([], [])  # nothing moves
    assert (first["partition"], first["leader_epoch"]) == (0, 0) and first["replicas"] in ([0], [1])
    assert first["leader"] == first["replicas"][0] and first["isr"] == first["replicas"]
    code, docs = run_json(capsys, "topics", "list", "--bootstrap-server", address)
    assert docs == [{"topics": ["orders"]}]
    code, docs = run_json(capsys, "topics", "create", "--bootstrap-server", address, "--topic", "bad",
                          "--config", "retention.msec=1")
    assert code == 1 and docs[0]["error"]["code"] == "INVALID_CONFIG"
    code, docs = run_json(capsys, "topics", "delete", "--bootstrap-server", address, "--topic", "orders")
    assert code == 0
    code, docs = run_json(capsys, "topics", "describe", "--bootstrap-server", address, "--topic", "orders")
    assert code == 1 and docs[0]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_produce_consume_offsets_and_groups(cluster, capsys, store):
    address, replica = cluster
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    code, docs = run_json(capsys, "produce", "--bootstrap-server", address, "--topic", "orders",
                          "--num-records", "50", "--record-size", "100")
    assert code == 0
    assert docs[0]["records"] == 50 and docs[0]["bytes"] == 5000
    assert set(docs[0]) == {"records", "bytes", "seconds", "records_per_second", "mb_per_second"}

    code, docs = run_json(capsys, "consume", "--bootstrap-server", address, "--topic", "orders",
                          "--partition", "0", "--offset", "45", "--timeout-ms", "200")
    assert code == 0 and [d["offset"] for d in docs] == [45, 46, 47, 48, 49]
    assert set(docs[0]) == {"topic", "partition", "offset", "timestamp", "key", "value"}
    assert docs[0]["key"] is None and len(base64.b64decode(docs[0]["value"])) == 100

    code, docs = run_json(capsys, "consume", "--bootstrap-server", address, "--topic", "orders", "--group", "etl",
                          "--max-records", "20")
    assert code == 0 and len(docs) == 20
    code, docs = run_json(capsys, "groups", "describe", "--bootstrap-server", address, "--group", "etl")
    assert docs[0]["groups"][0]["offsets"] == [{"topic": "orders", "partition": 0, "offset": 20,
                                                "log_end_offset": 50, "lag": 30}]

    code, docs = run_json(capsys, "offsets", "--bootstrap-server", address, "--topic", "orders", "--time", "latest")
    assert docs == [{"partitions": [{"topic": "orders", "partition": 0, "offset": 50}]}]

    with Admin(address) as admin:
        assert admin.delete_records({("orders", 0): 10})[("orders", 0)].low_watermark == 10
    code, docs = run_json(capsys, "consume", "--bootstrap-server", address, "--topic", "orders",
                          "--partition", "0", "--offset", "0", "--timeout-ms", "200")
    assert code == 1 and docs[-1]["error"]["code"] == "OFFSET_OUT_OF_RANGE"

    code, docs = run_json(capsys, "groups", "list", "--bootstrap-server", address)
    assert docs == [{"groups": ["etl"]}]
    code, docs = run_json(capsys, "groups", "delete", "--bootstrap-server", address, "--group", "etl",
                          "--group", "nope")
    assert code == 1
    assert docs == [{"groups": [{"group": "etl", "deleted": True}, {"group": "nope", "error": "GROUP_ID_NOT_FOUND"}]}]


def test_lines_from_stdin_are_produced(cluster, capsys, store, monkeypatch):
    address, replica = cluster
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a\tone\nb\ttwo\n")))
    code, docs = run_json(capsys, "produce", "--bootstrap-server", address, "--topic", "orders",
                          "--key-separator", "\t")
    assert code == 0 and docs[0]["records"] == 2
    code, docs = run_json(capsys, "consume", "--bootstrap-server", address, "--topic", "orders",
                          "--timeout-ms", "200")
    assert [(base64.b64decode(d["key"]), base64.b64decode(d["value"])) for d in docs] == [
        (b"a", b"one"), (b"b", b"two")]
