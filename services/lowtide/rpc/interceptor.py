"""The server side of ``rpc.status``: the one place a raised domain error becomes a gRPC status.

Servicers raise ``LowtideError`` for whole-call failures; this interceptor aborts the call with the
status of the error's class and details ``"KAFKA_NAME: message"`` (clients parse the name back).
A server may pass ``translate``: it turns an infrastructure exception it knows (a Redis outage,
say) into a typed ``LowtideError``, so callers get a Kafka name and a retriable flag, not a bare
INTERNAL. Any other exception is logged and reported as ``UNKNOWN_SERVER_ERROR`` with status INTERNAL.
Per-partition errors are not exceptions: they travel inside the response messages.

A request whose bytes cannot be parsed (upb's ``DecodeError``, or ``WireFormatError`` from the
Replica's own Produce deserializer) is a client's fault, not the server's: the interceptor wraps each
method's deserializer so such a request reaches the handler as ``Unparsable`` and is answered
INVALID_ARGUMENT ``INVALID_REQUEST: ...`` with one warning line. Left to gRPC, it logged a traceback
("Exception deserializing message!") and answered INTERNAL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from lowtide.errors import InvalidRequest, LowtideError
from lowtide.rpc.status import details_for, status_for

log = logging.getLogger(__name__)


Translate = Callable[[Exception], LowtideError | None]


class WrappedHandlers:
    """Each method's wrapped handler, kept while gRPC hands over the same handler for the method.

    gRPC's server asks every interceptor for the method's handler on every call, on the one thread
    that dispatches all calls. Wrapping anew each time built closures and a handler tuple per
    interceptor per call. A wrap depends only on the method and the handler it wraps, and gRPC
    passes the same handler object for a registered method on every call, so the wrap is kept;
    another handler object for the method is wrapped anew. Thread-safe: two threads racing on a
    method wrap it twice, and either wrap is correct."""

    def __init__(self, wrap: Callable[[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler]) -> None:
        self._wrap = wrap
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def get(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        hit = self._wrapped.get(method)
        if hit is not None and hit[0] is handler:
            return hit[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


class Unparsable:
    """What a wrapped deserializer returns for bytes that are not a well-formed request."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(method: str, deserializer: Callable[[bytes], object] | None) -> Callable[[bytes], object] | None:
    if deserializer is None:
        return None

    def parse(raw: bytes) -> object:
        try:
            return deserializer(raw)
        except (DecodeError, ValueError) as exc:  # WireFormatError and UnicodeDecodeError are ValueErrors
            return Unparsable(f"{method}: {type(exc).__name__}: {exc}")

    return parse


def _refuse(request: Unparsable) -> None:
    log.warning("refused a request that cannot be parsed: %s", request.reason)
    raise InvalidRequest(f"the request cannot be parsed: {request.reason}")


def _parsed(request_iterator):
    for request in request_iterator:
        if type(request) is Unparsable:
            _refuse(request)
        yield request


def _abort(behavior, context, exc: Exception, translate: Translate | None) -> None:
    """Abort the call with the status ``exc`` maps to (re-raises what gRPC itself raised)."""
    if isinstance(exc, LowtideError):
        context.abort(status_for(exc), details_for(exc))
    if isinstance(exc, grpc.RpcError):
        raise exc
    if context.code() is not None and context.code() != grpc.StatusCode.OK:
        raise exc
    typed = translate(exc) if translate is not None else None
    if typed is not None:
        log.warning("%s failed: %s", getattr(behavior, "__name__", "handler"), typed.message)
        context.abort(status_for(typed), details_for(typed))
    log.exception("unhandled error in %s", getattr(behavior, "__name__", "handler"), exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, f"UNKNOWN_SERVER_ERROR: {type(exc).__name__}: {exc}")


def _wrap_unary(behavior, translate: Translate | None):
    def handler(request, context):
        try:
            if type(request) is Unparsable:
                _refuse(request)
            return behavior(request, context)
        except Exception as exc:  # noqa: BLE001 - the boundary: report, never crash the server
            _abort(behavior, context, exc, translate)

    return handler


def _wrap_stream_stream(behavior, translate: Translate | None):
    # A streaming handler is a generator: errors surface while it is iterated, so the mapping
    # wraps the iteration, not the call.
    def handler(request_iterator, context):
        try:
            yield from behavior(_parsed(request_iterator), context)
        except Exception as exc:  # noqa: BLE001 - the boundary: report, never crash the server
            _abort(behavior, context, exc, translate)

    return handler


class WrappingInterceptor(grpc.ServerInterceptor):
    """Base of lowtide's server interceptors: wraps each method's unary and bidi-streaming handler
    once (``WrappedHandlers``) with ``_unary`` / ``_bidi``; other kinds pass through."""

    def __init__(self) -> None:
        self._handlers = WrappedHandlers(self._wrap)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        return self._handlers.get(handler_call_details.method, handler)

    def _unary(self, method: str, behavior):
        raise NotImplementedError

    def _bidi(self, method: str, behavior):
        raise NotImplementedError

    def _deserializer(self, method: str, deserializer):
        return deserializer

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=self._deserializer(method, handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._bidi(method, handler.stream_stream),
                request_deserializer=self._deserializer(method, handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler


class ErrorInterceptor(WrappingInterceptor):
    """Maps exceptions escaping a unary or bidi-streaming handler to gRPC status (see module doc)."""

    def __init__(self, *, translate: Translate | None = None) -> None:
        self._translate = translate
        super().__init__()

    def _unary(self, method: str, behavior):
        return _wrap_unary(behavior, self._translate)

    def _bidi(self, method: str, behavior):
        return _wrap_stream_stream(behavior, self._translate)

    def _deserializer(self, method: str, deserializer):
        return _tolerant(method, deserializer)
