"""Auth on the replica port, on a real cluster started with ``auth_enabled`` (no tokens file, so
``up`` generates every service's identity and an admin super user).

Brief §4 invariant: with auth on every call on every port carries an identity; a follower's
``replica_id`` must be the authenticated broker.
"""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.auth.acl import AclBinding
from lowtide.auth.tokens import add_token
from lowtide.client import Admin, Producer
from lowtide.errors import ClusterAuthorizationFailed, SaslAuthenticationFailed
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.messages.replica import FetchPosition
from lowtide.record import encode_batch
from lowtide.rpc.framed.callers import SocketReplicationStream
from lowtide_pb import common_pb2, replica_pb2
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

TOPIC_AUTHORIZATION_FAILED = 29


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def service_token(cluster: LocalCluster, name: str) -> list[tuple[str, str]]:
    return bearer(Path(cluster.state.auth["services"][name]["token_file"]).read_text().strip())


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One auth-enabled 3-replica cluster for the module (each test uses its own topics). A long
    session timeout keeps a paused follower live, so it still counts toward the low watermark."""
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("auth-cluster"), replicas=3,
                                         replica_config=dict(DEFAULT_REPLICA_CONFIG), auth_enabled=True,
                                         session_timeout_ms=30000))


@pytest.fixture(scope="module")
def admin_md(cluster: LocalCluster) -> list[tuple[str, str]]:
    return s.auth_metadata(cluster)


@pytest.fixture(scope="module")
def alice(cluster: LocalCluster) -> list[tuple[str, str]]:
    """A user token with no ACLs of its own (tests grant what they need on their own topics)."""
    add_token(s.store(cluster), token="alice-token", principal="User:alice")
    return bearer("alice-token")


def grant(cluster: LocalCluster, admin_md, principal: str, topic: str, *operations: str) -> None:
    with Admin(cluster.bootstrap, metadata=admin_md) as admin:
        errors = admin.create_acls([AclBinding(principal, "TOPIC", topic, "LITERAL", op, "ALLOW")
                                    for op in operations])
    assert errors == [None] * len(operations)
    time.sleep(0.5)  # the replicas' metadata watches deliver the change (normally within milliseconds)


def refused(call, *, status: grpc.StatusCode, name: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == status and err.value.details().startswith(name), err.value.details()


def led_by_same_broker(cluster: LocalCluster, first: str, second: str) -> tuple[int, int, int]:
    """(broker, partition of ``first``, partition of ``second``) with both partitions led by broker."""
    store = s.store(cluster)
    leaders = {st.leader: st.partition for st in store.partition_states(second)}
    for st in store.partition_states(first):
        if st.leader in leaders:
            return st.leader, st.partition, leaders[st.leader]
    raise AssertionError(f"no broker leads a partition of both {first} and {second}")


def test_cluster_up_with_auth_writes_private_identities_and_records_them_in_cluster_json(cluster):
    doc = json.loads((cluster.data_dir / "cluster.json").read_text())
    auth = doc["auth"]
    assert {"bootstrap", "redis", "object_store", "services"} <= doc.keys()
    assert {n: v["principal"] for n, v in auth["services"].items()} == {
        "replica-0": "User:broker-0", "replica-1": "User:broker-1", "replica-2": "User:broker-2",
        "frontdoor-0": "User:frontdoor", "coordinator-0": "User:coordinator", "coordinator-1": "User:coordinator",
        "orphan-scanner-0": "User:orphan-scanner"}
    secrets = Path(auth["secrets_dir"])
    files = [Path(v["token_file"]) for v in auth["services"].values()]
    files += [Path(auth["admin_token_file"]), Path(auth["admin_command_config"])]
    assert files[0] == secrets / "replica-0.token"
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    # the CLI works against the cluster with the generated admin config; without it, the caller is
    # User:ANONYMOUS on the front door and sees no topic (docs/operations.md#authentication: the ACLs decide, and deny)
    s.cli_json("topics", "create", "--bootstrap-server", cluster.bootstrap, "--topic", "listed",
               "--partitions", "1", "--replication-factor", "1", "--command-config", auth["admin_command_config"])
    assert "listed" in s.cli_json("topics", "list", "--bootstrap-server", cluster.bootstrap,
                                  "--command-config", auth["admin_command_config"])["topics"]
    proc = s.lowtide_cli("topics", "list", "--bootstrap-server", cluster.bootstrap, "--output", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["topics"] == []


def test_replica_calls_without_a_valid_token_are_refused_and_change_nothing(cluster, admin_md):
    s.create_topic(cluster, "anon", rf=3, metadata=admin_md)
    assert s.produce(cluster, "anon", [b"x"] * 5, metadata=admin_md).error_code == 0
    leader = s.leader_of(cluster, "anon")
    stub = s.replica(cluster, leader)
    tp = common_pb2.TopicPartition(topic="anon", partition=0)
    calls = {
        "Produce": lambda md: stub.Produce(replica_pb2.ProduceRequest(acks=1, timeout_ms=1000, partitions=[
            replica_pb2.ProducePartition(topic="anon", partition=0, records=encode_batch([b"forged"]))]),
            metadata=md),
        "Fetch": lambda md: stub.Fetch(replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, partitions=[
            replica_pb2.FetchPartition(topic="anon", partition=0, fetch_offset=0)]), metadata=md),
        "FollowerFetch": lambda md: stub.Fetch(replica_pb2.FetchRequest(replica_id=(leader + 1) % 3, partitions=[
            replica_pb2.FetchPartition(topic="anon", partition=0, fetch_offset=5, log_start_offset=5)]),
            metadata=md),
        "ListOffsets": lambda md: stub.ListOffsets(common_pb2.ListOffsetsRequest(partitions=[
            common_pb2.ListOffsetsPartition(topic="anon", partition=0, timestamp=-1)]), metadata=md),
        "DeleteRecords": lambda md: stub.DeleteRecords(common_pb2.DeleteRecordsRequest(timeout_ms=500, partitions=[
            common_pb2.DeleteRecordsPartition(topic="anon", partition=0, offset=3)]), metadata=md),
        "OffsetForLeaderEpoch": lambda md: stub.OffsetForLeaderEpoch(replica_pb2.OffsetForLeaderEpochRequest(
            partitions=[replica_pb2.EpochQuery(topic="anon", partition=0, leader_epoch=0)]), metadata=md),
        "DescribeLogs": lambda md: stub.DescribeLogs(replica_pb2.DescribeLogsRequest(partitions=[tp]), metadata=md),
    }
    for name, call in calls.items():
        for md in ([], bearer("forged-token"), [("authorization", "Basic YWRtaW4=")]):
            try:
                refused(lambda c=call, m=md: c(m), status=grpc.StatusCode.UNAUTHENTICATED,
                        name="SASL_AUTHENTICATION_FAILED")
            except AssertionError as exc:
                raise AssertionError(f"{name} with {md!r}: {exc}") from None
    # health (for probes) stays open
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(cluster.service(f"replica-{leader}").grpc))
    assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    for broker in (0, 1, 2):
        log = s.describe(cluster, broker, "anon", metadata=admin_md)
        assert (log.log_start_offset, log.log_end_offset) == (0, 5)
    assert s.describe(cluster, leader, "anon", metadata=admin_md).low_watermark == 0


def test_a_user_is_refused_per_partition_on_topics_without_acls_while_its_other_partitions_proceed(
        cluster, admin_md, alice):
    for topic in ("closed", "open"):
        s.create_topic(cluster, topic, partitions=3, rf=3, metadata=admin_md)
    grant(cluster, admin_md, "User:alice", "open", "WRITE", "READ", "DELETE")
    broker, pc, po = led_by_same_broker(cluster, "closed", "open")
    assert s.produce(cluster, "closed", [b"c"] * 4, partition=pc, metadata=admin_md).error_code == 0
    stub = s.replica(cluster, broker)

    produced = stub.Produce(replica_pb2.ProduceRequest(acks=-1, timeout_ms=10000, partitions=[
        replica_pb2.ProducePartition(topic="closed", partition=pc, records=encode_batch([b"no"] * 3)),
        replica_pb2.ProducePartition(topic="open", partition=po, records=encode_batch([b"yes"] * 3))]),
        metadata=alice, timeout=20).partitions
    assert [(r.topic, r.error_code, r.base_offset) for r in produced] == [
        ("closed", TOPIC_AUTHORIZATION_FAILED, -1), ("open", 0, 0)]

    fetched = stub.Fetch(replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, partitions=[
        replica_pb2.FetchPartition(topic="closed", partition=pc, fetch_offset=0),
        replica_pb2.FetchPartition(topic="open", partition=po, fetch_offset=0)]), metadata=alice).partitions
    assert [(r.topic, r.error_code, bool(r.records)) for r in fetched] == [
        ("closed", TOPIC_AUTHORIZATION_FAILED, False), ("open", 0, True)]
    began = time.monotonic()  # nothing allowed: answered at once, not after the long poll
    [only] = stub.Fetch(replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=5000, min_bytes=1, partitions=[
        replica_pb2.FetchPartition(topic="closed", partition=pc, fetch_offset=4)]), metadata=alice).partitions
    assert only.error_code == TOPIC_AUTHORIZATION_FAILED and time.monotonic() - began < 2

    listed = stub.ListOffsets(common_pb2.ListOffsetsRequest(partitions=[
        common_pb2.ListOffsetsPartition(topic="closed", partition=pc, timestamp=-1),
        common_pb2.ListOffsetsPartition(topic="open", partition=po, timestamp=-1)]), metadata=alice).partitions
    assert [(r.error_code, r.offset) for r in listed] == [(TOPIC_AUTHORIZATION_FAILED, -1), (0, 3)]

    deleted = stub.DeleteRecords(common_pb2.DeleteRecordsRequest(timeout_ms=10000, partitions=[
        common_pb2.DeleteRecordsPartition(topic="closed", partition=pc, offset=2),
        common_pb2.DeleteRecordsPartition(topic="open", partition=po, offset=1)]), metadata=alice,
        timeout=20).partitions
    assert [(r.topic, r.error_code, r.low_watermark) for r in deleted] == [
        ("closed", TOPIC_AUTHORIZATION_FAILED, -1), ("open", 0, 1)]

    epochs = stub.OffsetForLeaderEpoch(replica_pb2.OffsetForLeaderEpochRequest(partitions=[
        replica_pb2.EpochQuery(topic="closed", partition=pc, leader_epoch=0),
        replica_pb2.EpochQuery(topic="open", partition=po, leader_epoch=0)]), metadata=alice).partitions
    assert [r.error_code for r in epochs] == [TOPIC_AUTHORIZATION_FAILED, 0]

    refused(lambda: stub.DescribeLogs(replica_pb2.DescribeLogsRequest(), metadata=alice),
            status=grpc.StatusCode.PERMISSION_DENIED, name="CLUSTER_AUTHORIZATION_FAILED")
    # the refused partition changed nothing anywhere: no append, no deletion
    for replica in s.store(cluster).partition_state("closed", pc).replicas:
        log = s.describe(cluster, replica, "closed", pc, metadata=admin_md)
        assert (log.log_start_offset, log.log_end_offset) == (0, 4), replica


def test_a_follower_fetch_is_accepted_only_from_the_broker_whose_replica_id_it_names(cluster, admin_md, alice):
    s.create_topic(cluster, "follow", rf=3, metadata=admin_md)
    assert s.produce(cluster, "follow", [b"v"] * 10, metadata=admin_md).error_code == 0
    leader = s.leader_of(cluster, "follow")
    follower, other = sorted(b for b in (0, 1, 2) if b != leader)
    stub = s.replica(cluster, leader)

    def low_watermark() -> int:
        return s.describe(cluster, leader, "follow", metadata=admin_md).low_watermark

    def fetch_as_follower(md):
        # What a follower that had deleted up to 6 would report: it would let the LW reach 6.
        return stub.Fetch(replica_pb2.FetchRequest(replica_id=follower, max_wait_ms=0, partitions=[
            replica_pb2.FetchPartition(topic="follow", partition=0, fetch_offset=10, log_start_offset=6)]),
            metadata=md)

    def replicate_as_follower(md):
        # The same round on a Replicate stream: every request of a stream is checked as a Fetch.
        return next(iter(stub.Replicate(iter([replica_pb2.FetchRequest(
            replica_id=follower, max_wait_ms=0, partitions=[replica_pb2.FetchPartition(
                topic="follow", partition=0, fetch_offset=10, log_start_offset=6)])]), metadata=md, timeout=10)))

    def listen_as_follower(md):
        port = s.store(cluster).brokers()[leader].replication_port
        stream = SocketReplicationStream(f"127.0.0.1:{port}", tls=None, metadata=md, connect_timeout_s=5)
        try:
            return stream.fetch([FetchPosition(topic="follow", partition=0, fetch_offset=10, log_start_offset=6)],
                                replica_id=follower, max_wait_ms=0)
        finally:
            stream.close()

    cluster.pause(f"replica-{follower}")  # its own fetches must not move the LW during the test
    try:
        [pending] = s.replica(cluster, leader).DeleteRecords(common_pb2.DeleteRecordsRequest(
            timeout_ms=300, partitions=[common_pb2.DeleteRecordsPartition(topic="follow", partition=0, offset=6)]),
            metadata=admin_md, timeout=10).partitions
        assert pending.error_code == 7  # REQUEST_TIMED_OUT: the paused follower still holds the LW back
        assert low_watermark() == 0

        for md in (alice, admin_md, service_token(cluster, f"replica-{other}"), service_token(cluster, "frontdoor-0")):
            for attempt in (fetch_as_follower, replicate_as_follower):
                refused(lambda m=md, a=attempt: a(m), status=grpc.StatusCode.PERMISSION_DENIED,
                        name="CLUSTER_AUTHORIZATION_FAILED")
                assert low_watermark() == 0, f"a refused {attempt.__name__} must record nothing"
            # The same round on the replication listener (no gRPC), authenticated by its HELLO.
            with pytest.raises(ClusterAuthorizationFailed):
                listen_as_follower(md)
            assert low_watermark() == 0, "a refused round on the replication listener must record nothing"
        with pytest.raises(SaslAuthenticationFailed):
            listen_as_follower(bearer("not-a-token"))

        [answer] = replicate_as_follower(service_token(cluster, f"replica-{follower}")).partitions
        assert answer.error_code == 0
        assert low_watermark() == 6  # the same round from the right broker does move it
        [answer] = fetch_as_follower(service_token(cluster, f"replica-{follower}")).partitions
        assert answer.error_code == 0
    finally:
        cluster.resume(f"replica-{follower}")


def test_replication_and_the_front_door_fan_out_keep_working_with_auth_on(cluster, admin_md, alice, tmp_path):
    s.create_topic(cluster, "replicated", partitions=2, rf=3, metadata=admin_md)
    grant(cluster, admin_md, "User:alice", "replicated", "WRITE", "DELETE")
    with Producer(cluster.bootstrap, acks=-1, metadata=alice) as producer:
        report = producer.produce_values("replicated", [b"r%d" % i for i in range(200)], partition=1)
    assert report.records == 200
    for broker in (0, 1, 2):  # acks=all came back: every follower fetched with its own token
        s.wait_until(lambda b=broker: s.describe(cluster, b, "replicated", 1, metadata=admin_md)
                     .log_end_offset == 200, what=f"replica {broker} caught up")
    # the front door calls the leaders as User:frontdoor after authorizing its caller
    alice_cfg = tmp_path / "alice.properties"
    alice_cfg.write_text("lowtide.auth.token=alice-token\n")
    out = s.cli_json("offsets", "--bootstrap-server", cluster.bootstrap, "--topic", "replicated",
                     "--time", "latest", "--command-config", str(alice_cfg))
    assert sorted((p["partition"], p["offset"]) for p in out["partitions"]) == [(0, 0), (1, 200)]
    with Admin(cluster.bootstrap, metadata=alice) as admin:
        result = admin.delete_records({("replicated", 1): 150})
    assert result[("replicated", 1)].error is None and result[("replicated", 1)].low_watermark == 150
