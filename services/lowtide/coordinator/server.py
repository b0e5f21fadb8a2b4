"""Diskless coordinator server: one shard of KIP-1164's coordinator (`lowtide serve coordinator --shard K`).

Starts serving health/reflection/metrics at once and loads in the background: it takes shard K's
Redis lease (``coordinator.leadership``), reads partition K of ``__diskless_metadata`` from its
applied offset to the end (restoring its newest snapshot first when the log below was deleted),
registers its address in ``lowtide:coordinators`` and only then answers requests (before:
NOT_COORDINATOR without the lease, else COORDINATOR_LOAD_IN_PROGRESS; both retriable). The topic is
created on the first write, so a cluster that never uses diskless topics has no metadata partitions.
State lives in ``--data-dir``: ``state.sqlite`` and
``snapshots/``; each snapshot is also put in the object store (``coordinator.snapshot_store``) before
the log below it is deleted, so a shard started on an empty ``--data-dir`` restores from there.
With ``--auth-enabled`` every call needs CLUSTER_ACTION on the CLUSTER, and
``--token-file`` is this coordinator's own token for the replicas and the other shards it calls.
"""

from __future__ import annotations

import argparse
import logging
import uuid
from pathlib import Path

import redis as redis_lib
from prometheus_client import REGISTRY

from lowtide.client.diskless_files import describe_files
from lowtide.client.replica import ReplicaClient
from lowtide.common.bootstrap import ServerBootstrap
from lowtide.common.server import add_auth_flags, add_common_flags, add_flag
from lowtide.coordinator.applier import APPLIER_KINDS, PROCESS
from lowtide.coordinator.leadership import ShardLease, read_shards
from lowtide.coordinator.lifetime import DEFAULT_CLAIM_AFTER_MS, FileLifetime
from lowtide.coordinator.metadata_log import MetadataLog
from lowtide.coordinator.metrics import COMMIT_DURATION, CoordinatorCollector
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
from lowtide_pb import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["DisklessCoordinator"].full_name
DEFAULT_GRPC_PORT = 9094


def _applier_kind(value: str) -> str:
    if value not in APPLIER_KINDS:
        raise argparse.ArgumentTypeError(f"--applier must be one of {', '.join(APPLIER_KINDS)}, got {value!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_flags(parser, grpc_port=DEFAULT_GRPC_PORT)
    add_flag(parser, "--shard", type=int, required=True, help="the coordinator shard (metadata partition) served")
    add_flag(parser, "--shards", type=int, default=1,
             help="partitions of __diskless_metadata when this coordinator creates it "
                  "(KIP-1164 diskless.metadata.topic.num.partitions)")
    add_flag(parser, "--data-dir", required=True, help="directory of the SQLite state and its snapshots")
    add_flag(parser, "--advertised-host", default="127.0.0.1", help="host other services use to reach us")
    add_flag(parser, "--object-store", default=None, help="object store URL of the WAL files (file:///dir, s3://...)")
    add_flag(parser, "--lease-ms", type=int, default=6000, help="shard leader lease in Redis")
    add_flag(parser, "--append-timeout-ms", type=int, default=10000, help="acks=all wait of a metadata append")
    add_flag(parser, "--appends-in-flight", type=int, default=2,
             help="metadata log appends in flight at once (1-5); each is conditional on the log end, so they land "
                  "in order or not at all")
    add_flag(parser, "--applier", type=_applier_kind, default=PROCESS,
             help="where replicated metadata records are applied to the SQLite state: 'process' (a child "
                  "process, so the apply runs beside the shard's checks instead of sharing its GIL) or 'thread'")
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


def build_hand_over(*, redis: redis_lib.Redis, channels: ChannelPool, metadata: list[tuple[str, str]]):
    """The file lifetime worker's call to the next owner shard (found in the shard registry)."""
    def hand_over(target: int, object_key: str, owner_ids: tuple[int, ...], to_index: int) -> None:
        shard = read_shards(redis).get(target)
        if shard is None:
            raise CoordinatorNotAvailable(f"coordinator shard {target} has not registered an address")
        stub = channels.stub(shard.grpc, coordinator_pb2_grpc.DisklessCoordinatorStub)
        reply = call(stub.HandOverFile, coordinator_pb2.DisklessHandOverFileRequest(
            object_key=object_key, owner_ids=list(owner_ids), to_owner_index=to_index), metadata=metadata, timeout=30)
        error = error_or_none(reply.error_code, reply.error_message)
        if error is not None:
            raise error
    return hand_over


def build_knows_file(*, redis: redis_lib.Redis, channels: ChannelPool, metadata: list[tuple[str, str]]):
    """The file lifetime worker's question to an earlier owner: do you know this file?"""
    def knows_file(target: int, object_key: str) -> bool:
        shard = read_shards(redis).get(target)
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
    check_backend(name, args.lease_backend)
    boot.require_token_file("the token this coordinator presents to the replicas holding its metadata log")
    boot.require_object_store()
    connections = boot.connect()
    redis, access, metadata, channels = (connections.redis, connections.access, connections.call_metadata,
                                         connections.channels)
    replicas = ReplicaClient(channels=channels, metadata=metadata)
    owner = f"{name}-{uuid.uuid4().hex[:12]}"
    config = ShardConfig(
        shard=args.shard, shards=max(args.shards, args.shard + 1), data_dir=Path(args.data_dir), owner=owner,
        advertised_grpc=boot.advertised_grpc, metrics_url=boot.metrics_url,
        lease_ms=args.lease_ms, lease_margin_ms=max(100, args.lease_ms // 6), append_timeout_ms=args.append_timeout_ms,
        appends_in_flight=args.appends_in_flight, applier=args.applier,
        snapshot=SnapshotPolicy(every_records=args.snapshot_interval_records, every_ms=args.snapshot_interval_ms),
        file_delete_grace_ms=args.file_delete_grace_ms, lifetime_interval_ms=args.file_lifetime_interval_ms)
    object_store = open_object_store(args.object_store)
    lifetime = FileLifetime(store=object_store, grace_ms=args.file_delete_grace_ms,
                            hand_over=build_hand_over(redis=redis, channels=channels, metadata=metadata),
                            knows_file=build_knows_file(redis=redis, channels=channels, metadata=metadata),
                            claim_after_ms=args.file_claim_after_ms,
                            interval_ms=args.file_lifetime_interval_ms)
    metadata_log = MetadataLog(shard=args.shard, shards=config.shards, store=MetadataStore(redis=redis),
                               replicas=replicas, request_timeout_ms=args.append_timeout_ms)
    if args.lease_backend == "kubernetes":
        lease = kubernetes_lease(args, role=f"coordinator-{args.shard}", owner=owner, lease_ms=config.lease_ms,
                                 margin_ms=config.lease_margin_ms)
    else:
        lease = ShardLease(redis=redis, shard=args.shard, owner=owner, lease_ms=config.lease_ms,
                           margin_ms=config.lease_margin_ms)
    store = MetadataStore(redis=redis)
    retention = RetentionPass(topic_configs=lambda: {n: t.config for n, t in store.topics().items() if t.diskless},
                              interval_ms=args.retention_check_interval_ms)
    shard = ShardService(config=config, metadata_log=metadata_log, lease=lease, lifetime=lifetime, redis=redis,
                         retention=retention, snapshot_store=SnapshotStore(store=object_store, shard=args.shard,
                                                                           keep=config.snapshot.keep))
    REGISTRY.register(CoordinatorCollector(shard))
    commit_seconds = COMMIT_DURATION.labels(shard=str(args.shard))
    servicer = CoordinatorServicer(shard, access=access, observe_commit=commit_seconds.observe)

    def register(server) -> None:
        coordinator_pb2_grpc.add_DisklessCoordinatorServicer_to_server(servicer, server)

    def on_stop() -> None:
        shard.stop()
        replicas.close()  # the channel pool and Redis are closed by the bootstrap

    return boot.serve(service_names=[SERVICE_NAME], register=register, on_stop=on_stop, ready=shard.start)
