"""One real local cluster and one real local-mode SparkSession per test module (both are slow to
start); every test uses its own topics. Spark needs Java 17+: a missing ``java`` skips, naming it
(CI installs it)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, print_log_tails, require_redis_server


def require_java() -> None:
    if shutil.which("java") is None:
        pytest.skip("java is not installed (Spark needs Java 17+: apt-get install openjdk-17-jre-headless)")


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require_redis_server()
    cluster = LocalCluster(ClusterConfig(data_dir=tmp_path_factory.mktemp("spark-cluster"), replicas=3,
                                         replica_config=dict(DEFAULT_REPLICA_CONFIG)))
    try:
        cluster.up(detach=True)
        yield cluster
    except BaseException:
        print_log_tails(cluster)
        raise
    finally:
        cluster.down(timeout_s=10.0)


@pytest.fixture(scope="module")
def spark():
    require_java()
    from lowtide.spark import build_session

    session = build_session("lowtide-tests", master="local[2]")
    yield session
    session.stop()
