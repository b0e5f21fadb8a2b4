"""`lowtide delete-records`: the KIP-107 tool, shaped like kafka-delete-records.sh.

    lowtide delete-records --bootstrap-server B --offset-json-file F [--command-config F] [--timeout-ms MS]

The file is Kafka's format: ``{"partitions": [{"topic": "orders", "partition": 0, "offset": 10000}],
"version": 1}`` (offset -1 = the current high watermark). A missing, unreadable or malformed file,
or a partition listed twice, fails with INVALID_REQUEST naming the file before anything is sent.
JSON output: ``{"partitions": [{"topic", "partition", "low_watermark"} | {"topic", "partition",
"error"}]}``; the exit code is 1 when any partition failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lowtide.cli.client_args import add_cluster_command, build_admin
from lowtide.cli.output import CliError, emit

DEFAULT_TIMEOUT_MS = 30_000


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_cluster_command(subparsers, "delete-records", help="delete records before offsets (KIP-107)", func=run)
    parser.add_argument("--offset-json-file", required=True, metavar="FILE",
                        help='{"partitions":[{"topic":"orders","partition":0,"offset":10000}],"version":1}')
    parser.add_argument("--timeout-ms", type=int, default=DEFAULT_TIMEOUT_MS,
                        help="how long the leaders may wait for the replicas (default 30000)")


def _invalid(path: str, message: str) -> CliError:
    return CliError("INVALID_REQUEST", f"offset JSON file {path!r}: {message}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_offset_json_file(path: str) -> list[tuple[str, int, int]]:
    """Parse and validate Kafka's offset JSON file into (topic, partition, offset) in file order."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise _invalid(path, f"cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _invalid(path, "is not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(path, f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise _invalid(path, 'expected an object with a "partitions" list')
    if "version" in doc and doc["version"] != 1:
        raise _invalid(path, f'unsupported "version" {doc["version"]!r} (expected 1)')
    if not doc["partitions"]:
        raise _invalid(path, '"partitions" is empty: nothing to delete')
    items: list[tuple[str, int, int]] = []
    seen: set[tuple[str, int]] = set()
    for i, entry in enumerate(doc["partitions"]):
        where = f"partitions[{i}]"
        if not isinstance(entry, dict):
            raise _invalid(path, f"{where} must be an object with topic, partition and offset")
        topic, partition, offset = entry.get("topic"), entry.get("partition"), entry.get("offset")
        if not isinstance(topic, str) or not topic:
            raise _invalid(path, f'{where}: "topic" must be a non-empty string')
        if not _is_int(partition) or partition < 0:
            raise _invalid(path, f'{where}: "partition" must be an integer >= 0, got {partition!r}')
        if not _is_int(offset):
            raise _invalid(path, f'{where}: "offset" must be an integer (-1 = high watermark), got {offset!r}')
        if (topic, partition) in seen:
            raise _invalid(path, f"partition {topic}-{partition} is listed more than once")
        seen.add((topic, partition))
        items.append((topic, partition, offset))
    return items


def run(args: argparse.Namespace) -> int:
    items = read_offset_json_file(args.offset_json_file)
    if args.timeout_ms <= 0:
        raise CliError("INVALID_REQUEST", f"--timeout-ms must be > 0, got {args.timeout_ms}")
    text_mode = args.output != "json"
    if text_mode:
        sys.stdout.write("Executing records delete operation\n")
        sys.stdout.flush()
    with build_admin(args, timeout_s=args.timeout_ms / 1000 + 5) as admin:
        results = admin.delete_records(items, timeout_ms=args.timeout_ms)
    rows, lines, failed = [], [], 0
    for topic, partition, _ in items:
        result = results.get((topic, partition))
        if result is None or result.error is not None:
            failed += 1
            name = result.error.name if result is not None and result.error is not None else "UNKNOWN_SERVER_ERROR"
            message = result.error.message if result is not None and result.error is not None else "no result"
            rows.append({"topic": topic, "partition": partition, "error": name})
            lines.append(f"partition: {topic}-{partition}\terror: {name}: {message}")
        else:
            rows.append({"topic": topic, "partition": partition, "low_watermark": result.low_watermark})
            lines.append(f"partition: {topic}-{partition}\tlow_watermark: {result.low_watermark}")
    emit(args, {"partitions": rows}, "Records delete operation completed:\n" + "\n".join(lines))
    return 1 if failed else 0
