"""`lowtide metadata migrate --from-redis`: a cluster's metadata as releases before etcd kept it in
Redis, copied into etcd by the real CLI (real redis-server, real etcd)."""

from __future__ import annotations

import json

import pytest
import redis as redis_lib

from lowtide.common.procs import start_etcd
from lowtide.frontdoor.transactions.producer_ids import ProducerIdBlocks
from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo
from lowtide.metadata.store import MetadataStore
from tests.integration.support import lowtide_cli


@pytest.fixture
def etcd_url(tmp_path):
    members = start_etcd(tmp_path / "etcd")
    yield "etcd://" + members[0].endpoint
    for m in members:
        m.stop()


def _write_legacy_cluster(url: str) -> None:
    """What a release before etcd kept in Redis (its layout, as lowtide.metadata.legacy_redis reads)."""
    client = redis_lib.Redis.from_url(url)
    client.set("lowtide:cluster_id", "c0ffee")
    client.hset("lowtide:topics", "orders", TopicInfo(name="orders", topic_id="t1", partitions=2,
                                                      replication_factor=2, config={"retention.ms": "60000"}).to_json())
    for p, leader in ((0, 1), (1, 2)):
        client.hset("lowtide:partitions:orders", str(p), PartitionState(
            topic="orders", partition=p, leader=leader, leader_epoch=7, replicas=(1, 2), isr=(1, 2),
            partition_epoch=9).to_json())
    for b in (1, 2):
        client.hset("lowtide:brokers", str(b), BrokerInfo(id=b, host=f"10.0.0.{b}", port=9000).to_json())
    client.hset("lowtide:broker_configs", "", json.dumps({"leader.replication.throttled.rate": "1000"}))
    client.set("lowtide:txn:next_producer_id", 4242)
    client.close()


def test_migrate_copies_topics_partitions_with_their_epochs_brokers_and_configs_and_is_idempotent(
        redis_url, etcd_url) -> None:
    _write_legacy_cluster(redis_url)
    first = lowtide_cli("metadata", "migrate", "--from-redis", redis_url, "--metadata-url", etcd_url,
                        "--output", "json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["cluster_id"] == "c0ffee"
    assert doc["written"] == {"topics": 1, "partitions": 2, "brokers": 2, "broker_configs": 1, "producer_id_floor": 1}

    store = MetadataStore.from_url(etcd_url)
    try:
        store.start()
        assert store.stored_cluster_id() == "c0ffee"
        assert store.topic("orders").config == {"retention.ms": "60000"}
        state = store.partition_state("orders", 1)
        assert (state.leader, state.leader_epoch, state.partition_epoch, state.isr) == (2, 7, 9, (1, 2))
        assert sorted(store.brokers()) == [1, 2]
        assert store.broker_config("") == {"leader.replication.throttled.rate": "1000"}
        assert ProducerIdBlocks(store=store).next_id() == 4243  # never an id the old Redis gave
    finally:
        store.close()

    again = lowtide_cli("metadata", "migrate", "--from-redis", redis_url, "--metadata-url", etcd_url,
                        "--output", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["written"] == {"topics": 0, "partitions": 0, "brokers": 0, "broker_configs": 0,
                                                   "producer_id_floor": 0}


def test_migrate_refuses_an_etcd_of_another_cluster_and_writes_nothing(redis_url, etcd_url) -> None:
    _write_legacy_cluster(redis_url)
    store = MetadataStore.from_url(etcd_url)
    try:
        store.create_cluster_id("another")
        result = lowtide_cli("metadata", "migrate", "--from-redis", redis_url, "--metadata-url", etcd_url,
                             "--output", "json")
        assert result.returncode != 0
        assert json.loads(result.stdout)["error"]["code"] == "INVALID_REQUEST"
        store.sync()
        assert store.topics() == {}
    finally:
        store.close()


def test_migrate_dry_run_reads_and_writes_nothing(redis_url, etcd_url) -> None:
    _write_legacy_cluster(redis_url)
    result = lowtide_cli("metadata", "migrate", "--from-redis", redis_url, "--metadata-url", etcd_url,
                         "--dry-run", "--output", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["read"]["partitions"] == 2
    store = MetadataStore.from_url(etcd_url)
    try:
        store.start()
        assert store.stored_cluster_id() is None
    finally:
        store.close()
