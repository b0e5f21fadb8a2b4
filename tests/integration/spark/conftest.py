"""The worker's shared local cluster and one real local-mode SparkSession per test module (both are
slow to start); every test uses its own topics. Spark needs Java 17+: a missing ``java`` skips, naming it
(CI installs it)."""

from __future__ import annotations

import shutil

import pytest

from lowtide.localcluster import LocalCluster


def require_java() -> None:
    if shutil.which("java") is None:
        pytest.skip("java is not installed (Spark needs Java 17+: apt-get install openjdk-17-jre-headless)")


@pytest.fixture(scope="module")
def spark_cluster(shared_cluster: LocalCluster) -> LocalCluster:
    """The worker's shared cluster (tests/integration/conftest.py, the same configuration: 3 replicas,
    DEFAULT_REPLICA_CONFIG): these tests stop, kill and reconfigure nothing and only use topics and
    groups named for themselves, so they need no cluster start of their own (seconds of CPU each)."""
    return shared_cluster


@pytest.fixture(scope="module")
def spark():
    require_java()
    from lowtide.spark import build_session

    session = build_session("lowtide-tests", master="local[2]")
    yield session
    session.stop()
