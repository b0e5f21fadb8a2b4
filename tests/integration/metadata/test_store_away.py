"""With the metadata store unreachable, the data plane keeps working (issue 51,
docs/design/metadata.md#when-the-store-is-away).

On real processes: every second a *new* Kafka client (kafka-python) bootstraps through the front
door's Kafka listener, produces one record with acks=all, reads it back and deletes up to it with
DeleteRecords, first with etcd up, then with every etcd member stopped for 30 s. The rounds must
succeed as often with the store away as with it up. A topic creation meanwhile fails with a
retriable error, and succeeds once the store is back.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError

from lowtide.localcluster import LocalCluster
from tests.integration.support import create_topic

TOPIC = "away"
AWAY_S = 30.0


def _one_round(bootstrap: str, n: int) -> bool:
    """A new client's bootstrap, acks=all produce, fetch and DeleteRecords; True when all worked."""
    producer = admin = consumer = None
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=5000, max_block_ms=5000,
                                 retries=2)
        sent = producer.send(TOPIC, value=b"round-%d" % n, partition=0).get(timeout=10)
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=5000, request_timeout_ms=6000)
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, sent.offset)
        values = [r.value for r in consumer]
        if not values or values[0] != b"round-%d" % n:
            return False
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        result = admin.delete_records({tp: sent.offset + 1})
        return result[tp]["low_watermark"] == sent.offset + 1
    except KafkaError:
        return False
    finally:
        for client in (producer, consumer, admin):
            if client is not None:
                client.close()


def _rounds(bootstrap: str, *, seconds: float, first: int) -> tuple[int, int]:
    """(succeeded, tried) of one round per second for ``seconds``."""
    ok = tried = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        ok += _one_round(bootstrap, first + tried)
        tried += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    return ok, tried


def test_new_kafka_clients_produce_fetch_and_delete_records_with_every_etcd_member_stopped(
        cluster_factory) -> None:
    cluster: LocalCluster = cluster_factory()
    create_topic(cluster, TOPIC, partitions=1, rf=3)
    bootstrap = cluster.state.kafka_bootstrap
    if not bootstrap:
        pytest.skip("this cluster has no Kafka listener")
    up_ok, up_tried = _rounds(bootstrap, seconds=8, first=0)
    assert up_ok == up_tried, f"with the store up only {up_ok} of {up_tried} rounds succeeded"

    members = [s.name for s in cluster.services("etcd")]
    for name in members:
        cluster.stop_service(name)
    try:
        away_ok, away_tried = _rounds(bootstrap, seconds=AWAY_S, first=up_tried)
        # What needs the store waits, then fails with a retriable error.
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
        try:
            with pytest.raises(KafkaError) as failed:
                admin.create_topics([NewTopic("made-while-away", 1, 3)], timeout_ms=15000)
            assert failed.value.retriable, failed.value
        finally:
            admin.close()
    finally:
        for name in members:
            cluster.start_service(name)
    assert away_ok == away_tried, f"with every etcd member stopped only {away_ok} of {away_tried} rounds succeeded"

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.create_topics([NewTopic("made-while-away", 1, 3)], timeout_ms=15000)
                break
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                time.sleep(1)
    finally:
        admin.close()
