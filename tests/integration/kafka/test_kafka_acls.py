"""Apache Kafka's own ``kafka-acls`` (4.1.2, unchanged) against an auth-on cluster's Kafka listener:
CreateAcls, DescribeAcls and DeleteAcls reach lowtide's ACL store, so what the tool adds is what
the gRPC Admin.DescribeAcls lists and what the authorizer then decides, for Kafka clients too;
Kafka's filters (ANY, MATCH over PREFIXED bindings) select as Kafka selects; a principal without
ALTER/DESCRIBE on the cluster is refused with Kafka's ClusterAuthorizationException; what the
store cannot hold (Kafka's CREATE operation, which ``--producer`` adds) is refused and not stored.
DescribeTopicPartitions, asked as alice, answers a topic she may not DESCRIBE refused and last.

With auth on, Kafka's rules for what ``kafka-transactions`` reaches on the replicas: DescribeProducers
needs READ on the topic (per partition, TOPIC_AUTHORIZATION_FAILED otherwise, over gRPC and over
Kafka alike), and ``abort`` (WriteTxnMarkers) needs CLUSTER_ACTION on the cluster; a refused abort
appends nothing, so the transaction still holds the last stable offset until one allowed aborts it.

One auth-on cluster for the module (``admin`` is a super user, ``alice`` and ``erin`` have no ACLs but
those the tests give them); each test uses principals and topics of its own."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from lowtide.errors import TopicAuthorizationFailed
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.record import encode_batch
from lowtide_pb import admin_pb2, common_pb2, replica_pb2, transactions_pb2
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.wire import KafkaConnection, request_module
from tests.kafka_tools import kafka_tool

ADMIN_TOKEN, ALICE_TOKEN, ERIN_TOKEN = "admin-secret", "alice-secret", "erin-secret"
ADMIN, ALICE = [("authorization", f"Bearer {ADMIN_TOKEN}")], [("authorization", f"Bearer {ALICE_TOKEN}")]
ERIN = [("authorization", f"Bearer {ERIN_TOKEN}")]
TOPIC_AUTHORIZATION_FAILED = 29
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
READ, WRITE, DESCRIBE = 3, 4, 8
ALLOW, DENY = 3, 2


@dataclass(frozen=True)
class Secured:
    cluster: LocalCluster
    admin_props: Path  # Kafka client properties: SASL/PLAIN as User:admin
    alice_props: Path

    def grpc_acls(self, principal: str) -> set[tuple]:
        """What lowtide's own Admin.DescribeAcls lists for ``principal``."""
        answer = s.admin(self.cluster).DescribeAcls(
            admin_pb2.DescribeAclsRequest(filter=admin_pb2.AclFilter(principal=principal)), metadata=ADMIN, timeout=20)
        return {(a.resource_type, a.resource_name, a.pattern_type, a.operation, a.permission) for a in answer.acls}

    def grpc_create(self, principal: str, rtype: int, name: str, ptype: int, operation: int, permission: int) -> None:
        answer = s.admin(self.cluster).CreateAcls(admin_pb2.CreateAclsRequest(acls=[admin_pb2.AclBinding(
            principal=principal, resource_type=rtype, resource_name=name, pattern_type=ptype, operation=operation,
            permission=permission)]), metadata=ADMIN, timeout=20)
        assert list(answer.results) == [0]

    def grpc_delete(self, principal: str) -> None:
        s.admin(self.cluster).DeleteAcls(admin_pb2.DeleteAclsRequest(filters=[admin_pb2.AclFilter(
            principal=principal)]), metadata=ADMIN, timeout=20)
        assert self.grpc_acls(principal) == set()


def _props(path: Path, user: str, password: str) -> Path:
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="{user}" password="{password}";\n')
    return path


@pytest.fixture(scope="module")
def secured(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kafka-acls")
    tokens = tmp / "tokens"
    tokens.write_text(f"{ADMIN_TOKEN} User:admin\n{ALICE_TOKEN} User:alice\n{ERIN_TOKEN} User:erin\n")
    config = ClusterConfig(data_dir=tmp / "cluster", replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
                           auth_enabled=True, tokens_file=tokens, super_users="User:admin")
    for cluster in running_cluster(request, config):
        yield Secured(cluster=cluster, admin_props=_props(tmp / "admin.properties", "admin", ADMIN_TOKEN),
                      alice_props=_props(tmp / "alice.properties", "alice", ALICE_TOKEN))


def acls(secured: Secured, *args: str, as_alice: bool = False) -> subprocess.CompletedProcess[str]:
    props = secured.alice_props if as_alice else secured.admin_props
    return subprocess.run([str(kafka_tool("kafka-acls")), "--bootstrap-server", secured.cluster.kafka_bootstrap,
                           "--command-config", str(props), *args], capture_output=True, text=True, timeout=120)


def fetch_as_alice(cluster: LocalCluster, topic: str) -> int:
    """The error code of alice's consumer Fetch of ``topic``-0 (gRPC, at the leader)."""
    leader = s.replica(cluster, s.leader_of(cluster, topic))
    answer = leader.Fetch(replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, partitions=[
        replica_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=0, partition_max_bytes=1 << 20)]),
        metadata=ALICE, timeout=20)
    return answer.partitions[0].error_code


def read_as_alice(cluster: LocalCluster, topic: str) -> list[bytes]:
    """Every value of ``topic``-0, read as alice by kafka-python over SASL/PLAIN."""
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, consumer_timeout_ms=1500,
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             sasl_plain_username="alice", sasl_plain_password=ALICE_TOKEN)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek(TopicPartition(topic, 0), 0)
        return [m.value for m in consumer]
    finally:
        consumer.close()


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"kafka-acls exited {result.returncode}:\n{result.stdout}\n{result.stderr[-3000:]}"
    return result.stdout


def test_kafka_acls_add_list_remove_go_to_lowtides_store_and_the_authorizer_decides_by_them(secured):
    cluster = secured.cluster
    s.create_topic(cluster, "acl-orders", metadata=ADMIN)
    assert s.produce(cluster, "acl-orders", [b"one", b"two"], metadata=ADMIN).error_code == 0
    assert fetch_as_alice(cluster, "acl-orders") == TOPIC_AUTHORIZATION_FAILED
    # --consumer: READ and DESCRIBE on the topic, READ on the group (Kafka's convenience option)
    added = ok(acls(secured, "--add", "--allow-principal", "User:alice", "--consumer", "--topic", "acl-orders",
                    "--group", "acl-readers"))
    assert "ResourcePattern(resourceType=TOPIC, name=acl-orders, patternType=LITERAL)" in added
    assert secured.grpc_acls("User:alice") == {(TOPIC, "acl-orders", LITERAL, READ, ALLOW),
                                               (TOPIC, "acl-orders", LITERAL, DESCRIBE, ALLOW),
                                               (GROUP, "acl-readers", LITERAL, READ, ALLOW)}
    s.wait_until(lambda: read_as_alice(cluster, "acl-orders") == [b"one", b"two"],
                 what="alice reading, with a Kafka client, under the ACLs kafka-acls added")

    listed = ok(acls(secured, "--list", "--topic", "acl-orders"))
    assert "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=acl-orders, patternType=LITERAL)`" \
        in listed
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in listed
    assert "(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW)" in listed
    assert "acl-readers" not in listed

    ok(acls(secured, "--remove", "--force", "--allow-principal", "User:alice", "--operation", "Read",
            "--topic", "acl-orders"))
    assert secured.grpc_acls("User:alice") == {(TOPIC, "acl-orders", LITERAL, DESCRIBE, ALLOW),
                                               (GROUP, "acl-readers", LITERAL, READ, ALLOW)}
    s.wait_until(lambda: fetch_as_alice(cluster, "acl-orders") == TOPIC_AUTHORIZATION_FAILED,
                 what="alice refused again")
    ok(acls(secured, "--remove", "--force", "--topic", "acl-orders"))  # every ACL of the resource
    assert secured.grpc_acls("User:alice") == {(GROUP, "acl-readers", LITERAL, READ, ALLOW)}
    secured.grpc_delete("User:alice")


def test_prefixed_acls_are_listed_and_removed_through_kafkas_match_filter(secured):
    ok(acls(secured, "--add", "--allow-principal", "User:bob", "--operation", "Write", "--topic", "pay",
            "--resource-pattern-type", "prefixed"))
    secured.grpc_create("User:bob", TOPIC, "payroll", LITERAL, WRITE, DENY)
    secured.grpc_create("User:bob", TOPIC, "other", LITERAL, DESCRIBE, ALLOW)
    assert secured.grpc_acls("User:bob") == {(TOPIC, "pay", PREFIXED, WRITE, ALLOW),
                                             (TOPIC, "payroll", LITERAL, WRITE, DENY),
                                             (TOPIC, "other", LITERAL, DESCRIBE, ALLOW)}
    # MATCH: every binding that applies to topic "payroll" (the literal one and the "pay" prefix)
    matched = ok(acls(secured, "--list", "--topic", "payroll", "--resource-pattern-type", "match"))
    assert "ResourcePattern(resourceType=TOPIC, name=pay, patternType=PREFIXED)" in matched
    assert "ResourcePattern(resourceType=TOPIC, name=payroll, patternType=LITERAL)" in matched
    assert "name=other" not in matched
    ok(acls(secured, "--remove", "--force", "--topic", "payroll", "--resource-pattern-type", "match"))
    assert secured.grpc_acls("User:bob") == {(TOPIC, "other", LITERAL, DESCRIBE, ALLOW)}
    secured.grpc_delete("User:bob")


def test_without_alter_or_describe_on_the_cluster_kafka_acls_is_refused(secured):
    refused = acls(secured, "--add", "--allow-principal", "User:alice", "--operation", "All", "--cluster",
                   as_alice=True)
    assert refused.returncode != 0
    assert "ClusterAuthorizationException" in refused.stdout + refused.stderr
    assert secured.grpc_acls("User:alice") == set()
    listed = acls(secured, "--list", as_alice=True)
    assert "ClusterAuthorizationException" in listed.stdout + listed.stderr
    # granted DESCRIBE on the cluster, alice may list (but still not add: ALTER)
    secured.grpc_create("User:alice", CLUSTER, "kafka-cluster", LITERAL, DESCRIBE, ALLOW)
    listed = acls(secured, "--list", as_alice=True)
    assert "(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW)" in ok(listed)
    secured.grpc_delete("User:alice")


def test_what_the_store_cannot_hold_is_refused_and_not_stored(secured):
    # --producer adds WRITE, DESCRIBE and Kafka's CREATE, which lowtide's ACLs have not: that one
    # binding is INVALID_REQUEST (the tool fails), the other two are stored (CreateAcls is per binding)
    refused = acls(secured, "--add", "--allow-principal", "User:carol", "--producer", "--topic", "acl-c")
    assert refused.returncode != 0
    assert "InvalidRequestException" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert secured.grpc_acls("User:carol") == {(TOPIC, "acl-c", LITERAL, WRITE, ALLOW),
                                               (TOPIC, "acl-c", LITERAL, DESCRIBE, ALLOW)}
    secured.grpc_delete("User:carol")


def test_describe_topic_partitions_answers_a_topic_alice_may_not_describe_last_and_refused(secured):
    cluster = secured.cluster
    for name in ("acl-seen", "acl-hidden"):
        s.create_topic(cluster, name, metadata=ADMIN)
    secured.grpc_create("User:alice", TOPIC, "acl-seen", LITERAL, DESCRIBE, ALLOW)
    m = request_module(75, 0)
    try:
        with KafkaConnection(cluster.kafka_bootstrap) as conn:
            conn.sasl_plain("alice", ALICE_TOKEN)
            answer = conn.call(m.DescribeTopicPartitionsRequest(
                topics=(m.TopicRequest(name="acl-hidden"), m.TopicRequest(name="acl-seen")), cursor=None))
            everything = conn.call(m.DescribeTopicPartitionsRequest(topics=(), cursor=None))
        assert [(t.name, int(t.error_code), len(t.partitions)) for t in answer.topics] == [
            ("acl-seen", 0, 1), ("acl-hidden", TOPIC_AUTHORIZATION_FAILED, 0)]
        assert "acl-hidden" not in {t.name for t in everything.topics}  # unnamed: not disclosed
        assert "acl-seen" in {t.name for t in everything.topics}
    finally:
        secured.grpc_delete("User:alice")


def test_with_auth_off_acls_are_stored_as_lowtide_acls_stores_them(shared_cluster):
    # Kafka without an authorizer answers SECURITY_DISABLED; lowtide's store keeps ACLs with auth
    # off too (gRPC CreateAcls does), so they decide once auth is turned on.
    create, describe, delete = request_module(30, 3), request_module(29, 3), request_module(31, 3)
    with KafkaConnection(shared_cluster.kafka_bootstrap) as conn:
        created = conn.call(create.CreateAclsRequest(creations=(create.AclCreation(
            resource_type=TOPIC, resource_name="acl-off", resource_pattern_type=PREFIXED, principal="User:dave",
            host="*", operation=READ, permission_type=ALLOW),)))
        assert [int(r.error_code) for r in created.results] == [0]
        listed = conn.call(describe.DescribeAclsRequest(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter="User:dave",
            host_filter=None, operation=1, permission_type=1))
        assert int(listed.error_code) == 0
        assert [(r.resource_type, r.resource_name, r.pattern_type, [(a.principal, a.host, a.operation,
                                                                     a.permission_type) for a in r.acls])
                for r in listed.resources] == [(TOPIC, "acl-off", PREFIXED, [("User:dave", "*", READ, ALLOW)])]
        deleted = conn.call(delete.DeleteAclsRequest(filters=(delete.DeleteAclsFilter(
            resource_type_filter=TOPIC, resource_name_filter="acl-off-topic", pattern_type_filter=2,  # MATCH
            principal_filter=None, host_filter=None, operation=1, permission_type=1),)))
        (result,) = deleted.filter_results
        assert int(result.error_code) == 0
        assert [(a.resource_name, a.pattern_type, a.principal) for a in result.matching_acls] == [
            ("acl-off", PREFIXED, "User:dave")]


TXN_TOPIC, TXN_PID, TXN_EPOCH = "txn-guarded", 5150, 0
READ_COMMITTED = 1


def transactions_tool(cluster: LocalCluster, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kafka_tool("kafka-transactions")), "--bootstrap-server", cluster.kafka_bootstrap,
                           "--command-config", str(config), *args], capture_output=True, text=True, timeout=120)


def stable_offset(cluster: LocalCluster) -> int:
    with Admin(cluster.bootstrap, metadata=ADMIN) as admin:
        answer = admin.list_offsets({(TXN_TOPIC, 0): OffsetSpec.LATEST},
                                    isolation_level=READ_COMMITTED)[(TXN_TOPIC, 0)]
    assert answer.error is None, answer
    return answer.offset


def test_describe_producers_needs_read_on_the_topic_and_abort_cluster_action(secured, tmp_path):
    kafka_tool("kafka-transactions")  # skips, naming what to install
    cluster = secured.cluster
    s.create_topic(cluster, TXN_TOPIC, metadata=ADMIN)
    leader = s.replica(cluster, s.leader_of(cluster, TXN_TOPIC, 0))
    produced = leader.Produce(replica_pb2.ProduceRequest(acks=-1, timeout_ms=10_000, partitions=[
        replica_pb2.ProducePartition(topic=TXN_TOPIC, partition=0, records=encode_batch(
            [b"a", b"b"], producer_id=TXN_PID, producer_epoch=TXN_EPOCH, base_sequence=0, is_transactional=True))]),
        metadata=ADMIN, timeout=20)
    assert produced.partitions[0].error_code == 0, produced
    assert stable_offset(cluster) == 0

    # gRPC: erin without ACLs is refused per partition, and gets nothing of the producer state
    ask = transactions_pb2.DescribeProducersRequest(
        partitions=[common_pb2.TopicPartition(topic=TXN_TOPIC, partition=0)])
    [refused] = leader.DescribeProducers(ask, metadata=ERIN, timeout=20).partitions
    assert (refused.error_code, list(refused.producers)) == (TopicAuthorizationFailed.code, [])
    # Kafka: the same refusal, which Kafka's admin client raises as TopicAuthorizationException
    erin = _props(tmp_path / "erin.properties", "erin", ERIN_TOKEN)
    result = transactions_tool(cluster, erin, "describe-producers", "--topic", TXN_TOPIC, "--partition", "0")
    assert result.returncode != 0 and "TopicAuthorizationException" in result.stderr, result.stderr[-3000:]

    admin_cfg = tmp_path / "admin.properties"
    admin_cfg.write_text(f"lowtide.auth.token={ADMIN_TOKEN}\n")
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", str(admin_cfg),
               "--principal", "User:erin", "--operation", "read", "--topic", TXN_TOPIC)
    s.wait_acls_in_force()
    s.wait_until(lambda: not leader.DescribeProducers(ask, metadata=ERIN, timeout=20).partitions[0].error_code,
                 what="erin's READ on the topic in force")
    [allowed] = leader.DescribeProducers(ask, metadata=ERIN, timeout=20).partitions
    assert [(p.producer_id, p.producer_epoch, p.current_txn_start_offset) for p in allowed.producers] == [
        (TXN_PID, TXN_EPOCH, 0)]

    # READ is enough to find the transaction but not to abort it: WriteTxnMarkers needs CLUSTER_ACTION
    result = transactions_tool(cluster, erin, "abort", "--topic", TXN_TOPIC, "--partition", "0",
                               "--start-offset", "0")
    # (Kafka's AbortTransactionHandler: "... failed due to cluster authorization error")
    assert result.returncode != 0 and "cluster authorization" in result.stderr, result.stderr[-3000:]
    assert stable_offset(cluster) == 0  # nothing appended
    result = transactions_tool(cluster, secured.admin_props, "abort", "--topic", TXN_TOPIC, "--partition", "0",
                               "--start-offset", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert stable_offset(cluster) == 3  # two records and the ABORT marker
    secured.grpc_delete("User:erin")
