"""`lowtide share-groups list|describe` against an in-process front door (its share group
coordinator) and the real replica servers of ``replica_set``."""

from __future__ import annotations

import uuid

import pytest

from lowtide.cli.main import main
from lowtide.client import Admin
from lowtide.client.replica import ReplicaClient
from lowtide.messages.consumer_groups import ConsumerHeartbeat
from lowtide.rpc.convert import consumer_groups as convert_consumer
from lowtide.share.codec import ShareSnapshot, ShareStateKey
from lowtide.share.persist import ShareStateLog
from lowtide.share.state import ACKNOWLEDGED, ARCHIVED, StateBatch
from tests.unit.cli.conftest import run_json


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()


def _join_share_group(address: str, group_id: str, topic: str, client_id: str) -> str:
    """One share member's first heartbeat (ShareGroupHeartbeat over gRPC); returns its member id."""
    member_id = uuid.uuid4().hex
    with Admin(address) as admin:
        answer = convert_consumer.heartbeat_result_from_proto(admin.call(
            "ShareGroupHeartbeat", convert_consumer.heartbeat_to_proto(ConsumerHeartbeat(
                group_id=group_id, member_id=member_id, member_epoch=0, subscribed_topic_names=(topic,),
                client_id=client_id))))
    assert answer.error is None
    return answer.member_id


def _topic_with_records(capsys, store, address: str, topic: str, *, assignment: list[list[int]],
                        records: int) -> None:
    """A topic (one partition per replica list of ``assignment``) with ``records`` records of 10
    bytes, produced through the CLI."""
    store.create_topic(name=topic, partitions=len(assignment), replication_factor=1, config={},
                       assignment=assignment)
    code, _ = run_json(capsys, "produce", "--bootstrap-server", address, "--topic", topic,
                       "--num-records", str(records), "--record-size", "10")
    assert code == 0


def test_a_share_group_is_listed_and_described_with_its_member_assignment_and_end_offsets(cluster, capsys, store):
    address, _ = cluster
    _topic_with_records(capsys, store, address, "jobs", assignment=[[0], [1]], records=6)
    member_id = _join_share_group(address, "workers", "jobs", "worker-1")

    code, docs = run_json(capsys, "share-groups", "list", "--bootstrap-server", address)
    assert (code, docs) == (0, [{"groups": [{"group": "workers", "state": "Stable"}]}])

    code, docs = run_json(capsys, "share-groups", "describe", "--bootstrap-server", address, "--group", "workers")
    assert code == 0
    [group] = docs[0]["groups"]
    assert (group["group"], group["state"]) == ("workers", "Stable")
    assert group["members"] == [{"member_id": member_id, "client_id": "worker-1",
                                 "assignment": [{"topic": "jobs", "partition": 0}, {"topic": "jobs", "partition": 1}]}]
    assert [(p["topic"], p["partition"]) for p in group["partitions"]] == [("jobs", 0), ("jobs", 1)]
    assert sum(p["log_end_offset"] for p in group["partitions"]) == 6
    # Nothing fetched yet: no durable state, so no start offset and no lag.
    assert [(p["start_offset"], p["lag"]) for p in group["partitions"]] == [(-1, None), (-1, None)]


def test_describe_shows_the_start_offset_from_share_group_state_and_the_undelivered_lag(cluster, capsys, store):
    address, _ = cluster
    _topic_with_records(capsys, store, address, "tasks", assignment=[[0]], records=10)
    # The state a share-partition leader would have written: start at 3, offsets 3-4 acknowledged,
    # 6 archived, 5 and 7-9 not yet done.
    topic_id = store.topics()["tasks"].topic_id
    ShareStateLog(store=store, replicas=ReplicaClient()).write(
        ShareStateKey(group_id="crunchers", topic_id=topic_id, partition=0),
        ShareSnapshot(snapshot_epoch=0, state_epoch=1, leader_epoch=0, start_offset=3, create_timestamp_ms=1,
                      write_timestamp_ms=1, batches=(StateBatch(3, 4, ACKNOWLEDGED, 1), StateBatch(6, 6, ARCHIVED, 5))))
    _join_share_group(address, "crunchers", "tasks", "cruncher")

    code, docs = run_json(capsys, "share-groups", "describe", "--bootstrap-server", address, "--group", "crunchers")
    assert code == 0
    assert docs[0]["groups"][0]["partitions"] == [{"topic": "tasks", "partition": 0, "start_offset": 3,
                                                   "log_end_offset": 10, "lag": 4}]


def test_describing_an_unknown_share_group_is_a_json_error_and_a_failed_exit(cluster, capsys):
    address, _ = cluster
    code, docs = run_json(capsys, "share-groups", "describe", "--bootstrap-server", address, "--group", "nobody")
    assert code != 0
    assert docs == [{"error": {"code": "GROUP_ID_NOT_FOUND", "message": docs[0]["error"]["message"]}}]


def _describe_starts(capsys, address: str, group_id: str) -> list[tuple[int, int]]:
    code, docs = run_json(capsys, "share-groups", "describe", "--bootstrap-server", address, "--group", group_id)
    assert code == 0
    return [(p["partition"], p["start_offset"]) for p in docs[0]["groups"][0]["partitions"]]


def test_reset_moves_an_empty_share_groups_start_offsets_and_refuses_a_group_with_members(cluster, capsys, store):
    address, _ = cluster
    _topic_with_records(capsys, store, address, "queue", assignment=[[0]], records=8)
    member_id = _join_share_group(address, "readers", "queue", "reader")

    code, docs = run_json(capsys, "share-groups", "reset", "--bootstrap-server", address, "--group", "readers",
                          "--topic", "queue", "--to-latest")
    assert code != 0 and docs[0]["error"]["code"] == "NON_EMPTY_GROUP"
    assert _describe_starts(capsys, address, "readers") == [(0, -1)]  # nothing was written

    with Admin(address) as admin:  # the member leaves (epoch -1): the group is empty
        admin.call("ShareGroupHeartbeat", convert_consumer.heartbeat_to_proto(ConsumerHeartbeat(
            group_id="readers", member_id=member_id, member_epoch=-1)))
    code, docs = run_json(capsys, "share-groups", "reset", "--bootstrap-server", address, "--group", "readers",
                          "--topic", "queue", "--to-offset", "5", "--dry-run")
    assert (code, docs) == (0, [{"group": "readers", "dry_run": True,
                                 "partitions": [{"topic": "queue", "partition": 0, "start_offset": 5}]}])
    # A dry run writes nothing: no member is assigned the partition and it has no state.
    assert _describe_starts(capsys, address, "readers") == []

    code, docs = run_json(capsys, "share-groups", "reset", "--bootstrap-server", address, "--group", "readers",
                          "--topic", "queue", "--to-latest")
    assert (code, docs[0]["partitions"]) == (0, [{"topic": "queue", "partition": 0, "start_offset": 8}])
    assert _describe_starts(capsys, address, "readers") == [(0, 8)]
    code, docs = run_json(capsys, "share-groups", "reset", "--bootstrap-server", address, "--group", "readers",
                          "--topic", "queue", "--to-earliest")
    assert (code, docs[0]["partitions"]) == (0, [{"topic": "queue", "partition": 0, "start_offset": 0}])
    assert _describe_starts(capsys, address, "readers") == [(0, 0)]


def test_a_share_group_with_state_but_no_membership_is_described_as_empty(cluster, capsys, store):
    # Membership lives in the front door's memory; a group it never saw (or forgot on a restart)
    # can still be reset, and describe shows its durable start offsets with state Empty.
    address, _ = cluster
    store.create_topic(name="backlog", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    code, docs = run_json(capsys, "share-groups", "reset", "--bootstrap-server", address, "--group", "ghosts",
                          "--topic", "backlog", "--to-offset", "0")
    assert code == 0
    code, docs = run_json(capsys, "share-groups", "describe", "--bootstrap-server", address, "--group", "ghosts")
    assert code == 0
    assert docs[0]["groups"] == [{"group": "ghosts", "state": "Empty", "members": [], "partitions": [
        {"topic": "backlog", "partition": 0, "start_offset": 0, "log_end_offset": 0, "lag": 0}]}]
    assert main(["share-groups", "describe", "--bootstrap-server", address, "--group", "ghosts"]) == 0
    text = capsys.readouterr().out.splitlines()  # the table as kafka-share-groups --describe prints it
    assert "ghosts\tEmpty\t-\t-\t-" in text and "ghosts\tbacklog\t0\t0\t0\t0" in text


def test_delete_offsets_forgets_an_empty_share_groups_state_of_a_topic_and_refuses_a_group_with_members(
        cluster, capsys, store):
    address, _ = cluster
    for topic in ("inbox", "outbox"):
        store.create_topic(name=topic, partitions=1, replication_factor=1, config={}, assignment=[[0]])
        code, _ = run_json(capsys, "share-groups", "reset", "--bootstrap-server", address, "--group", "clerks",
                           "--topic", topic, "--to-offset", "0")
        assert code == 0
    member_id = _join_share_group(address, "clerks", "inbox", "clerk")
    code, docs = run_json(capsys, "share-groups", "delete-offsets", "--bootstrap-server", address,
                          "--group", "clerks", "--topic", "inbox")
    assert code != 0 and docs[0]["error"]["code"] == "NON_EMPTY_GROUP"
    with Admin(address) as admin:  # the member leaves: the group is empty
        admin.call("ShareGroupHeartbeat", convert_consumer.heartbeat_to_proto(ConsumerHeartbeat(
            group_id="clerks", member_id=member_id, member_epoch=-1)))
    assert sorted(_describe_starts(capsys, address, "clerks")) == [(0, 0), (0, 0)]

    code, docs = run_json(capsys, "share-groups", "delete-offsets", "--bootstrap-server", address,
                          "--group", "clerks", "--topic", "inbox", "--topic", "nowhere")
    assert (code, docs) == (1, [{"group": "clerks", "topics": [
        {"topic": "inbox"}, {"topic": "nowhere", "error": "UNKNOWN_TOPIC_OR_PARTITION"}]}])
    code, docs = run_json(capsys, "share-groups", "describe", "--bootstrap-server", address, "--group", "clerks")
    assert code == 0
    assert [(p["topic"], p["start_offset"]) for p in docs[0]["groups"][0]["partitions"]] == [("outbox", 0)]
