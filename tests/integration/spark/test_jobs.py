"""spark-jobs/*.py as a user runs them: ``python spark-jobs/X.py`` in their own processes (each
starts its own local Spark) against a real cluster: produce, consume as a group into Parquet
files, then the retention caller deletes exactly what the group committed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lowtide.client import Admin

JOBS = Path(__file__).resolve().parents[3] / "spark-jobs"


def run_job(name: str, *args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(JOBS / name), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env)


@pytest.mark.parametrize("name", ["producer.py", "consumer.py", "retention.py"])
def test_every_job_explains_itself_with_help(name):
    proc = run_job(name, "--help", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--bootstrap-server" in proc.stdout and "--topic" in proc.stdout


# Spark gives a Python worker it starts on its own (not through pyspark.daemon) a fixed 10 s to
# connect back; a loaded machine missed it once (CI). The consumer job runs on an interpreter that
# makes the first such worker take 12 s, as that machine did: the job must restart its query from
# the checkpoint and still do exactly its two micro-batches (one Spark program for both checks: a
# Spark JVM is the costliest thing the suite starts).
SLOW_FIRST_WORKER = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" != "pyspark.daemon" ] && mkdir "{mark}" 2>/dev/null; then sleep 12; fi
exec {python} "$@"
"""
RESTART_MESSAGE = "restarting the query from its checkpoint"
# The slowed worker itself, once its 12 s are over, fails to reach the socket Spark closed and prints
# its traceback (when is up to the scheduler: before or after the restart): expected, and removed
# before looking for any other traceback or exception.
SLOW_WORKER_TRACEBACK = re.compile(
    r"Traceback \(most recent call last\):\n(?:(?!Traceback).*\n)*?.*CANNOT_OPEN_SOCKET.*\n?")


def without_the_slow_workers_traceback(stderr: str) -> str:
    return SLOW_WORKER_TRACEBACK.sub("", stderr)


# A whole pipeline of separate programs (Spark JVMs, a cluster): minutes when the parallel suite
# shares 2 cores; the suite-wide 300 s is a hang guard, this one too, with room for a busy machine.
@pytest.mark.timeout(900)
def test_the_producer_consumer_and_retention_jobs_run_end_to_end_as_separate_programs_through_a_slow_worker(
        spark_cluster, tmp_path):
    bootstrap = spark_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic("jobs-in", partitions=2, replication_factor=3)
    proc = run_job("producer.py", "--bootstrap-server", bootstrap, "--topic", "jobs-in", "--records", "5000",
                   "--record-size", "200", "--batch-bytes", "16384", "--output", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["records"] == 5000

    python = tmp_path / "slow-python"
    python.write_text(SLOW_FIRST_WORKER.format(mark=tmp_path / "delayed-once", python=sys.executable))
    python.chmod(0o755)
    proc = run_job("consumer.py", "--bootstrap-server", bootstrap, "--topic", "jobs-in", "--group", "g1",
                   "--checkpoint-dir", str(tmp_path / "ckpt"), "--output-path", str(tmp_path / "out"),
                   "--max-offsets-per-trigger", "1000", "--max-batches", "2", "--output", "json",
                   timeout=420, env=dict(os.environ, PYSPARK_PYTHON=str(python)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "delayed-once").is_dir(), "no Python worker was started outside the daemon"
    assert RESTART_MESSAGE in proc.stderr, proc.stderr[-3000:]
    failed, _, restarted = proc.stderr.rpartition(RESTART_MESSAGE)
    assert "Python worker failed to connect back" in failed, failed[-3000:]
    consumed = json.loads(proc.stdout)
    assert consumed["stopped_early"] and 0 < sum(consumed["committed"].values()) < 5000
    # After the restart it ends by itself after exactly two micro-batches (endingOffsets), none
    # cancelled mid-write, none read twice.
    assert consumed["micro_batches"] == 2 and consumed["records"] == sum(consumed["committed"].values()), consumed
    stderr, restarted = without_the_slow_workers_traceback(proc.stderr), without_the_slow_workers_traceback(restarted)
    assert "Traceback" not in stderr and "Exception" not in restarted, restarted[-3000:]
    assert list((tmp_path / "out").glob("*.parquet")), "the consumer wrote no Parquet file"

    proc = run_job("retention.py", "--bootstrap-server", bootstrap, "--topic", "jobs-in", "--output", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["groups"] == ["g1"]
    for row in report["partitions"]:
        assert row["low_watermark"] == consumed["committed"][str(row["partition"])]
