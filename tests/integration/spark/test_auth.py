"""The data source on an auth-enabled cluster: credentials given as an option reach every call
(front door and replicas, driver and executors); without them nothing is read or written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lowtide.client import Admin
from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster


@pytest.fixture(scope="module")
def auth_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("spark-auth"), replicas=3,
                                         replica_config=dict(DEFAULT_REPLICA_CONFIG), auth_enabled=True))


def test_a_token_option_lets_a_spark_job_write_and_read_and_no_token_gets_nothing(spark, auth_cluster, tmp_path):
    metadata = s.auth_metadata(auth_cluster)
    token = dict(metadata)["authorization"].removeprefix("Bearer ")
    with Admin(auth_cluster.bootstrap, metadata=metadata) as admin:
        admin.create_topic("secured", partitions=2, replication_factor=3)
    config = tmp_path / "client.properties"
    config.write_text(f"lowtide.auth.token={token}\n")
    opts = {"bootstrap.servers": auth_cluster.bootstrap}

    spark.createDataFrame([(f"v{i}",) for i in range(200)], "value string").write.format("lowtide") \
        .options(**opts).option("lowtide.auth.token", token).option("topic", "secured").mode("append").save()
    rows = (spark.read.format("lowtide").options(**opts).option("lowtide.command.config", str(config))
            .option("subscribe", "secured").load().collect())
    assert sorted(bytes(r.value) for r in rows) == sorted(f"v{i}".encode() for i in range(200))

    with pytest.raises(Exception, match="TopicAuthorizationFailed|not authorized|does not exist"):
        spark.read.format("lowtide").options(**opts).option("subscribe", "secured").load().collect()
    with pytest.raises(Exception, match="TopicAuthorizationFailed|not authorized"):
        spark.createDataFrame([("x",)], "value string").write.format("lowtide").options(**opts) \
            .option("topic", "secured").mode("append").save()
