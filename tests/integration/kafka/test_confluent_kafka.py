"""confluent-kafka (librdkafka, a C client independent of kafka-python) against a local cluster's
Kafka listener, unchanged: topics, idempotent acks=all produce, a consumer group with commits,
KIP-107 delete_records, and Kafka's error names, including after a kill -9 of a leader."""

from __future__ import annotations

import signal
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from lowtide.client import Admin
from lowtide.groups import (
    OFFSETS_TOPIC,
    OffsetKey,
    OffsetValue,
    encode_offset_key,
    encode_offset_value,
    partition_for_group,
)
from lowtide.localcluster import ClusterConfig
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

OFFSET_NOT_AVAILABLE = 78


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
    through_front_door = s.metric(kcluster, "frontdoor-0", "lowtide_delete_records_duration_seconds_count")
    futures = admin.delete_records([TopicPartition("c-trim", 0, 10), TopicPartition("c-trim", 1, 25)])
    marks = {tp.partition: f.result(timeout=30).low_watermark for tp, f in futures.items()}
    assert marks == {0: 10, 1: 25}
    # The AdminClient sent each partition to its leader, which answered in process (issue 47).
    assert s.metric(kcluster, "frontdoor-0", "lowtide_delete_records_duration_seconds_count") == through_front_door
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


def test_a_clients_keyed_produce_to_consumer_offsets_is_invalid_topic_and_the_groups_offsets_stay(kcluster, admin):
    _create(admin, "ledger", 1)
    with Admin(kcluster.bootstrap) as lowtide:
        assert lowtide.commit_offsets("payroll", {("ledger", 0): 42}) == {("ledger", 0): None}
    partitions = len(admin.list_topics(OFFSETS_TOPIC, timeout=10).topics[OFFSETS_TOPIC].partitions)
    producer = Producer({"bootstrap.servers": kcluster.kafka_bootstrap, "acks": "all", "message.timeout.ms": 15000})
    errors = []
    # a commit record in Kafka's own format rewinding the group to 0, as its coordinator would write it
    producer.produce(OFFSETS_TOPIC, partition=partition_for_group("payroll", partitions=partitions),
                     key=encode_offset_key(OffsetKey("payroll", "ledger", 0)),
                     value=encode_offset_value(OffsetValue(offset=0, metadata="", commit_timestamp=0)),
                     on_delivery=lambda err, _m: errors.append(err))
    producer.flush(20)
    assert [e.code() if e else None for e in errors] == [KafkaError.TOPIC_EXCEPTION]
    with Admin(kcluster.bootstrap) as lowtide:
        assert {tp: c.offset for tp, c in lowtide.fetch_offsets("payroll").items()} == {("ledger", 0): 42}
        # the group coordinator itself still writes the topic
        assert lowtide.commit_offsets("payroll", {("ledger", 0): 43}) == {("ledger", 0): None}
        assert {tp: c.offset for tp, c in lowtide.fetch_offsets("payroll").items()} == {("ledger", 0): 43}


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


def test_two_consumers_in_one_group_split_the_partitions_and_one_takes_over_when_the_other_leaves(kcluster, admin):
    _create(admin, "c-shared", 4)
    _produce(kcluster.kafka_bootstrap, "c-shared", [b"a%03d" % i for i in range(200)], 4)
    config = {"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "c-shared-group",
              "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    first, second = Consumer({**config, "client.id": "first"}), Consumer({**config, "client.id": "second"})
    first.subscribe(["c-shared"])
    second.subscribe(["c-shared"])
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 60
    # librdkafka joins in its own threads; polling both in turn just collects what they fetch.
    while time.monotonic() < deadline:
        for consumer in (first, second):
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                seen.add((message.partition(), message.offset()))
        owned = [{tp.partition for tp in c.assignment()} for c in (first, second)]
        if len(seen) == 200 and all(owned) and not owned[0] & owned[1] and owned[0] | owned[1] == {0, 1, 2, 3}:
            break
    assert len(seen) == 200
    assert all(owned) and not owned[0] & owned[1] and owned[0] | owned[1] == {0, 1, 2, 3}, owned
    for consumer in (first, second):
        consumer.commit(asynchronous=False)
    second.close()  # LeaveGroup: the first member gets every partition at the next rebalance
    _produce(kcluster.kafka_bootstrap, "c-shared", [b"b%03d" % i for i in range(40)], 4)
    later: list[bytes] = []
    deadline = time.monotonic() + 60
    while (len(later) < 40 or len(first.assignment()) < 4) and time.monotonic() < deadline:
        message = first.poll(0.2)
        if message is not None and message.error() is None and message.value().startswith(b"b"):
            later.append(message.value())
    assert {tp.partition for tp in first.assignment()} == {0, 1, 2, 3}
    assert sorted(later) == [b"b%03d" % i for i in range(40)]
    with Admin(kcluster.bootstrap) as lowtide:
        described = lowtide.describe_groups(["c-shared-group"])["c-shared-group"]
    assert described.state == "Stable" and len(described.members) == 1
    first.close()


def _kafka_address(cluster, name: str) -> tuple[str, int]:
    host, port = cluster.service(name).kafka.rsplit(":", 1)
    return host, int(port)


def _list_latest_offset_v1(address: tuple[str, int], topic: str, partition: int) -> tuple[int, int]:
    """(error code, offset) of a raw ListOffsets v1 (latest) sent to one broker, encoded by hand
    so that no client library's retry hides the broker's own answer."""
    name = topic.encode()
    body = struct.pack(">iih", -1, 1, len(name)) + name + struct.pack(">iiq", 1, partition, -1)
    payload = struct.pack(">hhih", 2, 1, 41, 4) + b"test" + body
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        answer = sock.recv(size, socket.MSG_WAITALL)
    correlation, topics, name_len = struct.unpack_from(">iih", answer)
    assert (correlation, topics) == (41, 1)
    _partitions, got_partition, code, _timestamp, offset = struct.unpack_from(">iihqq", answer, 10 + name_len)
    assert got_partition == partition
    return code, offset


def test_after_a_kill_9_the_restarted_old_leader_answers_not_leader_or_follower(kcluster, admin):
    _create(admin, "c-not-leader", 1)
    _produce(kcluster.kafka_bootstrap, "c-not-leader", [b"x%d" % i for i in range(10)], 1)
    old = s.leader_of(kcluster, "c-not-leader")
    kcluster.kill(f"replica-{old}", signal.SIGKILL)
    try:
        deadline = time.monotonic() + 30
        while s.leader_of(kcluster, "c-not-leader") == old and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        kcluster.start_service(f"replica-{old}")
    new = s.leader_of(kcluster, "c-not-leader")
    assert new != old
    # Just elected, the new leader may not know the HW yet (a follower learns it one round late):
    # it answers OFFSET_NOT_AVAILABLE, retriable, never an offset below the acknowledged records,
    # until its follower's fetch brings the HW to the start of its epoch (as Kafka's leader does).
    answers = []

    def settled() -> bool:
        answers.append(_list_latest_offset_v1(_kafka_address(kcluster, f"replica-{new}"), "c-not-leader", 0))
        return answers[-1][0] != OFFSET_NOT_AVAILABLE

    s.wait_until(settled, timeout_s=30, interval_s=0.05, what="the new leader's HW")
    assert set(answers[:-1]) <= {(OFFSET_NOT_AVAILABLE, -1)}, answers
    assert answers[-1] == (0, 10)
    code, _ = _list_latest_offset_v1(_kafka_address(kcluster, f"replica-{old}"), "c-not-leader", 0)
    assert code == 6  # NOT_LEADER_OR_FOLLOWER, as a Kafka follower answers


def test_a_commit_keeps_the_leader_epoch_the_consumer_saw_and_offset_fetch_returns_it(kcluster, admin):
    # KIP-320: the consumer commits the epoch of the last record it read; after a restart it
    # validates its position against that epoch (OffsetForLeaderEpoch) instead of trusting it blindly.
    _create(admin, "c-epoch", 1)
    _produce(kcluster.kafka_bootstrap, "c-epoch", [b"e%d" % i for i in range(10)], 1)
    consumer = Consumer({"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "c-epoch-group",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("c-epoch", 0, 0)])
        got = _poll(consumer, 10)
        epoch = got[-1].leader_epoch()
        assert epoch is not None and epoch >= 0
        consumer.commit(message=got[-1], asynchronous=False)
        [committed] = consumer.committed([TopicPartition("c-epoch", 0)], timeout=10)
    finally:
        consumer.close()
    assert (committed.offset, committed.leader_epoch) == (10, epoch)
    with Admin(kcluster.bootstrap) as lowtide_admin:
        stored = lowtide_admin.fetch_offsets("c-epoch-group", [("c-epoch", 0)])[("c-epoch", 0)]
    assert (stored.offset, stored.leader_epoch) == (10, epoch)


def test_metadata_answers_are_kept_while_current_and_a_new_topic_shows_at_once(kcluster, admin):
    listeners = [e.name for e in kcluster.services() if e.kafka]

    def kept() -> float:
        return sum(s.metric(kcluster, name, "lowtide_kafka_metadata_answers_total", source="kept")
                   for name in listeners)

    before = kept()
    answers = [admin.list_topics(timeout=10) for _ in range(6)]  # librdkafka picks any broker each time
    assert len({frozenset(a.topics) for a in answers}) == 1
    assert kept() > before
    _create(admin, "c-meta-new", 3)
    s.wait_until(lambda: len(s.store(kcluster).partition_states("c-meta-new")) == 3)
    # The store moved: a kept answer is not served, and the new topic is in the next one.
    s.wait_until(lambda: len(admin.list_topics(timeout=10).topics["c-meta-new"].partitions) == 3)
