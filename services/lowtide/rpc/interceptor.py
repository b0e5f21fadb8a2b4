"""The server side of ``rpc.status``: the one place a raised domain error becomes a gRPC status.

Servicers raise ``LowtideError`` for whole-call failures; this interceptor aborts the call with the
status of the error's class and details ``"KAFKA_NAME: message"`` (clients parse the name back).
Any other exception is logged and reported as ``UNKNOWN_SERVER_ERROR`` with status INTERNAL.
Per-partition errors are not exceptions: they travel inside the response messages.
"""

from __future__ import annotations

import logging

import grpc

from lowtide.errors import LowtideError
from lowtide.rpc.status import details_for, status_for

log = logging.getLogger(__name__)


def _wrap_unary(behavior):
    def handler(request, context):
        try:
            return behavior(request, context)
        except LowtideError as err:
            context.abort(status_for(err), details_for(err))
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
