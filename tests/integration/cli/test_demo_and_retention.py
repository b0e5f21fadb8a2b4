"""The main job and the KIP-68 client-side retention caller, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration import support as s


# A whole pipeline of separate programs (Spark JVMs, a cluster): minutes when the parallel suite
# shares 2 cores; the suite-wide 300 s is a hang guard, this one too, with room for a busy machine.
@pytest.mark.timeout(600)
def test_demo_deletes_only_what_both_groups_consumed_drains_a_queue_and_leaves_nothing_behind(tmp_path, monkeypatch):
    # One run of the main job (each is minutes of Spark JVMs) checks both what it did and that it
    # cleans up: without --data-dir it runs in a temporary directory and removes it. The text
    # rendering of the same document is tests/unit/cli/test_demo_render.py.
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the demo's mkdtemp puts its cluster
    proc = s.lowtide_cli("demo", "--records", "8000", "--segment-bytes", "262144", "--output", "json", timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sum(r["before"]["hw"] for r in doc["partitions"]) == 8000
    for r in doc["partitions"]:
        assert r["committed_slow"] < r["committed_fast"] == r["before"]["hw"]
        assert r["after"]["lso"] == r["after"]["lw"] == r["committed_slow"] == r["delete_before"]
        assert r["after"]["hw"] == r["before"]["hw"]
        for replica, before in r["bytes_before"].items():
            assert r["bytes_after"][replica] < before
    # The pipeline ran as Spark jobs: the producer, both consumer groups, the retention caller.
    for step in ("Spark producer: 8,000 records", "Spark consumer 'fast'", "Spark consumer 'slow'",
                 "Spark retention caller"):
        assert step in proc.stderr
    assert doc["spark"]["slow"]["stopped_early"] and doc["spark"]["fast"]["records"] == 8000
    # The queue step: two share group workers took all of it, and every replica's log of the queue
    # starts at its end, with less on disk.
    queue = doc["queue"]
    assert queue["errors"] == [] and queue["delivered"] == queue["records"] == 2000 and queue["drained"]
    for r in queue["partitions"]:
        assert r["after"]["lso"] == r["after"]["hw"] == r["before"]["hw"] > 0
        for replica, before in r["bytes_before"].items():
            assert r["bytes_after"][replica] < before
    # Nothing in the main job's output reads as a failure: no Python traceback, no Java stack trace
    # (the slow group's query ends at its end offsets instead of being stopped mid-micro-batch).
    failures = failures_in(proc.stderr)
    assert failures == [], "\n".join(failures)[-3000:]
    # Metrics offered while the cluster lived, not after; everything stopped, the directory removed.
    assert "metrics (Prometheus text), live while the demo runs:" in proc.stderr
    assert proc.stderr.index("live while the demo runs") < proc.stderr.index("[8/8] stopping")
    assert doc["metrics_live"] is False and doc["data_dir"] is None
    assert list(tmp_path.glob("lowtide-demo-*")) == []
    assert processes_naming(str(tmp_path)) == [], "processes of the demo's cluster still run"


WORKER_TIMEOUT = "Timed out while waiting for the Python worker to connect back"
RESTARTED = "a Python worker did not start in time; restarting the query from its checkpoint"


def failures_in(stderr: str) -> list[str]:
    """The lines of ``stderr`` that read as a failure (a Python traceback, a Java exception), except
    those of a Python worker that missed Spark's fixed 10 s to connect back when the demo then said
    it restarts the query from its checkpoint (``spark/jobs.py``): a handled event on a loaded
    machine, whose worker traceback and JVM log Spark prints itself. A block is a Java exception
    with its ``at``/``Caused by`` lines, or a Python traceback up to its exception line."""
    lines = stderr.splitlines()
    handled = RESTARTED in stderr
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Traceback (most recent call last)"):
            j = i + 1
            while j < len(lines) and lines[j][:1] in (" ", "\t"):
                j += 1
            block = lines[i:j + 1]
        elif "Exception" in line or "Error:" in line:
            j = i + 1
            while j < len(lines) and (lines[j].startswith(("\tat ", "\t...", "Caused by:"))):
                j += 1
            block = lines[i:j]
            j -= 1
        else:
            i += 1
            continue
        text = "\n".join(block)
        if not (handled and (WORKER_TIMEOUT in text or "CANNOT_OPEN_SOCKET" in text)):
            out += [b for b in block if "Exception" in b or "Error" in b or "Traceback" in b]
        i = j + 1
    return out


def test_a_handled_python_worker_timeout_is_no_failure_and_anything_else_is():
    java = ("26/12/03 16:50:01 ERROR MicroBatchExecution: Query [id = 1] terminated with error\n"
            "org.apache.spark.SparkException: failed\n\tat org.apache.spark.X.y(X.scala:1)\n"
            f"Caused by: java.net.SocketTimeoutException: {WORKER_TIMEOUT}\n\t... 33 more\n")
    python = ("Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n"
              "pyspark.errors.exceptions.base.PySparkRuntimeError: [CANNOT_OPEN_SOCKET] Can not open socket\n")
    notice = f"      Spark consumer 'slow': {RESTARTED} (attempt 2)\n"
    assert failures_in(java + notice + python + "[6/8] next step\n") == []
    assert failures_in(java + python) != []  # not handled: nobody said the query restarts
    other = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n"
    assert failures_in(java + notice + python + other) == ["Traceback (most recent call last):", "ValueError: boom"]


def processes_naming(text: str) -> list[str]:
    """Command lines of running processes that mention ``text`` (the demo's services name their directory)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended meanwhile
        if text in args:
            found.append(args)
    return found


def test_retention_run_skips_partitions_a_group_has_not_committed_and_deletes_below_the_minimum(shared_cluster):
    cluster = shared_cluster  # faults nothing; its topic and groups are its own
    s.create_topic(cluster, "rt-inter", partitions=2, rf=3)
    for p in (0, 1):
        assert s.produce(cluster, "rt-inter", [b"x"] * 50, partition=p).error_code == 0
    admin = s.admin(cluster)
    from lowtide_pb import admin_pb2
    admin.OffsetCommit(admin_pb2.OffsetCommitRequest(group_id="rt-a", partitions=[
        admin_pb2.OffsetCommitPartition(topic="rt-inter", partition=0, offset=40),
        admin_pb2.OffsetCommitPartition(topic="rt-inter", partition=1, offset=50)]))
    admin.OffsetCommit(admin_pb2.OffsetCommitRequest(group_id="rt-b", partitions=[
        admin_pb2.OffsetCommitPartition(topic="rt-inter", partition=0, offset=25)]))
    out = s.cli_json("retention", "run", "--bootstrap-server", cluster.bootstrap, "--topic", "rt-inter")
    rows = {r["partition"]: r for r in out["partitions"]}
    assert sorted(out["groups"]) == ["rt-a", "rt-b"]
    assert rows[0]["low_watermark"] == 25       # min(40, 25)
    assert "skipped" in rows[1]                 # group b never committed partition 1: delete nothing
    assert s.describe(cluster, s.leader_of(cluster, "rt-inter", 1), "rt-inter", 1).log_start_offset == 0
