"""Which certificate a server's metadata store presents to an ``etcds://`` etcd: the server's own
(its ``--tls-cert``/``--tls-key``, trusting ``--tls-ca``), as it does to the services it calls.

A stand-in etcd (the Maintenance service only) that requires a client certificate records the
subject of the one each call came with."""

from __future__ import annotations

import argparse
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from lowtide.common import bootstrap
from lowtide.common.server import add_auth_flags, add_common_flags
from lowtide.metadata.store import MetadataStore
from lowtide.tls import config as tls_config
from lowtide.tls.certs import CertFiles, CertificateAuthority
from lowtide_pb import etcd_rpc_pb2 as pb
from lowtide_pb import etcd_rpc_pb2_grpc as pb_grpc


class RecordingMaintenance(pb_grpc.MaintenanceServicer):
    def __init__(self) -> None:
        self.callers: list[str] = []

    def Status(self, request, context):  # noqa: N802 - the gRPC method's name
        self.callers += [cn.decode() for cn in context.auth_context().get("x509_common_name", [])]
        return pb.StatusResponse(version="stand-in", leader=1, header=pb.ResponseHeader(member_id=1, revision=1))


@pytest.fixture
def stand_in_etcd(tmp_path: Path):
    """(CA, address, servicer): a mutual-TLS-only stand-in of an etcd member with a certificate of the CA."""
    ca = CertificateAuthority.create(tmp_path / "ca")
    files = ca.issue("etcd-0")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = RecordingMaintenance()
    pb_grpc.add_MaintenanceServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials([(files.key.read_bytes(), files.cert.read_bytes())],
                                              root_certificates=files.ca.read_bytes(), require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield ca, f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


def server_args(files: CertFiles, metadata_url: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_flags(parser, grpc_port=0)
    add_auth_flags(parser, checks="-", own_token="-")
    return parser.parse_args(["--metadata-url", metadata_url, "--tls-cert", str(files.cert), "--tls-key",
                              str(files.key), "--tls-ca", str(files.ca), "--tls-client-auth", "required"])


def test_a_server_dials_an_etcds_metadata_url_with_its_own_certificate(stand_in_etcd, monkeypatch) -> None:
    ca, address, servicer = stand_in_etcd
    monkeypatch.setattr(tls_config, "_default", [])  # the process default is the server's to set
    monkeypatch.setattr(bootstrap, "configure_logging", lambda **_kwargs: None)
    args = server_args(ca.issue("replica-0", common_name="broker-0"), f"etcds://{address}")
    boot = bootstrap.ServerBootstrap(args, name="replica-0")
    try:
        store = MetadataStore.from_url(args.metadata_url)  # as ServerBootstrap.connect opens it
        try:
            assert store.client.status(timeout_s=5.0).leader == 1
        finally:
            store.close()
    finally:
        boot.tls.close()
    assert servicer.callers == ["broker-0"]


def test_a_tool_dials_an_etcds_url_with_the_certificate_it_is_given_over_the_process_default(
        stand_in_etcd, monkeypatch) -> None:
    ca, address, servicer = stand_in_etcd
    own, admin = ca.issue("frontdoor-0", common_name="frontdoor"), ca.issue("admin")
    monkeypatch.setattr(tls_config, "_default", [tls_config.ClientTls(ca=own.ca, cert=own.cert, key=own.key)])
    for tls in (None, tls_config.ClientTls(ca=admin.ca, cert=admin.cert, key=admin.key)):
        store = MetadataStore.from_url(f"etcds://{address}", tls=tls)
        try:
            store.client.status(timeout_s=5.0)
        finally:
            store.close()
    assert servicer.callers == ["frontdoor", "admin"]
