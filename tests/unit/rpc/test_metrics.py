"""The request-metrics interceptor on a real gRPC server: counts, codes, latency, streams."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from prometheus_client import REGISTRY

from lowtide.errors import UnknownTopicOrPartition
from lowtide.rpc.interceptor import ErrorInterceptor
from lowtide.rpc.metrics import MetricsInterceptor, split_method

SERVICE = "lowtide.test.Probe"


def _identity(raw: bytes) -> bytes:
    return raw


def _ok(request: bytes, context) -> bytes:
    return request


def _fail(request: bytes, context) -> bytes:
    raise UnknownTopicOrPartition("no such partition")


def _echo_stream(requests, context):
    yield from requests


@pytest.fixture
def channel():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         interceptors=[MetricsInterceptor(), ErrorInterceptor()])
    handlers = {
        "Ok": grpc.unary_unary_rpc_method_handler(_ok, _identity, _identity),
        "Fail": grpc.unary_unary_rpc_method_handler(_fail, _identity, _identity),
        "Echo": grpc.stream_stream_rpc_method_handler(_echo_stream, _identity, _identity),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    server.stop(None)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"grpc_service": SERVICE, **labels}) or 0.0


def test_split_method_names_the_service_and_the_method() -> None:
    assert split_method("/lowtide.v1.Replica/Fetch") == ("lowtide.v1.Replica", "Fetch")


def test_a_successful_unary_call_is_started_handled_ok_and_timed(channel) -> None:
    labels = {"grpc_method": "Ok", "grpc_type": "unary"}
    before = (sample("lowtide_grpc_server_started_total", **labels),
              sample("lowtide_grpc_server_handled_total", grpc_code="OK", **labels),
              sample("lowtide_grpc_server_handling_seconds_count", **labels))
    assert channel.unary_unary(f"/{SERVICE}/Ok")(b"ping", timeout=5) == b"ping"
    after = (sample("lowtide_grpc_server_started_total", **labels),
             sample("lowtide_grpc_server_handled_total", grpc_code="OK", **labels),
             sample("lowtide_grpc_server_handling_seconds_count", **labels))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1]


def test_a_domain_error_is_counted_with_the_status_it_was_mapped_to(channel) -> None:
    labels = {"grpc_method": "Fail", "grpc_type": "unary"}
    before = sample("lowtide_grpc_server_handled_total", grpc_code="NOT_FOUND", **labels)
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(f"/{SERVICE}/Fail")(b"x", timeout=5)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert sample("lowtide_grpc_server_handled_total", grpc_code="NOT_FOUND", **labels) - before == 1
    assert sample("lowtide_grpc_server_handled_total", grpc_code="OK", **labels) == 0


def test_a_stream_counts_once_per_call_and_once_per_message(channel) -> None:
    labels = {"grpc_method": "Echo", "grpc_type": "bidi_stream"}
    before = (sample("lowtide_grpc_server_handled_total", grpc_code="OK", **labels),
              sample("lowtide_grpc_server_msg_received_total", **labels),
              sample("lowtide_grpc_server_msg_sent_total", **labels))
    replies = list(channel.stream_stream(f"/{SERVICE}/Echo")(iter([b"a", b"b", b"c"]), timeout=5))
    assert replies == [b"a", b"b", b"c"]
    after = (sample("lowtide_grpc_server_handled_total", grpc_code="OK", **labels),
             sample("lowtide_grpc_server_msg_received_total", **labels),
             sample("lowtide_grpc_server_msg_sent_total", **labels))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 3, 3]
