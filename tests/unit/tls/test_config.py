"""TLS settings: flags and properties files, certificates reloaded from disk, and a real gRPC
server on loopback serving TLS and mutual TLS with them."""

from __future__ import annotations

import argparse
import shutil
import socket
import ssl
import urllib.request
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import lowtide.rpc.channels as channels_module
from lowtide.common.server import add_flag, start_metrics_server
from lowtide.errors import InvalidConfig
from lowtide.rpc.channels import ChannelPool, open_channel
from lowtide.tls.certs import CertificateAuthority
from lowtide.tls.config import (
    CertificateWatcher,
    ClientTls,
    ServerTls,
    ServerTlsConfig,
    add_tls_flags,
    server_tls_from_args,
)
from lowtide.tls.principal import LOWTIDE_RULES


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path / "ca")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_tls_flags(parser, add_flag)
    return parser.parse_args(list(argv))


def test_no_tls_flags_means_plaintext():
    assert server_tls_from_args(parse()) is None


def test_tls_flags_become_a_checked_config(ca):
    files = ca.issue("frontdoor")
    config = server_tls_from_args(parse("--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca",
                                        str(files.ca), "--tls-client-auth", "required",
                                        "--tls-principal-mapping-rules", LOWTIDE_RULES))
    assert config == ServerTlsConfig(cert=files.cert, key=files.key, ca=files.ca, client_auth="required",
                                     principal_rules=LOWTIDE_RULES)
    assert config.mutual


@pytest.mark.parametrize("argv, message", [
    (("--tls-cert", "a.pem"), "--tls-cert and --tls-key go together"),
    (("--tls-ca", "ca.pem"), "need --tls-cert and --tls-key"),
    (("--tls-cert", "a", "--tls-key", "b", "--tls-client-auth", "maybe"), "--tls-client-auth must be one of"),
    (("--tls-cert", "a", "--tls-key", "b", "--tls-client-auth", "required"), "needs --tls-ca"),
    (("--tls-cert", "a", "--tls-key", "b", "--tls-principal-mapping-rules", "RULE:x"), "mapping.rules"),
])
def test_inconsistent_tls_flags_are_an_invalid_config_naming_the_flag(argv, message):
    with pytest.raises(InvalidConfig, match=message):
        server_tls_from_args(parse(*argv))


def test_tls_flags_fall_back_to_lowtide_environment_variables(ca, monkeypatch):
    files = ca.issue("replica-0")
    monkeypatch.setenv("LOWTIDE_TLS_CERT", str(files.cert))
    monkeypatch.setenv("LOWTIDE_TLS_KEY", str(files.key))
    config = server_tls_from_args(parse())
    assert config is not None and config.cert == files.cert and config.client_auth == "none"


def test_a_missing_or_non_pem_file_is_named_in_the_error(ca, tmp_path):
    files = ca.issue("x")
    with pytest.raises(InvalidConfig, match="cannot read TLS certificate .*nope.pem"):
        ServerTls(ServerTlsConfig(cert=tmp_path / "nope.pem", key=files.key), watch=False)
    (tmp_path / "garbage.pem").write_text("not a certificate")
    with pytest.raises(InvalidConfig, match="garbage.pem' is not PEM"):
        ServerTls(ServerTlsConfig(cert=tmp_path / "garbage.pem", key=files.key), watch=False)


def test_a_key_that_does_not_match_its_certificate_stops_start_up(ca):
    one, other = ca.issue("one"), ca.issue("other")
    with pytest.raises(InvalidConfig, match="do not load together"):
        ServerTls(ServerTlsConfig(cert=one.cert, key=other.key), watch=False)


def test_the_watcher_takes_a_rotated_pair_and_skips_a_half_written_one(ca, tmp_path):
    files = ca.issue("svc")
    watcher = CertificateWatcher(cert=files.cert, key=files.key, ca=files.ca)
    first = watcher.current
    assert watcher.check() is False  # nothing changed
    # mid-rotation: a new certificate whose key is not there yet (cert-manager writes both, in turn)
    staged = ca.issue("svc", directory=tmp_path / "staged")
    shutil.copyfile(staged.cert, files.cert)
    assert watcher.check() is False and watcher.current == first and watcher.generation == 0
    shutil.copyfile(staged.key, files.key)
    assert watcher.check() is True
    assert watcher.current.cert == staged.cert.read_bytes() and watcher.generation == 1


def test_client_tls_from_a_properties_file_uses_librdkafka_key_names(tmp_path):
    props = {"security.protocol": "SSL", "ssl.ca.location": "/etc/ca.crt", "ssl.certificate.location": "c.crt",
             "ssl.key.location": "c.key", "lowtide.ssl.server.name": "frontdoor.lowtide"}
    tls = ClientTls.from_properties(props, base=tmp_path)
    assert tls == ClientTls(ca=Path("/etc/ca.crt"), cert=tmp_path / "c.crt", key=tmp_path / "c.key",
                            server_name="frontdoor.lowtide")
    assert ClientTls.from_properties({"lowtide.auth.token": "t"}) is None
    assert ClientTls.from_properties({"security.protocol": "SASL_PLAINTEXT", "ssl.ca.location": "x"}) is None
    assert ClientTls.from_properties({"security.protocol": "ssl"}) == ClientTls()  # the system's CAs
    assert ClientTls.from_properties(tls.to_properties()) == tls


def test_a_client_certificate_needs_its_key():
    with pytest.raises(InvalidConfig, match="needs its key"):
        ClientTls(ca=None, cert=Path("c.crt"))


def test_client_tls_from_the_environment():
    assert ClientTls.from_env({}) is None
    assert ClientTls.from_env({"LOWTIDE_TLS_CA": "/ca.crt"}) == ClientTls(ca=Path("/ca.crt"))


class _WhoAmI(health.HealthServicer):
    """Health that remembers the client certificate's principal of each call."""

    def __init__(self, tls: ServerTls) -> None:
        super().__init__()
        self.tls = tls
        self.principals: list[str | None] = []
        self.certificates: list[bytes] = []

    def Check(self, request, context):
        pems = context.auth_context().get("x509_pem_cert")
        self.principals.append(self.tls.mapper.principal_of_pem(pems[0]) if pems else None)
        if pems:
            self.certificates.append(pems[0])
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture
def tls_server(ca):
    servers = []

    def start(client_auth: str) -> tuple[str, _WhoAmI]:
        files = ca.issue("server")
        tls = ServerTls(ServerTlsConfig(cert=files.cert, key=files.key, ca=files.ca, client_auth=client_auth,
                                        principal_rules=LOWTIDE_RULES))
        servicer = _WhoAmI(tls)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
        server.start()
        servers.append((server, tls))
        return f"127.0.0.1:{port}", servicer

    yield start
    for server, tls in servers:
        server.stop(0)
        tls.close()


def check(address: str, tls: ClientTls | None) -> grpc.StatusCode:
    channel = open_channel(address, tls)
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        channel.close()


def test_server_only_tls_serves_any_client_that_trusts_the_ca_and_no_plaintext(tls_server, ca):
    address, servicer = tls_server("none")
    assert check(address, ClientTls(ca=ca.ca_path)) == grpc.StatusCode.OK
    assert check(address, None) == grpc.StatusCode.UNAVAILABLE
    assert servicer.principals == [None]


def test_mutual_tls_serves_only_clients_with_a_certificate_and_names_them(tls_server, ca, tmp_path):
    address, servicer = tls_server("required")
    broker = ca.issue("replica-1", common_name="broker-1")
    assert check(address, ClientTls(ca=broker.ca, cert=broker.cert, key=broker.key)) == grpc.StatusCode.OK
    assert servicer.principals == ["User:broker-1"]
    assert check(address, ClientTls(ca=ca.ca_path)) == grpc.StatusCode.UNAVAILABLE
    stranger = CertificateAuthority.create(tmp_path / "stranger").issue("broker-1")
    assert check(address, ClientTls(ca=ca.ca_path, cert=stranger.cert, key=stranger.key)) == grpc.StatusCode.UNAVAILABLE
    assert servicer.principals == ["User:broker-1"]  # the refused ones never reached the servicer


def test_metrics_over_https_serve_a_rotated_certificate_to_new_connections(ca, tmp_path):
    files = ca.issue("svc")
    tls = ServerTls(ServerTlsConfig(cert=files.cert, key=files.key, ca=files.ca), watch=False)
    server = start_metrics_server("127.0.0.1:0", tls=tls)
    try:
        context = ssl.create_default_context(cafile=str(files.ca))

        def served_serial() -> int:
            with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as raw, \
                    context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                return x509.load_der_x509_certificate(conn.getpeercert(binary_form=True)).serial_number

        before = served_serial()
        body = urllib.request.urlopen(f"https://127.0.0.1:{server.server_port}/metrics", context=context).read()
        assert b"python_info" in body or b"process_" in body
        ca.issue("svc")  # renewed on disk
        assert tls.watcher.check()
        assert served_serial() != before
    finally:
        server.shutdown()


def test_a_channel_pool_presents_a_renewed_client_certificate_on_later_calls(tls_server, ca, monkeypatch):
    monkeypatch.setattr(channels_module, "ROTATION_CHECK_S", 0.0)
    address, servicer = tls_server("required")
    files = ca.issue("replica-1", common_name="broker-1")
    pool = ChannelPool(tls=ClientTls(ca=files.ca, cert=files.cert, key=files.key))
    try:
        old_stub = pool.stub(address, health_pb2_grpc.HealthStub)
        old_stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        ca.issue("replica-1", common_name="broker-1")  # renewed: same subject, new key and serial
        new_stub = pool.stub(address, health_pb2_grpc.HealthStub)
        assert new_stub is not old_stub
        new_stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        old_stub.Check(health_pb2.HealthCheckRequest(), timeout=5)  # the old channel still works
    finally:
        pool.close()
    serials = [x509.load_pem_x509_certificate(pem).serial_number for pem in servicer.certificates]
    assert serials[0] != serials[1] and serials[2] == serials[0]
