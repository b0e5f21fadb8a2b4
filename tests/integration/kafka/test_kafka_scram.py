"""SASL/SCRAM-SHA-256 on the Kafka listener of a real auth-on cluster, with unchanged Kafka clients:
kafka-python, confluent-kafka (librdkafka) and Apache Kafka's own Java tools.

Credentials are made three ways (``lowtide scram set``, confluent-kafka's AdminClient and
``kafka-configs``, the last two through Kafka's AlterUserScramCredentials on the listener); ACLs
through the gRPC Admin service (``lowtide acls add``). A SCRAM user's identity is a session token
the listener minted, so the decisions of the in-process servicers (Produce, Fetch) and of the
front door (DeleteRecords, the consumer group calls, forwarded over gRPC) are the gRPC ones.

Sessions last 6 s in this cluster (``--kafka-connections-max-reauth-ms``), so the clients
re-authenticate on their connections several times during a test.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis as redis_lib
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, TopicAuthorizationFailedError

from lowtide.client import Admin
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.kafka_tools import kafka_tool

SESSION_MS = 6000
ADMIN_TOKEN = "admin-secret"


@dataclass(frozen=True)
class Secured:
    """The module's auth-on cluster, a scratch directory, the admin's --command-config, and a
    metadata store on the cluster's etcd (to look at the session tokens)."""

    cluster: LocalCluster
    tmp: Path
    admin_cfg: Path
    metadata: MetadataStore

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def kafka_bootstrap(self) -> str:
        return self.cluster.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.cluster.redis_url


@pytest.fixture(scope="module")
def secured(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kafka-scram")
    tokens = tmp / "tokens"
    tokens.write_text(f"{ADMIN_TOKEN} User:admin\n")
    admin_cfg = tmp / "admin.properties"
    admin_cfg.write_text(f"lowtide.auth.token={ADMIN_TOKEN}\n")
    config = ClusterConfig(data_dir=tmp / "cluster", replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
                           auth_enabled=True, tokens_file=tokens, super_users="User:admin",
                           extra_env={"LOWTIDE_KAFKA_CONNECTIONS_MAX_REAUTH_MS": str(SESSION_MS)})
    for cluster in running_cluster(request, config):
        metadata = MetadataStore.from_url(cluster.metadata_url)
        try:
            yield Secured(cluster=cluster, tmp=tmp, admin_cfg=admin_cfg, metadata=metadata)
        finally:
            metadata.close()


def scram(user: str, password: str) -> dict:
    """kafka-python settings of a SCRAM-SHA-256 login."""
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": user, "sasl_plain_password": password}


def confluent_scram(bootstrap: str, user: str, password: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": password, **extra}


def admin_plain(bootstrap: str) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": "admin", "sasl.password": ADMIN_TOKEN}


def lowtide_admin(cluster) -> Admin:
    return Admin(cluster.bootstrap, metadata=[("authorization", f"Bearer {ADMIN_TOKEN}")])


def set_password(cluster, user: str, password: str) -> None:
    path = cluster.tmp / f"{user}.password"
    path.write_text(password + "\n")
    s.cli_json("scram", "set", "--bootstrap-server", cluster.bootstrap, "--command-config", str(cluster.admin_cfg),
               "--user", user, "--password-file", str(path))


def grant(cluster, principal: str, operation: str, *resource: str) -> None:
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", str(cluster.admin_cfg),
               "--principal", principal, "--operation", operation, *resource)
    s.wait_acls_in_force()


def create_topic(cluster, name: str, partitions: int = 1) -> None:
    s.create_topic(cluster.cluster, name, partitions=partitions,
                   metadata=[("authorization", f"Bearer {ADMIN_TOKEN}")])


def session_tokens_of(cluster, principal: str) -> int:
    """The token records of ``principal`` in the metadata store (SCRAM users have only sessions)."""
    return sum(1 for entry in section(cluster.metadata, "tokens").items().values()
               if entry.value == principal.encode())


def confluent_login_refused(bootstrap: str, user: str, password: str) -> bool:
    """Whether librdkafka reports an authentication failure for this login (its metadata call then
    only says the broker is unreachable; the reason comes through the error callback)."""
    errors: list[ConfluentError] = []
    admin = AdminClient(confluent_scram(bootstrap, user, password, error_cb=errors.append))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        admin.poll(0.2)
    return any(e.code() == ConfluentError._AUTHENTICATION and "Authentication failed" in e.str() for e in errors)


def produce(bootstrap: str, creds: dict, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **creds)
    try:
        for value in values:
            producer.send(topic, value=value, partition=0).get(timeout=30)
    finally:
        producer.close()


def consume(bootstrap: str, creds: dict, topic: str, count: int) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=15000, **creds)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        out = []
        for message in consumer:
            out.append(message.value)
            if len(out) == count:
                break
        return out
    finally:
        consumer.close()


def test_kafka_python_produces_and_consumes_after_a_scram_login_with_a_credential_from_lowtide_scram_set(secured):
    cluster = secured
    create_topic(cluster, "scram-orders")
    set_password(cluster, "alice", "alice-pw")
    grant(cluster, "User:alice", "write", "--topic", "scram-orders")
    grant(cluster, "User:alice", "read", "--topic", "scram-orders")
    produce(cluster.kafka_bootstrap, scram("alice", "alice-pw"), "scram-orders", [b"a", b"b", b"c"])
    assert consume(cluster.kafka_bootstrap, scram("alice", "alice-pw"), "scram-orders", 3) == [b"a", b"b", b"c"]
    # the credential lowtide describes has no secret in it, and the closed connections left no session
    listed = s.cli_json("scram", "list", "--bootstrap-server", cluster.bootstrap, "--command-config",
                        str(cluster.admin_cfg), "--user", "alice")
    assert listed == {"users": [{"user": "alice", "credentials": [{"mechanism": "SCRAM-SHA-256",
                                                                   "iterations": 8192}]}]}
    s.wait_until(lambda: session_tokens_of(cluster, "User:alice") == 0, what="alice's sessions ended")


def test_a_scram_user_without_an_acl_gets_topic_authorization_failed_then_is_allowed_after_the_grant(secured):
    cluster = secured
    create_topic(cluster, "scram-guarded")
    produce(cluster.kafka_bootstrap, {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                                      "sasl_plain_username": "admin", "sasl_plain_password": ADMIN_TOKEN},
            "scram-guarded", [b"%d" % i for i in range(10)])
    set_password(cluster, "bob", "bob-pw")
    # Produce: answered by the leader's in-process servicer
    with pytest.raises(TopicAuthorizationFailedError):
        produce(cluster.kafka_bootstrap, scram("bob", "bob-pw"), "scram-guarded", [b"x"])
    # DeleteRecords: forwarded by the leader's listener to the front door over gRPC
    bob = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=15000,
                           **scram("bob", "bob-pw"))
    try:
        grant(cluster, "User:bob", "describe", "--topic", "scram-guarded")
        s.wait_until(lambda: "scram-guarded" in bob.list_topics(), what="bob sees the topic")
        with pytest.raises(TopicAuthorizationFailedError):
            bob.delete_records({TopicPartition("scram-guarded", 0): 4}, timeout_ms=5000)
        grant(cluster, "User:bob", "delete", "--topic", "scram-guarded")
        grant(cluster, "User:bob", "write", "--topic", "scram-guarded")
        results: list = []
        s.wait_until(lambda: results.append(_try_delete(bob, "scram-guarded", 4)) or results[-1] is not None,
                     what="bob's delete allowed")
        assert results[-1][TopicPartition("scram-guarded", 0)]["low_watermark"] == 4
    finally:
        bob.close()
    s.wait_until(lambda: _try_produce(cluster.kafka_bootstrap, scram("bob", "bob-pw"), "scram-guarded"),
                 what="bob's produce allowed")


def _try_delete(admin: KafkaAdminClient, topic: str, offset: int):
    try:
        return admin.delete_records({TopicPartition(topic, 0): offset}, timeout_ms=5000)
    except TopicAuthorizationFailedError:
        return None


def _try_produce(bootstrap: str, creds: dict, topic: str) -> bool:
    try:
        produce(bootstrap, creds, topic, [b"bob"])
        return True
    except TopicAuthorizationFailedError:
        return False


def test_a_wrong_password_or_an_unknown_user_is_refused_by_kafka_python_and_confluent_kafka(secured):
    cluster = secured
    set_password(cluster, "carl", "carl-pw")
    for user, password in (("carl", "wrong"), ("nobody", "carl-pw")):
        with pytest.raises(KafkaError):
            KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=5000,
                             api_version_auto_timeout_ms=5000, **scram(user, password)).list_topics()
        assert confluent_login_refused(cluster.kafka_bootstrap, user, password)
    assert session_tokens_of(cluster, "User:carl") == 0


def test_confluent_kafka_creates_a_credential_reads_it_back_and_its_user_consumes_in_a_group(secured):
    cluster = secured
    bootstrap = cluster.kafka_bootstrap
    admin = AdminClient(admin_plain(bootstrap))
    for future in admin.create_topics([NewTopic("scram-events", 1, 3)], operation_timeout=15).values():
        future.result(timeout=30)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    for future in admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("erin", info, b"erin-pw")]).values():
        future.result(timeout=30)
    described = admin.describe_user_scram_credentials(["erin"])["erin"].result(timeout=30)
    [erin_info] = described.scram_credential_infos
    assert (erin_info.mechanism, erin_info.iterations) == (ScramMechanism.SCRAM_SHA_256, 4096)
    # ... and lowtide's own view of it is the same credential
    with lowtide_admin(cluster) as lt:
        assert lt.describe_user_scram_credentials(["erin"])["erin"].credentials == (("SCRAM-SHA-256", 4096),)
    for operation, resource in (("write", ("--topic", "scram-events")), ("read", ("--topic", "scram-events")),
                                ("read", ("--group", "erin-group"))):
        grant(cluster, "User:erin", operation, *resource)
    producer = Producer(confluent_scram(bootstrap, "erin", "erin-pw", acks="all"))
    failures: list = []
    for i in range(5):
        producer.produce("scram-events", value=b"e%d" % i, partition=0,
                         on_delivery=lambda err, _m: err is not None and failures.append(err))
    assert producer.flush(30) == 0 and failures == []
    # the group calls (FindCoordinator, JoinGroup, SyncGroup, OffsetCommit) go to the front door
    consumer = Consumer(confluent_scram(bootstrap, "erin", "erin-pw", **{
        "group.id": "erin-group", "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    try:
        consumer.subscribe(["scram-events"])
        got, deadline = [], time.monotonic() + 60
        while len(got) < 5 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
        assert got == [b"e%d" % i for i in range(5)]
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    with lowtide_admin(cluster) as lt:
        assert lt.fetch_offsets("erin-group")[("scram-events", 0)].offset == 5
    # deleted through Kafka's API, the credential no longer logs in
    for future in admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_256)]).values():
        future.result(timeout=30)
    assert confluent_login_refused(bootstrap, "erin", "erin-pw")


def test_without_alter_on_the_cluster_a_scram_user_may_not_create_credentials_over_kafka(secured):
    cluster = secured
    set_password(cluster, "frank", "frank-pw")
    admin = AdminClient(confluent_scram(cluster.kafka_bootstrap, "frank", "frank-pw"))
    [future] = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "mallory", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw")]).values()
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        future.result(timeout=30)
    with lowtide_admin(cluster) as lt:
        assert lt.describe_user_scram_credentials(["mallory"])["mallory"].error.name == "RESOURCE_NOT_FOUND"


def test_clients_re_authenticate_as_sessions_end_and_a_deleted_credential_ends_the_connection(secured):
    cluster = secured
    create_topic(cluster, "scram-long")
    set_password(cluster, "gina", "gina-pw")
    grant(cluster, "User:gina", "write", "--topic", "scram-long")
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all", **scram("gina", "gina-pw"))
    try:
        # across two and a half session lifetimes on the same connections: every send succeeds
        deadline = time.monotonic() + SESSION_MS * 2.5 / 1000
        sent = 0
        while time.monotonic() < deadline:
            producer.send("scram-long", value=b"g", partition=0).get(timeout=30)
            sent += 1
            time.sleep(0.5)
        assert sent >= 20
        assert session_tokens_of(cluster, "User:gina") >= 1
        s.cli_json("scram", "remove", "--bootstrap-server", cluster.bootstrap, "--command-config",
                   str(cluster.admin_cfg), "--user", "gina")
        # the next re-authentication fails: the listener closes the connection and no login works
        time.sleep(SESSION_MS / 1000 + 1)
        with pytest.raises(KafkaError):
            producer.send("scram-long", value=b"late", partition=0).get(timeout=10)
    finally:
        with contextlib.suppress(KafkaError):  # the refused record is still pending: close reports it
            producer.close(timeout=5)
    s.wait_until(lambda: session_tokens_of(cluster, "User:gina") == 0, what="gina's sessions ended")


def test_kafka_java_tools_create_a_credential_with_kafka_configs_and_produce_with_scram(secured):
    cluster = secured
    configs_tool, producer_tool = kafka_tool("kafka-configs"), kafka_tool("kafka-console-producer")
    create_topic(cluster, "scram-java")
    admin_props = cluster.tmp / "java-admin.properties"
    admin_props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                           "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                           f'username="admin" password="{ADMIN_TOKEN}";\n')
    altered = subprocess.run([str(configs_tool), "--bootstrap-server", cluster.kafka_bootstrap, "--command-config",
                              str(admin_props), "--alter", "--add-config",
                              "SCRAM-SHA-256=[iterations=8192,password=hana-pw]", "--entity-type", "users",
                              "--entity-name", "hana"], capture_output=True, text=True, timeout=120)
    assert altered.returncode == 0, altered.stderr[-3000:]
    grant(cluster, "User:hana", "write", "--topic", "scram-java")
    hana_props = cluster.tmp / "hana.properties"
    hana_props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                          "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                          'username="hana" password="hana-pw";\n')
    produced = subprocess.run([str(producer_tool), "--bootstrap-server", cluster.kafka_bootstrap, "--topic",
                               "scram-java", "--producer.config", str(hana_props)],
                              input="one\ntwo\nthree\n", capture_output=True, text=True, timeout=120)
    assert produced.returncode == 0, produced.stderr[-3000:]
    admin_creds = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                   "sasl_plain_username": "admin", "sasl_plain_password": ADMIN_TOKEN}
    assert consume(cluster.kafka_bootstrap, admin_creds, "scram-java", 3) == [b"one", b"two", b"three"]
    # a wrong password makes the same tool fail instead of producing
    hana_props.write_text(hana_props.read_text().replace("hana-pw", "wrong"))
    refused = subprocess.run([str(producer_tool), "--bootstrap-server", cluster.kafka_bootstrap, "--topic",
                              "scram-java", "--producer.config", str(hana_props), "--request-timeout-ms", "5000"],
                             input="four\n", capture_output=True, text=True, timeout=120)
    assert "Authentication failed" in refused.stderr


def test_credentials_acls_and_live_sessions_survive_a_redis_flushall(secured):
    # Issue 51: Redis keeps only the purgatory timers. Emptied, it takes no credential, ACL or
    # session with it: a connection logged in before keeps producing, and a new login works.
    cluster = secured
    create_topic(cluster, "scram-flushed")
    set_password(cluster, "ivy", "ivy-pw")
    grant(cluster, "User:ivy", "write", "--topic", "scram-flushed")
    grant(cluster, "User:ivy", "read", "--topic", "scram-flushed")
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all", **scram("ivy", "ivy-pw"))
    try:
        producer.send("scram-flushed", value=b"before", partition=0).get(timeout=30)
        assert session_tokens_of(cluster, "User:ivy") >= 1
        client = redis_lib.Redis.from_url(cluster.redis_url)
        try:
            assert client.flushall() and client.dbsize() == 0
        finally:
            client.close()
        producer.send("scram-flushed", value=b"same-session", partition=0).get(timeout=30)
    finally:
        producer.close()
    produce(cluster.kafka_bootstrap, scram("ivy", "ivy-pw"), "scram-flushed", [b"new-login"])
    assert consume(cluster.kafka_bootstrap, scram("ivy", "ivy-pw"), "scram-flushed", 3) == [
        b"before", b"same-session", b"new-login"]
