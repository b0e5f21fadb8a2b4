"""Requests whose bytes are not a protobuf message, sent to every gRPC service of a real local
cluster: each is answered INVALID_ARGUMENT (``INVALID_REQUEST: ...``) and leaves a warning line,
not a traceback, in the service's log.

The two inputs that reached gRPC's own "Exception deserializing message!" traceback (and an
INTERNAL answer) before: bytes upb refuses (``DecodeError``, any method), and bytes the Replica's
Produce deserializer refuses (``WireFormatError``, lowtide/rpc/wire.py). A bidi stream (Replicate)
is refused the same way on its first unparsable message."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide_pb import admin_pb2, coordinator_pb2, replica_pb2, scanner_pb2
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

# b"\x0b": field 1 with wire type 3 (a group start): upb refuses it, as does lowtide.rpc.wire.
# b"\x0a\x05ab": a length-delimited field that runs past the end of the message.
# b"\x08" + 11 x 0xff: a varint longer than 10 bytes.
GARBAGE = [b"\x0b", b"\x0a\x05ab", b"\x08" + b"\xff" * 11]

SERVICES = {  # service in the cluster -> the gRPC service it serves and one unary method of it
    "replica-0": (replica_pb2, "Replica", "ListOffsets"),
    "frontdoor-0": (admin_pb2, "Admin", "ListTopics"),
    "coordinator-0": (coordinator_pb2, "DisklessCoordinator", "CommitFile"),
    "orphan-scanner-0": (scanner_pb2, "OrphanScanner", "Status"),
}


@pytest.fixture(scope="module")
def every_service(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("unparsable"), replicas=1, coordinators=1,
                           orphan_scanners=1, replica_config=dict(DEFAULT_REPLICA_CONFIG))
    yield from running_cluster(request, config)


def full_name(module, service: str) -> str:
    return module.DESCRIPTOR.services_by_name[service].full_name


def unary(cluster: LocalCluster, name: str, method: str, raw: bytes) -> grpc.RpcError:
    """The error ``raw`` sent to ``method`` of ``name`` got (identity serializers: the bytes as they are)."""
    with grpc.insecure_channel(cluster.service(name).grpc) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            call(raw, timeout=10)
    return caught.value


def log_of(cluster: LocalCluster, name: str) -> str:
    return Path(cluster.service(name).log).read_text()


def assert_refused(err: grpc.RpcError) -> None:
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert err.details().startswith("INVALID_REQUEST: the request cannot be parsed"), err.details()


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_request_that_is_not_protobuf_is_invalid_argument_without_a_traceback(every_service, name):
    module, service, method = SERVICES[name]
    path = f"/{full_name(module, service)}/{method}"
    for raw in GARBAGE:
        assert_refused(unary(every_service, name, path, raw))
    log = log_of(every_service, name)
    assert "Traceback" not in log and "Exception deserializing" not in log
    assert log.count("refused a request that cannot be parsed") >= len(GARBAGE)


def test_a_produce_its_own_deserializer_cannot_split_is_invalid_argument_without_a_traceback(every_service):
    path = f"/{full_name(replica_pb2, 'Replica')}/Produce"
    for raw in GARBAGE:
        err = unary(every_service, "replica-0", path, raw)
        assert_refused(err)
        assert "WireFormatError" in err.details()
    assert "Traceback" not in log_of(every_service, "replica-0")


def test_a_replication_stream_whose_message_is_not_protobuf_is_invalid_argument(every_service):
    path = f"/{full_name(replica_pb2, 'Replica')}/Replicate"
    with grpc.insecure_channel(every_service.service("replica-0").grpc) as channel:
        call = channel.stream_stream(path, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            list(call(iter([GARBAGE[0]]), timeout=10))
    assert_refused(caught.value)
    assert "Traceback" not in log_of(every_service, "replica-0")
