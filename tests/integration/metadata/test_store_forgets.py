"""The metadata store forgets the cluster, and nothing is deleted (issue 51, docs/design/metadata.md).

On real processes (etcd, redis-server, 3 replicas, a front door): records are produced with
acks=all, then the store is (a) emptied (`etcdctl del --prefix`: every key, the cluster id with
them, in one revision) or (b) replaced by a fresh, empty etcd on the same port. Every lowtide
service must stop with its one clear line, every partition directory must stay, and once the
operator puts the store back the services start again and every acknowledged record reads back.
Redis emptied must change nothing either.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import redis as redis_lib

from lowtide.localcluster import LocalCluster
from tests.integration.support import create_topic, etcd_client, etcdctl, produce, read_all
from tests.waiting import wait_until

TOPIC = "kept"
PARTITIONS = 3
RECORDS_PER_PARTITION = 200
FAIL_STOP_LINE = "stopping, touching nothing"


def _lowtide_services(cluster: LocalCluster) -> list:
    return [s for s in cluster.services() if s.kind not in ("redis", "etcd")]


def _partition_dirs(cluster: LocalCluster) -> dict[str, set[str]]:
    out = {}
    for s in cluster.services("replica"):
        out[s.name] = {e.name for e in os.scandir(s.data_dir) if e.is_dir() and e.name.startswith(TOPIC + "-")}
    return out


def _produce_all(cluster: LocalCluster) -> None:
    create_topic(cluster, TOPIC, partitions=PARTITIONS, rf=3)
    for p in range(PARTITIONS):
        for _ in range(RECORDS_PER_PARTITION // 50):
            result = produce(cluster, TOPIC, [b"v%d" % i for i in range(50)], partition=p, acks=-1)
            assert result.error_code == 0, result


def _assert_every_service_fail_stopped(cluster: LocalCluster) -> None:
    services = _lowtide_services(cluster)
    wait_until(lambda: not any(cluster.is_running(s.name) for s in services), timeout_s=45,
               what="every lowtide service stopped")
    for s in services:
        text = Path(s.log).read_text(errors="replace")
        assert FAIL_STOP_LINE in text, f"{s.name} stopped without its line ({s.log})"


def _start_services(cluster: LocalCluster) -> None:
    for s in _lowtide_services(cluster):
        cluster.start_service(s.name)


def _assert_everything_reads_back(cluster: LocalCluster) -> None:
    for p in range(PARTITIONS):
        wait_until(lambda p=p: len(read_all(cluster, TOPIC, partition=p)) == RECORDS_PER_PARTITION, timeout_s=30,
                   what=f"{TOPIC}-{p} reads back all {RECORDS_PER_PARTITION} records")


def test_redis_emptied_deletes_nothing_and_costs_no_record(cluster_factory) -> None:
    cluster = cluster_factory()
    _produce_all(cluster)
    before = _partition_dirs(cluster)
    redis_lib.Redis.from_url(cluster.redis_url).flushall()
    time.sleep(5)  # what used to be enough for every replica to delete every log
    assert _partition_dirs(cluster) == before
    _assert_everything_reads_back(cluster)


def test_an_emptied_store_stops_every_service_and_a_restored_one_brings_everything_back(cluster_factory,
                                                                                        tmp_path) -> None:
    if shutil.which("etcdctl") is None and not os.path.exists("/usr/bin/etcdctl"):
        pytest.skip("etcdctl is not installed (apt-get install etcd-client; `make setup` does it)")
    cluster = cluster_factory()
    _produce_all(cluster)
    member = cluster.service("etcd-0")
    backup = tmp_path / "backup.db"
    etcdctl(cluster, "snapshot", "save", str(backup), endpoint=member.grpc)
    before = _partition_dirs(cluster)
    assert all(len(d) == PARTITIONS for d in before.values()), before

    client = etcd_client(cluster, [member.grpc])
    try:
        client.delete_prefix("/lowtide/")
    finally:
        client.close()
    _assert_every_service_fail_stopped(cluster)
    assert _partition_dirs(cluster) == before

    # The operator restores the backup into the member's data directory and starts everything.
    cluster.stop_service("etcd-0")
    argv = member.argv
    peer = argv[argv.index("--initial-advertise-peer-urls") + 1]
    shutil.rmtree(member.data_dir)
    etcdctl(cluster, "snapshot", "restore", str(backup), "--data-dir", member.data_dir, "--name", "etcd-0",
            "--initial-cluster", f"etcd-0={peer}", "--initial-advertise-peer-urls", peer,
            "--initial-cluster-token", "lowtide", endpoint=member.grpc)
    cluster.start_service("etcd-0")
    _start_services(cluster)
    assert _partition_dirs(cluster) == before
    _assert_everything_reads_back(cluster)


def test_a_fresh_store_in_place_of_the_old_stops_every_service_and_the_old_one_brings_everything_back(
        cluster_factory) -> None:
    cluster = cluster_factory()
    _produce_all(cluster)
    before = _partition_dirs(cluster)
    member = cluster.service("etcd-0")
    kept = Path(member.data_dir + ".kept")

    cluster.stop_service("etcd-0")
    os.rename(member.data_dir, kept)
    cluster.start_service("etcd-0")  # same ports, no data: a fresh, empty store
    _assert_every_service_fail_stopped(cluster)
    assert _partition_dirs(cluster) == before

    cluster.stop_service("etcd-0")
    shutil.rmtree(member.data_dir)
    os.rename(kept, member.data_dir)
    cluster.start_service("etcd-0")
    _start_services(cluster)
    assert _partition_dirs(cluster) == before
    _assert_everything_reads_back(cluster)
