"""`lowtide share-groups list|describe`: KIP-932 share groups (kafka-share-groups.sh --list/--describe).

JSON output: list -> {"groups": [{"group", "state"}]}; describe -> {"groups": [{"group", "state",
"members": [{"member_id", "client_id", "assignment": [{"topic", "partition"}]}], "partitions":
[{"topic", "partition", "start_offset", "log_end_offset", "lag"}]}]} (every partition assigned to a
member or with durable share state; start_offset -1 when the group has no state for it yet,
log_end_offset the high watermark, -1 when unknown; lag the records from the start offset to the
end not yet acknowledged or archived, null when either is unknown). The members and assignments
come from the front door's share group coordinator (ShareGroupDescribe over gRPC), the start offsets
from its reader of ``__share_group_state`` (ShareGroupStartOffsets). A group the coordinator does not
know is an error (GROUP_ID_NOT_FOUND) and a non-zero exit.
"""

from __future__ import annotations

import argparse

from lowtide.cli.client_args import add_connection_flags, build_admin
from lowtide.cli.output import CliError, emit
from lowtide.client import OffsetSpec
from lowtide.errors import error_or_none
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
        starts: dict[str, dict[tuple[str, int], admin_pb2.ShareStartOffset]] = {}
        for group_id in args.group:
            answer = admin.call("ShareGroupStartOffsets", admin_pb2.ShareGroupStartOffsetsRequest(group_id=group_id))
            error = error_or_none(answer.error_code, answer.error_message)
            if error is not None:
                raise CliError(error.name, error.message)
            starts[group_id] = {(s.topic, s.partition): s for s in answer.partitions}
        partitions = {(tp.topic, p) for d in described.values() for m in d.members
                      for tp in m.assignment for p in tp.partitions}
        partitions |= {tp for found in starts.values() for tp in found}
        ends = admin.list_offsets({tp: OffsetSpec.LATEST for tp in partitions}) if partitions else {}
    docs, lines = [], ["GROUP\tSTATE\tMEMBER-ID\tCLIENT-ID\tASSIGNMENT"]
    part_lines = ["GROUP\tTOPIC\tPARTITION\tSTART-OFFSET\tLOG-END-OFFSET\tLAG"]
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
        for topic, partition in sorted(assigned | set(starts[group_id])):
            end = ends.get((topic, partition))
            log_end = end.offset if end is not None and end.error is None else -1
            state = starts[group_id].get((topic, partition))
            start = state.start_offset if state is not None else -1
            lag = count_lag(start, state.finished, log_end) if state is not None and log_end >= 0 else None
            rows.append({"topic": topic, "partition": partition, "start_offset": start, "log_end_offset": log_end,
                         "lag": lag})
            part_lines.append(f"{group_id}\t{topic}\t{partition}\t{start}\t{log_end}\t{'-' if lag is None else lag}")
        docs.append({"group": group_id, "state": d.state, "members": members, "partitions": rows})
    emit(args, {"groups": docs}, "\n".join([*lines, "", *part_lines]))
    return 0


def count_lag(start_offset: int, finished, log_end: int) -> int:
    """Records from the start offset to the end not yet acknowledged or archived (``finished``:
    [first, last] ranges), as the replicas count DescribeShareGroupOffsets' lag."""
    done = sum(min(r.last, log_end - 1) - max(r.first, start_offset) + 1
               for r in finished if r.last >= start_offset and r.first < log_end)
    return max(0, log_end - start_offset - done)
