"""Diskless coordinator server: one shard of KIP-1164's coordinator (`lowtide serve coordinator --shard K`).

Starts serving health/reflection/metrics at once and loads in the background: it takes shard K's
lease in the metadata store (``coordinator.leadership``: ``shards/K/leader`` under an etcd lease),
reads partition K of ``__diskless_metadata`` from its applied offset to the end (restoring its
newest snapshot first when the log below was deleted), registers its address in the shard registry
(``shards/K/address``) and only then answers requests (before:
NOT_COORDINATOR without the lease, else COORDINATOR_LOAD_IN_PROGRESS; both retriable). The topic is
created on the first write, so a cluster that never uses diskless topics has no metadata partitions.
State lives in ``--data-dir``: ``state.sqlite`` and
``snapshots/``; each snapshot is also put in the object store (``coordinator.snapshot_store``) before
the log below it is deleted, so a shard started on an empty ``--data-dir`` restores from there.
With ``--standby-shards J,L`` the process is also the warm standby of shards J and L
(docs/design/diskless.md#warm-standby): each follows its metadata log into
``--data-dir``/``standby-J/``, is served on a gRPC port of its own (``--standby-grpc-host``, an
ephemeral port, listed under ``shards/J/standbys/`` while this process lives; after a takeover the
shard registry points there) and, unless ``--framed-listener off``, a framed listener of its own
(another ephemeral port there, the registry's ``framed`` once it leads), answers FindBatches
from its copy to a caller asking for a standby's answer, and takes the shard over once its
leader's lease expires. Standbys apply on a thread (no applier process each) and have no
scrape-time gauges of their own.
With ``--auth-enabled`` every call needs CLUSTER_ACTION on the CLUSTER, and
``--token-file`` is this coordinator's own token for the replicas and the other shards it calls.
"""

from __future__ import annotations

import argparse
import logging
import uuid
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
from prometheus_client import REGISTRY

from lowtide.client.diskless_files import describe_files
from lowtide.client.replica import ReplicaClient
from lowtide.common.bootstrap import ServerBootstrap
from lowtide.common.server import (
    SERVER_OPTIONS,
    add_auth_flags,
    add_common_flags,
    add_flag,
    listener_from_flag,
    translate_store_errors,
)
from lowtide.coordinator.applier import APPLIER_KINDS, PROCESS, THREAD
from lowtide.coordinator.leadership import ShardLease, StandbyRegistration, read_shards
from lowtide.coordinator.lifetime import DEFAULT_CLAIM_AFTER_MS, FileLifetime
from lowtide.coordinator.metadata_log import MetadataLog
from lowtide.coordinator.metrics import COMMIT_DURATION, COMMIT_REQUESTS, CoordinatorCollector
from lowtide.coordinator.retention import RetentionPass
from lowtide.coordinator.service import ShardConfig, ShardService
from lowtide.coordinator.servicer import CoordinatorServicer
from lowtide.coordinator.snapshot_store import SnapshotStore
from lowtide.coordinator.snapshots import SnapshotPolicy
from lowtide.errors import CoordinatorNotAvailable, error_or_none
from lowtide.leases import add_lease_flags, check_backend, kubernetes_lease
from lowtide.metadata.store import MetadataStore
from lowtide.objectstore import open_object_store
from lowtide.rpc.channels import ChannelPool, call
from lowtide.rpc.framed.callers import ListenerProducer
from lowtide.rpc.framed.listener import FramedListener
from lowtide.rpc.interceptor import ErrorInterceptor
from lowtide.rpc.metrics import MetricsInterceptor
from lowtide_pb import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["DisklessCoordinator"].full_name
DEFAULT_GRPC_PORT = 9094


def _applier_kind(value: str) -> str:
    if value not in APPLIER_KINDS:
        raise argparse.ArgumentTypeError(f"--applier must be one of {', '.join(APPLIER_KINDS)}, got {value!r}")
    return value


def _shard_list(value: str) -> list[int]:
    try:
        shards = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--standby-shards takes shard numbers separated by commas, got {value!r}") \
            from None
    if any(k < 0 for k in shards):
        raise argparse.ArgumentTypeError(f"--standby-shards: a shard is >= 0, got {value!r}")
    return shards


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_flags(parser, grpc_port=DEFAULT_GRPC_PORT)
    add_flag(parser, "--shard", type=int, required=True, help="the coordinator shard (metadata partition) served")
    add_flag(parser, "--shards", type=int, default=1,
             help="partitions of __diskless_metadata when this coordinator creates it "
                  "(KIP-1164 diskless.metadata.topic.num.partitions)")
    add_flag(parser, "--data-dir", required=True, help="directory of the SQLite state and its snapshots")
    add_flag(parser, "--advertised-host", default="127.0.0.1", help="host other services use to reach us")
    add_flag(parser, "--object-store", default=None, help="object store URL of the WAL files (file:///dir, s3://...)")
    add_flag(parser, "--lease-ms", type=int, default=6000,
             help="shard leader lease in the metadata store (whole seconds in etcd, at least 2); a killed leader's "
                  "shard is taken over about this long after the kill")
    add_flag(parser, "--standby-shards", type=_shard_list, default=[],
             help="also be the warm standby of these shards (comma-separated): follow their metadata logs, answer "
                  "FindBatches asked of a standby, take over when their leader's lease expires")
    add_flag(parser, "--standby-grpc-host", default="0.0.0.0",
             help="host the standby shards' gRPC ports (one ephemeral port each) listen on")
    add_flag(parser, "--framed-listener", default="auto",
             help="where brokers send CommitFile without gRPC, as framed calls on a plain TCP/TLS port "
                  "(lowtide.rpc.framed.listener; cheaper per file): HOST:PORT, 'auto' (the gRPC listen host, a free "
                  "port, advertised in the shard registry) or 'off' (gRPC only)")
    add_flag(parser, "--append-timeout-ms", type=int, default=10000, help="acks=all wait of a metadata append")
    add_flag(parser, "--appends-in-flight", type=int, default=2,
             help="metadata log appends in flight at once (1-5); each is conditional on the log end, so they land "
                  "in order or not at all")
    add_flag(parser, "--append-linger-ms", type=int, default=5,
             help="with an append in flight, or requests coming within twice this of each other, a request waits "
                  "up to this long for others to ride the next append with it (an idle shard appends at once); "
                  "fewer appends, less CPU per commit")
    add_flag(parser, "--apply-linger-ms", type=int, default=40,
             help="a replicated metadata append waits up to this long for others to share its SQLite transaction "
                  "(requests are answered when replicated; a read that needs the apply ends the wait at once): "
                  "fewer, larger transactions, less CPU per commit")
    add_flag(parser, "--applier", type=_applier_kind, default=PROCESS,
             help="where replicated metadata records are applied to the SQLite state: 'process' (a child "
                  "process, so the apply runs beside the shard's checks instead of sharing its GIL) or 'thread'")
    add_flag(parser, "--applier-nice", type=int, default=10,
             help="the applier process's niceness (0-19): its work is off every request's path, so it yields the "
                  "cores to the shard and the replicas when both are wanted")
    add_flag(parser, "--snapshot-interval-records", type=int, default=10000, help="snapshot after this many records")
    add_flag(parser, "--snapshot-interval-ms", type=int, default=300000,
             help="snapshot at least this often when records were applied (0 = only by record count)")
    add_flag(parser, "--file-delete-grace-ms", type=int, default=60000,
             help="diskless.file.delete.grace.ms: how long a deletable WAL file stays for in-flight reads")
    add_flag(parser, "--file-claim-after-ms", type=int, default=DEFAULT_CLAIM_AFTER_MS,
             help="a file this shard is done with but an earlier owner never recorded (a commit that reached only "
                  "some owners) is claimed once its row is this old and no earlier owner knows it; must exceed "
                  "the longest a commit may be in flight, like the orphan scanner's grace period (the default is "
                  "the same 10 minutes)")
    add_flag(parser, "--file-lifetime-interval-ms", type=int, default=1000,
             help="how often the file handover/deletion worker looks for work")
    add_flag(parser, "--retention-check-interval-ms", type=int, default=5000,
             help="how often time/size retention (retention.ms, retention.bytes) runs on the shard's partitions")
    add_lease_flags(parser)
    add_auth_flags(parser, checks="require a bearer token with CLUSTER_ACTION on every call",
                   own_token="this coordinator's own token (User:coordinator) for its calls to replicas and "
                             "other shards")


def build_hand_over(*, store: MetadataStore, channels: ChannelPool, metadata: list[tuple[str, str]]):
    """The file lifetime worker's call to the next owner shard (found in the shard registry)."""
    def hand_over(target: int, object_key: str, owner_ids: tuple[int, ...], to_index: int) -> None:
        shard = read_shards(store).get(target)
        if shard is None:
            raise CoordinatorNotAvailable(f"coordinator shard {target} has not registered an address")
        stub = channels.stub(shard.grpc, coordinator_pb2_grpc.DisklessCoordinatorStub)
        reply = call(stub.HandOverFile, coordinator_pb2.DisklessHandOverFileRequest(
            object_key=object_key, owner_ids=list(owner_ids), to_owner_index=to_index), metadata=metadata, timeout=30)
        error = error_or_none(reply.error_code, reply.error_message)
        if error is not None:
            raise error
    return hand_over


def build_knows_file(*, store: MetadataStore, channels: ChannelPool, metadata: list[tuple[str, str]]):
    """The file lifetime worker's question to an earlier owner: do you know this file?"""
    def knows_file(target: int, object_key: str) -> bool:
        shard = read_shards(store).get(target)
        if shard is None:
            raise CoordinatorNotAvailable(f"coordinator shard {target} has not registered an address")
        answer = describe_files(channels, shard.grpc, [object_key], metadata=metadata, timeout_s=30)
        if object_key in answer.errors:
            raise answer.errors[object_key]
        return object_key in answer.known
    return knows_file


def run(args: argparse.Namespace) -> int:
    name = f"coordinator-{args.shard}"
    boot = ServerBootstrap(args, name=name)
    if args.shard < 0:
        raise SystemExit(f"{name}: --shard must be >= 0")
    args.lease_backend = check_backend(name, args.lease_backend)
    boot.require_token_file("the token this coordinator presents to the replicas holding its metadata log")
    boot.require_object_store()
    connections = boot.connect()
    access, metadata, channels = connections.access, connections.call_metadata, connections.channels
    replicas = ReplicaClient(channels=channels, metadata=metadata)
    owner = f"{name}-{uuid.uuid4().hex[:12]}"
    object_store = open_object_store(args.object_store)
    store = connections.metadata
    standby_shards = [k for k in args.standby_shards if k != args.shard]
    shards = max(args.shards, args.shard + 1, *(k + 1 for k in standby_shards))

    framed = listener_from_flag(args.framed_listener, grpc_addr=args.grpc_addr, tls=boot.tls, name=name,
                                flag="--framed-listener")
    advertised_framed = f"{args.advertised_host}:{framed.bind()}" if framed is not None else ""

    def build_shard(index: int, *, data_dir: Path, advertised_grpc: str, standby: bool,
                    follow: bool = False, advertised_framed: str = "") -> ShardService:
        config = ShardConfig(
            shard=index, shards=shards, data_dir=data_dir, owner=owner,
            advertised_grpc=advertised_grpc, advertised_framed=advertised_framed, metrics_url=boot.metrics_url,
            lease_ms=args.lease_ms, lease_margin_ms=max(100, args.lease_ms // 6),
            append_timeout_ms=args.append_timeout_ms, appends_in_flight=args.appends_in_flight,
            append_linger_ms=args.append_linger_ms,
            apply_linger_ms=args.apply_linger_ms,
            applier_nice=args.applier_nice,
            # A standby applies on a thread: no applier process per standby shard.
            applier=THREAD if standby else args.applier, standby=standby, follow=follow,
            snapshot=SnapshotPolicy(every_records=args.snapshot_interval_records, every_ms=args.snapshot_interval_ms),
            file_delete_grace_ms=args.file_delete_grace_ms, lifetime_interval_ms=args.file_lifetime_interval_ms)
        lifetime = FileLifetime(store=object_store, grace_ms=args.file_delete_grace_ms,
                                hand_over=build_hand_over(store=store, channels=channels, metadata=metadata),
                                knows_file=build_knows_file(store=store, channels=channels, metadata=metadata),
                                claim_after_ms=args.file_claim_after_ms,
                                interval_ms=args.file_lifetime_interval_ms)
        metadata_log = MetadataLog(shard=index, shards=config.shards, store=store,
                                   replicas=replicas, request_timeout_ms=args.append_timeout_ms,
                                   listener=ListenerProducer(tls=replicas.channels.tls, metadata=replicas.metadata))
        if args.lease_backend == "kubernetes":
            lease = kubernetes_lease(args, role=f"coordinator-{index}", owner=owner, lease_ms=config.lease_ms,
                                     margin_ms=config.lease_margin_ms)
        else:
            lease = ShardLease(metadata=store, shard=index, owner=owner, lease_ms=config.lease_ms,
                               margin_ms=config.lease_margin_ms)
        retention = RetentionPass(topic_configs=lambda: {n: t.config for n, t in store.topics().items() if t.diskless},
                                  interval_ms=args.retention_check_interval_ms)
        return ShardService(config=config, metadata_log=metadata_log, lease=lease, lifetime=lifetime, metadata=store,
                            retention=retention, snapshot_store=SnapshotStore(store=object_store, shard=index,
                                                                              keep=config.snapshot.keep))

    # With standbys, the shard's own process follows its log too while another leads it (after this
    # process was paused or restarted), so taking it back is as quick as a standby's takeover.
    shard = build_shard(args.shard, data_dir=Path(args.data_dir), advertised_grpc=boot.advertised_grpc, standby=False,
                        follow=bool(standby_shards), advertised_framed=advertised_framed)
    REGISTRY.register(CoordinatorCollector(shard))
    standbys = [_StandbyShard(index=k, args=args, tls=boot.tls, framed=framed is not None) for k in standby_shards]
    for standby in standbys:
        standby.service = build_shard(standby.index, data_dir=Path(args.data_dir) / f"standby-{standby.index}",
                                      advertised_grpc=standby.advertised, standby=True,
                                      advertised_framed=standby.advertised_framed)
        standby.serve(CoordinatorServicer(standby.service, access=access), authenticate=access.authenticate_peer)
    registration = StandbyRegistration(store, owner=owner)  # the standbys, under a lease of this process's
    commit_seconds = COMMIT_DURATION.labels(shard=str(args.shard))
    servicer = CoordinatorServicer(
        shard, access=access, observe_commit=commit_seconds.observe,
        count_commit=lambda transport, error: COMMIT_REQUESTS.labels(str(args.shard), transport, error).inc())

    def register(server) -> None:
        coordinator_pb2_grpc.add_DisklessCoordinatorServicer_to_server(servicer, server)

    def start() -> None:
        shard.start()
        if framed is not None:
            # On the shard's pipeline loop: a CommitFile is queued for the writer there and answered
            # when its append lands, on the loop that got the append's answer, with no thread parked
            # per call and none woken to answer it (coordinator/servicer.py _FramedSession).
            framed.start(open_session=servicer.open_framed_session, authenticate=access.authenticate_peer,
                         draining=lambda: False, loop=shard.loop)
            log.info("framed listener", extra={"fields": {"address": advertised_framed}})
        for standby in standbys:
            standby.service.start()
            standby.start_framed()
            registration.add(shard=standby.index, grpc=standby.advertised)
            log.info("standing by", extra={"fields": {"shard": standby.index, "grpc": standby.advertised}})
        if standbys:
            registration.start()

    def on_stop() -> None:
        if framed is not None:
            framed.stop()
        for standby in standbys:
            standby.stop()
        try:
            registration.stop()
        except Exception:  # noqa: BLE001 - the store may be away at shutdown; the records go with their lease
            log.debug("could not unregister the standbys", exc_info=True)
        shard.stop()
        replicas.close()  # the channel pool and the metadata store are closed by the bootstrap

    return boot.serve(service_names=[SERVICE_NAME], register=register, on_stop=on_stop, ready=start)


class _StandbyShard:
    """A standby shard's gRPC server: a port of its own, so that once it leads, the shard registry
    can point brokers at it with no change to their requests (which do not name a shard); and,
    when the shard's own has one (``framed``), a framed listener of its own too, so that brokers
    keep sending CommitFile without gRPC after a takeover (the registry names it once the standby
    leads). Both ports are ephemeral, on ``--standby-grpc-host``, bound at construction (the
    shard's config advertises them) and served from ``serve``."""

    def __init__(self, *, index: int, args: argparse.Namespace, tls, framed: bool = False) -> None:
        self.index = index
        self.service: ShardService | None = None
        self._grace = args.grace_seconds
        self._framed = FramedListener(host=args.standby_grpc_host, port=0, tls=tls,
                                      name=f"coordinator-standby-{index}") if framed else None
        self.advertised_framed = f"{args.advertised_host}:{self._framed.bind()}" if self._framed is not None else ""
        self._servicer: CoordinatorServicer | None = None
        self._authenticate: Callable[[list[tuple[str, str]], bytes | None], str] | None = None
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=args.max_workers, thread_name_prefix=f"grpc-standby-{index}"),
            interceptors=[MetricsInterceptor(), ErrorInterceptor(translate=translate_store_errors)],
            options=SERVER_OPTIONS)
        address = f"{args.standby_grpc_host}:0"
        port = self._server.add_insecure_port(address) if tls is None else \
            self._server.add_secure_port(address, tls.grpc_credentials())
        if port == 0:
            raise SystemExit(f"coordinator standby of shard {index}: cannot listen on {address}")
        self.advertised = f"{args.advertised_host}:{port}"

    def serve(self, servicer: CoordinatorServicer, *,
              authenticate: Callable[[list[tuple[str, str]], bytes | None], str]) -> None:
        coordinator_pb2_grpc.add_DisklessCoordinatorServicer_to_server(servicer, self._server)
        self._server.start()
        self._servicer, self._authenticate = servicer, authenticate

    def start_framed(self) -> None:
        """Once the standby's service runs: its framed listener, on the service's pipeline loop."""
        if self._framed is not None and self.service is not None and self._servicer is not None:
            assert self._authenticate is not None
            self._framed.start(open_session=self._servicer.open_framed_session, authenticate=self._authenticate,
                               draining=lambda: False, loop=self.service.loop)

    def stop(self) -> None:
        if self._framed is not None:
            self._framed.stop()
        self._server.stop(self._grace).wait(self._grace + 1)
        if self.service is not None:
            self.service.stop()
