"""A front door forwards ``lowtide.v1.OrphanScanner`` calls to the orphan scanner registered in
the cluster metadata, so ``lowtide orphans scan --bootstrap-server B`` finds the scanner through
the cluster.

A running scanner registers itself in the metadata section ``scanners`` (``scanners/{name}`` ->
{"grpc": HOST:PORT, ...}; lowtide/scanner/server.py) and removes itself when it stops; the front
door reads the section from its metadata image (no round trip). A call is
forwarded as the bytes it came as (nothing is parsed here), with the caller's metadata (its bearer
token: the scanner checks CLUSTER_ACTION itself) and the caller's remaining deadline, to the
registered scanners in name order: the next is tried only when one cannot be reached
(UNAVAILABLE: a scanner killed before it could deregister). The scanner's answer, status and
details come back unchanged. With no scanner registered the call fails COORDINATOR_NOT_AVAILABLE,
saying so.

Thread-safety: handlers run on gRPC's worker threads; the channel pool is thread-safe.
"""

from __future__ import annotations

import json
import logging

import grpc

from lowtide.client.scanner import SCANNER_METHODS, SCANNER_REGISTRY, SCANNER_SERVICE
from lowtide.errors import CoordinatorNotAvailable
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore
from lowtide.rpc.channels import ChannelPool

log = logging.getLogger(__name__)

# Metadata gRPC sets on each hop itself: not forwarded.
_HOP_METADATA = ("user-agent", ":authority", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout")
# The caller set no deadline (gRPC then reports one far in the future): the scanner's own client default.
_NO_DEADLINE_S = 3600.0


class _RawScanner:
    """The scanner's methods with identity serializers: request and answer stay bytes."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.methods = {name: channel.unary_unary(f"/{SCANNER_SERVICE}/{name}", request_serializer=None,
                                                  response_deserializer=None, _registered_method=True)
                        for name in SCANNER_METHODS}


def registered_scanners(store: MetadataStore) -> list[tuple[str, str]]:
    """(name, gRPC address) of each scanner registered in the cluster metadata, by name."""
    out = []
    for name, entry in sorted(section(store, SCANNER_REGISTRY).items().items()):
        try:
            address = json.loads(entry.value)["grpc"]
        except (ValueError, KeyError, TypeError):
            continue
        out.append((name, address))
    return out


class ScannerProxy:
    def __init__(self, store: MetadataStore, channels: ChannelPool) -> None:
        self._store = store
        self._channels = channels

    def _forward(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        scanners = registered_scanners(self._store)
        if not scanners:
            raise CoordinatorNotAvailable(f"no orphan scanner is registered in the cluster (metadata section "
                                          f"{SCANNER_REGISTRY}/): is `lowtide serve orphan-scanner` running? (or call "
                                          "it directly: lowtide orphans scan --scanner-address HOST:PORT)")
        metadata = [(k, v) for k, v in context.invocation_metadata() if k not in _HOP_METADATA]
        remaining = context.time_remaining()
        timeout = _NO_DEADLINE_S if remaining is None or remaining > 10 * _NO_DEADLINE_S else remaining
        last: grpc.RpcError | None = None
        for name, address in scanners:
            try:
                return self._channels.stub(address, _RawScanner).methods[method](
                    request, metadata=metadata, timeout=timeout)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    context.abort(err.code(), err.details() or "")
                log.warning("orphan scanner %s at %s (registered in the cluster) cannot be reached: %s", name,
                            address, err.details())
                last = err
        assert last is not None
        context.abort(grpc.StatusCode.UNAVAILABLE,
                      f"COORDINATOR_NOT_AVAILABLE: no registered orphan scanner answered "
                      f"({', '.join(f'{n} at {a}' for n, a in scanners)}): {last.details()}")

    def handlers(self) -> grpc.GenericRpcHandler:
        def handler(method: str):
            def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
                return self._forward(method, request, context)
            forward.__name__ = f"OrphanScanner.{method}"
            return grpc.unary_unary_rpc_method_handler(forward)

        return grpc.method_handlers_generic_handler(SCANNER_SERVICE, {m: handler(m) for m in SCANNER_METHODS})


def add_scanner_proxy(server: grpc.Server, *, store: MetadataStore, channels: ChannelPool) -> None:
    """Serve ``lowtide.v1.OrphanScanner`` on ``server`` by forwarding (see module doc)."""
    server.add_generic_rpc_handlers((ScannerProxy(store, channels).handlers(),))
