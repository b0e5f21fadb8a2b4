"""`lowtide delete-records`: the offset JSON file is validated before anything is sent, and the
output follows kafka-delete-records.sh (text) and docs/operations.md#the-cli-output-contract (json)."""

from __future__ import annotations

import json

import pytest

from lowtide.cli.delete_records_cmd import read_offset_json_file
from lowtide.cli.main import main
from lowtide.cli.output import CliError
from tests.unit.cli.conftest import run_json
from tests.waiting import wait_until


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()


def write(tmp_path, doc) -> str:
    path = tmp_path / "offsets.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)



def test_kafkas_file_format_is_read_in_order(tmp_path):
    path = write(tmp_path, {"partitions": [{"topic": "orders", "partition": 1, "offset": -1},
                                           {"topic": "orders", "partition": 0, "offset": 10000}], "version": 1})
    assert read_offset_json_file(path) == [("orders", 1, -1), ("orders", 0, 10000)]


@pytest.mark.parametrize("doc, reason", [
    ("{not json", "malformed JSON"),
    ({"version": 1}, '"partitions" list'),
    ({"partitions": []}, "empty"),
    ({"partitions": [{"topic": "", "partition": 0, "offset": 1}]}, '"topic"'),
    ({"partitions": [{"topic": "t", "partition": -1, "offset": 1}]}, '"partition"'),
    ({"partitions": [{"topic": "t", "partition": 0, "offset": "10"}]}, '"offset"'),
    ({"partitions": [{"topic": "t", "partition": 0, "offset": True}]}, '"offset"'),
    ({"partitions": [{"topic": "t", "partition": 0, "offset": 1}], "version": 2}, "version"),
    ({"partitions": [{"topic": "t", "partition": 0, "offset": 1}, {"topic": "t", "partition": 0, "offset": 2}]},
     "more than once"),
])
def test_bad_files_are_invalid_requests_naming_the_path(tmp_path, doc, reason):
    path = write(tmp_path, doc)
    with pytest.raises(CliError) as err:
        read_offset_json_file(path)
    assert err.value.code == "INVALID_REQUEST"
    assert path in err.value.message and reason in err.value.message


def test_missing_file_fails_in_json_mode_without_contacting_the_cluster(tmp_path, capsys):
    missing = str(tmp_path / "nope.json")
    code, docs = run_json(capsys, "delete-records", "--bootstrap-server", "127.0.0.1:1",
                          "--offset-json-file", missing)
    assert code == 1
    assert docs[0]["error"]["code"] == "INVALID_REQUEST" and missing in docs[0]["error"]["message"]


def test_results_and_errors_per_partition_with_exit_one_on_failure(front_door, replica_set, store, tmp_path,
                                                                   capsys):
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    replica_set.wait_for_leaders("orders")
    replica_set.produce("orders", 0, [b"v"] * 10_000)
    path = write(tmp_path, {"partitions": [{"topic": "orders", "partition": 0, "offset": 5},
                                           {"topic": "ghost", "partition": 0, "offset": 1}], "version": 1})
    code, docs = run_json(capsys, "delete-records", "--bootstrap-server", front_door.address,
                          "--offset-json-file", path, "--timeout-ms", "5000")
    assert code == 1
    assert docs == [{"partitions": [{"topic": "orders", "partition": 0, "low_watermark": 5},
                                    {"topic": "ghost", "partition": 0, "error": "UNKNOWN_TOPIC_OR_PARTITION"}]}]
    path = write(tmp_path, {"partitions": [{"topic": "orders", "partition": 0, "offset": 10000}], "version": 1})
    assert main(["delete-records", "--bootstrap-server", front_door.address, "--offset-json-file", path]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == ["Executing records delete operation", "Records delete operation completed:",
                                "partition: orders-0\tlow_watermark: 10000"]


def test_command_config_token_is_sent(front_door_factory, replica_set, store, tmp_path, capsys):
    from lowtide.auth.acl import AclBinding
    from lowtide.auth.store import AclStore
    from lowtide.auth.tokens import add_token

    front_door = front_door_factory(auth_enabled=True)
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    replica_set.wait_for_leaders("orders")
    replica_set.produce("orders", 0, [b"v"] * 5)
    add_token(store, token="t0k", principal="User:alice")
    AclStore(metadata=store).add([AclBinding("User:alice", "TOPIC", "orders", "LITERAL", "DELETE", "ALLOW")])
    front_door.catch_up()
    offsets = write(tmp_path, {"partitions": [{"topic": "orders", "partition": 0, "offset": 3}], "version": 1})
    config = tmp_path / "client.properties"
    config.write_text("lowtide.auth.token=t0k\n")
    base = ["delete-records", "--bootstrap-server", front_door.address, "--offset-json-file", offsets]
    code, docs = run_json(capsys, *base)
    assert code == 1 and docs[0]["partitions"][0]["error"] == "TOPIC_AUTHORIZATION_FAILED"

    # The front door learns of the ACL through its metadata watch, as a Kafka broker learns of one
    # from the metadata log: a moment later, and on a loaded machine seconds later.
    def deleted_with_the_token() -> bool:
        code, docs = run_json(capsys, *base, "--command-config", str(config))
        return code == 0 and docs[0]["partitions"][0]["low_watermark"] == 3

    wait_until(deleted_with_the_token, timeout_s=30, interval_s=0.2, what="a delete authorized by alice's token")
