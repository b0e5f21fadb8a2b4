"""`lowtide retention run`: KIP-68 client-side consumed retention for one topic.

Per partition the report says where the log starts now (``log_start_offset``), the target
(``delete_before`` = the minimum committed offset over the groups, -1 = delete nothing), how many
offsets lie between the two (``records``: offsets, so a gap in the log counts too) and which groups
set that minimum (``min_groups``; for a target of -1, the groups with no committed offset). With
``--dry-run`` nothing is deleted and that is the answer; a real run then calls DeleteRecords and
adds the new ``low_watermark`` (or the partition's ``error``). A partition with nothing to delete
carries ``skipped`` with the reason.

JSON: ``{"topic", "groups", "dry_run", "partitions": [{"topic", "partition", "log_start_offset",
"delete_before", "records", "min_groups", "committed": {group: offset | null}} + "low_watermark" |
"error" | "skipped"]}``. The exit code is 1 when any partition failed.
"""

from __future__ import annotations

import argparse
from typing import Any

from lowtide.cli.client_args import add_cluster_command, build_admin
from lowtide.cli.output import emit, progress
from lowtide.client import Admin, OffsetSpec
from lowtide.client.admin import CommittedOffset, ListedOffset
from lowtide.client.retention import RetentionPlan, plan_consumed_retention, run_consumed_retention
from lowtide.messages import TopicPartition


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("retention", help="consumed retention (KIP-68, client-side option)")
    sub = p.add_subparsers(dest="retention_command", required=True)
    run_p = add_cluster_command(sub, "run", help="delete what every consumer group has consumed", func=run)
    run_p.add_argument("--topic", required=True)
    run_p.add_argument("--group", action="append", dest="groups",
                       help="a group that must have consumed the data (repeatable; default: every group "
                            "that has committed offsets for the topic)")
    run_p.add_argument("--dry-run", action="store_true",
                       help="delete nothing; per partition print the log start offset, the target offset, "
                            "how many records that would delete and which groups set the target")
    run_p.add_argument("--timeout-ms", type=int, default=30000)


class _OffsetRecorder:
    """The Admin as ``plan_consumed_retention`` sees it, keeping every group's committed offsets.

    The report names the groups that set each target from the very offsets the plan used: a second
    OffsetFetch could see newer commits and contradict the target it is meant to explain.
    """

    def __init__(self, admin: Admin) -> None:
        self._admin = admin
        self.committed: dict[str, dict[TopicPartition, CommittedOffset]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._admin, name)

    def fetch_offsets(self, group_id: str, partitions: Any = ()) -> dict[TopicPartition, CommittedOffset]:
        answer = self._admin.fetch_offsets(group_id, partitions)
        self.committed[group_id] = answer
        return answer


def _committed_offset(recorder: _OffsetRecorder, group: str, tp: TopicPartition) -> int | None:
    c = recorder.committed.get(group, {}).get(tp)
    return None if c is None or c.error is not None or c.offset < 0 else c.offset


def plan_rows(plan: RetentionPlan, recorder: _OffsetRecorder,
              earliest: dict[TopicPartition, ListedOffset]) -> list[dict[str, Any]]:
    """One row per partition: LSO, target, offsets between them, the groups that set the target."""
    rows = []
    for tp, target in sorted(plan.targets.items()):
        committed = {g: _committed_offset(recorder, g, tp) for g in plan.groups}
        if target < 0:
            setters = [g for g, o in committed.items() if o is None]
        else:
            setters = [g for g, o in committed.items() if o == target]
        lso = earliest.get(tp)
        row: dict[str, Any] = {"topic": tp[0], "partition": tp[1],
                               "log_start_offset": lso.offset if lso is not None and lso.error is None else None,
                               "delete_before": target, "records": 0, "min_groups": setters, "committed": committed}
        if target < 0:
            row["skipped"] = plan.reasons.get(tp, "no committed offset")
        elif lso is None or lso.error is not None:
            row["records"] = None
            row["error"] = lso.error.name if lso is not None and lso.error is not None else "UNKNOWN_SERVER_ERROR"
        elif target <= lso.offset:
            row["skipped"] = f"nothing new to delete: the log already starts at {lso.offset}"
        else:
            row["records"] = target - lso.offset
        rows.append(row)
    return rows


def _render_row(row: dict[str, Any], *, dry_run: bool) -> str:
    lso = "?" if row["log_start_offset"] is None else row["log_start_offset"]
    target = row["delete_before"]
    by = ", ".join(row["min_groups"]) or "-"
    head = (f"partition: {row['topic']}-{row['partition']}\tlog_start_offset: {lso}\t"
            f"target: {target} (set by {by})\t")
    if "error" in row:
        return head + f"error: {row['error']}"
    if "skipped" in row:
        return head + f"skipped: {row['skipped']}"
    span = f"{row['records']} records (offsets {lso}..{target - 1})"
    if dry_run:
        return head + f"would delete {span}"
    return head + f"deleted {span}; low_watermark: {row['low_watermark']}"


def run(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        # An unknown topic is an error (UNKNOWN_TOPIC_OR_PARTITION), not an empty plan that exits 0.
        partitions = admin.describe_cluster([args.topic]).topic(args.topic).partitions
        recorder = _OffsetRecorder(admin)
        plan = plan_consumed_retention(recorder, args.topic, groups=args.groups)  # type: ignore[arg-type]
        progress(args, f"groups considered: {', '.join(plan.groups) or '(none)'}")
        earliest = admin.list_offsets({(args.topic, p.partition): OffsetSpec.EARLIEST for p in partitions})
        results = {} if args.dry_run else run_consumed_retention(admin, plan, timeout_ms=args.timeout_ms)
    rows = plan_rows(plan, recorder, earliest)
    for row in rows:
        res = results.get((row["topic"], row["partition"]))
        if res is None:
            continue
        # The run's own answer wins over the plan's view of the LSO read a moment earlier.
        row.pop("skipped", None)
        row.pop("error", None)
        if res.error is not None:
            row["error"] = res.error.name
        else:
            row["low_watermark"] = res.low_watermark
    if not args.dry_run:
        for row in rows:
            if "low_watermark" not in row and "error" not in row and "skipped" not in row:
                # Planned, but DeleteRecords was not sent: the LSO reached the target meanwhile.
                row["skipped"] = "nothing new to delete: the log start offset reached the target"
    failed = any("error" in r for r in rows)
    header = ["Dry run: nothing was deleted."] if args.dry_run else []
    text = "\n".join(header + [_render_row(r, dry_run=args.dry_run) for r in rows])
    emit(args, {"topic": args.topic, "groups": plan.groups, "dry_run": args.dry_run, "partitions": rows}, text)
    return 1 if failed else 0
