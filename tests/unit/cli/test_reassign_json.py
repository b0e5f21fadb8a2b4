"""Kafka's reassignment files as `lowtide reassign` reads and writes them (lowtide.cli.reassign_cmd):
the format ``kafka-reassign-partitions`` uses both ways, the checks it makes, the throttled-replica
lists it writes, and how a partition's progress is told from the metadata and the move list."""

from __future__ import annotations

import json

import pytest

from lowtide.cli.output import CliError
from lowtide.cli.reassign_cmd import (
    parse_reassignment,
    parse_topics_to_move,
    reassignment_doc,
    status_line,
    status_of,
    throttled_replicas,
    to_json,
)
from lowtide.client.admin import OngoingReassignment

KAFKA_FILE = ('{"version":1,"partitions":[{"topic":"orders","partition":1,"replicas":[2,3],"log_dirs":["any","any"]},'
              '{"topic":"orders","partition":0,"replicas":[1,2],"log_dirs":["any","any"]}]}')


def test_kafkas_file_reads_and_writes_back_in_partition_order():
    moves = parse_reassignment(json.loads(KAFKA_FILE))
    assert moves == {("orders", 1): (2, 3), ("orders", 0): (1, 2)}
    assert to_json(reassignment_doc(moves)) == (
        '{"version":1,"partitions":[{"topic":"orders","partition":0,"replicas":[1,2],"log_dirs":["any","any"]},'
        '{"topic":"orders","partition":1,"replicas":[2,3],"log_dirs":["any","any"]}]}')


def test_log_dirs_may_be_left_out():
    assert parse_reassignment({"partitions": [{"topic": "t", "partition": 0, "replicas": [0]}]}) == {("t", 0): (0,)}


@pytest.mark.parametrize("entry, code", [
    ({"topic": "t", "partition": 0, "replicas": [1, 2], "log_dirs": ["/data", "any"]}, "INVALID_REQUEST"),
    ({"topic": "t", "partition": 0, "replicas": [1, 2], "log_dirs": ["any"]}, "INVALID_REQUEST"),
    ({"topic": "t", "partition": 0, "replicas": [1, 1]}, "INVALID_REPLICA_ASSIGNMENT"),
    ({"topic": "t", "partition": 0, "replicas": []}, "INVALID_REPLICA_ASSIGNMENT"),
    ({"topic": "t", "partition": -1, "replicas": [1]}, "INVALID_REQUEST"),
    ({"partition": 0, "replicas": [1]}, "INVALID_REQUEST"),
])
def test_entries_kafkas_tool_would_refuse_are_refused(entry, code):
    with pytest.raises(CliError) as refused:
        parse_reassignment({"version": 1, "partitions": [entry]})
    assert refused.value.code == code


def test_a_partition_listed_twice_or_another_version_is_refused():
    twice = {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1]}] * 2}
    with pytest.raises(CliError, match="more than once"):
        parse_reassignment(twice)
    with pytest.raises(CliError, match="version 2"):
        parse_reassignment({"version": 2, "partitions": [{"topic": "t", "partition": 0, "replicas": [1]}]})


def test_topics_to_move_keep_their_order_once_each():
    doc = {"version": 1, "topics": [{"topic": "b"}, {"topic": "a"}, {"topic": "b"}]}
    assert parse_topics_to_move(doc) == ["b", "a"]
    with pytest.raises(CliError):
        parse_topics_to_move({"version": 1, "topics": []})


def test_throttled_replicas_name_the_current_replicas_as_leaders_and_the_added_ones_as_followers():
    moves = {("orders", 0): (1, 2, 3), ("orders", 4): (0, 1, 2)}
    current = {("orders", 0): (0, 1, 2), ("orders", 4): (0, 1, 2)}
    assert throttled_replicas(moves, current) == {"orders": {
        "leader.replication.throttled.replicas": "0:0,0:1,0:2,4:0,4:1,4:2",
        "follower.replication.throttled.replicas": "0:3"}}


def test_progress_is_read_from_the_move_list_and_the_replicas():
    targets = {("t", 0): (1, 2), ("t", 1): (2, 3), ("t", 2): (3, 0)}
    current = {("t", 0): (1, 2), ("t", 1): (2, 3, 0), ("t", 2): (0, 1)}
    ongoing = [OngoingReassignment(topic="t", partition=1, replicas=(2, 3, 0), adding=(3,), removing=(0,))]
    states = status_of(targets, current, ongoing)
    assert states == {("t", 0): "completed", ("t", 1): "in_progress", ("t", 2): "mismatch"}
    assert status_line(("t", 0), "completed", target=(1, 2), current=(1, 2)) == \
        "Reassignment of partition t-0 is completed."
    assert status_line(("t", 1), "in_progress", target=(2, 3), current=(2, 3, 0)) == \
        "Reassignment of partition t-1 is still in progress."
    assert status_line(("t", 2), "mismatch", target=(3, 0), current=(0, 1)) == \
        "There is no active reassignment of partition t-2, but replica set is [0, 1] rather than [3, 0]."
