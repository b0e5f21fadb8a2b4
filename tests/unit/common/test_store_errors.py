"""A Redis outage inside a handler reaches the caller as a typed, retriable error (issue 9,
finding 7: DeleteRecords failed with an untyped INTERNAL TimeoutError). A real gRPC server on
loopback with the interceptors every service uses; the handler raises what redis-py raises when
the server is gone (a real redis-server cannot be made to time out one call on demand)."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
import redis as redis_lib

from lowtide.common.server import SERVER_OPTIONS, translate_store_errors
from lowtide.errors import LowtideError, RequestTimedOut
from lowtide.rpc.channels import call
from lowtide.rpc.interceptor import ErrorInterceptor


def serve_raising(exc: Exception) -> tuple[grpc.Server, str]:
    def fail(request, context):
        raise exc

    handler = grpc.method_handlers_generic_handler("test.Svc", {
        "Call": grpc.unary_unary_rpc_method_handler(fail, request_deserializer=bytes, response_serializer=bytes)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=SERVER_OPTIONS,
                         interceptors=[ErrorInterceptor(translate=translate_store_errors)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("exc", [redis_lib.TimeoutError("Timeout reading from socket"),
                                 redis_lib.ConnectionError("Error 111 connecting to 127.0.0.1:6399")])
def test_a_redis_outage_is_a_retriable_request_timed_out(exc):
    server, address = serve_raising(exc)
    channel = grpc.insecure_channel(address)
    try:
        stub = channel.unary_unary("/test.Svc/Call", request_serializer=bytes, response_deserializer=bytes)
        with pytest.raises(LowtideError) as raised:
            call(stub, b"x", timeout=5)
        assert isinstance(raised.value, RequestTimedOut) and raised.value.retriable
        assert "Redis" in raised.value.message
    finally:
        channel.close()
        server.stop(0)


def test_any_other_exception_is_still_an_unknown_server_error():
    server, address = serve_raising(ValueError("boom"))
    channel = grpc.insecure_channel(address)
    try:
        stub = channel.unary_unary("/test.Svc/Call", request_serializer=bytes, response_deserializer=bytes)
        with pytest.raises(LowtideError) as raised:
            call(stub, b"x", timeout=5)
        assert raised.value.name == "UNKNOWN_SERVER_ERROR"
    finally:
        channel.close()
        server.stop(0)
