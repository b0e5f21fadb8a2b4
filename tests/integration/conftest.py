"""Fixtures for integration tests: complete local clusters of real processes (no mocks).

* ``cluster_factory(replicas=3, config={...}, auth_enabled=False, ...) -> LocalCluster`` starts a
  cluster (detached, in its own temporary directory) and returns it once every service is healthy.
  Every cluster it made is stopped at the end of the test, pass or fail; when the test failed, the
  tail of each service's log is printed (pytest shows it under "Captured stdout teardown").
* ``cluster``: the usual 3-replica cluster with small segments and a short ISR lag limit.
* ``running_cluster(request, config)``: the same lifecycle for a module-scoped fixture.

Every test under ``tests/integration`` gets the ``integration`` marker, so ``pytest -m integration``
selects them and ``-m "not integration"`` skips them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.localcluster.control import tail_file

INTEGRATION_DIR = Path(__file__).resolve().parent
LOG_TAIL_LINES = 60
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()

# Small segments so retention/DeleteRecords tests roll segments with little data; a short ISR lag
# limit so a stopped follower leaves the ISR within a test's patience.
DEFAULT_REPLICA_CONFIG = {"segment.bytes": "65536", "replica.lag.time.max.ms": "3000"}

ClusterFactory = Callable[..., LocalCluster]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees every collected item of the session, not only ours: filter by path.
    for item in items:
        if INTEGRATION_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    # Keep each phase's report on the item so fixture teardown knows whether the test failed.
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def require_redis_server() -> None:
    """Skip (naming the tool) when redis-server is not installed; CI installs it."""
    if shutil.which("redis-server") is None and not os.path.exists("/usr/sbin/redis-server"):
        pytest.skip("redis-server is not installed (apt-get install redis-server; `make setup` does it)")


def _test_failed(item: pytest.Item) -> bool:
    reports = item.stash.get(_REPORTS, {})
    return any(r.failed for r in reports.values())


def print_log_tails(cluster: LocalCluster) -> None:
    """Print the last lines of every service log of ``cluster`` (for failure diagnosis)."""
    try:
        services = cluster.services()
    except Exception:  # the cluster never got as far as a plan: nothing to show
        return
    for entry in services:
        print(f"\n----- {entry.name} (pid {entry.pid}) {entry.log} -----")
        print(tail_file(entry.log, lines=LOG_TAIL_LINES), end="")


@pytest.fixture
def cluster_factory(request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    """A factory of running local clusters; all of them are stopped when the test ends."""
    made: list[LocalCluster] = []

    def start_cluster(*, replicas: int = 3, config: dict[str, str] | None = None, coordinators: int | None = None,
                      frontdoors: int = 1, auth_enabled: bool = False, tokens_file: Path | None = None,
                      super_users: str = "", session_timeout_ms: int | None = None,
                      extra_env: dict[str, str] | None = None, data_dir: Path | None = None,
                      tls: bool = False) -> LocalCluster:
        require_redis_server()
        cluster_config = ClusterConfig(
            data_dir=data_dir or tmp_path_factory.mktemp("cluster"), replicas=replicas, frontdoors=frontdoors,
            replica_config=dict(DEFAULT_REPLICA_CONFIG if config is None else config),
            auth_enabled=auth_enabled, tokens_file=tokens_file, super_users=super_users,
            session_timeout_ms=session_timeout_ms, extra_env=dict(extra_env or {}), tls=tls)
        if coordinators is not None:
            cluster_config.coordinators = coordinators
        cluster = LocalCluster(cluster_config)
        made.append(cluster)  # before up: a half-started cluster is still torn down
        cluster.up(detach=True)
        return cluster

    yield start_cluster

    failed = _test_failed(request.node)
    for cluster in reversed(made):
        if failed:
            print_log_tails(cluster)
        cluster.down(timeout_s=10.0)


@pytest.fixture
def cluster(cluster_factory: ClusterFactory) -> LocalCluster:
    """3 replicas, 1 frontdoor (+ coordinator/scanner once built), segment.bytes=65536,
    replica.lag.time.max.ms=3000."""
    return cluster_factory()


@pytest.fixture(scope="session")
def shared_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The ``cluster`` configuration, started once per test process (each pytest-xdist worker has its
    own) and shared by the tests that neither stop, kill nor reconfigure anything and only read or
    write topics (and groups) named for themselves: a cluster start costs seconds of CPU, and on
    2 cores that is what the parallel suite runs short of. A test that faults a process takes its
    own ``cluster``."""
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("shared"), replicas=3,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG))
    yield from running_cluster(request, config)



def running_cluster(request: pytest.FixtureRequest, config: ClusterConfig) -> Iterator[LocalCluster]:
    """Body of a (module-scoped) cluster fixture: up, yield, down; the services' log tails are
    printed when a test failed while the cluster was up."""
    require_redis_server()
    cluster = LocalCluster(config)
    failed_before = request.session.testsfailed
    try:
        cluster.up(detach=True)
        yield cluster
    finally:
        if request.session.testsfailed > failed_before:
            print_log_tails(cluster)
        cluster.down(timeout_s=10.0)
