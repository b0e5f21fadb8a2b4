"""`lowtide strays list|remove --data-dir DIR`: the stray partitions of a replica data directory
(logs the metadata no longer names, set aside and kept: docs/design/metadata.md#stray-partitions).

    lowtide strays list --data-dir DIR
    lowtide strays remove --data-dir DIR (--all | --older-than-ms MS)

Works on the directory itself (run it where the replica's volume is, e.g. `kubectl exec`): a
running replica never opens a stray, so removing one is safe while it runs. json output:
``{"strays": [{"path", "topic", "partition", "set_aside_ms", "bytes"}]}`` (remove: the removed ones).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lowtide.cli.main import add_output_flag
from lowtide.cli.output import CliError, emit
from lowtide.log.strays import Stray, list_strays, remove_strays


def register(subparsers: argparse._SubParsersAction) -> None:
    strays = subparsers.add_parser("strays", help="stray partitions of a replica data directory (kept, not served)")
    sub = strays.add_subparsers(dest="strays_command", required=True)
    listing = sub.add_parser("list", help="list the stray partitions")
    listing.add_argument("--data-dir", type=Path, required=True, help="the replica's data directory")
    add_output_flag(listing)
    listing.set_defaults(func=run_list)
    remove = sub.add_parser("remove", help="remove stray partitions (the operator's word)")
    remove.add_argument("--data-dir", type=Path, required=True, help="the replica's data directory")
    which = remove.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every stray partition")
    which.add_argument("--older-than-ms", type=int, help="those set aside at least this long ago")
    add_output_flag(remove)
    remove.set_defaults(func=run_remove)


def _check_dir(path: Path) -> None:
    if not path.is_dir():
        raise CliError("INVALID_REQUEST", f"{path} is not a directory")


def _doc(strays: list[Stray]) -> dict:
    return {"strays": [{"path": str(s.path), "topic": s.topic, "partition": s.partition,
                        "set_aside_ms": s.set_aside_ms, "bytes": s.bytes} for s in strays]}


def run_list(args: argparse.Namespace) -> int:
    _check_dir(args.data_dir)
    strays = list_strays(args.data_dir)
    text = "\n".join(f"{s.path}\t{s.topic}-{s.partition}\t{s.bytes} bytes" for s in strays) or "no stray partitions"
    emit(args, _doc(strays), text=text)
    return 0


def run_remove(args: argparse.Namespace) -> int:
    _check_dir(args.data_dir)
    if args.older_than_ms is not None and args.older_than_ms < 0:
        raise CliError("INVALID_REQUEST", f"--older-than-ms must be >= 0, got {args.older_than_ms}")
    removed = remove_strays(args.data_dir, older_than_ms=0 if args.all else args.older_than_ms)
    text = "\n".join(f"removed {s.path} ({s.bytes} bytes)" for s in removed) or "no stray partition removed"
    emit(args, _doc(removed), text=text)
    return 0
