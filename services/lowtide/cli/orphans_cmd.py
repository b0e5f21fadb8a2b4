"""`lowtide orphans scan`: run one orphan-file scan now (KIP-1164 "Orphan files") and report it.

Where the scanner is: found through the cluster. The call goes to ``--bootstrap-server``, a front
door, which forwards ``lowtide.v1.OrphanScanner`` to the scanner registered in the cluster
metadata (section ``scanners``, lowtide/frontdoor/scanner_proxy.py); with none registered it answers
COORDINATOR_NOT_AVAILABLE, saying so. ``--scanner-address HOST:PORT`` (env
LOWTIDE_SCANNER_ADDRESS) overrides that with the address of the ``lowtide serve orphan-scanner``
process itself (on Kubernetes its Service, locally the ``orphan-scanner-0`` entry of
cluster.json). A front door from before the forwarding answers UNIMPLEMENTED, reported as such.

Output: text, the counts and the keys deleted (or, with ``--dry-run``, that would be); json, the
scan report (``lowtide.client.scanner.ScanResult``). Progress of a long scan goes to stderr. A
scan that stopped early (a shard could not answer) exits 1 with its reason as the error.
"""

from __future__ import annotations

import argparse
import os
import threading

from lowtide.cli.client_args import add_cluster_command, read_call_metadata
from lowtide.cli.output import CliError, emit, progress
from lowtide.client.scanner import ScannerClient, ScanResult
from lowtide.errors import LowtideError, NetworkException

PROGRESS_EVERY_S = 2.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("orphans", help="orphan WAL files of diskless topics (KIP-1164)")
    sub = p.add_subparsers(dest="orphans_command", required=True)
    scan = add_cluster_command(sub, "scan", func=run_scan,
                               help="scan object storage for orphan WAL files now and delete them")
    scan.add_argument("--scanner-address", metavar="HOST:PORT", default=os.environ.get("LOWTIDE_SCANNER_ADDRESS"),
                      help="call this orphan scanner directly (env LOWTIDE_SCANNER_ADDRESS); default: the one "
                           "registered in the cluster, through the bootstrap server")
    scan.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")


def _watch_progress(args: argparse.Namespace, client: ScannerClient, done: threading.Event) -> None:
    # Progress from Status while ScanNow runs: only scans that take a while print anything.
    while not done.wait(PROGRESS_EVERY_S):
        try:
            status = client.status(timeout_s=5)
        except LowtideError:
            continue
        if status.running and status.current is not None:
            c = status.current
            progress(args, f"scanning: {c.listed} listed, {c.candidates} candidates, {c.known} known, "
                           f"{c.orphans} orphans, {c.deleted} deleted")


def render(result: ScanResult) -> str:
    verb = "would delete" if result.dry_run else "deleted"
    lines = [f"listed {result.listed}, skipped {result.skipped} (newer than the threshold), "
             f"candidates {result.candidates}, known {result.known}, orphans {result.orphans}, "
             f"deleted {result.deleted} ({result.deleted_bytes} bytes) in {result.duration_seconds:.2f}s"]
    keys = result.orphan_keys if result.dry_run else result.deleted_keys
    lines += [f"  {verb} {k}" for k in keys]
    shown = len(keys)
    total = result.orphans if result.dry_run else result.deleted
    if total > shown:
        lines.append(f"  ... and {total - shown} more")
    return "\n".join(lines)


def run_scan(args: argparse.Namespace) -> int:
    address = args.scanner_address or args.bootstrap_server
    client = ScannerClient(address, metadata=read_call_metadata(args))
    done = threading.Event()
    watcher = threading.Thread(target=_watch_progress, args=(args, client, done), daemon=True)
    watcher.start()
    try:
        result = client.scan_now(dry_run=args.dry_run)
    except NetworkException as err:
        if "UNIMPLEMENTED" in err.message and not args.scanner_address:
            raise CliError("INVALID_REQUEST", f"{address} does not serve lowtide.v1.OrphanScanner: pass "
                           "--scanner-address (the orphan-scanner service)") from None
        raise
    finally:
        done.set()
        client.close()
    if not result.ok:
        raise CliError("KAFKA_STORAGE_ERROR" if result.failure in ("list_failed", "delete_failed")
                       else "COORDINATOR_NOT_AVAILABLE",
                       f"orphan scan stopped ({result.failure}), nothing deleted after that: {result.failure_detail}; "
                       f"deleted before it: {result.deleted}")
    emit(args, result.to_json(), render(result))
    return 0
