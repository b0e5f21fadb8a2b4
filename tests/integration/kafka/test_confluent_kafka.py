"""confluent-kafka (librdkafka, a C client independent of kafka-python) against a local cluster's
Kafka listener, unchanged: topics, idempotent acks=all produce, a consumer group with commits,
KIP-107 delete_records, and Kafka's error names, including after a kill -9 of a leader."""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from lowtide.localcluster import ClusterConfig
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("confluent"), replicas=3,
                                                      replica_config=dict(DEFAULT_REPLICA_CONFIG),
                                                      session_timeout_ms=2000))


@pytest.fixture(scope="module")
def admin(kcluster):
    return AdminClient({"bootstrap.servers": kcluster.kafka_bootstrap})


def _create(admin: AdminClient, name: str, partitions: int, rf: int = 3) -> None:
    for future in admin.create_topics([NewTopic(name, partitions, rf)], operation_timeout=15).values():
        future.result(timeout=30)


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    failures = []
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % partitions,
                         on_delivery=lambda err, _msg: err is not None and failures.append(err))
    assert producer.flush(30) == 0
    assert failures == []


def _poll(consumer: Consumer, count: int, timeout_s: float = 30.0) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got.append(message)
    return got


def test_idempotent_acks_all_produce_is_read_back_in_order(kcluster, admin):
    _create(admin, "c-orders", 2)
    _produce(kcluster.kafka_bootstrap, "c-orders", [b"v%03d" % i for i in range(300)], 2)
    consumer = Consumer({"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "c-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("c-orders", p, 0) for p in (0, 1)])
    got = _poll(consumer, 300)
    consumer.close()
    assert [m.value() for m in got if m.partition() == 0] == [b"v%03d" % i for i in range(0, 300, 2)]
    assert [m.offset() for m in got if m.partition() == 1] == list(range(150))


def test_delete_records_returns_each_partitions_low_watermark(kcluster, admin):
    _create(admin, "c-trim", 2)
    _produce(kcluster.kafka_bootstrap, "c-trim", [b"%d" % i for i in range(60)], 2)
    futures = admin.delete_records([TopicPartition("c-trim", 0, 10), TopicPartition("c-trim", 1, 25)])
    marks = {tp.partition: f.result(timeout=30).low_watermark for tp, f in futures.items()}
    assert marks == {0: 10, 1: 25}
    consumer = Consumer({"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "c-marks"})
    assert consumer.get_watermark_offsets(TopicPartition("c-trim", 0), timeout=10) == (10, 30)
    consumer.close()


def test_delete_records_above_the_high_watermark_is_offset_out_of_range(kcluster, admin):
    _create(admin, "c-short", 1)
    _produce(kcluster.kafka_bootstrap, "c-short", [b"x"], 1)
    future = admin.delete_records([TopicPartition("c-short", 0, 99)])[TopicPartition("c-short", 0, 99)]
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=30)
    assert raised.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE


def test_producing_to_an_unknown_topic_names_unknown_topic_or_partition(kcluster):
    # librdkafka waits topic.metadata.propagation.max.ms for a topic the brokers call unknown
    # (it may be being created) before it fails the message with the brokers' error.
    producer = Producer({"bootstrap.servers": kcluster.kafka_bootstrap, "message.timeout.ms": 15000,
                         "topic.metadata.propagation.max.ms": 1000})
    errors = []
    producer.produce("no-such-topic", value=b"x", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(20)
    assert errors and errors[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


def test_a_kill_9_of_the_leader_loses_no_acknowledged_record(kcluster, admin):
    _create(admin, "c-failover", 1)
    _produce(kcluster.kafka_bootstrap, "c-failover", [b"before-%d" % i for i in range(50)], 1)
    leader = s.leader_of(kcluster, "c-failover")
    kcluster.kill(f"replica-{leader}", signal.SIGKILL)
    try:
        _produce(kcluster.kafka_bootstrap, "c-failover", [b"after-%d" % i for i in range(50)], 1)
        consumer = Consumer({"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "c-failover"})
        consumer.assign([TopicPartition("c-failover", 0, 0)])
        got = [m.value() for m in _poll(consumer, 100)]
        consumer.close()
        assert got == [b"before-%d" % i for i in range(50)] + [b"after-%d" % i for i in range(50)]
        assert s.leader_of(kcluster, "c-failover") != leader
    finally:
        kcluster.start_service(f"replica-{leader}")
