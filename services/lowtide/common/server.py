"""gRPC server scaffolding every lowtide service shares.

Each service gets: a thread-pool gRPC server with the error interceptor, the standard health
service (``grpc.health.v1.Health``), server reflection, a Prometheus ``/metrics`` HTTP endpoint,
configuration from flags with ``LOWTIDE_*`` environment fallbacks, structured logs, and graceful
SIGTERM: health flips to NOT_SERVING, in-flight calls get a grace period, then ``on_stop`` runs.
With ``--tls-cert``/``--tls-key`` the gRPC port speaks only TLS (and with ``--tls-client-auth
required`` only to clients with a certificate from ``--tls-ca``); ``--metrics-tls`` serves
``/metrics`` over HTTPS with the same certificate (docs/design/tls.md).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from lowtide.common.gc_tuning import young_collections_less_often
from lowtide.errors import LowtideError, RequestTimedOut
from lowtide.purgatory.connection import RedisError
from lowtide.rpc.channels import CHANNEL_OPTIONS
from lowtide.rpc.framed.listener import FramedListener
from lowtide.rpc.interceptor import ErrorInterceptor
from lowtide.rpc.metrics import MetricsInterceptor
from lowtide.tls.config import ServerTls, add_tls_flags

log = logging.getLogger(__name__)

SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]


def env_default(flag: str, default: str | None = None) -> str | None:
    """Flags fall back to LOWTIDE_<FLAG>, e.g. --redis-url -> LOWTIDE_REDIS_URL."""
    return os.environ.get("LOWTIDE_" + flag.lstrip("-").replace("-", "_").upper(), default)


def add_flag(parser: argparse.ArgumentParser, flag: str, *, default=None, type=str, help: str = "",
             required: bool = False) -> None:
    env = env_default(flag)
    value = type(env) if env is not None else default
    parser.add_argument(flag, default=value, type=type, required=required and value is None,
                        help=f"{help} (env LOWTIDE_{flag.lstrip('-').replace('-', '_').upper()})")


def add_common_flags(parser: argparse.ArgumentParser, *, grpc_port: int) -> None:
    add_flag(parser, "--grpc-addr", default=f"127.0.0.1:{grpc_port}", help="gRPC listen address")
    add_flag(parser, "--metrics-addr", default="127.0.0.1:0", help="Prometheus /metrics listen address")
    add_flag(parser, "--metadata-url", default="etcd://127.0.0.1:2379",
             help="the cluster metadata store: etcd://HOST:PORT[,HOST:PORT...] (the etcd members)")
    add_flag(parser, "--redis-url", default="redis://127.0.0.1:6379/0", help="Redis URL (purgatory timers)")
    add_flag(parser, "--redis-wait-seconds", default=120.0, type=float,
             help="at start-up, wait this long for Redis to answer before giving up")
    add_flag(parser, "--log-level", default="INFO", help="log level")
    add_flag(parser, "--log-format", default="json", help="json | text")
    add_flag(parser, "--max-workers", default=64, type=int, help="gRPC handler threads")
    add_flag(parser, "--grace-seconds", default=5.0, type=float, help="graceful shutdown grace")
    add_tls_flags(parser, add_flag)
    raw = os.environ.get("LOWTIDE_METRICS_TLS", "")
    parser.add_argument("--metrics-tls", action=argparse.BooleanOptionalAction,
                        default=raw.strip().lower() in ("1", "true", "yes", "on"),
                        help="serve /metrics over HTTPS with --tls-cert (env LOWTIDE_METRICS_TLS)")


def add_auth_flags(parser: argparse.ArgumentParser, *, checks: str, own_token: str) -> None:
    """The authentication flags every server takes. ``checks`` says what --auth-enabled enforces
    on this server; ``own_token`` whose token --token-file holds and what the server calls with it."""
    raw = os.environ.get("LOWTIDE_AUTH_ENABLED", "")
    parser.add_argument("--auth-enabled", action=argparse.BooleanOptionalAction,
                        default=raw.strip().lower() in ("1", "true", "yes", "on"),
                        help=f"{checks} (env LOWTIDE_AUTH_ENABLED)")
    add_flag(parser, "--tokens-file", default=None, help="file of 'token principal' lines")
    add_flag(parser, "--super-users", default="", help="comma-separated principals that bypass ACLs")
    add_flag(parser, "--token-file", default=None, help=own_token)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host or "0.0.0.0", int(port)


def listener_from_flag(value: str, *, grpc_addr: str, tls: ServerTls | None, name: str,
                       flag: str) -> FramedListener | None:
    """The framed listener (lowtide.rpc.framed.listener) a ``--...-listener`` flag asks for: ``off``
    (None), ``auto`` (the gRPC listen host, a free port) or ``HOST:PORT``; a bad value exits
    naming ``flag``."""
    value = value.strip()
    if value == "off":
        return None
    if value == "auto":
        host, port = split_addr(grpc_addr)[0], 0
    else:
        try:
            host, port = split_addr(value)
        except ValueError:
            raise SystemExit(f"{name}: {flag} must be HOST:PORT, auto or off, got {value!r}") from None
    return FramedListener(host=host.strip("[]"), port=port, tls=tls, name=name)


def translate_store_errors(exc: Exception) -> LowtideError | None:
    """A Redis outage (metadata, purgatory timers, ACLs) as a typed, retriable error.

    REQUEST_TIMED_OUT is what Kafka answers when a request could not be completed in time for a
    reason the caller may retry; clients retry it within their own deadline, and nothing was
    changed (a DeleteRecords that could not park in the purgatory already moved the leader's LSO,
    which a retry finds as a no-op, exactly as after a KIP-107 timeout).
    """
    if isinstance(exc, RedisError):
        return RequestTimedOut(f"the cluster's metadata and timer store (Redis) is unavailable: "
                               f"{type(exc).__name__}: {exc}")
    return None


def start_metrics_server(addr: str, *, tls: ServerTls | None = None):
    """Prometheus ``/metrics`` on ``addr`` (HTTPS with ``tls``) in a daemon thread; returns the
    server (``.server_port``, ``.shutdown()``)."""
    host, port = split_addr(addr)
    if tls is None:
        server, _ = start_http_server(port, addr=host)
        return server
    server, _ = start_http_server(port, addr=host, certfile=str(tls.config.cert), keyfile=str(tls.config.key))
    # The listening socket's context makes every accepted connection's: reloaded in place, a
    # rotated certificate reaches /metrics without a restart, as it reaches the gRPC port.
    context = server.socket.context
    tls.watcher.on_change(lambda _pems: context.load_cert_chain(str(tls.config.cert), str(tls.config.key)))
    return server


@dataclass
class ServiceSpec:
    name: str  # e.g. "replica-0"
    service_names: Sequence[str]  # fully qualified gRPC services for health + reflection
    register: Callable[[grpc.Server], None]
    on_stop: Callable[[], None] = lambda: None
    # Runs when shutdown starts, before the grace period: ends long-lived streams (replication)
    # that would otherwise hold the whole grace period.
    on_draining: Callable[[], None] = lambda: None
    extra_reflection: Sequence[str] = field(default_factory=tuple)


def serve(spec: ServiceSpec, *, grpc_addr: str, metrics_addr: str, max_workers: int = 64,
          grace_seconds: float = 5.0, ready: Callable[[], None] | None = None, tls: ServerTls | None = None,
          metrics_tls: bool = False) -> None:
    """Run a service until SIGTERM/SIGINT. Blocks. ``tls``: serve gRPC over TLS only."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                         # Metrics outermost: it times the whole call and reads the status errors were mapped to.
                         interceptors=[MetricsInterceptor(), ErrorInterceptor(translate=translate_store_errors)],
                         options=SERVER_OPTIONS)
    spec.register(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(spec.service_names) + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                        reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    if tls is None:
        port = server.add_insecure_port(grpc_addr)
    else:
        port = server.add_secure_port(grpc_addr, tls.grpc_credentials())
    if port == 0:
        raise SystemExit(f"{spec.name}: cannot listen on {grpc_addr}")
    if metrics_tls and tls is None:
        raise SystemExit(f"{spec.name}: --metrics-tls needs --tls-cert and --tls-key")
    metrics_server = start_metrics_server(metrics_addr, tls=tls if metrics_tls else None)
    server.start()
    # Domain start-up (registration, recovery) runs with the port open but health NOT_SERVING,
    # so readiness means "ready", not "listening".
    for svc in [""] + list(spec.service_names):
        health_servicer.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
    if ready:
        ready()
    # What start-up loaded (modules, classes, functions, the gRPC and protobuf machinery: ~70k
    # objects) lives as long as the process. Frozen, it is out of the cyclic collector's sight, so
    # a full collection scans only what serving created. Under CommitFile load the coordinator's
    # full collections scanned ~75k objects every ~2 s and took 40-55 ms, holding the GIL: every
    # request in flight stalled that long (the p99).
    gc.freeze()
    young_collections_less_often()
    for svc in [""] + list(spec.service_names):
        health_servicer.set(svc, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving", extra={"fields": {"grpc": grpc_addr, "metrics_port": metrics_server.server_port,
                                          "services": list(spec.service_names),
                                          "tls": "off" if tls is None else "mutual" if tls.mutual else "on"}})

    stop_event = threading.Event()

    def on_signal(signum, _frame):
        log.info("signal received, shutting down", extra={"fields": {"signal": signum}})
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop_event.wait()
    health_servicer.enter_graceful_shutdown()
    spec.on_draining()
    # Let in-flight calls (parked fetches, acks=all produces) finish before state is closed.
    server.stop(grace_seconds).wait(grace_seconds + 1)
    try:
        spec.on_stop()
    finally:
        metrics_server.shutdown()
        log.info("stopped")
