"""With auth on, Kafka's rules for what ``kafka-transactions`` reaches on the replicas: DescribeProducers
needs READ on the topic (per partition, TOPIC_AUTHORIZATION_FAILED otherwise, over gRPC and over
Kafka alike), and ``abort`` (WriteTxnMarkers) needs CLUSTER_ACTION on the cluster; a refused abort
appends nothing, so the transaction still holds the last stable offset until one allowed aborts it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from lowtide.errors import TopicAuthorizationFailed
from lowtide.record import encode_batch
from lowtide_pb import common_pb2, replica_pb2, transactions_pb2
from tests.integration import support as s
from tests.kafka_tools import kafka_tool

TOPIC, PID, EPOCH = "txn-guarded", 5150, 0
ADMIN_TOKEN = [("authorization", "Bearer admin-secret")]
ALICE_TOKEN = [("authorization", "Bearer alice-secret")]
READ_COMMITTED = 1


def sasl_properties(path: Path, user: str, password: str) -> Path:
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="{user}" password="{password}";\n')
    return path


def tool(cluster, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kafka_tool("kafka-transactions")), "--bootstrap-server", cluster.kafka_bootstrap,
                           "--command-config", str(config), *args], capture_output=True, text=True, timeout=120)


def stable_offset(cluster) -> int:
    with Admin(cluster.bootstrap, metadata=ADMIN_TOKEN) as admin:
        answer = admin.list_offsets({(TOPIC, 0): OffsetSpec.LATEST}, isolation_level=READ_COMMITTED)[(TOPIC, 0)]
    assert answer.error is None, answer
    return answer.offset


def test_describe_producers_needs_read_on_the_topic_and_abort_cluster_action(cluster_factory, tmp_path):
    kafka_tool("kafka-transactions")  # skips, naming what to install, before a cluster starts
    tokens = tmp_path / "tokens"
    tokens.write_text("admin-secret User:admin\nalice-secret User:alice\n")
    cluster = cluster_factory(auth_enabled=True, tokens_file=tokens, super_users="User:admin")
    s.create_topic(cluster, TOPIC, metadata=ADMIN_TOKEN)
    leader = s.replica(cluster, s.leader_of(cluster, TOPIC, 0))
    produced = leader.Produce(replica_pb2.ProduceRequest(acks=-1, timeout_ms=10_000, partitions=[
        replica_pb2.ProducePartition(topic=TOPIC, partition=0, records=encode_batch(
            [b"a", b"b"], producer_id=PID, producer_epoch=EPOCH, base_sequence=0, is_transactional=True))]),
        metadata=ADMIN_TOKEN, timeout=20)
    assert produced.partitions[0].error_code == 0, produced
    assert stable_offset(cluster) == 0

    # gRPC: alice without ACLs is refused per partition, and gets nothing of the producer state
    ask = transactions_pb2.DescribeProducersRequest(partitions=[common_pb2.TopicPartition(topic=TOPIC, partition=0)])
    [refused] = leader.DescribeProducers(ask, metadata=ALICE_TOKEN, timeout=20).partitions
    assert (refused.error_code, list(refused.producers)) == (TopicAuthorizationFailed.code, [])
    # Kafka: the same refusal, which Kafka's admin client raises as TopicAuthorizationException
    alice = sasl_properties(tmp_path / "alice.properties", "alice", "alice-secret")
    result = tool(cluster, alice, "describe-producers", "--topic", TOPIC, "--partition", "0")
    assert result.returncode != 0 and "TopicAuthorizationException" in result.stderr, result.stderr[-3000:]

    admin_cfg = tmp_path / "admin.properties"
    admin_cfg.write_text("lowtide.auth.token=admin-secret\n")
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", str(admin_cfg),
               "--principal", "User:alice", "--operation", "read", "--topic", TOPIC)
    s.wait_until(lambda: not leader.DescribeProducers(ask, metadata=ALICE_TOKEN, timeout=20).partitions[0].error_code,
                 what="alice's READ on the topic in force")
    [allowed] = leader.DescribeProducers(ask, metadata=ALICE_TOKEN, timeout=20).partitions
    assert [(p.producer_id, p.producer_epoch, p.current_txn_start_offset) for p in allowed.producers] == [
        (PID, EPOCH, 0)]

    # READ is enough to find the transaction but not to abort it: WriteTxnMarkers needs CLUSTER_ACTION
    result = tool(cluster, alice, "abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "0")
    # (Kafka's AbortTransactionHandler: "... failed due to cluster authorization error")
    assert result.returncode != 0 and "cluster authorization" in result.stderr, result.stderr[-3000:]
    assert stable_offset(cluster) == 0  # nothing appended
    admin = sasl_properties(tmp_path / "admin-kafka.properties", "admin", "admin-secret")
    result = tool(cluster, admin, "abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert stable_offset(cluster) == 3  # two records and the ABORT marker
