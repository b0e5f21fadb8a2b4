"""Request metrics of every gRPC server: rates, errors and latency per RPC.

The names and labels follow the go-grpc-prometheus convention operators already have dashboards
and alerts for (``grpc_service``, ``grpc_method``, ``grpc_type``, ``grpc_code``), under lowtide's
prefix::

    lowtide_grpc_server_started_total{grpc_service,grpc_method,grpc_type}
    lowtide_grpc_server_handled_total{grpc_service,grpc_method,grpc_type,grpc_code}
    lowtide_grpc_server_handling_seconds{grpc_service,grpc_method,grpc_type}   histogram
    lowtide_grpc_server_msg_received_total{grpc_service,grpc_method,grpc_type}  stream messages
    lowtide_grpc_server_msg_sent_total{grpc_service,grpc_method,grpc_type}

Labels are bounded: the methods a server registers, the 17 gRPC codes. A streaming call counts
once when it starts and once when it ends (its handling time is the stream's life), and each of
its messages in the ``msg_*`` counters.

This interceptor sits *outside* the error interceptor, so it sees the status a domain error was
mapped to (``context.code()`` after the handler returned or aborted).
"""

from __future__ import annotations

import time

import grpc
from prometheus_client import Counter, Histogram

from lowtide.rpc.interceptor import WrappingInterceptor

_LABELS = ["grpc_service", "grpc_method", "grpc_type"]
STARTED = Counter("lowtide_grpc_server_started", "RPCs started on the server", _LABELS)
HANDLED = Counter("lowtide_grpc_server_handled", "RPCs completed on the server, by status code",
                  [*_LABELS, "grpc_code"])
HANDLING_SECONDS = Histogram(
    "lowtide_grpc_server_handling_seconds", "Time from the start of an RPC to its completion", _LABELS,
    # Loopback requests take 0.1-50 ms; parked fetches and acks=all produces up to their timeouts.
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
MSG_RECEIVED = Counter("lowtide_grpc_server_msg_received", "Stream messages received by the server", _LABELS)
MSG_SENT = Counter("lowtide_grpc_server_msg_sent", "Stream messages sent by the server", _LABELS)


def split_method(full_method: str) -> tuple[str, str]:
    """``/lowtide.v1.Replica/Fetch`` -> (``lowtide.v1.Replica``, ``Fetch``)."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method


def _code_name(context: grpc.ServicerContext, failed: bool) -> str:
    code = context.code()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return code.name


class _Children:
    """The labelled children of one method, resolved once (a ``labels()`` call costs a lock and a
    dict lookup per use; the produce path calls this thousands of times a second)."""

    __slots__ = ("labels", "started", "seconds", "received", "sent", "_handled")

    def __init__(self, labels: tuple[str, str, str]) -> None:
        self.labels = labels
        self.started = STARTED.labels(*labels)
        self.seconds = HANDLING_SECONDS.labels(*labels)
        self.received = MSG_RECEIVED.labels(*labels)
        self.sent = MSG_SENT.labels(*labels)
        self._handled: dict[str, Counter] = {}

    def handled(self, code: str) -> Counter:
        child = self._handled.get(code)
        if child is None:
            child = self._handled[code] = HANDLED.labels(*self.labels, code)
        return child


def _wrap_unary(behavior, children: _Children):
    def handler(request, context):
        children.started.inc()
        began = time.perf_counter()
        failed = True
        try:
            response = behavior(request, context)
            failed = False
            return response
        finally:
            children.seconds.observe(time.perf_counter() - began)
            children.handled(_code_name(context, failed)).inc()

    return handler


def _wrap_stream_stream(behavior, children: _Children):
    def counted(request_iterator):
        for request in request_iterator:
            children.received.inc()
            yield request

    def handler(request_iterator, context):
        children.started.inc()
        began = time.perf_counter()
        failed = True
        try:
            for response in behavior(counted(request_iterator), context):
                children.sent.inc()
                yield response
            failed = False
        finally:
            children.seconds.observe(time.perf_counter() - began)
            # A stream the client cancelled ends with GeneratorExit here: report CANCELLED.
            code = _code_name(context, failed)
            children.handled("CANCELLED" if failed and code == "UNKNOWN" and not context.is_active()
                             else code).inc()

    return handler


class MetricsInterceptor(WrappingInterceptor):
    """Counts and times every unary and bidi-streaming call (see module doc). Thread-safe."""

    def __init__(self) -> None:
        self._children: dict[tuple[str, str], _Children] = {}
        super().__init__()

    def _children_for(self, method: str, kind: str) -> _Children:
        key = (method, kind)
        children = self._children.get(key)
        if children is None:
            service, name = split_method(method)
            children = self._children[key] = _Children((service, name, kind))
        return children

    def _unary(self, method: str, behavior):
        return _wrap_unary(behavior, self._children_for(method, "unary"))

    def _bidi(self, method: str, behavior):
        return _wrap_stream_stream(behavior, self._children_for(method, "bidi_stream"))
