"""A shard applies its metadata records in a process of its own (coordinator.applier): if that
process dies, the shard reloads with a new one and no acknowledged commit is lost.

The shard runs in this test's process (so the test can kill its applier) over a real metadata log
on three real replica processes and a real redis-server (inproc.py)."""

from __future__ import annotations

import os
import signal
import time

from lowtide.coordinator.service import LEADER
from lowtide.errors import LowtideError
from tests import waiting
from tests.integration.coordinator.inproc import PARTITIONS, commit_file, create_topic

BATCHES_PER_PARTITION = 100 // PARTITIONS  # of each file _commit sends
RECORDS_PER_BATCH = 10


def test_a_shard_whose_applier_process_dies_reloads_and_loses_no_acknowledgedcommit_file(shard):
    topic_id = create_topic(shard, "applier-death")
    acked = []
    for n in range(5):
        commit_file(shard, topic_id, n)
        acked.append(n)
    first = shard.applier._proc.pid
    os.kill(first, signal.SIGKILL)
    n, deadline = 5, time.monotonic() + 120
    while len(acked) < 10:
        assert time.monotonic() < deadline, f"only {len(acked)} commits acknowledged; {shard.status_detail}"
        try:
            commit_file(shard, topic_id, n)
            acked.append(n)
        except LowtideError as exc:
            assert exc.retriable, exc  # the shard reloads meanwhile
            time.sleep(0.05)
        n += 1
    # Commits may be acknowledged before the shard notices the death (the applier applies behind
    # the durable append): the shard must still notice, and start a new applier.
    waiting.wait_until(lambda: shard.applier.alive() and shard.applier._proc.pid != first, timeout_s=60,
                       what="a new applier process")
    assert shard.status == LEADER

    def committed(core):
        files = [k for k in (f"wal/{topic_id.hex()}-{i:08d}" for i in range(n)) if core.state.file(k)]
        return files, {p: core.state.partition(topic_id, p).high_watermark for p in range(PARTITIONS)}

    files, high_watermarks = shard.read(committed)
    assert {f"wal/{topic_id.hex()}-{i:08d}" for i in acked} <= set(files)
    # Every file in the state (acknowledged, or failed after it reached the log) counted once.
    assert set(high_watermarks.values()) == {len(files) * BATCHES_PER_PARTITION * RECORDS_PER_BATCH}


def test_the_applier_process_runs_at_a_lower_priority_than_its_shard(shard):
    # Its work is off every request's path (answers go out when replicated): it yields the cores.
    assert shard.config.applier_nice == 10
    shard_nice = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, shard.applier._proc.pid) == min(19, shard_nice + 10)
