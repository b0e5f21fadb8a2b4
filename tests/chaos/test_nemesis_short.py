"""A one-minute randomized nemesis run (the long one is `make chaos`): no invariant may break."""

from __future__ import annotations

import pytest

from tests.chaos.harness import fmt_violations, redis_available
from tests.chaos.run import run_chaos

pytestmark = pytest.mark.integration

SEED = 20240611


def test_one_minute_of_random_faults_breaks_no_invariant(tmp_path):
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server; `make setup` does it)")
    result = run_chaos(minutes=1.0, seed=SEED, data_dir=tmp_path / "cluster")
    print(result.table())
    print("\n".join(result.fault_log))
    assert not result.harness_errors, result.harness_errors
    assert sum(result.faults.values()) >= 3, f"too few faults injected: {result.faults}"
    assert result.summary.records_acked > 100, result.table()
    assert result.summary.deletes_acked > 0, result.table()
    assert not result.violations, (f"{len(result.violations)} violations (seed {SEED}):\n"
                                   f"{fmt_violations(result.violations)}")
