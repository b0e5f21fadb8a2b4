"""Fixtures of the chaos suite: ``chaos_cluster(...)`` starts a local cluster of real processes
(redis-server, 3 replicas, a front door) with a 3 s session timeout and a 3 s ISR lag limit;
every cluster is stopped at the end of the test, and the service logs are printed when it failed.
``default_chaos_cluster`` is ``chaos_cluster()``'s (cluster, env) for a whole module, for the tests
that fault nothing but redis-server and use topics of their own."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lowtide.localcluster import LocalCluster
from tests.chaos.harness import ChaosEnv, log_tails, redis_available, start_cluster

_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


@pytest.fixture
def chaos_cluster(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[LocalCluster, ChaosEnv]]]:
    """``chaos_cluster(**start_cluster kwargs) -> (cluster, env)``."""
    made: list[LocalCluster] = []
    envs: list[ChaosEnv] = []

    def start(**kwargs) -> tuple[LocalCluster, ChaosEnv]:
        if not redis_available():
            pytest.skip("redis-server is not installed (apt-get install redis-server; `make setup` does it)")
        cluster = start_cluster(tmp_path_factory.mktemp("chaos"), register=made.append, **kwargs)
        env = ChaosEnv(cluster)
        envs.append(env)
        return cluster, env

    yield start

    failed = any(r.failed for r in request.node.stash.get(_REPORTS, {}).values())
    for env in envs:
        env.close()
    for cluster in reversed(made):
        if failed:
            print(log_tails(cluster))
        cluster.down(timeout_s=10.0)


@pytest.fixture(scope="module")
def default_chaos_cluster(request: pytest.FixtureRequest,
                          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ChaosEnv]]:
    """``chaos_cluster()`` (the default configuration) for every test of a module that asks for it."""
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server; `make setup` does it)")
    made: list[LocalCluster] = []
    failed_before = request.session.testsfailed
    env: ChaosEnv | None = None
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("chaos-shared"), register=made.append)
        env = ChaosEnv(cluster)
        yield cluster, env
    finally:
        if env is not None:
            env.close()
        for cluster in made:
            if request.session.testsfailed > failed_before:
                print(log_tails(cluster))
            cluster.down(timeout_s=10.0)
