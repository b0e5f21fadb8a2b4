"""One start-up for every lowtide server: the wiring the replica, front door, coordinator and
orphan scanner used to write out each on their own.

A server's ``run(args)`` does, in this order:

1. ``boot = ServerBootstrap(args, name=...)``: structured logs under the service's name, the
   listen addresses parsed once (``grpc_port``, ``metrics_addr``; ``advertised_grpc`` and
   ``metrics_url`` for what it registers where others find it), and the TLS of ``--tls-*``
   (``boot.tls``; its certificate also becomes the client certificate of every channel the
   process opens, so calls between services are mutual TLS);
2. its own flag checks, with ``boot.require_token_file(why)`` and ``boot.require_object_store()``
   for the two every server words alike (a ``SystemExit`` naming the service and the flag's
   environment variable);
3. ``boot.connect()`` for the shared connections: the metadata store (etcd, ``--metadata-url``),
   Redis (5 s socket timeouts; purgatory timers and the like), the access control
   of ``--auth-enabled``/``--tokens-file``/``--super-users`` (lowtide.auth.access: tokens and
   ACLs in the metadata store), the call
   metadata of its own ``--token-file`` for the services it calls, and a gRPC ``ChannelPool``;
4. its domain objects, then ``boot.serve(...)``: the gRPC server with health, reflection and
   ``/metrics`` and graceful SIGTERM (``lowtide.common.server.serve``) from the common flags; after
   the service's own ``on_stop`` it closes the channel pool and Redis.

Why one module: the same ten lines in four servers drifted (one split the metrics address, one
did not; one closed Redis, one did not), and a new server should get the flags' behaviour by
calling this, not by copying a neighbour.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from lowtide.auth.access import AccessControl, build_access_control, parse_super_users
from lowtide.auth.identity import token_file_metadata
from lowtide.common.logs import configure_logging
from lowtide.common.server import ServiceSpec, serve, split_addr
from lowtide.errors import InvalidConfig, MetadataStoreUnavailable
from lowtide.metadata.identity import ClusterGuard, check_cluster_identity
from lowtide.metadata.store import MetadataStore
from lowtide.purgatory.connection import RedisClient, connect_redis
from lowtide.rpc.channels import ChannelPool
from lowtide.tls.config import ServerTls, server_tls_from_args, set_default_client_tls

REDIS_SOCKET_TIMEOUT_S = 5


@dataclass
class Connections:
    """What ``ServerBootstrap.connect`` made; closed by ``ServerBootstrap.serve`` after ``on_stop``."""

    redis: RedisClient  # the purgatory's timers and low-watermark events, nothing else
    # The cluster metadata (etcd), its image loaded in the background from the first read on.
    metadata: MetadataStore
    access: AccessControl
    # ("authorization", "Bearer <own token>") for calls to other services; empty without --token-file.
    call_metadata: list[tuple[str, str]]
    channels: ChannelPool

    guard: ClusterGuard | None = None

    def close(self) -> None:
        if self.guard is not None:
            self.guard.stop()
        self.channels.close()
        self.metadata.close()
        self.redis.close()


def join_cluster(store: MetadataStore, *, data_dir: Path | None, node_id: str, timeout_s: float) -> ClusterGuard:
    """Check that the metadata store knows this service's cluster (lowtide.metadata.identity: a
    ``SystemExit`` with one clear line otherwise, nothing touched) and start the guard that
    fail-stops the process if the store forgets it later."""
    try:
        cluster_id = check_cluster_identity(store, data_dir=data_dir, node_id=node_id, timeout_s=timeout_s)
    except MetadataStoreUnavailable as exc:
        raise SystemExit(f"{node_id}: {exc.message}") from None
    guard = ClusterGuard(store, cluster_id=cluster_id, data_dir=data_dir, node_id=node_id)
    guard.start()
    return guard


class ServerBootstrap:
    """The shared start-up of one server process (module doc has the order of calls).

    ``args`` holds the flags of ``add_common_flags`` and, for ``connect``, ``add_auth_flags``.
    Not thread-safe: the server's main thread uses it, once.
    """

    def __init__(self, args: argparse.Namespace, *, name: str) -> None:
        configure_logging(service=name, level=args.log_level, fmt=args.log_format)
        self.name = name
        self.args = args
        _, self.grpc_port = split_addr(args.grpc_addr)
        metrics_host, self.metrics_port = split_addr(args.metrics_addr)
        self.metrics_addr = f"{metrics_host}:{self.metrics_port}"
        self.connections: Connections | None = None
        try:
            tls_config = server_tls_from_args(args)
            self.tls = ServerTls(tls_config) if tls_config is not None else None
        except InvalidConfig as exc:
            raise SystemExit(f"{name}: {exc.message}") from None
        if self.tls is not None:
            set_default_client_tls(self.tls.client())

    # -- addresses others reach this server at ---------------------------------------------------
    @property
    def advertised_grpc(self) -> str:
        """``--advertised-host`` with the gRPC port (servers that take ``--advertised-host``)."""
        return f"{self.args.advertised_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Where Prometheus scrapes this server, as it registers it."""
        scheme = "https" if getattr(self.args, "metrics_tls", False) else "http"
        return f"{scheme}://{self.args.advertised_host}:{self.metrics_port}/metrics"

    # -- checks every server words alike -----------------------------------------------------------
    def require_token_file(self, why: str) -> None:
        """With ``--auth-enabled`` a server calling others needs its own token; ``why`` says whose
        token it is and whom the server presents it to."""
        if self.tls is not None and self.tls.mutual:
            return  # the certificate is the identity (docs/design/tls.md)
        if self.args.auth_enabled and not self.args.token_file:
            raise SystemExit(f"{self.name}: --auth-enabled needs --token-file (env LOWTIDE_TOKEN_FILE): {why}")

    def require_object_store(self) -> None:
        if not self.args.object_store:
            raise SystemExit(f"{self.name}: --object-store (env LOWTIDE_OBJECT_STORE) is required: the WAL files' "
                             "store")

    # -- shared connections ------------------------------------------------------------------------
    def connect(self) -> Connections:
        """Redis, access control, own-token call metadata and a channel pool, from the flags."""
        args = self.args
        redis = connect_redis(args.redis_url, timeout_s=REDIS_SOCKET_TIMEOUT_S)
        metadata = MetadataStore.from_url(args.metadata_url)
        self.connections = Connections(
            redis=redis,
            metadata=metadata,
            access=build_access_control(metadata=metadata, enabled=args.auth_enabled, tokens_file=args.tokens_file,
                                        super_users=parse_super_users(args.super_users),
                                        certificates=self.tls.mapper if self.tls is not None and self.tls.mutual
                                        else None),
            # With mutual TLS the certificate is this service's identity, and its token would be refused.
            call_metadata=[] if self.tls is not None and self.tls.mutual else token_file_metadata(args.token_file),
            channels=ChannelPool())
        data_dir = getattr(args, "data_dir", None)
        self.connections.guard = join_cluster(self.connections.metadata, data_dir=Path(data_dir) if data_dir else None,
                                              node_id=self.name, timeout_s=args.redis_wait_seconds)
        return self.connections

    # -- serving -----------------------------------------------------------------------------------
    def serve(self, *, service_names: Sequence[str], register: Callable[[grpc.Server], None],
              on_stop: Callable[[], None] = lambda: None, on_draining: Callable[[], None] = lambda: None,
              ready: Callable[[], None] | None = None) -> int:
        """Serve until SIGTERM/SIGINT (``lowtide.common.server.serve`` with the common flags);
        returns the process exit code. ``on_stop`` runs after the grace period; the connections
        of ``connect`` are closed after it, whether it raised or not."""
        args = self.args

        def stop() -> None:
            try:
                on_stop()
            finally:
                if self.connections is not None:
                    self.connections.close()

        serve(ServiceSpec(name=self.name, service_names=list(service_names), register=register, on_stop=stop,
                          on_draining=on_draining),
              grpc_addr=args.grpc_addr, metrics_addr=self.metrics_addr, max_workers=args.max_workers,
              grace_seconds=args.grace_seconds, ready=ready, tls=self.tls, metrics_tls=args.metrics_tls)
        return 0
