"""The service kinds a local cluster starts, as data: adding a kind is one ``ServiceKind`` entry.

Each entry says which module implements ``lowtide serve KIND`` (the kind is skipped while that
module does not exist), how many instances a ``ClusterConfig`` asks for, whether an instance gets
its own data directory, and which extra flags it takes. Start order is the order of ``KINDS``
(Redis is not a kind here: it is started first, by ``LocalCluster``, with ``procs.start_redis``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from lowtide.auth.identity import FRONTDOOR_PRINCIPAL, broker_principal
from lowtide.errors import MetadataStoreUnavailable
from lowtide.localcluster.config import COORDINATOR_MODULE, SCANNER_MODULE, ClusterConfig, is_module_available
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore
from lowtide.tls.config import ClientTls
from lowtide.tls.principal import LOWTIDE_RULES

REPLICA_MODULE = "lowtide.replica.server"
FRONTDOOR_MODULE = "lowtide.frontdoor.server"


@dataclass(frozen=True)
class InstanceContext:
    """What a kind's flag builder may use for one instance."""

    config: ClusterConfig
    index: int
    data_dir: Path | None
    redis_url: str
    metadata_url: str = ""
    # The supervisor's own store on the cluster's etcd, shared by the readiness checks (a store is a
    # watch and threads: one per look would pile up); None: a check opens one for its look.
    metadata: MetadataStore | None = None
    # How the supervisor dials an ``etcds://`` metadata_url (a --tls cluster: its admin certificate).
    client_tls: ClientTls | None = None


@dataclass(frozen=True)
class ServiceKind:
    """One kind of service process. ``build_flags`` returns the kind-specific flags only: the
    supervisor adds ``--grpc-addr``, ``--metrics-addr``, ``--metadata-url`` and ``--redis-url`` itself."""

    kind: str
    module: str
    count: Callable[[ClusterConfig], int]
    build_flags: Callable[[InstanceContext], list[str]]
    has_data_dir: bool = False
    # Readiness beyond health SERVING, given (instance index, its context): e.g. a replica only
    # counts once it is registered live in the metadata, or topic creation right after `up` would fail.
    is_ready: Callable[[int, InstanceContext], bool] | None = None
    # Full command override (tests use it for stand-in services); default: the lowtide CLI.
    command: Callable[[InstanceContext], list[str]] | None = None
    # The principal instance N authenticates as when auth is on; default ``User:<kind>``.
    principal: Callable[[int], str] | None = None
    # Start together with the kind before it in ``KINDS`` instead of after it is healthy.
    start_with_previous: bool = False

    def name(self, index: int) -> str:
        return f"{self.kind}-{index}"

    def principal_of(self, index: int) -> str:
        return self.principal(index) if self.principal else f"User:{self.kind}"

    def takes_token_file(self) -> bool:
        """Whether instances get an identity of their own (their server takes ``--token-file``)."""
        return self.command is None and "--token-file" in supported_flags(self.module)

    def is_available(self) -> bool:
        return is_module_available(self.module)

    def build_argv(self, ctx: InstanceContext, *, grpc_addr: str, metrics_addr: str) -> list[str]:
        base = self.command(ctx) if self.command else [sys.executable, "-m", "lowtide.cli.main", "serve", self.kind]
        store = ["--metadata-url", ctx.metadata_url] if ctx.metadata_url else []
        return [*base, "--grpc-addr", grpc_addr, "--metrics-addr", metrics_addr, *store, "--redis-url", ctx.redis_url,
                *self.build_flags(ctx), *self._shared_flags(ctx)]

    def _shared_flags(self, ctx: InstanceContext) -> list[str]:
        # Cluster-wide settings go to every kind whose parser takes them, so a new kind that
        # reads the object store needs no entry here (they also reach it as LOWTIDE_* variables).
        known = supported_flags(self.module) if self.command is None else frozenset()
        flags: list[str] = []
        for flag, value in (("--object-store", ctx.config.object_store_url),
                            ("--object-store-url", ctx.config.object_store_url)):
            if flag in known:
                flags += [flag, value]
        config = ctx.config
        if config.tls and "--tls-cert" in known:
            files = config.tls_dir / self.name(ctx.index)
            flags += ["--tls-cert", str(files / "tls.crt"), "--tls-key", str(files / "tls.key"),
                      "--tls-ca", str(config.tls_dir / "ca.crt"), "--tls-client-auth", config.tls_client_auth,
                      "--tls-principal-mapping-rules", LOWTIDE_RULES]
            if "--metrics-tls" in known:  # every port TLS: /metrics is HTTPS with the same certificate
                flags.append("--metrics-tls")
        if config.auth_enabled and "--auth-enabled" in known:
            # Every call on every port carries an identity: each service that checks tokens also
            # gets its own (DIR/secrets/<name>.token, written by LocalCluster before it starts).
            flags.append("--auth-enabled")
            if config.tokens_file is not None:
                flags += ["--tokens-file", str(config.tokens_file)]
            if config.effective_super_users:
                flags += ["--super-users", config.effective_super_users]
            if "--token-file" in known and not config.mutual_tls:  # with mTLS the certificate is the identity
                flags += ["--token-file", str(config.token_file(self.name(ctx.index)))]
        return flags


@functools.cache
def supported_flags(module: str) -> frozenset[str]:
    """The option strings ``lowtide serve`` accepts for the kind implemented by ``module``
    (its ``add_arguments(parser)``); empty when the module cannot be imported."""
    try:
        add_arguments = importlib.import_module(module).add_arguments
    except (ImportError, AttributeError):
        return frozenset()
    parser = _FlagRecorder(add_help=False)
    add_arguments(parser)
    return frozenset(parser.flags)


class _FlagRecorder(argparse.ArgumentParser):
    """A parser that records the option strings added to it (argparse keeps its list private).
    The servers' ``add_arguments`` add every flag on the parser itself, not in argument groups."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.flags: set[str] = set()

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags.update(action.option_strings)
        return action


def _replica_flags(ctx: InstanceContext) -> list[str]:
    flags = ["--id", str(ctx.index), "--data-dir", str(ctx.data_dir), "--advertised-host", "127.0.0.1"]
    known = supported_flags(REPLICA_MODULE)
    if ctx.config.session_timeout_ms is not None and "--session-timeout-ms" in known:
        flags += ["--session-timeout-ms", str(ctx.config.session_timeout_ms)]
    for key, value in ctx.config.replica_config.items():
        # Broker settings that the replica takes as flags (replica.lag.time.max.ms ->
        # --replica-lag-time-max-ms) go as flags; the rest are topic-config broker defaults.
        flag = "--" + key.replace(".", "-").replace("_", "-")
        if flag in known and flag != "--config":
            flags += [flag, value]
        else:
            flags += ["--config", f"{key}={value}"]
    return flags


@contextlib.contextmanager
def _metadata(ctx: InstanceContext) -> Iterator[MetadataStore]:
    """The context's shared metadata store, else one opened (and closed) for this look."""
    if ctx.metadata is not None:
        yield ctx.metadata
        return
    store = MetadataStore.from_url(ctx.metadata_url, tls=ctx.client_tls)
    try:
        yield store
    finally:
        store.close()


def _is_replica_registered(index: int, ctx: InstanceContext) -> bool:
    try:
        with _metadata(ctx) as store:
            store.start(timeout_s=2.0)
            return index in store.live_broker_ids([index])
    except MetadataStoreUnavailable:
        return False


def _frontdoor_flags(ctx: InstanceContext) -> list[str]:
    # Several frontdoors log under distinct names when the frontdoor takes --name.
    return ["--name", f"frontdoor-{ctx.index}"] if "--name" in supported_flags(FRONTDOOR_MODULE) else []


# With standbys: the lease a takeover waits out after a kill -9 (the server's default is 6 s).
STANDBY_LEASE_MS = 1500


def _coordinator_flags(ctx: InstanceContext) -> list[str]:
    flags = ["--shard", str(ctx.index), "--data-dir", str(ctx.data_dir)]
    if "--shards" in supported_flags(COORDINATOR_MODULE):
        flags += ["--shards", str(ctx.config.coordinators)]
    others = [str(k) for k in range(ctx.config.coordinators) if k != ctx.index]
    if ctx.config.coordinator_standbys and others:
        flags += ["--standby-shards", ",".join(others), "--lease-ms", str(STANDBY_LEASE_MS)]
    return flags


# Records of lowtide.coordinator.leadership in the metadata section "shards" (localcluster may not
# import the coordinator package): shard K's lease holder and its registered address.
_SHARDS_SECTION = "shards"
_COORDINATOR_LEASE = "{shard}/leader"
_COORDINATOR_ADDRESS = "{shard}/address"


def _is_coordinator_leading(index: int, ctx: InstanceContext) -> bool:
    """Shard ``index`` is served: a process holds its lease and has registered (after loading)."""
    try:
        with _metadata(ctx) as store:
            store.start(timeout_s=2.0)
            shards = section(store, _SHARDS_SECTION)
            owner = shards.get(_COORDINATOR_LEASE.format(shard=index))
            address = shards.get(_COORDINATOR_ADDRESS.format(shard=index))
    except MetadataStoreUnavailable:
        return False
    return owner is not None and address is not None and \
        json.loads(address.value).get("owner") == owner.value.decode()


def _scanner_flags(ctx: InstanceContext) -> list[str]:
    # --shards: a scan with fewer shards registered than the cluster has deletes nothing.
    flags = ["--name", f"orphan-scanner-{ctx.index}"]
    if "--shards" in supported_flags(SCANNER_MODULE):
        flags += ["--shards", str(ctx.config.coordinators)]
    return flags


# Start order: replicas host the data everything else talks to; the frontdoor is the bootstrap;
# coordinators keep their metadata log on the replicas (so they start alongside the frontdoor, not
# after it); the scanner asks the coordinators.
KINDS: tuple[ServiceKind, ...] = (
    ServiceKind("replica", REPLICA_MODULE, lambda c: c.replicas, _replica_flags, has_data_dir=True,
                is_ready=_is_replica_registered, principal=broker_principal),
    ServiceKind("frontdoor", FRONTDOOR_MODULE, lambda c: c.frontdoors, _frontdoor_flags,
                principal=lambda _index: FRONTDOOR_PRINCIPAL),
    ServiceKind("coordinator", COORDINATOR_MODULE, lambda c: c.coordinators, _coordinator_flags, has_data_dir=True,
                is_ready=_is_coordinator_leading, start_with_previous=True),
    # Without coordinators there is nothing to scan for; the scanner needs no shard to start (its
    # first scan is one interval away), so it starts alongside the coordinators.
    ServiceKind("orphan-scanner", SCANNER_MODULE, lambda c: c.orphan_scanners if c.coordinators else 0,
                _scanner_flags, start_with_previous=True),
)
