"""The server interceptors wrap each method's handler once, not once per call."""

from __future__ import annotations

from types import SimpleNamespace

import grpc

from lowtide.rpc.interceptor import ErrorInterceptor
from lowtide.rpc.metrics import MetricsInterceptor


def _identity(raw: bytes) -> bytes:
    return raw


def _ok(request: bytes, context) -> bytes:
    return request


def _details(method: str):
    return SimpleNamespace(method=method, invocation_metadata=())


def test_each_interceptor_hands_out_the_same_wrap_for_the_same_handler_on_every_call() -> None:
    handler = grpc.unary_unary_rpc_method_handler(_ok, _identity, _identity)
    for interceptor in (ErrorInterceptor(), MetricsInterceptor()):
        first = interceptor.intercept_service(lambda _d: handler, _details("/lowtide.test.Probe/Ok"))
        second = interceptor.intercept_service(lambda _d: handler, _details("/lowtide.test.Probe/Ok"))
        assert first is second
        assert first is not handler and first.unary_unary is not _ok  # wrapped, not passed through
        assert first.response_serializer is _identity
        # the error interceptor's deserializer turns unparsable bytes into a refusal; parsable ones parse as before
        assert first.request_deserializer(b"x") == b"x"


def test_another_handler_for_the_method_or_another_method_gets_a_wrap_of_its_own() -> None:
    one = grpc.unary_unary_rpc_method_handler(_ok, _identity, _identity)
    other = grpc.unary_unary_rpc_method_handler(_ok, _identity, _identity)
    interceptor = ErrorInterceptor()
    wrap_one = interceptor.intercept_service(lambda _d: one, _details("/lowtide.test.Probe/Ok"))
    wrap_other = interceptor.intercept_service(lambda _d: other, _details("/lowtide.test.Probe/Ok"))
    wrap_elsewhere = interceptor.intercept_service(lambda _d: one, _details("/lowtide.test.Probe/Other"))
    assert wrap_one is not wrap_other and wrap_one is not wrap_elsewhere
    # The newest wrap of a method is the one kept.
    assert interceptor.intercept_service(lambda _d: other, _details("/lowtide.test.Probe/Ok")) is wrap_other


def test_an_unknown_method_stays_unknown() -> None:
    assert ErrorInterceptor().intercept_service(lambda _d: None, _details("/lowtide.test.Probe/Nope")) is None
    assert MetricsInterceptor().intercept_service(lambda _d: None, _details("/lowtide.test.Probe/Nope")) is None
