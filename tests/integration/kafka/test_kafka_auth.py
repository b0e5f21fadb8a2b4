"""Auth on the Kafka listener: SASL/PLAIN with lowtide tokens (username = principal name, password =
token), nothing served before authentication, and the same ACL decisions as gRPC."""

from __future__ import annotations

import socket
import struct

import pytest
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka import Producer
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAuthorizationFailedError

from lowtide.client import Admin
from lowtide.errors import InvalidTopic
from lowtide.groups import (
    OFFSETS_TOPIC,
    OffsetKey,
    OffsetValue,
    encode_offset_key,
    encode_offset_value,
    partition_for_group,
)
from lowtide.localcluster import ClusterConfig
from lowtide.record import encode_batch
from lowtide_pb import replica_pb2
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster


def _sasl(user: str, password: str) -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": user,
            "sasl_plain_password": password}


@pytest.fixture(scope="module")
def secured(request, tmp_path_factory):
    """One auth-on cluster for the module: the tests fault nothing, write topics of their own, and
    what they grant alice (DESCRIBE and DELETE on ``guarded``, ALL on the offsets topic) is nothing
    another test here asserts she lacks."""
    tmp = tmp_path_factory.mktemp("kafka-auth")
    tokens = tmp / "tokens"
    tokens.write_text("admin-secret User:admin\nalice-secret User:alice\n")
    config = ClusterConfig(data_dir=tmp / "cluster", replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
                           auth_enabled=True, tokens_file=tokens, super_users="User:admin")
    for cluster in running_cluster(request, config):
        yield cluster, tmp


def test_with_auth_on_every_api_needs_a_sasl_identity_and_acls_decide_as_on_grpc(secured):
    cluster, tmp = secured
    bootstrap = cluster.kafka_bootstrap
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000, **_sasl("admin", "admin-secret"))
    admin.create_topics([NewTopic("guarded", num_partitions=1, replication_factor=3)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **_sasl("admin", "admin-secret"))
    for i in range(10):
        producer.send("guarded", value=b"%d" % i, partition=0)
    producer.flush(timeout=30)
    producer.close()

    # alice may DESCRIBE the topic but not DELETE from it: her delete is refused for the partition
    # (TOPIC_AUTHORIZATION_FAILED, as gRPC answers it) and nothing moves
    admin_cfg = tmp / "admin.properties"
    admin_cfg.write_text("lowtide.auth.token=admin-secret\n")
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", str(admin_cfg),
               "--principal", "User:alice", "--operation", "describe", "--topic", "guarded")
    s.wait_acls_in_force()
    alice = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000, **_sasl("alice", "alice-secret"))
    s.wait_until(lambda: "guarded" in alice.list_topics(), what="alice sees the topic")
    with pytest.raises(TopicAuthorizationFailedError):
        alice.delete_records({TopicPartition("guarded", 0): 5}, timeout_ms=5000)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=10000, **_sasl("admin", "admin-secret"))
    consumer.assign([TopicPartition("guarded", 0)])
    consumer.seek_to_beginning()
    assert next(iter(consumer)).offset == 0
    # granted DELETE on the topic (the same ACL the gRPC path checks), her delete goes through
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", str(admin_cfg),
               "--principal", "User:alice", "--operation", "delete", "--topic", "guarded")
    s.wait_acls_in_force()
    results: list = []
    s.wait_until(lambda: results.append(_try_delete(alice, "guarded", 5)) or results[-1] is not None,
                 what="alice's delete allowed")
    assert results[-1][TopicPartition("guarded", 0)]["low_watermark"] == 5
    for client in (alice, admin, consumer):
        client.close()


def _try_delete(admin: KafkaAdminClient, topic: str, offset: int):
    try:
        return admin.delete_records({TopicPartition(topic, 0): offset}, timeout_ms=5000)
    except TopicAuthorizationFailedError:
        return None


def test_a_wrong_password_or_anothers_token_is_refused(secured):
    cluster, _ = secured
    for user, password in (("alice", "wrong"), ("admin", "alice-secret")):
        with pytest.raises(KafkaError):
            KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=5000,
                             api_version_auto_timeout_ms=5000, **_sasl(user, password)).list_topics()


def test_a_request_before_authentication_closes_the_connection_unanswered(secured):
    cluster, _ = secured
    host, port = cluster.kafka_bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # Metadata v1 for all topics, no SASL first
        payload = struct.pack(">hhih", 3, 1, 5, 4) + b"test" + struct.pack(">i", -1)
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        assert sock.recv(4) == b""  # closed, nothing answered


def test_with_auth_on_internal_topics_refuse_every_clients_produce_whatever_the_acls(secured):
    cluster, tmp = secured
    admin_token = [("authorization", "Bearer admin-secret")]
    alice_token = [("authorization", "Bearer alice-secret")]
    s.create_topic(cluster, "ledger", metadata=admin_token)
    with Admin(cluster.bootstrap, metadata=admin_token) as lowtide:
        assert lowtide.commit_offsets("payroll", {("ledger", 0): 42}) == {("ledger", 0): None}
    admin_cfg = tmp / "admin.properties"
    admin_cfg.write_text("lowtide.auth.token=admin-secret\n")
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", str(admin_cfg),
               "--principal", "User:alice", "--operation", "all", "--topic", OFFSETS_TOPIC)
    s.wait_acls_in_force()
    partition = partition_for_group("payroll", partitions=s.store(cluster).topic(OFFSETS_TOPIC).partitions)
    key = encode_offset_key(OffsetKey("payroll", "ledger", 0))
    value = encode_offset_value(OffsetValue(offset=0, metadata="", commit_timestamp=0))

    def kafka_produce(user: str, password: str) -> list:
        producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "security.protocol": "SASL_PLAINTEXT",
                             "sasl.mechanisms": "PLAIN", "sasl.username": user, "sasl.password": password,
                             "acks": "all", "message.timeout.ms": 15000})
        errors: list = []
        producer.produce(OFFSETS_TOPIC, partition=partition, key=key, value=value,
                         on_delivery=lambda err, _m: errors.append(err and err.code()))
        producer.flush(20)
        return errors

    # alice, granted ALL on the topic, and the super user (CLUSTER_ACTION included), over Kafka
    assert kafka_produce("alice", "alice-secret") == [ConfluentError.TOPIC_EXCEPTION]
    assert kafka_produce("admin", "admin-secret") == [ConfluentError.TOPIC_EXCEPTION]
    # over gRPC: the super user not saying it is a coordinator, and alice saying so without CLUSTER_ACTION
    leader = s.replica(cluster, s.leader_of(cluster, OFFSETS_TOPIC, partition))
    batch = encode_batch([value], keys=[key])
    for token, coordinator in ((admin_token, False), (alice_token, True)):
        answer = leader.Produce(replica_pb2.ProduceRequest(acks=-1, timeout_ms=10000, coordinator_append=coordinator,
                                                           partitions=[replica_pb2.ProducePartition(
                                                               topic=OFFSETS_TOPIC, partition=partition,
                                                               records=batch)]), metadata=token, timeout=20)
        assert answer.partitions[0].error_code == InvalidTopic.code
    with Admin(cluster.bootstrap, metadata=admin_token) as lowtide:
        assert {tp: c.offset for tp, c in lowtide.fetch_offsets("payroll").items()} == {("ledger", 0): 42}
