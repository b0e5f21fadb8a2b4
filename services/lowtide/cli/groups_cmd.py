"""`lowtide groups list|describe|delete`: consumer groups' committed offsets (kafka-consumer-groups.sh).

JSON output: list -> {"groups": [ids]}; describe -> {"groups": [{"group", "offsets": [{"topic",
"partition", "offset", "log_end_offset", "lag"}]}]} (log_end_offset = high watermark, -1 and lag
null when unknown); delete -> {"groups": [{"group", "deleted": true} | {"group", "error"}]}.
"""

from __future__ import annotations

import argparse

from lowtide.cli.client_args import add_cluster_command, build_admin
from lowtide.cli.output import CliError, emit
from lowtide.client import OffsetSpec


def register(subparsers: argparse._SubParsersAction) -> None:
    groups = subparsers.add_parser("groups", help="list, describe and delete consumer groups")
    actions = groups.add_subparsers(dest="groups_action", required=True)
    add_cluster_command(actions, "list", help="list group ids", func=run_list)
    for name, func, help_text in (("describe", run_describe, "committed offsets and lag of groups"),
                                  ("delete", run_delete, "delete groups and their committed offsets")):
        parser = add_cluster_command(actions, name, help=help_text, func=func)
        parser.add_argument("--group", action="append", required=True, help="group id (repeatable)")


def run_list(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        groups = admin.list_groups()
    emit(args, {"groups": groups}, "\n".join(groups))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        described = admin.describe_groups(args.group)
        for group_id in args.group:
            error = described[group_id].error if group_id in described else None
            if error is not None:
                raise CliError(error.name, error.message)
        partitions = {tp for g in described.values() for tp in g.offsets}
        ends = admin.list_offsets({tp: OffsetSpec.LATEST for tp in partitions}) if partitions else {}
    docs, lines = [], []
    for group_id in args.group:
        rows = []
        for (topic, partition), committed in sorted(described[group_id].offsets.items()):
            end = ends.get((topic, partition))
            log_end = end.offset if end is not None and end.error is None else -1
            lag = max(0, log_end - committed.offset) if log_end >= 0 else None
            rows.append({"topic": topic, "partition": partition, "offset": committed.offset,
                         "log_end_offset": log_end, "lag": lag})
            lines.append(f"{group_id}\t{topic}\t{partition}\t{committed.offset}\t{log_end}\t"
                         f"{'-' if lag is None else lag}")
        docs.append({"group": group_id, "offsets": rows})
    header = "GROUP\tTOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-END-OFFSET\tLAG"
    emit(args, {"groups": docs}, "\n".join([header, *lines]))
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        results = admin.delete_groups(args.group)
    rows, lines, failed = [], [], 0
    for group_id in args.group:
        error = results.get(group_id)
        if error is None:
            rows.append({"group": group_id, "deleted": True})
            lines.append(f"Deleted group {group_id}.")
        else:
            failed += 1
            rows.append({"group": group_id, "error": error.name})
            lines.append(f"Group {group_id}: error: {error.name}: {error.message}")
    emit(args, {"groups": rows}, "\n".join(lines))
    return 1 if failed else 0
