"""Per-topic counters of a replica (produce/fetch bytes, ISR changes) on real processes: they are
exported while the replica hosts the topic and gone once the topic is deleted, so dashboards do not
list deleted topics until the replicas restart."""

from __future__ import annotations

from lowtide.client.admin import Admin
from lowtide.localcluster import LocalCluster
from tests.integration import support as s


def produced_series(cluster: LocalCluster, topic: str) -> list[str]:
    """The replicas whose /metrics carry a lowtide_produce_bytes_total series of ``topic``."""
    return [f"replica-{b}" for b in range(3)
            if s.metric(cluster, f"replica-{b}", "lowtide_produce_bytes_total", topic=topic) > 0]


def test_a_deleted_topics_counters_leave_every_replicas_metrics(shared_cluster) -> None:
    cluster = shared_cluster  # faults nothing; its topics are its own
    s.create_topic(cluster, "tm-gone-soon", partitions=3)
    s.create_topic(cluster, "tm-stays", partitions=1)
    for p in range(3):
        s.produce(cluster, "tm-gone-soon", [b"x" * 100] * 10, partition=p)
    s.produce(cluster, "tm-stays", [b"y" * 100] * 10)
    s.fetch(cluster, "tm-gone-soon", 0)
    # three partitions with RF 3: every replica leads one, so every replica counted produce bytes
    assert produced_series(cluster, "tm-gone-soon") == ["replica-0", "replica-1", "replica-2"]

    Admin(cluster.bootstrap).delete_topic("tm-gone-soon")

    s.wait_until(lambda: produced_series(cluster, "tm-gone-soon") == [], what="tm-gone-soon's series removed")
    for b in range(3):
        assert s.metric(cluster, f"replica-{b}", "lowtide_fetch_bytes_total", topic="tm-gone-soon") == 0
    # the other topic's series stay
    assert produced_series(cluster, "tm-stays") != []
