"""Orphan scanner server (KIP-1164 "Orphan files"): `lowtide serve orphan-scanner`.

Every ``--scan-interval-ms`` (diskless.coordinator.orphan.scan.interval.ms), and on ``ScanNow``, it
deletes the WAL files under ``--prefix`` of ``--object-store`` that no coordinator shard knows and
that are older than the threshold (``scan.py``). Shards are found in the shard registry of the
cluster metadata (``shards.py``); with
``--auth-enabled`` its calls need CLUSTER_ACTION and it calls the shards with ``--token-file``.

The grace period rule (``--grace-period-ms``, diskless.coordinator.orphan.scan.grace.period.ms):
a WAL file is uploaded, then committed; between the two a scan must not take it for an orphan. A
broker sends the commit within its commit interval of the upload (``--commit-interval-ms``, the
brokers' diskless.commit.interval.ms) with a deadline of at most ``--commit-timeout-ms`` (the
brokers' CommitFile deadline); a coordinator drops a CommitFile whose deadline passed before it
was processed, and knows the file from the moment it processes one (a pending commit counts as
known) until it applies or fails it, within its append timeout (``--append-timeout-ms``, the
coordinators' flag of that name). So the longest a commit may be in flight, counted from the
upload, is commit interval + max(commit timeout, append timeout), and the scanner refuses to
start with a grace period not strictly above it. Uploads themselves must finish within the grace
margin left (S3 stamps an object with the time its upload began), and a broker must not send a
commit later than that bound after the upload (not even after waiting behind earlier commits):
keep the grace period well above the rule; the default is 10 minutes.

Registration: ``scanners/{name}`` in the cluster metadata (section ``scanners``) -> {"grpc",
"metrics", "since_ms"}, written once serving and deleted at shutdown, so a front door can forward
``lowtide.v1.OrphanScanner`` calls to it (``lowtide orphans scan --bootstrap-server B``).
"""

from __future__ import annotations

import argparse
import json
import logging

from lowtide.client.scanner import SCANNER_REGISTRY
from lowtide.clock import now_ms
from lowtide.common.bootstrap import ServerBootstrap
from lowtide.common.server import add_auth_flags, add_common_flags, add_flag
from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.sections import section
from lowtide.objectstore import open_object_store
from lowtide.scanner.scan import ScanConfig
from lowtide.scanner.service import ScannerConfig, ScannerService
from lowtide.scanner.servicer import ScannerServicer
from lowtide.scanner.shards import discover_shards
from lowtide_pb import scanner_pb2, scanner_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = scanner_pb2.DESCRIPTOR.services_by_name["OrphanScanner"].full_name
DEFAULT_GRPC_PORT = 9096
DEFAULT_GRACE_PERIOD_MS = 600_000
DEFAULT_SCAN_INTERVAL_MS = 300_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_flags(parser, grpc_port=DEFAULT_GRPC_PORT)
    add_flag(parser, "--name", default="orphan-scanner-0", help="this scanner's name (logs, registration)")
    add_flag(parser, "--advertised-host", default="127.0.0.1", help="host other services use to reach us")
    add_flag(parser, "--object-store", default=None, help="object store URL of the WAL files (file:///dir, s3://...)")
    add_flag(parser, "--prefix", default="wal/",
             help="key prefix of WAL files in the store (a string prefix; the brokers write wal/<uuid>)")
    add_flag(parser, "--scan-interval-ms", type=int, default=DEFAULT_SCAN_INTERVAL_MS,
             help="diskless.coordinator.orphan.scan.interval.ms: time between two scans")
    add_flag(parser, "--grace-period-ms", type=int, default=DEFAULT_GRACE_PERIOD_MS,
             help="diskless.coordinator.orphan.scan.grace.period.ms: only files older than the shards' oldest "
                  "file minus this are candidates; must exceed --commit-interval-ms + "
                  "max(--commit-timeout-ms, --append-timeout-ms)")
    add_flag(parser, "--append-timeout-ms", type=int, default=10_000,
             help="the coordinators' --append-timeout-ms: the longest a shard holds a commit before it fails")
    add_flag(parser, "--commit-interval-ms", type=int, default=250,
             help="the brokers' WAL commit interval: the longest from an upload to its CommitFile call")
    add_flag(parser, "--commit-timeout-ms", type=int, default=30_000,
             help="the brokers' CommitFile deadline: the longest a sent commit may take to reach a shard")
    add_flag(parser, "--shards", type=int, default=0,
             help="coordinator shards expected (diskless.metadata.topic.num.partitions); 0: the highest registered "
                  "shard + 1. A scan with any of them missing deletes nothing")
    add_flag(parser, "--describe-batch", type=int, default=1000, help="keys per DescribeFiles call")
    add_flag(parser, "--shard-timeout-ms", type=int, default=10_000, help="deadline of one DescribeFiles call")
    add_auth_flags(parser, checks="require a bearer token with CLUSTER_ACTION on every call",
                   own_token="this scanner's own token for its calls to the shards")


def check_grace_period(*, grace_period_ms: int, append_timeout_ms: int, commit_interval_ms: int,
                       commit_timeout_ms: int) -> None:
    """Refuse a grace period a commit in flight could outlast (the module doc gives the rule)."""
    in_flight = commit_interval_ms + max(commit_timeout_ms, append_timeout_ms)
    if grace_period_ms <= in_flight:
        raise ValueError(
            f"--grace-period-ms {grace_period_ms} is too short: it must exceed the longest a commit may be in "
            f"flight, --commit-interval-ms {commit_interval_ms} + max(--commit-timeout-ms {commit_timeout_ms}, "
            f"--append-timeout-ms {append_timeout_ms}) = {in_flight} ms, or a file uploaded but not committed "
            "yet could be deleted as an orphan")


def run(args: argparse.Namespace) -> int:
    name = args.name
    boot = ServerBootstrap(args, name=name)
    boot.require_object_store()
    boot.require_token_file("the token this scanner presents to the coordinator shards")
    try:
        check_grace_period(grace_period_ms=args.grace_period_ms, append_timeout_ms=args.append_timeout_ms,
                           commit_interval_ms=args.commit_interval_ms, commit_timeout_ms=args.commit_timeout_ms)
        config = ScannerConfig(scan=ScanConfig(grace_period_ms=args.grace_period_ms, prefix=args.prefix,
                                               describe_batch=args.describe_batch),
                               scan_interval_ms=args.scan_interval_ms)
    except ValueError as exc:
        raise SystemExit(f"{name}: {exc}") from None
    connections = boot.connect()
    access, metadata, channels = connections.access, connections.call_metadata, connections.channels
    registry = section(connections.metadata, SCANNER_REGISTRY)
    store = open_object_store(args.object_store)

    def find_shards():
        return discover_shards(connections.metadata, expected=args.shards, channels=channels, metadata=metadata,
                               timeout_s=args.shard_timeout_ms / 1000)

    service = ScannerService(store=store, config=config, find_shards=find_shards)
    servicer = ScannerServicer(service, access=access)

    def register(server) -> None:
        scanner_pb2_grpc.add_OrphanScannerServicer_to_server(servicer, server)

    def ready() -> None:
        registry.put(name, json.dumps({"grpc": boot.advertised_grpc, "metrics": boot.metrics_url,
                                       "since_ms": now_ms()}, sort_keys=True).encode())
        service.start()
        log.info("orphan scanner started", extra={"fields": {
            "object_store": args.object_store, "prefix": args.prefix, "scan_interval_ms": args.scan_interval_ms,
            "grace_period_ms": args.grace_period_ms, "shards": args.shards}})

    def on_stop() -> None:
        service.stop()
        try:
            registry.delete([name])
        except MetadataStoreUnavailable:
            pass  # the front door finds a dead address and says so; nothing to clean up elsewhere
        store.close()  # the channel pool and the metadata store are closed by the bootstrap

    return boot.serve(service_names=[SERVICE_NAME], register=register, on_stop=on_stop, ready=ready)
