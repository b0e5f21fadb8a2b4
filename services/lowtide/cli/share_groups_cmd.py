"""`lowtide share-groups list|describe`: KIP-932 share groups (kafka-share-groups.sh --list/--describe).

JSON output: list -> {"groups": [{"group", "state"}]}; describe -> {"groups": [{"group", "state",
"members": [{"member_id", "client_id", "assignment": [{"topic", "partition"}]}], "partitions":
[{"topic", "partition", "log_end_offset"}]}]} (the partitions assigned to a member; log_end_offset is
the high watermark, -1 when unknown). The members and assignments come from the front door's share
group coordinator (ShareGroupDescribe over gRPC). A group the coordinator does not know is an error
(GROUP_ID_NOT_FOUND) and a non-zero exit.
"""

from __future__ import annotations

import argparse

from lowtide.cli.client_args import add_connection_flags, build_admin
from lowtide.cli.output import CliError, emit
from lowtide.client import OffsetSpec
from lowtide.rpc.convert import consumer_groups as convert_consumer
from lowtide_pb import admin_pb2

SHARE_PROTOCOL_TYPE = "share"


def register(subparsers: argparse._SubParsersAction) -> None:
    groups = subparsers.add_parser("share-groups", help="list and describe KIP-932 share groups")
    actions = groups.add_subparsers(dest="share_groups_action", required=True)
    listing = actions.add_parser("list", help="list share groups and their states")
    add_connection_flags(listing)
    listing.set_defaults(func=run_list)
    describe = actions.add_parser("describe", help="state, members, assignments and end offsets of share groups")
    add_connection_flags(describe)
    describe.add_argument("--group", action="append", required=True, help="share group id (repeatable)")
    describe.set_defaults(func=run_describe)


def run_list(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        listings = [g for g in admin.list_group_listings() if g.protocol_type == SHARE_PROTOCOL_TYPE]
    rows = [{"group": g.group_id, "state": g.state} for g in sorted(listings, key=lambda g: g.group_id)]
    emit(args, {"groups": rows}, "\n".join(["GROUP\tSTATE", *(f"{r['group']}\t{r['state']}" for r in rows)]))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        described = {d.group_id: d for d in convert_consumer.descriptions_from_proto(admin.call(
            "ShareGroupDescribe", admin_pb2.ConsumerGroupDescribeRequest(group_ids=list(args.group))))}
        for group_id in args.group:
            found = described.get(group_id)
            if found is None:
                raise CliError("GROUP_ID_NOT_FOUND", f"share group {group_id!r} was not described")
            if found.error is not None:
                raise CliError(found.error.name, found.error.message)
        partitions = {(tp.topic, p) for d in described.values() for m in d.members
                      for tp in m.assignment for p in tp.partitions}
        ends = admin.list_offsets({tp: OffsetSpec.LATEST for tp in partitions}) if partitions else {}
    docs, lines = [], ["GROUP\tSTATE\tMEMBER-ID\tCLIENT-ID\tASSIGNMENT"]
    part_lines = ["GROUP\tTOPIC\tPARTITION\tLOG-END-OFFSET"]
    for group_id in args.group:
        d = described[group_id]
        members = []
        assigned: set[tuple[str, int]] = set()
        for m in sorted(d.members, key=lambda m: m.member_id):
            assignment = sorted((tp.topic, p) for tp in m.assignment for p in tp.partitions)
            assigned.update(assignment)
            members.append({"member_id": m.member_id, "client_id": m.client_id,
                            "assignment": [{"topic": t, "partition": p} for t, p in assignment]})
            lines.append(f"{group_id}\t{d.state}\t{m.member_id}\t{m.client_id}\t"
                         f"{','.join(f'{t}-{p}' for t, p in assignment) or '-'}")
        if not d.members:
            lines.append(f"{group_id}\t{d.state}\t-\t-\t-")
        rows = []
        for topic, partition in sorted(assigned):
            end = ends.get((topic, partition))
            log_end = end.offset if end is not None and end.error is None else -1
            rows.append({"topic": topic, "partition": partition, "log_end_offset": log_end})
            part_lines.append(f"{group_id}\t{topic}\t{partition}\t{log_end}")
        docs.append({"group": group_id, "state": d.state, "members": members, "partitions": rows})
    emit(args, {"groups": docs}, "\n".join([*lines, "", *part_lines]))
    return 0
