"""The Kafka listener over TLS on a real ``--tls`` cluster with auth (issue 33): ``SSL`` with client
certificates as identities and ``SASL_SSL`` with SCRAM inside TLS, with unchanged Kafka clients:
Apache Kafka's console producer and consumer (PEM truststore and keystore, KIP-651),
confluent-kafka (librdkafka) and kafka-python.

One cluster for the module: 3 replicas and a front door, each with an ``SSL`` listener requiring
client certificates and a ``SASL_SSL`` one, and no plaintext listener (issue 51). Client
certificates are issued by the cluster's CA (``DIR/tls``) for ``CN=<user>,O=lowtide``, which the
cluster's mapping rules make ``User:<user>``; ACLs are granted with ``lowtide acls add``.
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import TopicAuthorizationFailedError

from lowtide.auth.acl import AclBinding
from lowtide.client import Admin
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.tls.certs import CertFiles, CertificateAuthority
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.kafka_tools import kafka_tool

# Ample for an ACL change to reach the replicas (their metadata watches deliver it; auth/acl.py Authorizer).
ACL_REFRESH_S = 0.25


@dataclass(frozen=True)
class TlsCluster:
    cluster: LocalCluster
    tmp: Path
    ca: CertificateAuthority

    @property
    def ca_file(self) -> str:
        return self.cluster.state.tls["ca"]

    def bootstrap(self, protocol: str) -> str:
        address = self.cluster.kafka_bootstrap_for(protocol)
        assert address, f"the cluster has no {protocol} listener"
        return address

    def client_cert(self, user: str) -> CertFiles:
        """A client certificate CN=<user>,O=lowtide signed by the cluster's CA."""
        return self.ca.issue(f"client-{user}", common_name=user, directory=self.tmp / "certs" / user)


@pytest.fixture(scope="module")
def tcluster(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kafka-tls")
    config = ClusterConfig(data_dir=tmp / "cluster", replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
                           auth_enabled=True, tls=True)
    for cluster in running_cluster(request, config):
        yield TlsCluster(cluster=cluster, tmp=tmp, ca=CertificateAuthority.create(config.tls_dir))


def grant(tc: TlsCluster, principal: str, resource: tuple[str, str], *operations: str) -> None:
    """ACLs through the Admin service as User:admin (the cluster's admin certificate), in force on
    every replica when this returns: a replica's authorizer checks the ACL version at most every
    0.2 s (auth/acl.py), so a request within 0.2 s of the grant may still be judged by the ACLs
    before it. Creating the topic afterwards was assumed to take longer; on an idle machine it
    did not always."""
    kind, name = resource
    with Admin(tc.cluster.bootstrap, tls=tc.cluster.client_tls) as admin:
        errors = admin.create_acls([AclBinding(principal=principal, resource_type=kind.upper(), resource_name=name,
                                               pattern_type="LITERAL", operation=operation.upper(),
                                               permission="ALLOW") for operation in operations])
    assert errors == [None] * len(operations), errors
    time.sleep(ACL_REFRESH_S)


def kafka_python_ssl(tc: TlsCluster, files: CertFiles | None) -> dict:
    creds = {"bootstrap_servers": tc.bootstrap("SSL"), "security_protocol": "SSL", "ssl_cafile": tc.ca_file}
    if files is not None:
        creds.update(ssl_certfile=str(files.cert), ssl_keyfile=str(files.key))
    return creds


def confluent_ssl(tc: TlsCluster, files: CertFiles, **extra) -> dict:
    return {"bootstrap.servers": tc.bootstrap("SSL"), "security.protocol": "SSL", "ssl.ca.location": tc.ca_file,
            "ssl.certificate.location": str(files.cert), "ssl.key.location": str(files.key), **extra}


def replica_ports(tc: TlsCluster, listener: str) -> set[int]:
    return {int(r.kafka_listeners[listener].rpartition(":")[2]) for r in tc.cluster.services("replica")}


def run_java(tool: str, *args: str, stdin: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([str(kafka_tool(tool)), *args], stdin=subprocess.PIPE if stdin is not None else None,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, stdin: str | None = None, timeout_s: float = 120) -> str:
    out, err = proc.communicate(input=stdin, timeout=timeout_s)
    assert proc.returncode == 0, err[-3000:]
    return out


def produce_and_consume_with_java(tc: TlsCluster, *, protocol: str, props: Path, topic: str, group: str) -> list[str]:
    """The console consumer (started first, reading from the beginning) and the console producer
    run side by side: two JVM starts in the wall time of one."""
    lines = [f"{protocol.lower()}-{i}" for i in range(3)]
    consumer = run_java("kafka-console-consumer", "--bootstrap-server", tc.bootstrap(protocol), "--topic", topic,
                        "--group", group, "--from-beginning", "--max-messages", str(len(lines)),
                        "--timeout-ms", "90000", "--consumer.config", str(props))
    try:
        producer = run_java("kafka-console-producer", "--bootstrap-server", tc.bootstrap(protocol), "--topic", topic,
                            "--producer.config", str(props), stdin="")
        finish(producer, stdin="".join(f"{line}\n" for line in lines))
        return finish(consumer).split()
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()


def test_java_console_producer_and_consumer_over_sasl_ssl_with_scram(tcluster):
    tc = tcluster
    with Admin(tc.cluster.bootstrap, tls=tc.cluster.client_tls) as admin:
        assert admin.upsert_user_scram_credential("carol", "carol-pw") is None
    grant(tc, "User:carol", ("topic", "tls-scram"), "write", "read")
    grant(tc, "User:carol", ("group", "tls-scram-group"), "read")
    s.create_topic(tc.cluster, "tls-scram")
    props = tc.tmp / "carol.properties"
    # Only a truststore (PEM, KIP-651): SASL_SSL authenticates with SCRAM, not a certificate.
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
                     "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                     'username="carol" password="carol-pw";\n'
                     f"ssl.truststore.type=PEM\nssl.truststore.location={tc.ca_file}\n")
    consumed = produce_and_consume_with_java(tc, protocol="SASL_SSL", props=props, topic="tls-scram",
                                             group="tls-scram-group")
    assert consumed == ["sasl_ssl-0", "sasl_ssl-1", "sasl_ssl-2"]


def test_java_console_producer_and_consumer_over_ssl_with_client_certificates(tcluster):
    tc = tcluster
    dave = tc.client_cert("dave")
    grant(tc, "User:dave", ("topic", "tls-java"), "write", "read")
    grant(tc, "User:dave", ("group", "tls-java-group"), "read")
    s.create_topic(tc.cluster, "tls-java")
    keystore = tc.tmp / "dave-keystore.pem"  # Java's PEM keystore: the PKCS#8 key and the certificate
    keystore.write_bytes(dave.key.read_bytes() + dave.cert.read_bytes())
    props = tc.tmp / "dave.properties"
    props.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={tc.ca_file}\n"
                     f"ssl.keystore.type=PEM\nssl.keystore.location={keystore}\n")
    consumed = produce_and_consume_with_java(tc, protocol="SSL", props=props, topic="tls-java", group="tls-java-group")
    assert consumed == ["ssl-0", "ssl-1", "ssl-2"]


def test_confluent_kafka_produces_and_kafka_python_consumes_over_ssl(tcluster):
    tc = tcluster
    erin = tc.client_cert("erin")
    grant(tc, "User:erin", ("topic", "tls-clients"), "write", "read", "describe")
    s.create_topic(tc.cluster, "tls-clients")
    producer = Producer(confluent_ssl(tc, erin))
    failures = []

    def delivered(err, _message) -> None:
        if err is not None:
            failures.append(err)

    for i in range(5):
        producer.produce("tls-clients", value=f"v{i}".encode(), on_delivery=delivered)
    assert producer.flush(30) == 0 and failures == []
    consumer = KafkaConsumer(consumer_timeout_ms=20000, **kafka_python_ssl(tc, erin))
    try:
        consumer.assign([TopicPartition("tls-clients", 0)])
        consumer.seek_to_beginning()
        values = [m.value for _, m in zip(range(5), consumer, strict=False)]
    finally:
        consumer.close()
    assert values == [f"v{i}".encode() for i in range(5)]


def test_metadata_answers_with_the_endpoints_of_the_listener_asked(tcluster):
    tc = tcluster
    admin_files = CertFiles(cert=Path(tc.cluster.state.tls["client_cert"]),
                            key=Path(tc.cluster.state.tls["client_key"]), ca=Path(tc.ca_file))
    ssl_brokers = AdminClient(confluent_ssl(tc, admin_files)).list_topics(timeout=30).brokers
    assert {b.port for b in ssl_brokers.values()} == replica_ports(tc, "SSL")
    sasl_ssl = AdminClient({"bootstrap.servers": tc.bootstrap("SASL_SSL"), "security.protocol": "SASL_SSL",
                            "ssl.ca.location": tc.ca_file, "sasl.mechanisms": "PLAIN", "sasl.username": "admin",
                            "sasl.password": Path(tc.cluster.state.auth["admin_token_file"]).read_text().strip()})
    assert {b.port for b in sasl_ssl.list_topics(timeout=30).brokers.values()} == replica_ports(tc, "SASL_SSL")
    assert len({*replica_ports(tc, "SSL"), *replica_ports(tc, "SASL_SSL")}) == 6
    # no plaintext listener (issue 51): each replica's Kafka address is its SSL listener
    assert {int(r.kafka.rpartition(":")[2]) for r in tc.cluster.services("replica")} == replica_ports(tc, "SSL")
    assert tc.cluster.kafka_bootstrap == tc.bootstrap("SSL") and tc.cluster.kafka_bootstrap_for("SASL_PLAINTEXT") == ""


def test_a_client_certificate_is_its_principal_in_acl_decisions(tcluster):
    tc = tcluster
    frank = tc.client_cert("frank")
    grant(tc, "User:frank", ("topic", "tls-frank"), "write")
    s.create_topic(tc.cluster, "tls-frank")
    s.create_topic(tc.cluster, "tls-not-frank")
    producer = KafkaProducer(**kafka_python_ssl(tc, frank), max_block_ms=20000)
    try:
        producer.send("tls-frank", b"allowed").get(timeout=30)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("tls-not-frank", b"refused").get(timeout=30)
    finally:
        producer.close(timeout=5)
    # gina's certificate is signed by the same CA, but User:gina has no ACL on tls-frank
    gina = KafkaProducer(**kafka_python_ssl(tc, tc.client_cert("gina")), max_block_ms=20000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            gina.send("tls-frank", b"refused").get(timeout=30)
    finally:
        gina.close(timeout=5)


def test_a_service_certificate_maps_to_its_principal_and_is_refused_on_the_kafka_listener(tcluster):
    """The certificate CN=broker-1,O=lowtide is User:broker-1, a lowtide service identity, which
    with mutual TLS authenticates by certificate on gRPC only: the listener refuses it and says why."""
    tc = tcluster
    broker = tc.client_cert("broker-1")
    context = ssl.create_default_context(cafile=tc.ca_file)
    context.load_cert_chain(str(broker.cert), str(broker.key))
    host, _, port = tc.bootstrap("SSL").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        client = b"tls-test"  # Metadata v1 for no topic: the first request that needs an identity
        body = struct.pack(">hhih", 3, 1, 8, len(client)) + client + struct.pack(">i", 0)
        tls.sendall(struct.pack(">i", len(body)) + body)
        answer = _read_all(tls)
    assert answer == b""  # closed without an answer, as Kafka closes a connection that failed to authenticate
    log = Path(tc.cluster.service("frontdoor-0").log)
    s.wait_until(lambda: "client certificate of User:broker-1 refused" in log.read_text(),
                 what="the refusal of User:broker-1 logged")


def _tls_connect(tc: TlsCluster, context: ssl.SSLContext) -> None:
    host, _, port = tc.bootstrap("SSL").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(_api_versions_frame())
        assert tls.recv(4), "no answer"  # TLS 1.3: a refused client certificate surfaces at the first read


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    try:
        while chunk := sock.recv(4096):
            answer += chunk
    except (ConnectionError, ssl.SSLError):
        pass
    return answer


def _api_versions_frame() -> bytes:
    client = b"tls-test"
    body = struct.pack(">hhih", 18, 0, 7, len(client)) + client  # ApiVersions v0, correlation id 7
    return struct.pack(">i", len(body)) + body


def test_untrusting_clients_clients_without_certificates_and_plaintext_are_refused_on_ssl(tcluster, tmp_path):
    tc = tcluster
    frank = tc.client_cert("frank")
    trusting = ssl.create_default_context(cafile=tc.ca_file)
    trusting.load_cert_chain(str(frank.cert), str(frank.key))
    _tls_connect(tc, trusting)  # the control: a trusting client with a certificate is answered
    # a client trusting another CA refuses the server's certificate
    other = CertificateAuthority.create(tmp_path / "other-ca")
    untrusting = ssl.create_default_context(cafile=str(other.ca_path))
    with pytest.raises(ssl.SSLCertVerificationError):
        _tls_connect(tc, untrusting)
    # ssl.client.auth=required: no client certificate, no connection
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        _tls_connect(tc, ssl.create_default_context(cafile=tc.ca_file))
    # a certificate from another CA is refused too
    foreign = other.issue("frank", directory=tmp_path / "foreign")
    impostor = ssl.create_default_context(cafile=tc.ca_file)
    impostor.load_cert_chain(str(foreign.cert), str(foreign.key))
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        _tls_connect(tc, impostor)
    # plaintext Kafka to the SSL port: never a Kafka answer
    host, _, port = tc.bootstrap("SSL").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(_api_versions_frame())
        answer = _read_all(raw)
    assert answer[4:8] != struct.pack(">i", 7), answer


def test_a_saslhandshake_on_the_ssl_listener_is_refused_as_kafka_refuses_it(tcluster):
    tc = tcluster
    hana = tc.client_cert("hana")
    context = ssl.create_default_context(cafile=tc.ca_file)
    context.load_cert_chain(str(hana.cert), str(hana.key))
    host, _, port = tc.bootstrap("SSL").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        client, mechanism = b"tls-test", b"PLAIN"
        body = struct.pack(">hhih", 17, 1, 9, len(client)) + client + struct.pack(">h", len(mechanism)) + mechanism
        tls.sendall(struct.pack(">i", len(body)) + body)
        head = tls.recv(10)
    _size, correlation, error = struct.unpack(">iih", head)
    assert (correlation, error) == (9, 34)  # ILLEGAL_SASL_STATE: the certificate is the identity here
