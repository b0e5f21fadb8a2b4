"""`lowtide share-groups list|describe|reset|delete-offsets`: KIP-932 share groups
(kafka-share-groups.sh --list, --describe, --reset-offsets, --delete-offsets).

JSON output: list -> {"groups": [{"group", "state"}]}; describe -> {"groups": [{"group", "state",
"members": [{"member_id", "client_id", "assignment": [{"topic", "partition"}]}], "partitions":
[{"topic", "partition", "start_offset", "log_end_offset", "lag"}]}]} (every partition assigned to a
member or with durable share state; start_offset -1 when the group has no state for it yet,
log_end_offset the high watermark, -1 when unknown; lag the records from the start offset to the
end not yet acknowledged or archived, null when either is unknown). The members and assignments
come from the front door's share group coordinator (ShareGroupDescribe over gRPC), the start offsets
from its reader of ``__share_group_state`` (ShareGroupStartOffsets). A group the coordinator does not
know is an error (GROUP_ID_NOT_FOUND) and a non-zero exit.

reset --group G --topic T [--partition P ...] (--to-earliest | --to-latest | --to-offset N)
[--dry-run]: new start offsets of an empty share group (Kafka's AlterShareGroupOffsets; a group with
members is NON_EMPTY_GROUP and a non-zero exit) -> {"group", "dry_run", "partitions": [{"topic",
"partition", "start_offset"} | {"topic", "partition", "start_offset", "error"}]}; a partition that
failed makes the exit non-zero. Without --partition every partition of the topic is reset.

delete-offsets --group G --topic T [--topic T2 ...]: forget an empty share group's state of whole
topics (Kafka's DeleteShareGroupOffsets: a member that comes back starts those partitions by
``share.auto.offset.reset``; a group with members is NON_EMPTY_GROUP and a non-zero exit) ->
{"group", "topics": [{"topic"} | {"topic", "error"}]}; a topic that failed makes the exit non-zero.
"""

from __future__ import annotations

import argparse

from lowtide.cli.client_args import add_cluster_command, build_admin
from lowtide.cli.output import CliError, emit
from lowtide.client import OffsetSpec
from lowtide.client.admin import ShareStartOffset
from lowtide.errors import GroupIdNotFound, LowtideError
from lowtide.messages.consumer_groups import ConsumerGroupDescription

SHARE_PROTOCOL_TYPE = "share"


def register(subparsers: argparse._SubParsersAction) -> None:
    groups = subparsers.add_parser("share-groups", help="list and describe KIP-932 share groups")
    actions = groups.add_subparsers(dest="share_groups_action", required=True)
    add_cluster_command(actions, "list", help="list share groups and their states", func=run_list)
    describe = add_cluster_command(actions, "describe", func=run_describe,
                                   help="state, members, assignments and end offsets of share groups")
    describe.add_argument("--group", action="append", required=True, help="share group id (repeatable)")
    reset = add_cluster_command(actions, "reset", help="reset an empty share group's start offsets", func=run_reset)
    reset.add_argument("--group", required=True, help="share group id")
    reset.add_argument("--topic", required=True, help="topic whose share-partitions to reset")
    reset.add_argument("--partition", type=int, action="append", help="partition (repeatable; default: all)")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset")
    to.add_argument("--to-latest", action="store_true", help="the log end offset (skip what is there)")
    to.add_argument("--to-offset", type=int, help="this offset")
    reset.add_argument("--dry-run", action="store_true", help="show the new start offsets, write nothing")
    delete = add_cluster_command(actions, "delete-offsets", func=run_delete_offsets,
                                 help="forget an empty share group's state of whole topics")
    delete.add_argument("--group", required=True, help="share group id")
    delete.add_argument("--topic", action="append", required=True, help="topic (repeatable)")


def run_list(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        listings = [g for g in admin.list_group_listings() if g.protocol_type == SHARE_PROTOCOL_TYPE]
    rows = [{"group": g.group_id, "state": g.state} for g in sorted(listings, key=lambda g: g.group_id)]
    emit(args, {"groups": rows}, "\n".join(["GROUP\tSTATE", *(f"{r['group']}\t{r['state']}" for r in rows)]))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        described = {d.group_id: d for d in admin.describe_share_groups(args.group)}
        starts: dict[str, dict[tuple[str, int], ShareStartOffset]] = {}
        for group_id in args.group:
            try:
                found_starts = admin.share_group_start_offsets(group_id)
            except LowtideError as err:
                raise CliError.from_lowtide(err) from err
            starts[group_id] = {(s.topic, s.partition): s for s in found_starts}
            found = described.get(group_id)
            if found is None:
                raise CliError("GROUP_ID_NOT_FOUND", f"share group {group_id!r} was not described")
            if isinstance(found.error, GroupIdNotFound) and starts[group_id]:
                # Membership is in the front door's memory (a restarted one forgets it) but the
                # start offsets are durable: a group with state and no members is Empty.
                described[group_id] = ConsumerGroupDescription(group_id=group_id, state="Empty")
            elif found.error is not None:
                raise CliError(found.error.name, found.error.message)
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
            lag = state.lag(log_end) if state is not None and log_end >= 0 else None
            rows.append({"topic": topic, "partition": partition, "start_offset": start, "log_end_offset": log_end,
                         "lag": lag})
            part_lines.append(f"{group_id}\t{topic}\t{partition}\t{start}\t{log_end}\t{'-' if lag is None else lag}")
        docs.append({"group": group_id, "state": d.state, "members": members, "partitions": rows})
    emit(args, {"groups": docs}, "\n".join([*lines, "", *part_lines]))
    return 0


def run_reset(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        described = admin.describe_topics([args.topic]).get(args.topic)
        if described is None:
            raise CliError("UNKNOWN_TOPIC_OR_PARTITION", f"topic {args.topic!r} does not exist")
        if described.error is not None:
            raise CliError(described.error.name, described.error.message)
        partitions = sorted(set(args.partition or [p.partition for p in described.partitions]))
        if args.to_offset is not None:
            targets = {p: args.to_offset for p in partitions}
        else:
            spec = OffsetSpec.EARLIEST if args.to_earliest else OffsetSpec.LATEST
            found = admin.list_offsets({(args.topic, p): spec for p in partitions})
            targets = {}
            for p in partitions:
                answer = found.get((args.topic, p))
                if answer is None or answer.error is not None:
                    error = answer.error if answer is not None else None
                    raise CliError(error.name if error else "UNKNOWN_TOPIC_OR_PARTITION",
                                   error.message if error else f"{args.topic}-{p} has no offset")
                targets[p] = answer.offset
        results: list[dict] = [{"topic": args.topic, "partition": p, "start_offset": o} for p, o in targets.items()]
        if not args.dry_run:
            try:
                answers = admin.reset_share_group_offsets(args.group, {(args.topic, p): o for p, o in targets.items()})
            except LowtideError as err:
                raise CliError.from_lowtide(err) from err
            results = []
            for (topic, partition), failed in answers.items():
                row: dict = {"topic": topic, "partition": partition, "start_offset": targets[partition]}
                if failed is not None:
                    row["error"] = failed.name
                results.append(row)
    results.sort(key=lambda r: r["partition"])
    lines = ["GROUP\tTOPIC\tPARTITION\tNEW-START-OFFSET"] + [
        f"{args.group}\t{r['topic']}\t{r['partition']}\t{r['start_offset']}"
        + (f"\terror: {r['error']}" if "error" in r else "") for r in results]
    emit(args, {"group": args.group, "dry_run": bool(args.dry_run), "partitions": results}, "\n".join(lines))
    return 1 if any("error" in r for r in results) else 0


def run_delete_offsets(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        try:
            answers = admin.delete_share_group_offsets(args.group, list(dict.fromkeys(args.topic)))
        except LowtideError as err:
            raise CliError.from_lowtide(err) from err
    rows = [{"topic": topic} | ({"error": failed.name} if failed is not None else {})
            for topic, failed in answers.items()]
    lines = ["GROUP\tTOPIC\tSTATUS"] + [f"{args.group}\t{r['topic']}\t{r.get('error', 'deleted')}" for r in rows]
    emit(args, {"group": args.group, "topics": rows}, "\n".join(lines))
    return 1 if any("error" in r for r in rows) else 0
