"""Kafka listeners (kafka/server.py, listener.py, tls_identity.py, apis_admin.endpoint): Kafka's
listeners / advertised.listeners / listener.security.protocol.map syntax, the TLS start-up checks,
a real loopback SSL listener recording who connected, and certificate logins."""

from __future__ import annotations

import argparse
import socket
import ssl
import struct
import threading
from types import SimpleNamespace

import pytest

from lowtide.errors import InvalidConfig, SaslAuthenticationFailed
from lowtide.kafka.apis_admin import endpoint
from lowtide.kafka.listener import Connection
from lowtide.kafka.server import (
    DEFAULT_PROTOCOL_MAP,
    KafkaEndpoint,
    ListenerSpec,
    add_kafka_flags,
    parse_advertised,
    parse_listeners,
    parse_protocol_map,
)
from lowtide.kafka.tls_identity import CertificateLogin
from lowtide.messages.admin import BrokerView
from lowtide.tls.certs import CertificateAuthority
from lowtide.tls.config import ServerTls, ServerTlsConfig
from lowtide.tls.principal import LOWTIDE_RULES, PrincipalMapper


def test_listeners_in_kafkas_syntax_with_the_default_and_a_custom_protocol_map():
    specs = parse_listeners("PLAINTEXT://:9092, SSL://127.0.0.1:9093,sasl_ssl://[::1]:9094",
                            parse_protocol_map(DEFAULT_PROTOCOL_MAP))
    assert specs == [ListenerSpec("PLAINTEXT", "PLAINTEXT", "0.0.0.0", 9092),
                     ListenerSpec("SSL", "SSL", "127.0.0.1", 9093), ListenerSpec("SASL_SSL", "SASL_SSL", "::1", 9094)]
    assert [s.tls for s in specs] == [False, True, True]
    named = parse_listeners("CLIENTS://:9093,INTERNAL://:9094", parse_protocol_map("CLIENTS:SSL,INTERNAL:PLAINTEXT"))
    assert [(s.name, s.protocol) for s in named] == [("CLIENTS", "SSL"), ("INTERNAL", "PLAINTEXT")]
    with pytest.raises(InvalidConfig, match="no security protocol"):
        parse_listeners("CLIENTS://:9093", parse_protocol_map(DEFAULT_PROTOCOL_MAP))
    with pytest.raises(InvalidConfig, match="NAME://HOST:PORT"):
        parse_listeners("SSL:9093", parse_protocol_map(DEFAULT_PROTOCOL_MAP))
    with pytest.raises(InvalidConfig, match="NAME:PROTOCOL"):
        parse_protocol_map("CLIENTS:TLS")
    assert parse_advertised("SSL://kafka-0.example:9093,PLAINTEXT://:0") == {
        "SSL": ("kafka-0.example", 9093), "PLAINTEXT": ("", 0)}


def _args(**flags) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_kafka_flags(parser, needs_frontdoor=False)
    parser.add_argument("--auth-enabled", action="store_true")
    argv = []
    for key, value in flags.items():
        argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [value])
    return parser.parse_args(argv)


def test_a_tls_listener_without_a_certificate_stops_start_up_with_a_clear_message():
    with pytest.raises(SystemExit, match="Kafka listener SSL needs a certificate: set --tls-cert"):
        KafkaEndpoint.from_args(_args(kafka_listeners="SSL://127.0.0.1:0"), name="replica-0")
    with pytest.raises(SystemExit, match="--kafka-ssl-client-auth must be one of"):
        KafkaEndpoint.from_args(_args(kafka_listener="127.0.0.1:0", kafka_ssl_client_auth="want"), name="x")
    with pytest.raises(SystemExit, match="does not have"):
        KafkaEndpoint.from_args(_args(kafka_listener="127.0.0.1:0", kafka_advertised_listeners="SSL://h:1"), name="x")
    assert KafkaEndpoint.from_args(_args(), name="x") is None


def test_the_plain_listener_keeps_its_flag_and_advertises_the_bound_port_unless_told():
    kafka = KafkaEndpoint.from_args(_args(kafka_listener="127.0.0.1:0", kafka_listeners="OTHER://127.0.0.1:0",
                                          kafka_listener_security_protocol_map="OTHER:PLAINTEXT",
                                          kafka_advertised_listeners="OTHER://kafka.example:19092"), name="x")
    assert [s.name for s in kafka.specs] == ["PLAINTEXT", "OTHER"]
    try:
        port = kafka.start()
        assert kafka.advertised("10.0.0.5") == {"PLAINTEXT": f"10.0.0.5:{port}", "OTHER": "kafka.example:19092"}
        assert kafka.advertised_port("10.0.0.5") == port
    finally:
        kafka.stop()
    with_auth = KafkaEndpoint.from_args(_args(kafka_listener="127.0.0.1:0", auth_enabled=True), name="x")
    assert with_auth.specs[0].name == "SASL_PLAINTEXT"


def test_metadata_endpoints_follow_the_listener_a_request_arrived_on():
    broker = BrokerView(id=1, host="10.0.0.1", port=7000, live=True, kafka_port=9092,
                        kafka_listeners={"SSL": "kafka-1.example:9093", "V6": "[::1]:9095"})
    on = lambda listener: SimpleNamespace(conn=Connection(peer="p", listener=listener))  # noqa: E731
    assert endpoint(on("SSL"), broker) == ("kafka-1.example", 9093)
    assert endpoint(on("V6"), broker) == ("::1", 9095)
    assert endpoint(on("PLAINTEXT"), broker) == ("10.0.0.1", 9092)  # not named: the one kafka_port
    old = BrokerView(id=2, host="10.0.0.2", port=7000, live=True, kafka_port=9092)  # from before named listeners
    assert endpoint(on("SSL"), old) == ("10.0.0.2", 9092)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.create(directory)
    server = ca.issue("server", common_name="broker-0")
    tls = ServerTls(ServerTlsConfig(cert=server.cert, key=server.key, ca=ca.ca_path, principal_rules=LOWTIDE_RULES),
                    watch=False)
    return SimpleNamespace(ca=ca, tls=tls, alice=ca.issue("alice"))


def test_an_ssl_listener_records_its_name_and_the_client_certificate(pki):
    seen: list[Connection] = []
    kafka = KafkaEndpoint(listeners=[ListenerSpec("SSL", "SSL", "127.0.0.1", 0)], max_request_bytes=1 << 20,
                          workers=2, name="t", tls=pki.tls, ssl_client_auth="required")

    def broker(conn, head, payload):
        seen.append(conn)
        return struct.pack(">ii", 4, head.correlation_id)

    kafka.attach(broker)
    port = kafka.start()
    try:
        context = ssl.create_default_context(cafile=str(pki.ca.ca_path))
        context.load_cert_chain(str(pki.alice.cert), str(pki.alice.key))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            body = struct.pack(">hhih", 18, 0, 5, 1) + b"c"
            tls.sendall(struct.pack(">i", len(body)) + body)
            assert struct.unpack(">ii", tls.recv(8)) == (4, 5)
        conn = seen[0]
        assert (conn.listener, conn.protocol) == ("SSL", "SSL")
        assert PrincipalMapper(LOWTIDE_RULES).principal_of_der(conn.peer_certificate) == "User:alice"
        # ssl.client.auth=required: no certificate, no connection
        bare = ssl.create_default_context(cafile=str(pki.ca.ca_path))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    bare.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(struct.pack(">i", len(body)) + body)
                if not tls.recv(8):
                    raise ConnectionError("closed")
    finally:
        kafka.stop()


class _Tokens:
    def __init__(self) -> None:
        self.live: dict[str, str] = {}
        self.count = 0
        self.lock = threading.Lock()

    def mint(self, principal: str, ttl_s: float) -> str:
        assert ttl_s > 60
        with self.lock:
            self.count += 1
            token = f"t{self.count}"
            self.live[token] = principal
        return token

    def end(self, token: str) -> None:
        self.live.pop(token, None)


def test_a_certificate_login_carries_a_session_token_renewed_and_ended_with_the_connection(pki):
    tokens = _Tokens()
    verified = []
    login = CertificateLogin(mapper=PrincipalMapper(LOWTIDE_RULES), mint=tokens.mint, end=tokens.end,
                             session_lifetime_ms=10_000, verify=verified.append)
    der = ssl.PEM_cert_to_DER_cert(pki.alice.cert.read_text())
    conn = Connection(peer="p", listener="SSL", protocol="SSL", peer_certificate=der)
    login.login(conn)
    assert (conn.principal, conn.authenticated, conn.metadata) == ("User:alice", True, (("authorization",
                                                                                         "Bearer t1"),))
    assert verified == [conn.metadata] and tokens.live == {"t1": "User:alice"}
    login.renew(conn)
    assert tokens.live == {"t2": "User:alice"} and conn.metadata == (("authorization", "Bearer t2"),)
    conn.close()
    assert tokens.live == {}
    with pytest.raises(SaslAuthenticationFailed, match="no client certificate"):
        login.login(Connection(peer="q", listener="SSL", protocol="SSL"))


def test_a_certificate_the_services_refuse_is_refused_at_login_and_its_token_forgotten(pki):
    tokens = _Tokens()

    def refuse(_metadata):
        raise SaslAuthenticationFailed("User:broker-0 authenticates with its certificate")

    login = CertificateLogin(mapper=PrincipalMapper(LOWTIDE_RULES), mint=tokens.mint, end=tokens.end,
                             session_lifetime_ms=10_000, verify=refuse)
    server_der = ssl.PEM_cert_to_DER_cert(pki.tls.config.cert.read_text())
    conn = Connection(peer="p", listener="SSL", protocol="SSL", peer_certificate=server_der)
    with pytest.raises(SaslAuthenticationFailed, match="client certificate of User:broker-0 refused"):
        login.login(conn)
    assert not conn.authenticated and tokens.live == {}
    # authentication off: the principal is recorded, nothing is minted
    off = CertificateLogin(mapper=PrincipalMapper(LOWTIDE_RULES), mint=None, end=None, session_lifetime_ms=10_000)
    off.login(conn)
    assert (conn.principal, conn.metadata) == ("User:broker-0", ())
