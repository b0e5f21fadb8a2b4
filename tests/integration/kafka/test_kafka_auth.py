"""Auth on the Kafka listener: SASL/PLAIN with lowtide tokens (username = principal name, password =
token), nothing served before authentication, and the same ACL decisions as gRPC."""

from __future__ import annotations

import socket
import struct

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAuthorizationFailedError

from tests.integration import support as s


def _sasl(user: str, password: str) -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": user,
            "sasl_plain_password": password}


@pytest.fixture
def secured(cluster_factory, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("admin-secret User:admin\nalice-secret User:alice\n")
    cluster = cluster_factory(auth_enabled=True, tokens_file=tokens, super_users="User:admin")
    return cluster, tmp_path


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
