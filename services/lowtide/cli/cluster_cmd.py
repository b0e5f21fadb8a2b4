"""`lowtide cluster up|down|status`: a complete local cluster of real processes (docs/operations.md#local-cluster).

``up`` prints the content of ``DIR/cluster.json`` (json mode: that JSON; text: a table) and, unless
``--detach``, stays in the foreground until Ctrl-C/SIGTERM, then stops everything it started.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from lowtide.cli.main import add_output_flag
from lowtide.cli.output import CliError, emit, progress
from lowtide.common.procs import MissingToolError
from lowtide.localcluster import ClusterConfig, ClusterError, LocalCluster, parse_config_pairs
from lowtide.localcluster.config import default_coordinators


def register(subparsers: argparse._SubParsersAction) -> None:
    cluster = subparsers.add_parser("cluster", help="start, inspect or stop a local cluster of real processes")
    actions = cluster.add_subparsers(dest="action", required=True)

    up = actions.add_parser("up", help="start redis-server, replicas, frontdoor and the other services")
    _add_data_dir(up)
    up.add_argument("--replicas", type=int, default=3, help="replica servers (broker ids 0..N-1)")
    up.add_argument("--metadata-members", type=int, default=1,
                    help="etcd members of the cluster metadata store (1, or 3 to survive a member's loss)")
    up.add_argument("--coordinators", type=int, default=None,
                    help=f"diskless coordinator shards (default {default_coordinators()}; 0 while not built)")
    up.add_argument("--frontdoors", type=int, default=1, help="frontdoor (Admin) servers; the first is bootstrap")
    up.add_argument("--detach", action="store_true", help="return once healthy; processes keep running")
    up.add_argument("--auth-enabled", action="store_true",
                    help="every service requires a bearer token and checks ACLs; writes each service's own "
                         "token, and (without --tokens-file) an admin token + DIR/secrets/admin.properties "
                         "for --command-config, under DIR/secrets")
    up.add_argument("--tokens-file", type=Path, default=None,
                    help="your own tokens file (lines 'token User:name') for every service; no admin is generated")
    up.add_argument("--super-users", default="", help="super users, e.g. User:ops,User:alice")
    up.add_argument("--session-timeout-ms", type=int, default=None, help="replica liveness session timeout")
    up.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                    help="replica broker setting or topic-config default (segment.bytes=65536, ...)")
    up.add_argument("--tls", action="store_true",
                    help="TLS on every gRPC port: a CA and a certificate per service under DIR/tls, calls between "
                         "services mutual TLS; the CLI's settings in DIR/tls/client.properties (--command-config)")
    up.add_argument("--tls-client-auth", choices=("required", "none"), default="required",
                    help="with --tls: require client certificates (mutual TLS; default) or not")
    up.add_argument("--with-prometheus", action="store_true",
                    help="also start a real Prometheus scraping every service, with lowtide's alert rules")
    up.add_argument("--health-timeout", type=float, default=60.0, help="seconds to wait for health SERVING")
    up.add_argument("--object-store", default=None,
                    help="WAL files of diskless topics: file:///dir or s3://bucket/prefix?endpoint=URL "
                         "(default DIR/objects; the bucket must exist)")
    add_output_flag(up)
    up.set_defaults(func=run_up)

    down = actions.add_parser("down", help="stop the cluster recorded in DIR/cluster.json")
    _add_data_dir(down)
    down.add_argument("--timeout", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL")
    add_output_flag(down)
    down.set_defaults(func=run_down)

    status = actions.add_parser("status", help="pid and health of every service (exit 1 if any is unhealthy)")
    _add_data_dir(status)
    add_output_flag(status)
    status.set_defaults(func=run_status)


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, required=True, help="the cluster's directory")


def build_config(args: argparse.Namespace) -> ClusterConfig:
    """The ClusterConfig an ``up`` command line asks for; bad values raise CliError(INVALID_CONFIG)."""
    try:
        config = ClusterConfig(
            data_dir=args.data_dir, replicas=args.replicas, frontdoors=args.frontdoors,
            metadata_members=args.metadata_members,
            replica_config=parse_config_pairs(args.config), auth_enabled=args.auth_enabled,
            tokens_file=args.tokens_file, super_users=args.super_users,
            session_timeout_ms=args.session_timeout_ms, health_timeout_s=args.health_timeout,
            with_prometheus=args.with_prometheus, object_store=args.object_store, tls=args.tls,
            tls_client_auth=args.tls_client_auth)
        if args.coordinators is not None:
            config.coordinators = args.coordinators
        config.validate()
    except ValueError as exc:
        raise CliError("INVALID_CONFIG", str(exc)) from None
    return config


def run_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(build_config(args))
    stop = threading.Event()
    starting = True

    def on_signal(_signum: int, _frame: Any) -> None:
        # During startup, interrupt it once: `up` stops what it started on any exception, and a
        # second signal must not interrupt that cleanup. Afterwards, just wake the foreground loop,
        # which stops the cluster in order.
        nonlocal starting
        stop.set()
        if starting:
            starting = False
            raise KeyboardInterrupt

    # Installed before starting, so a SIGTERM during startup does not leave orphans behind.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        doc = _call(lambda: cluster.up(detach=args.detach, progress=lambda m: progress(args, m)))
        starting = False
        emit(args, doc, format_cluster(doc))
        if args.detach:
            return 0
        progress(args, "cluster running; Ctrl-C stops it")
        _supervise(cluster, stop, args)
        progress(args, "stopping the cluster...")
        cluster.down(progress=lambda m: progress(args, m))
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(cluster: LocalCluster, stop: threading.Event, args: argparse.Namespace) -> None:
    """Wait for Ctrl-C/SIGTERM, reporting (once each) services that exit on their own."""
    reported: set[str] = set()
    while not stop.wait(1.0):
        for entry in cluster.services():
            if entry.name not in reported and not cluster.is_running(entry.name):
                reported.add(entry.name)
                progress(args, f"warning: {entry.name} (pid {entry.pid}) exited; see {entry.log}")


def run_down(args: argparse.Namespace) -> int:
    cluster = LocalCluster(ClusterConfig(data_dir=args.data_dir))
    report = _call(lambda: cluster.down(timeout_s=args.timeout, progress=lambda m: progress(args, m)))
    lines = [f"{r['name']:<18} pid {r['pid']:<8} {r['result']}" for r in report["services"]]
    emit(args, report, "\n".join(lines) if lines else f"no cluster in {report['data_dir']}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    report = _call(lambda: LocalCluster.load(args.data_dir).status())
    emit(args, report, format_status(report))
    return 0 if report["healthy"] else 1


def _call(action: Any) -> Any:
    try:
        return action()
    except ClusterError as exc:
        raise CliError(exc.code, exc.message) from None
    except MissingToolError as exc:
        raise CliError("MISSING_TOOL", str(exc)) from None


def format_cluster(doc: dict[str, Any]) -> str:
    lines = [f"lowtide local cluster in {doc['data_dir']}",
             f"  bootstrap     {doc['bootstrap']}",
             f"  redis         {doc['redis']}",
             f"  object store  {doc['object_store']}",
             *([f"  prometheus    {doc['prometheus']}"] if doc.get("prometheus") else []),
             "",
             f"  {'NAME':<18} {'KIND':<15} {'GRPC':<22} {'METRICS':<38} PID"]
    for s in doc["services"]:
        lines.append(f"  {s['name']:<18} {s['kind']:<15} {s['grpc']:<22} {s['metrics'] or '-':<38} {s['pid']}")
    lines += ["", f"  logs: {doc['logs_dir']}/<name>.log"]
    auth = doc.get("auth") or {}
    if auth:
        lines.append(f"  auth: on; service tokens in {auth['secrets_dir']}")
        if auth.get("admin_command_config"):
            lines.append(f"  admin ({auth['admin_principal']}): --command-config {auth['admin_command_config']}")
    tls = doc.get("tls") or {}
    if tls:
        lines.append(f"  tls: on ({tls['client_auth']} client auth); CA {tls['ca']}")
        if not auth.get("admin_command_config"):
            lines.append(f"  client: --command-config {tls['command_config']}")
    lines.append(f"  stop: lowtide cluster down --data-dir {doc['data_dir']}")
    return "\n".join(lines)


def format_status(report: dict[str, Any]) -> str:
    lines = [f"cluster in {report['data_dir']}: {'healthy' if report['healthy'] else 'UNHEALTHY'}"
             f" (state {report['state']}, bootstrap {report['bootstrap']})",
             f"  {'NAME':<18} {'KIND':<15} {'GRPC':<22} {'PID':<8} {'ALIVE':<6} HEALTH"]
    for s in report["services"]:
        lines.append(f"  {s['name']:<18} {s['kind']:<15} {s['grpc']:<22} {s['pid']:<8} "
                     f"{'yes' if s['alive'] else 'no':<6} {s['health']}")
    return "\n".join(lines)
