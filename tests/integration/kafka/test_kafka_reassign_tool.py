"""Kafka's own ``kafka-reassign-partitions`` against a 4-broker lowtide cluster (issue 31's
must-show): ``--generate`` proposes a placement over all four brokers, ``--execute --throttle``
moves a partition onto broker 3 (the throttle configs set, and removed by ``--verify`` once the
move is done), a second move onto a stopped broker stays in progress so ``--list`` shows it and
``--cancel`` takes it back; every record produced before reads back from both partitions, in
order, at its offset.

Real processes throughout: redis-server, four replica servers, a front door, and the JVM tool
speaking Kafka's protocol to the front door's Kafka listener (AlterPartitionReassignments 45,
ListPartitionReassignments 46, IncrementalAlterConfigs 44 on TOPIC and BROKER resources)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from tests.integration import support as s
from tests.kafka_tools import kafka_tool

TOPIC = "moving"
RECORDS = 300  # over two partitions
PER_BATCH = 10
THROTTLE = 1_000_000  # bytes/s: far above what 300 small records need, so the move still ends quickly


def reassign_tool(cluster, *args: str, ok: bool = True) -> str:
    tool = subprocess.run([str(kafka_tool("kafka-reassign-partitions")), "--bootstrap-server",
                           cluster.kafka_bootstrap, *args], capture_output=True, text=True, timeout=120)
    if ok:
        assert tool.returncode == 0, f"{args}: {tool.stdout}\n{tool.stderr[-3000:]}"
    return tool.stdout


def json_after(output: str, heading: str) -> dict:
    """The JSON document printed on the first non-empty line after ``heading``."""
    lines = output.splitlines()
    rest = lines[lines.index(heading) + 1:]
    return json.loads(next(line for line in rest if line.strip()))


def write_reassignment(path: Path, moves: dict[int, list[int]]) -> Path:
    path.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": p, "replicas": r, "log_dirs": ["any"] * len(r)} for p, r in moves.items()]}))
    return path


def verify_until_completed(cluster, path: Path, partition: str, *, timeout_s: float = 40) -> str:
    """Run ``--verify`` every second until it reports ``partition`` completed; its last output."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = reassign_tool(cluster, "--verify", "--reassignment-json-file", str(path), ok=False)
        if f"Reassignment of partition {partition} is completed." in out:
            return out
        assert time.monotonic() < deadline, f"{partition} still moving after {timeout_s} s:\n{out}"
        time.sleep(1)


def test_kafka_reassign_partitions_generates_executes_with_a_throttle_verifies_lists_and_cancels(
        cluster_factory, tmp_path):
    cluster = cluster_factory(replicas=4, coordinators=0)
    s.create_topic(cluster, TOPIC, partitions=2, rf=3)
    store = s.store(cluster)
    for p in range(2):  # many small batches (acks=all), so a throttled copy takes one at a time
        values = [f"record-{i}".encode() for i in range(p, RECORDS, 2)]
        for first in range(0, len(values), PER_BATCH):
            assert s.produce(cluster, TOPIC, values[first:first + PER_BATCH], partition=p).error_code == 0
    before = {p: store.partition_state(TOPIC, p).replicas for p in range(2)}

    # --generate: the current assignment and a proposal on brokers 0-3, replication factors kept.
    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({"version": 1, "topics": [{"topic": TOPIC}]}))
    out = reassign_tool(cluster, "--generate", "--topics-to-move-json-file", str(topics_file),
                        "--broker-list", "0,1,2,3")
    current = json_after(out, "Current partition replica assignment")
    assert {p["partition"]: p["replicas"] for p in current["partitions"]} == {p: list(r) for p, r in before.items()}
    proposed = json_after(out, "Proposed partition reassignment configuration")
    assert sorted(p["partition"] for p in proposed["partitions"]) == [0, 1]
    assert all(len(set(p["replicas"])) == 3 and set(p["replicas"]) <= {0, 1, 2, 3} for p in proposed["partitions"])

    # --execute --throttle: partition 0 swaps its last replica for the broker it lacks.
    spare = next(b for b in range(4) if b not in before[0])
    target = [*before[0][:2], spare]
    move = write_reassignment(tmp_path / "move.json", {0: target})
    out = reassign_tool(cluster, "--execute", "--reassignment-json-file", str(move), "--throttle", str(THROTTLE))
    assert "Save this to use as the --reassignment-json-file option during rollback" in out, out
    assert f"The inter-broker throttle limit was set to {THROTTLE} B/s" in out, out
    assert json_after(out, "Current partition replica assignment")["partitions"][0]["replicas"] == list(before[0])
    assert store.topic(TOPIC).config.get("follower.replication.throttled.replicas") == f"0:{spare}"

    # --verify until done; then the throttles are cleared.
    verified = verify_until_completed(cluster, move, f"{TOPIC}-0")
    assert "Clearing broker-level throttles" in verified and "Clearing topic-level throttles" in verified, verified
    done = store.partition_state(TOPIC, 0)
    assert (done.replicas, done.adding_replicas, done.removing_replicas) == (tuple(target), (), ())
    assert not store.topic(TOPIC).config.get("follower.replication.throttled.replicas")

    # A second move held back by a throttle of 1 byte/s (each batch costs its size in seconds, so
    # the adding replica copies a batch or two in the test's time) cannot finish: --list shows it,
    # --verify says it is in progress, --cancel takes it back and clears the throttles.
    absent = next(b for b in range(4) if b not in before[1])
    stuck = write_reassignment(tmp_path / "stuck.json", {1: [*before[1][:2], absent]})
    reassign_tool(cluster, "--execute", "--reassignment-json-file", str(stuck), "--throttle", "1")
    listed = reassign_tool(cluster, "--list")
    assert "Current partition reassignments:" in listed, listed
    assert f"{TOPIC}-1: " in listed and f"adding: {absent}." in listed, listed
    # kafka-topics --describe shows the move too (it asks ListPartitionReassignments).
    described = subprocess.run([str(kafka_tool("kafka-topics")), "--bootstrap-server", cluster.kafka_bootstrap,
                                "--describe", "--topic", TOPIC], capture_output=True, text=True, timeout=120)
    assert described.returncode == 0, described.stderr[-2000:]
    moving_line = next(line for line in described.stdout.splitlines() if "Partition: 1" in line)
    assert f"Adding Replicas: {absent}" in moving_line, described.stdout
    still = reassign_tool(cluster, "--verify", "--reassignment-json-file", str(stuck), ok=False)
    assert f"Reassignment of partition {TOPIC}-1 is still in progress." in still, still
    assert "Clearing" not in still, still  # throttles stay while a move is in progress
    cancelled = reassign_tool(cluster, "--cancel", "--reassignment-json-file", str(stuck))
    assert "Successfully cancelled" in cancelled and f"{TOPIC}-1" in cancelled, cancelled
    assert "Clearing broker-level throttles" in cancelled, cancelled
    reverted = store.partition_state(TOPIC, 1)
    assert (sorted(reverted.replicas), reverted.adding_replicas) == (sorted(before[1]), ())
    assert "No partition reassignments found." in reassign_tool(cluster, "--list")

    # Nothing produced before the moves is lost, nor reordered, nor renumbered.
    for p in range(2):
        read = s.read_all(cluster, TOPIC, partition=p)
        assert [offset for offset, _ in read] == list(range(RECORDS // 2))
        assert [value for _, value in read] == [f"record-{i}".encode() for i in range(p, RECORDS, 2)]
