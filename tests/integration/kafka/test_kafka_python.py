"""kafka-python (a pure-Python Kafka client) against a local cluster's Kafka listener, unchanged:
topics, idempotent acks=all produce, consume, KIP-107 delete_records, and Kafka's error names."""

from __future__ import annotations

import datetime
import io
import json
import socket
import struct
import sys
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import OffsetOutOfRangeError, TopicAlreadyExistsError, UnknownTopicOrPartitionError
from kio.serial import entity_reader, entity_writer

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from lowtide.errors import InvalidRequest
from lowtide.kafka.protocol import request_type, response_type


@pytest.fixture(scope="module")
def kcluster(shared_cluster):
    """The worker's shared cluster: these tests fault nothing, and their topics and group are their own (kp-)."""
    return shared_cluster


@pytest.fixture(scope="module")
def admin(kcluster):
    client = KafkaAdminClient(bootstrap_servers=kcluster.kafka_bootstrap, request_timeout_ms=15000)
    yield client
    client.close()


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int, **config) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=10000, **config)
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    out = []
    for message in consumer:
        out.append(message)
        if len(out) >= expected:
            break
    consumer.close()
    return out


def test_cluster_json_names_a_kafka_bootstrap_and_each_services_kafka_address(kcluster):
    doc = json.loads((kcluster.data_dir / "cluster.json").read_text())
    assert doc["kafka_bootstrap"] == kcluster.kafka_bootstrap
    kinds = {s["kind"]: s for s in doc["services"]}
    assert kinds["replica"]["kafka"].startswith("127.0.0.1:")
    assert kinds["frontdoor"]["kafka"] == doc["kafka_bootstrap"]


def test_metadata_lists_the_replicas_as_brokers_with_the_real_leaders_and_isr(kcluster, admin):
    admin.create_topics([NewTopic("kp-meta", num_partitions=3, replication_factor=3)])
    described = {t["name"]: t for t in admin.describe_topics(["kp-meta"])}["kp-meta"]
    with Admin(kcluster.bootstrap) as lowtide:
        truth = lowtide.describe_topics(["kp-meta"])["kp-meta"]
    leaders = {p["partition_index"]: (p["leader_id"], sorted(p["isr_nodes"])) for p in described["partitions"]}
    assert leaders == {p.partition: (p.leader, sorted(p.isr)) for p in truth.partitions}
    brokers = {b.get("broker_id", b.get("node_id")) for b in admin.describe_cluster()["brokers"]}
    assert brokers == {0, 1, 2}


def test_creating_a_topic_twice_is_topic_already_exists(admin):
    admin.create_topics([NewTopic("kp-twice", num_partitions=1, replication_factor=1)])
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic("kp-twice", num_partitions=1, replication_factor=1)])


def test_idempotent_acks_all_produce_is_read_back_in_order(kcluster, admin):
    admin.create_topics([NewTopic("kp-orders", num_partitions=2, replication_factor=3)])
    producer = KafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap, acks="all", enable_idempotence=True,
                             linger_ms=5)
    for i in range(200):
        producer.send("kp-orders", key=b"k", value=b"v%03d" % i, partition=i % 2)
    producer.flush(timeout=30)
    producer.close()
    got = _consume_all(kcluster.kafka_bootstrap, "kp-orders", 2, 200)
    by_partition = {p: [m.value for m in got if m.partition == p] for p in (0, 1)}
    assert by_partition[0] == [b"v%03d" % i for i in range(0, 200, 2)]
    assert by_partition[1] == [b"v%03d" % i for i in range(1, 200, 2)]
    assert [m.offset for m in got if m.partition == 0] == list(range(100))


def test_delete_records_returns_each_partitions_low_watermark_and_the_consumer_starts_there(kcluster, admin):
    admin.create_topics([NewTopic("kp-trim", num_partitions=2, replication_factor=3)])
    producer = KafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap, acks="all")
    for i in range(100):
        producer.send("kp-trim", value=b"%d" % i, partition=i % 2)
    producer.flush(timeout=30)
    producer.close()
    result = admin.delete_records({TopicPartition("kp-trim", 0): 20, TopicPartition("kp-trim", 1): 35})
    watermarks = {tp.partition: r["low_watermark"] for tp, r in result.items()}
    assert watermarks == {0: 20, 1: 35}
    with Admin(kcluster.bootstrap) as lowtide:
        earliest = lowtide.list_offsets({("kp-trim", 0): OffsetSpec.EARLIEST, ("kp-trim", 1): OffsetSpec.EARLIEST})
    assert {k[1]: v.offset for k, v in earliest.items()} == {0: 20, 1: 35}
    got = _consume_all(kcluster.kafka_bootstrap, "kp-trim", 2, 95, auto_offset_reset="earliest")
    assert min(m.offset for m in got if m.partition == 0) == 20
    assert min(m.offset for m in got if m.partition == 1) == 35


def test_a_consumer_positioned_below_the_low_watermark_resets_to_it(kcluster, admin):
    admin.create_topics([NewTopic("kp-reset", num_partitions=1, replication_factor=3)])
    producer = KafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap, acks="all")
    for i in range(30):
        producer.send("kp-reset", value=b"%d" % i, partition=0)
    producer.flush(timeout=30)
    producer.close()
    admin.delete_records({TopicPartition("kp-reset", 0): 12})
    consumer = KafkaConsumer(bootstrap_servers=kcluster.kafka_bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=10000)
    tp = TopicPartition("kp-reset", 0)
    consumer.assign([tp])
    consumer.seek(tp, 3)  # below the low watermark: OFFSET_OUT_OF_RANGE, then the reset policy
    first = next(iter(consumer))
    consumer.close()
    assert first.offset == 12 and first.value == b"12"


def test_delete_records_above_the_high_watermark_is_offset_out_of_range(kcluster, admin):
    admin.create_topics([NewTopic("kp-short", num_partitions=1, replication_factor=3)])
    producer = KafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap, acks="all")
    producer.send("kp-short", value=b"x", partition=0)
    producer.flush(timeout=30)
    producer.close()
    with pytest.raises(OffsetOutOfRangeError):
        admin.delete_records({TopicPartition("kp-short", 0): 50}, timeout_ms=5000)


def test_an_unknown_topic_is_unknown_topic_or_partition(admin):
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_records({TopicPartition("nope", 0): 1}, timeout_ms=3000)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _read_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    return sock.recv(size, socket.MSG_WAITALL)


def test_an_api_version_not_served_is_answered_unsupported_version_and_the_connection_stays_usable(kcluster):
    host, port = kcluster.kafka_bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # DeleteRecords v9 (no such version): answered, with its correlation id.
        sock.sendall(_frame(struct.pack(">hhih", 21, 9, 7, 4) + b"test"))
        assert struct.unpack_from(">i", _read_frame(sock))[0] == 7
        # ApiVersions v99: answered in v0 with error 35 and the versions served (KIP-511).
        sock.sendall(_frame(struct.pack(">hhih", 18, 99, 8, 4) + b"test"))
        correlation, code, count = struct.unpack_from(">ihi", _read_frame(sock))
        assert (correlation, code) == (8, 35) and count >= 10
        # Then a real ApiVersions v0 on the same connection: served.
        sock.sendall(_frame(struct.pack(">hhih", 18, 0, 9, 4) + b"test"))
        correlation, code, count = struct.unpack_from(">ihi", _read_frame(sock))
        assert (correlation, code) == (9, 0) and count >= 10


def test_a_group_consumers_commits_are_lowtides_committed_offsets_and_the_group_is_described(kcluster, admin):
    admin.create_topics([NewTopic("kp-grouped", num_partitions=4, replication_factor=3)])
    producer = KafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap, acks="all")
    for i in range(80):
        producer.send("kp-grouped", value=b"%d" % i, partition=i % 4)
    producer.flush(timeout=30)
    producer.close()
    consumer = KafkaConsumer("kp-grouped", bootstrap_servers=kcluster.kafka_bootstrap, group_id="kp-team",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    seen: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(seen) < 80 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            seen += [r.value for r in records]
    consumer.commit()
    assert sorted(seen) == sorted(b"%d" % i for i in range(80))
    assert {tp.partition for tp in consumer.assignment()} == {0, 1, 2, 3}
    with Admin(kcluster.bootstrap) as lowtide:
        committed = lowtide.fetch_offsets("kp-team")
        described = lowtide.describe_groups(["kp-team"])["kp-team"]
    assert {tp[1]: c.offset for tp, c in committed.items()} == {0: 20, 1: 20, 2: 20, 3: 20}
    assert described.state == "Stable" and described.protocol_type == "consumer" and len(described.members) == 1
    consumer.close()


def _kafka_call(address: str, api_key: int, version: int, body) -> object:
    """One request framed as any Kafka client frames it, over a plain socket; the decoded answer."""
    header = request_type(api_key, version).__header_schema__
    buf = io.BytesIO()
    entity_writer(header)(buf, header(request_api_key=api_key, request_api_version=version, correlation_id=11,
                                      client_id="test"))
    entity_writer(type(body))(buf, body)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_frame(buf.getvalue()))
        payload = _read_frame(sock)
    answer = response_type(api_key, version)
    return entity_reader(answer)(payload, 4 + (1 if answer.__flexible__ else 0))[0]


@pytest.mark.parametrize("version", [0, 2])
def test_a_partition_named_twice_in_one_delete_records_is_deleted_to_its_last_offset_and_answered_once(
        kcluster, admin, version):
    topic = f"kp-deleted-twice-v{version}"
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=3)])
    producer = KafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap, acks="all")
    for i in range(40):
        producer.send(topic, value=b"%d" % i, partition=i % 2)
    producer.flush(timeout=30)
    producer.close()
    schema = sys.modules[request_type(21, version).__module__]
    answer = _kafka_call(kcluster.kafka_bootstrap, 21, version, schema.DeleteRecordsRequest(
        topics=(schema.DeleteRecordsTopic(name=topic, partitions=(
                    schema.DeleteRecordsPartition(partition_index=0, offset=3),
                    schema.DeleteRecordsPartition(partition_index=1, offset=4),
                    schema.DeleteRecordsPartition(partition_index=0, offset=7))),
                schema.DeleteRecordsTopic(name=topic, partitions=(
                    schema.DeleteRecordsPartition(partition_index=1, offset=9),))),
        timeout=datetime.timedelta(seconds=15)))
    # as Kafka: the last offset of each partition applied, each partition answered once
    assert [(t.name, [(p.partition_index, p.low_watermark, p.error_code) for p in t.partitions])
            for t in answer.topics] == [(topic, [(0, 7, 0), (1, 9, 0)])]
    consumer = KafkaConsumer(bootstrap_servers=kcluster.kafka_bootstrap)
    assert consumer.beginning_offsets([TopicPartition(topic, 0), TopicPartition(topic, 1)]) == {
        TopicPartition(topic, 0): 7, TopicPartition(topic, 1): 9}
    consumer.close()
    # the gRPC door still refuses the whole request
    with Admin(kcluster.bootstrap) as lowtide, pytest.raises(InvalidRequest):
        lowtide.delete_records([(topic, 0, 10), (topic, 0, 11)])
