"""TLS on every gRPC port, on a real local cluster started with ``--tls`` and auth on (mutual TLS
between the services, docs/design/tls.md): what a plaintext or untrusting client gets, who a client
certificate makes you, and a certificate rotated on disk while the cluster serves; no Kafka or
/metrics port left plaintext (issue 51); and the cluster's etcd member (the metadata store) is one
of the gRPC services here: mutual TLS only, dialled by every service with its own certificate."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest
import redis as redis_lib
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.client import Admin, Consumer, Producer
from lowtide.coordinator.leadership import read_shards
from lowtide.errors import ClusterAuthorizationFailed, MetadataStoreUnavailable, NetworkException
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.messages import TopicPartition
from lowtide.messages.replica import FetchPosition
from lowtide.metadata.etcd import EtcdClient
from lowtide.rpc.channels import open_channel
from lowtide.rpc.framed.callers import SocketReplicationStream
from lowtide.tls.certs import CertificateAuthority
from lowtide.tls.config import ClientTls
from lowtide_pb import common_pb2, replica_pb2, replica_pb2_grpc
from tests import waiting
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster


@pytest.fixture(scope="module")
def tls_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("tls"), replicas=3, coordinators=1,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG), auth_enabled=True, tls=True)
    yield from running_cluster(request, config)


@pytest.fixture(scope="module")
def ca(tls_cluster: LocalCluster) -> CertificateAuthority:
    """The cluster's own CA (its key is in DIR/tls): issues certificates the services trust."""
    return CertificateAuthority.create(Path(tls_cluster.state.tls["dir"]))


def health(address: str, tls: ClientTls | None, *, metadata=()) -> int:
    channel = open_channel(address, tls)
    try:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5,
                                                         metadata=list(metadata)).status
    finally:
        channel.close()


def refused_connection(address: str, tls: ClientTls | None) -> str:
    with pytest.raises(grpc.RpcError) as err:
        health(address, tls)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
    return err.value.details()


def served_certificate(address: str, client: ClientTls) -> x509.Certificate:
    """The certificate a new TLS connection to ``address`` is shown."""
    host, _, port = address.rpartition(":")
    context = client.ssl_context()
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as conn:
        return x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))


def common_name(cert_path: Path) -> str:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return str(cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)


def grpc_services(cluster: LocalCluster):
    # Every gRPC port: the lowtide services' and the etcd members' (etcd answers grpc.health.v1 too).
    # Not Redis, which speaks RESP: it is checked on its own below.
    return [e for e in cluster.services() if not e.is_redis]


def test_every_service_answers_a_client_with_the_cluster_certificate(tls_cluster):
    for entry in grpc_services(tls_cluster):
        assert health(entry.grpc, tls_cluster.client_tls) == health_pb2.HealthCheckResponse.SERVING, entry.name


def test_every_service_refuses_a_plaintext_connection(tls_cluster):
    kinds = set()
    for entry in grpc_services(tls_cluster):
        refused_connection(entry.grpc, None)
        kinds.add(entry.kind)
    assert kinds == {"etcd", "replica", "frontdoor", "coordinator", "orphan-scanner"}


def test_a_client_that_does_not_trust_the_cluster_ca_is_refused(tls_cluster, tmp_path):
    stranger = CertificateAuthority.create(tmp_path / "stranger")
    own = tls_cluster.client_tls
    untrusting = ClientTls(ca=stranger.ca_path, cert=own.cert, key=own.key)
    for entry in grpc_services(tls_cluster):
        refused_connection(entry.grpc, untrusting)


def test_mutual_tls_refuses_a_client_without_a_certificate_or_with_one_from_another_ca(tls_cluster, tmp_path):
    stranger = CertificateAuthority.create(tmp_path / "stranger").issue("admin")
    no_certificate = ClientTls(ca=tls_cluster.client_tls.ca)
    foreign_certificate = ClientTls(ca=tls_cluster.client_tls.ca, cert=stranger.cert, key=stranger.key)
    for entry in grpc_services(tls_cluster):
        refused_connection(entry.grpc, no_certificate)
        refused_connection(entry.grpc, foreign_certificate)


def test_data_written_over_tls_is_replicated_over_mutual_tls_and_reads_back(tls_cluster):
    tls = tls_cluster.client_tls
    with Admin(tls_cluster.bootstrap, tls=tls) as admin:
        admin.create_topic("over-tls", partitions=2, replication_factor=3)
    values = [f"v{i}".encode() for i in range(2000)]
    with Producer(tls_cluster.bootstrap, acks=-1, tls=tls) as producer:
        for i, value in enumerate(values):
            producer.send("over-tls", value, partition=i % 2)
        producer.flush()
    read: list[bytes] = []
    with Consumer(tls_cluster.bootstrap, tls=tls) as consumer:  # no group: from the earliest offsets
        consumer.assign([TopicPartition("over-tls", 0), TopicPartition("over-tls", 1)])
        waiting.wait_until(lambda: read.extend(r.value for r in consumer.poll(max_wait_ms=500)) or len(read) >= 2000,
                           timeout_s=30, what="2000 records read back over TLS")
    assert sorted(read) == sorted(values)
    # acks=all succeeded, so both followers fetched over mutual TLS as the brokers they are
    for partition in (0, 1):
        state = s.store(tls_cluster).partition_state("over-tls", partition)
        assert sorted(state.isr) == [0, 1, 2], state


def test_a_diskless_topic_commits_and_reads_back_over_tls_end_to_end(tls_cluster):
    """The broker's CommitFile to the shard's framed listener and the shard's appends to the
    metadata partition's leader (on the shard's pipeline loop) both speak TLS."""
    tls = tls_cluster.client_tls
    with Admin(tls_cluster.bootstrap, tls=tls) as admin:
        admin.create_topic("diskless-over-tls", partitions=1, diskless=True)
    values = [f"d{i}".encode() for i in range(500)]
    with Producer(tls_cluster.bootstrap, acks=-1, tls=tls) as producer:
        for value in values:
            producer.send("diskless-over-tls", value, partition=0)
        producer.flush()
    read: list[bytes] = []
    with Consumer(tls_cluster.bootstrap, tls=tls) as consumer:
        consumer.assign([TopicPartition("diskless-over-tls", 0)])
        waiting.wait_until(lambda: read.extend(r.value for r in consumer.poll(max_wait_ms=500)) or len(read) >= 500,
                           timeout_s=60, what="500 diskless records read back over TLS")
    assert read == values
    assert read_shards(tls_cluster.metadata_store())[0].framed, "the shard advertises no framed listener"
    # The commits came on the framed listener (over TLS), not over gRPC (the fallback).
    scrape = s.metrics_text(tls_cluster, "coordinator-0")  # over HTTPS
    assert 'lowtide_coordinator_commit_requests_total{error="NONE",shard="0",transport="framed"}' in scrape
    assert 'transport="grpc"' not in scrape


def test_a_follower_certificate_for_one_broker_cannot_fetch_as_another(tls_cluster, ca, tmp_path):
    s.create_topic(tls_cluster, "follower-identity", rf=3, metadata=[])
    leader = s.leader_of(tls_cluster, "follower-identity")
    me, other = [b for b in (0, 1, 2) if b != leader]
    files = ca.issue(f"broker-{me}", directory=tmp_path / f"broker-{me}")
    as_broker = ClientTls(ca=files.ca, cert=files.cert, key=files.key)
    stub = replica_pb2_grpc.ReplicaStub(open_channel(tls_cluster.service(f"replica-{leader}").grpc, as_broker))

    def follower_fetch(replica_id: int) -> replica_pb2.FetchResponse:
        return stub.Fetch(replica_pb2.FetchRequest(replica_id=replica_id, max_wait_ms=0, partitions=[
            replica_pb2.FetchPartition(topic="follower-identity", partition=0, fetch_offset=0)]), timeout=10)

    with pytest.raises(grpc.RpcError) as err:
        follower_fetch(other)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value
    assert err.value.details().startswith("CLUSTER_AUTHORIZATION_FAILED"), err.value.details()
    assert follower_fetch(me).partitions[0].error_code == 0  # the certificate's own broker id is allowed


def test_the_replication_listener_speaks_mutual_tls_and_knows_a_follower_by_its_certificate(tls_cluster, ca,
                                                                                            tmp_path):
    s.create_topic(tls_cluster, "listener-identity", rf=3, metadata=[])
    leader = s.leader_of(tls_cluster, "listener-identity")
    me, other = [b for b in (0, 1, 2) if b != leader]
    address = f"127.0.0.1:{s.store(tls_cluster).brokers()[leader].replication_port}"
    files = ca.issue(f"broker-{me}", directory=tmp_path / f"broker-{me}")
    as_broker = ClientTls(ca=files.ca, cert=files.cert, key=files.key)
    position = [FetchPosition(topic="listener-identity", partition=0, fetch_offset=0)]

    def round_as(tls: ClientTls | None, replica_id: int):
        stream = SocketReplicationStream(address, tls=tls, metadata=(), connect_timeout_s=5)
        try:
            return stream.fetch(position, replica_id=replica_id, max_wait_ms=0)
        finally:
            stream.close()

    for stranger in (None, ClientTls(ca=files.ca)):  # plaintext; TLS without a client certificate
        with pytest.raises(NetworkException):
            round_as(stranger, me)
    with pytest.raises(ClusterAuthorizationFailed):
        round_as(as_broker, other)
    assert round_as(as_broker, me)[0].error is None  # the certificate's own broker id is allowed
    # The cluster's own followers replicate on the listener, over mutual TLS.
    for follower in (me, other):
        s.wait_until(lambda f=follower: s.metric(tls_cluster, f"replica-{leader}", "lowtide_replication_rounds_total",
                                                 follower=str(f), transport="socket") > 0,
                     what=f"follower {follower} fetching on the replication listener")
        assert s.metric(tls_cluster, f"replica-{leader}", "lowtide_replication_rounds_total",
                        follower=str(follower), transport="stream") == 0


def test_a_broker_token_without_the_broker_certificate_is_refused(tls_cluster):
    # The token a broker had before mutual TLS (DIR/secrets/replica-0.token): stolen, it makes no broker.
    token = Path(tls_cluster.state.auth["services"]["replica-0"]["token_file"]).read_text().strip()
    leader = tls_cluster.service("replica-1").grpc
    stub = replica_pb2_grpc.ReplicaStub(open_channel(leader, tls_cluster.client_tls))
    with pytest.raises(grpc.RpcError) as err:
        stub.DescribeLogs(replica_pb2.DescribeLogsRequest(partitions=[common_pb2.TopicPartition(topic="x")]),
                          metadata=[("authorization", f"Bearer {token}")], timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value
    assert "certificate" in err.value.details(), err.value.details()


def test_a_rotated_certificate_is_served_to_new_connections_and_open_channels_keep_working(tls_cluster, ca):
    tls = tls_cluster.client_tls
    front_door = tls_cluster.service("frontdoor-0")
    before = served_certificate(front_door.grpc, tls)
    with Admin(tls_cluster.bootstrap, tls=tls) as admin, Producer(tls_cluster.bootstrap, acks=-1, tls=tls) as producer:
        admin.create_topic("across-rotation", partitions=1, replication_factor=3)
        producer.send("across-rotation", b"before", partition=0)
        producer.flush()
        # Every service gets a new certificate on disk (same subject, new key), as cert-manager renews them.
        for entry in grpc_services(tls_cluster):
            ca.issue(entry.name, common_name=common_name(Path(tls_cluster.state.tls["dir"]) / entry.name / "tls.crt"))
        waiting.wait_until(lambda: served_certificate(front_door.grpc, tls).serial_number != before.serial_number,
                           timeout_s=10, what="the front door serving its rotated certificate")
        # Channels (and the replicas' replication streams) opened before the rotation keep working.
        producer.send("across-rotation", b"after", partition=0)
        producer.flush()
        assert admin.list_topics() and "across-rotation" in admin.list_topics()
    after = served_certificate(front_door.grpc, tls)
    assert after.serial_number != before.serial_number
    assert after.subject == before.subject
    assert [v for _, v in s.read_all(tls_cluster, "across-rotation")] == [b"before", b"after"]
    # and new connections with the rotated certificates work between every pair of services
    assert all(health(e.grpc, tls) == health_pb2.HealthCheckResponse.SERVING for e in grpc_services(tls_cluster))
    assert [e.pid for e in grpc_services(tls_cluster)] == [e.pid for e in grpc_services(LocalCluster.load(
        tls_cluster.data_dir))]  # no restart
    # etcd reads its certificate files at every handshake: the member serves its rotated one.
    member = tls_cluster.service("etcd-0")
    assert served_certificate(member.grpc, tls).serial_number == x509.load_pem_x509_certificate(
        (Path(tls_cluster.state.tls["dir"]) / "etcd-0" / "tls.crt").read_bytes()).serial_number
    client = s.etcd_client(tls_cluster)  # a new connection, after the rotation
    try:
        assert client.get_prefix("/lowtide/")[0], "the store answers no key over a new connection"
    finally:
        client.close()


def test_a_plaintext_client_at_a_tls_port_gets_an_error_that_says_how_to_configure_tls(tls_cluster):
    with Admin(tls_cluster.bootstrap, tls=False, timeout_s=5) as admin:  # type: ignore[arg-type]
        with pytest.raises(NetworkException) as err:
            admin.list_topics()
    assert "ssl.ca.location" in err.value.message, err.value.message



def test_redis_of_a_tls_cluster_speaks_only_tls(tls_cluster):
    url = tls_cluster.redis_url
    assert url.startswith("rediss://") and "ssl_ca_certs=" in url
    assert redis_lib.Redis.from_url(url).ping()  # every service reaches it with this URL
    host, port = tls_cluster.service("redis").grpc.rsplit(":", 1)
    plaintext = redis_lib.Redis(host=host, port=int(port), socket_timeout=3, socket_connect_timeout=3)
    with pytest.raises(redis_lib.ConnectionError):
        plaintext.ping()


def test_the_etcd_of_a_tls_cluster_serves_only_clients_with_a_certificate_of_the_cluster_ca(tls_cluster, tmp_path):
    """The metadata store: every service is given ``etcds://`` and dials it with its own certificate
    (the member refuses any other client, so the cluster running at all shows they do); a plaintext
    client, one without a certificate and one with a certificate of another CA get nothing."""
    members = tls_cluster.services("etcd")
    assert tls_cluster.metadata_url == "etcds://" + ",".join(m.grpc for m in members)
    for entry in grpc_services(tls_cluster):
        if not entry.is_etcd:
            assert entry.argv[entry.argv.index("--metadata-url") + 1] == tls_cluster.metadata_url, entry.name
    assert s.store(tls_cluster).live_broker_ids([0, 1, 2]) == {0, 1, 2}  # registered by the replicas over TLS
    stranger = CertificateAuthority.create(tmp_path / "stranger").issue("admin")
    refused = {"plaintext": None, "no certificate": ClientTls(ca=tls_cluster.client_tls.ca),
               "another CA's certificate": ClientTls(ca=tls_cluster.client_tls.ca, cert=stranger.cert,
                                                     key=stranger.key)}
    for what, tls in refused.items():
        client = EtcdClient([m.grpc for m in members], timeout_s=2.0,
                            credentials=tls.channel_credentials() if tls else None)
        try:
            with pytest.raises(MetadataStoreUnavailable):
                client.get_prefix("/lowtide/")
                pytest.fail(f"etcd answered a client with {what}")
        finally:
            client.close()
    admin = s.etcd_client(tls_cluster)
    try:
        assert admin.get_prefix("/lowtide/")[0]
    finally:
        admin.close()


def test_etcdctl_reaches_the_etcd_of_a_tls_cluster_only_with_the_cluster_client_certificate(tls_cluster):
    if shutil.which("etcdctl") is None and not os.path.exists("/usr/bin/etcdctl"):
        pytest.skip("etcdctl is not installed (apt-get install etcd-client; `make setup` does it)")
    member = tls_cluster.service("etcd-0")
    health = s.etcdctl(tls_cluster, "endpoint", "health", endpoint=member.grpc)
    assert "is healthy" in health.stdout + health.stderr
    keys = s.etcdctl(tls_cluster, "get", "/lowtide/", "--prefix", "--keys-only", endpoint=member.grpc).stdout
    assert any(line.startswith("/lowtide/") for line in keys.splitlines()), keys
    plain = subprocess.run(["etcdctl", f"--endpoints={member.grpc}", "--dial-timeout=2s", "--command-timeout=3s",
                            "endpoint", "health"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "ETCDCTL_API": "3"})
    assert plain.returncode != 0, plain.stdout


def test_cluster_status_checks_the_etcd_members_of_a_tls_cluster_over_tls_from_another_process(tls_cluster):
    report = s.cli_json("cluster", "status", "--data-dir", str(tls_cluster.data_dir), ok=False)
    health = {row["name"]: row["health"] for row in report["services"]}
    assert health["etcd-0"] == "SERVING", report
    assert report["healthy"] is True, report


def _plaintext_exchange(address: str, request: bytes) -> bytes:
    """What a plaintext client sending ``request`` to ``address`` reads back before the server
    closes the connection (or 10 s pass)."""
    host, _, port = address.rpartition(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        try:
            conn.sendall(request)
            while chunk := conn.recv(4096):
                answer += chunk
        except OSError:  # reset, or the timeout: no answer either way
            pass
    return answer


def _api_versions_frame(correlation_id: int) -> bytes:
    client = b"tls-test"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client)) + client  # ApiVersions v0
    return struct.pack(">i", len(body)) + body


def _cluster_json_services(cluster: LocalCluster) -> tuple[dict, list[dict]]:
    doc = json.loads((cluster.data_dir / "cluster.json").read_text())
    return doc, [e for e in doc["services"] if e["kind"] != "redis"]


def test_no_kafka_port_of_a_tls_cluster_answers_plaintext_and_kafka_bootstrap_is_tls(tls_cluster):
    """Issue 51: with --tls, no Kafka address cluster.json lists (each service's ``kafka``, its
    ``kafka_listeners``, ``kafka_bootstrap``) answers a plaintext ApiVersions, and kafka_bootstrap
    is the front door's SSL listener, answering the admin's certificate."""
    doc, services = _cluster_json_services(tls_cluster)
    addresses = {(e["name"], "kafka"): e["kafka"] for e in services if e.get("kafka")}
    addresses |= {(e["name"], n): a for e in services for n, a in e.get("kafka_listeners", {}).items()}
    addresses[("cluster", "kafka_bootstrap")] = doc["kafka_bootstrap"]
    assert {name for name, _ in addresses} == {"replica-0", "replica-1", "replica-2", "frontdoor-0", "cluster"}
    for (name, which), address in sorted(addresses.items()):
        answer = _plaintext_exchange(address, _api_versions_frame(7))
        assert answer[4:8] != struct.pack(">i", 7), f"{name} {which} {address} answered a plaintext ApiVersions"
    assert {n for _, n in addresses} == {"kafka", "SSL", "SASL_SSL", "kafka_bootstrap"}  # auth on: + SASL_SSL
    assert all(e["kafka"] == e["kafka_listeners"]["SSL"] for e in services if e.get("kafka"))
    assert doc["kafka_bootstrap"] == doc["kafka_bootstrap_ssl"] == tls_cluster.kafka_bootstrap
    assert tls_cluster.kafka_bootstrap_for("PLAINTEXT") == tls_cluster.kafka_bootstrap_for("SASL_PLAINTEXT") == ""
    host, _, port = doc["kafka_bootstrap"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            tls_cluster.client_tls.ssl_context().wrap_socket(raw, server_hostname=host) as conn:
        conn.sendall(_api_versions_frame(8))
        assert conn.recv(8)[4:8] == struct.pack(">i", 8)


def test_no_metrics_port_of_a_tls_cluster_answers_plain_http(tls_cluster):
    """Issue 51: every /metrics cluster.json lists (the etcd member's too) is an https URL; a plain
    HTTP GET there gets no HTTP answer, an HTTPS one verified with the cluster's CA gets the metrics
    (etcd's only with a client certificate)."""
    _, services = _cluster_json_services(tls_cluster)
    metrics = {e["name"]: e["metrics"] for e in services}
    assert set(metrics) == {e.name for e in grpc_services(tls_cluster)} and all(metrics.values()), metrics
    for name, url in sorted(metrics.items()):
        address = url.partition("://")[2].removesuffix("/metrics")
        answer = _plaintext_exchange(address, f"GET /metrics HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        assert not answer.startswith(b"HTTP/"), f"{name}'s /metrics answered plain HTTP: {answer[:60]!r}"
        assert url.startswith("https://"), (name, url)
        family = "etcd_" if tls_cluster.service(name).is_etcd else "lowtide_"
        assert f"# TYPE {family}" in s.metrics_text(tls_cluster, name), name  # over HTTPS with the CA
    member = tls_cluster.service("etcd-0")
    without_certificate = ssl.create_default_context(cafile=tls_cluster.state.tls["ca"])
    with pytest.raises(OSError):  # the handshake fails, or the connection is closed after it (TLS 1.3)
        urllib.request.urlopen(member.metrics_url, timeout=5, context=without_certificate).read()
