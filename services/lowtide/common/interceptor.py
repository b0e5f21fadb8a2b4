"""The one place where domain errors become gRPC statuses.

Servicers raise ``LowtideError`` for whole-call failures; this interceptor aborts the call with the
error's ``grpc_status`` and details ``"KAFKA_NAME: message"`` (clients parse the name back). Any
other exception is logged and reported as ``UNKNOWN_SERVER_ERROR`` with status INTERNAL.
Per-partition errors are not exceptions: they travel inside the response messages.
"""

from __future__ import annotations

import logging

import grpc

from lowtide.errors import LowtideError

log = logging.getLogger(__name__)


def _wrap_unary(behavior):
    def handler(request, context):
        try:
            return behavior(request, context)
        except LowtideError as err:
            context.abort(err.grpc_status, f"{err.name}: {err.message}")
        except grpc.RpcError:
            raise
        except Exception as exc:  # noqa: BLE001 - the boundary: report, never crash the server
            if context.code() is not None and context.code() != grpc.StatusCode.OK:
                raise
            log.exception("unhandled error in %s", getattr(behavior, "__name__", "handler"))
            context.abort(grpc.StatusCode.INTERNAL, f"UNKNOWN_SERVER_ERROR: {type(exc).__name__}: {exc}")

    return handler


class ErrorInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            _wrap_unary(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def error_from_rpc(exc: grpc.RpcError) -> LowtideError:
    """Client side: turn a failed call back into the domain error it carried."""
    from lowtide.errors import NetworkException, RequestTimedOut, error_for_name

    detail = exc.details() if hasattr(exc, "details") else str(exc)
    code = exc.code() if hasattr(exc, "code") else None
    if detail and ":" in detail:
        head, _, rest = detail.partition(":")
        head = head.strip()
        if head.isupper() and "_" in head:
            return error_for_name(head, rest.strip())
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimedOut(detail or "deadline exceeded")
    return NetworkException(f"{code.name if code else 'RPC'}: {detail}")
