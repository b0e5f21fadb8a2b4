"""`lowtide reassign`, `lowtide drain` and `lowtide rebalance` on a real 4-broker cluster (the
`lowtide` console script, real replica processes, redis-server and a front door):

* plan proposes every partition on the listed brokers; execute --throttle moves one partition
  and verify reports it completed and clears the throttles (exit 0);
* a move held back by a 1 byte/s throttle shows in `topics describe` (adding/removing replicas)
  and `reassign list`, verify exits 1 with it in progress, cancel takes it back;
* drain --broker 3 leaves broker 3 with no replica and every replication factor as it was, and a
  drain that would leave a topic under its replication factor is refused naming the topic;
* rebalance --execute --wait puts the emptied broker back to work, evening replicas per broker;
* every record produced before reads back at its offset.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.integration import support as s

TOPIC = "orders"
PARTITIONS, PER_PARTITION, PER_BATCH = 4, 60, 10


def cli(cluster, *args: str, ok: bool = True) -> tuple[int, dict]:
    proc = s.lowtide_cli(*args, "--bootstrap-server", cluster.bootstrap, "--output", "json")
    if ok:
        assert proc.returncode == 0, f"{args}: {proc.stdout}{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def write_moves(path: Path, moves: dict[int, list[int]]) -> str:
    path.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": p, "replicas": r} for p, r in moves.items()]}))
    return str(path)


def assignment(cluster) -> dict[int, tuple[int, ...]]:
    return {st.partition: st.replicas for st in s.store(cluster).partition_states(TOPIC)}


def test_reassign_execute_verify_cancel_drain_and_rebalance_on_a_running_cluster(cluster_factory, tmp_path):
    cluster = cluster_factory(replicas=4, coordinators=0)
    s.create_topic(cluster, TOPIC, partitions=PARTITIONS, rf=2)
    for p in range(PARTITIONS):  # small acks=all batches, so a throttled copy takes one at a time
        for first in range(0, PER_PARTITION, PER_BATCH):
            values = [f"{p}-{i}".encode() for i in range(first, first + PER_BATCH)]
            assert s.produce(cluster, TOPIC, values, partition=p).error_code == 0
    before = assignment(cluster)

    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({"version": 1, "topics": [{"topic": TOPIC}]}))
    _, plan = cli(cluster, "reassign", "plan", "--topics-to-move-json-file", str(topics_file), "--broker-list", "0,1,2")
    assert {e["partition"]: tuple(e["replicas"]) for e in plan["current"]["partitions"]} == before
    proposed = {e["partition"]: e["replicas"] for e in plan["proposed"]["partitions"]}
    assert sorted(proposed) == list(range(PARTITIONS))
    assert all(len(set(r)) == 2 and set(r) <= {0, 1, 2} for r in proposed.values())
    assert all(e["log_dirs"] == ["any", "any"] for e in plan["proposed"]["partitions"])

    # execute --throttle, then verify until completed; the throttles go with the last verify.
    spare = next(b for b in range(4) if b not in before[0])
    move = write_moves(tmp_path / "move.json", {0: [before[0][0], spare]})
    _, started = cli(cluster, "reassign", "execute", "--reassignment-json-file", move, "--throttle", "1000000")
    assert started["started"] == [f"{TOPIC}-0"] and started["current"]["partitions"][0]["replicas"] == list(before[0])
    verified = {}
    s.wait_until(lambda: verified.update(cli(cluster, "reassign", "verify", "--reassignment-json-file", move,
                                             ok=False)[1]) or verified["partitions"][0]["status"] == "completed",
                 timeout_s=30, what=f"{TOPIC}-0 on {[before[0][0], spare]}")
    assert verified["throttles_cleared"] is True
    assert assignment(cluster)[0] == (before[0][0], spare)
    assert not s.store(cluster).topic(TOPIC).config.get("follower.replication.throttled.replicas")

    # A move held back by a throttle of 1 byte/s is listed, shown by topics describe, and cancelled.
    absent = next(b for b in range(4) if b not in before[1])
    stuck = write_moves(tmp_path / "stuck.json", {1: [before[1][0], absent]})
    cli(cluster, "reassign", "execute", "--reassignment-json-file", stuck, "--throttle", "1")
    _, listed = cli(cluster, "reassign", "list")
    assert [(r["partition"], r["adding_replicas"], r["removing_replicas"]) for r in listed["reassignments"]] == [
        (1, [absent], [before[1][1]])]
    _, described = cli(cluster, "topics", "describe", "--topic", TOPIC)
    row = described["topics"][0]["partitions"][1]
    assert (row["adding_replicas"], row["removing_replicas"]) == ([absent], [before[1][1]])
    code, still = cli(cluster, "reassign", "verify", "--reassignment-json-file", stuck, ok=False)
    assert (code, still["partitions"][0]["status"], still["throttles_cleared"]) == (1, "in_progress", False)
    _, cancelled = cli(cluster, "reassign", "cancel", "--reassignment-json-file", stuck)
    assert cancelled == {"cancelled": [f"{TOPIC}-1"], "throttles_cleared": True}
    assert sorted(assignment(cluster)[1]) == sorted(before[1])
    s.wait_until(lambda: absent not in s.store(cluster).partition_state(TOPIC, 1).replicas, what="cancel applied")

    # drain broker 3: nothing left on it, replication factors kept.
    _, drained = cli(cluster, "drain", "--broker", "3", "--timeout", "40")
    assert drained["completed"] is True
    after_drain = assignment(cluster)
    assert all(3 not in r and len(set(r)) == 2 for r in after_drain.values()), after_drain
    assert not any(3 in st.replicas for t in s.store(cluster).topics() for st in s.store(cluster).partition_states(t))

    # A topic on every broker cannot be drained off one: refused, naming it, nothing moves.
    s.create_topic(cluster, "wide", partitions=1, rf=4)
    proc = s.lowtide_cli("drain", "--broker", "2", "--bootstrap-server", cluster.bootstrap, "--timeout", "5")
    assert proc.returncode == 1 and "INVALID_REPLICATION_FACTOR" in proc.stderr and "'wide' (4)" in proc.stderr, \
        proc.stderr
    assert assignment(cluster) == after_drain

    # rebalance: broker 3 gets its share back.
    _, proposal = cli(cluster, "rebalance", "--plan")
    load = {b["broker"]: (b["replicas"], b["replicas_after"]) for b in proposal["brokers"]}
    assert load[3] == (1, 3) and proposal["moves"] == 2, proposal  # 12 replicas ("wide" included) over 4 brokers
    cli(cluster, "rebalance", "--execute", "--wait", "--timeout", "40")
    per_broker = Counter(b for r in assignment(cluster).values() for b in r)
    assert max(per_broker.values()) - min(per_broker[b] for b in range(4)) <= 1, per_broker

    for p in range(PARTITIONS):
        read = s.read_all(cluster, TOPIC, partition=p)
        assert read == [(i, f"{p}-{i}".encode()) for i in range(PER_PARTITION)]
