"""Short (40 s) randomized nemesis runs (the long ones are `make chaos` and `make chaos-diskless`): no
invariant may break, on a classic topic or on a diskless one."""

from __future__ import annotations

import pytest

from tests.chaos.harness import fmt_violations, redis_available
from tests.chaos.run import run_chaos

pytestmark = pytest.mark.integration

SEED = 20240611
# 40 s each: with this seed, every fault kind the asserts below ask for comes within it (a
# coordinator kill or pause included), and the suite's CPU is the budget (`make chaos` runs long).
MINUTES = 0.67


def test_forty_seconds_of_random_faults_breaks_no_invariant(tmp_path):
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server; `make setup` does it)")
    result = run_chaos(minutes=MINUTES, seed=SEED, data_dir=tmp_path / "cluster")
    print(result.table())
    print("\n".join(result.fault_log))
    assert not result.harness_errors, result.harness_errors
    assert sum(result.faults.values()) >= 3, f"too few faults injected: {result.faults}"
    assert result.summary.records_acked > 100, result.table()
    assert result.summary.deletes_acked > 0, result.table()
    assert not result.violations, (f"{len(result.violations)} violations (seed {SEED}):\n"
                                   f"{fmt_violations(result.violations)}")


def test_forty_seconds_of_random_faults_on_a_diskless_topic_breaks_no_invariant(tmp_path):
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server; `make setup` does it)")
    result = run_chaos(minutes=MINUTES, seed=SEED, data_dir=tmp_path / "cluster", diskless=True)
    print(result.table())
    print("\n".join(result.fault_log))
    assert not result.harness_errors, result.harness_errors
    assert sum(result.faults.values()) >= 3, f"too few faults injected: {result.faults}"
    coordinator_faults = result.faults.get("coordinator_kill_restart", 0) + result.faults.get("coordinator_pause", 0)
    assert coordinator_faults >= 1, f"no coordinator shard fault (seed {SEED}): {result.faults}"
    assert result.summary.records_acked > 100, result.table()
    assert result.summary.deletes_acked > 0, result.table()
    assert not result.violations, (f"{len(result.violations)} violations (seed {SEED}, diskless):\n"
                                   f"{fmt_violations(result.violations)}")
