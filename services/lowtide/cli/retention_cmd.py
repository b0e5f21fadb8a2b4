"""`lowtide retention run`: KIP-68 client-side consumed retention for one topic."""

from __future__ import annotations

import argparse

from lowtide.cli.client_args import add_connection_flags, build_admin
from lowtide.cli.output import emit, progress
from lowtide.client.retention import plan_consumed_retention, run_consumed_retention


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("retention", help="consumed retention (KIP-68, client-side option)")
    sub = p.add_subparsers(dest="retention_command", required=True)
    run_p = sub.add_parser("run", help="delete what every consumer group has consumed")
    add_connection_flags(run_p)
    run_p.add_argument("--topic", required=True)
    run_p.add_argument("--group", action="append", dest="groups",
                       help="a group that must have consumed the data (repeatable; default: every group "
                            "that has committed offsets for the topic)")
    run_p.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    run_p.add_argument("--timeout-ms", type=int, default=30000)
    run_p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        plan = plan_consumed_retention(admin, args.topic, groups=args.groups)
        progress(args, f"groups considered: {', '.join(plan.groups) or '(none)'}")
        results = {} if args.dry_run else run_consumed_retention(admin, plan, timeout_ms=args.timeout_ms)
    rows, failed = [], False
    for (topic, partition), target in sorted(plan.targets.items()):
        row = {"topic": topic, "partition": partition, "delete_before": target}
        res = results.get((topic, partition))
        if res is not None and res.error is not None:
            row["error"], failed = res.error.name, True
        elif res is not None:
            row["low_watermark"] = res.low_watermark
        elif target < 0:
            row["skipped"] = plan.reasons.get((topic, partition), "no committed offset")
        rows.append(row)
    text = "\n".join(
        f"partition: {r['topic']}-{r['partition']}\t" + (
            f"low_watermark: {r['low_watermark']}" if "low_watermark" in r else
            f"error: {r['error']}" if "error" in r else
            f"skipped: {r.get('skipped', 'nothing new to delete')}" + (
                f" (would delete before {r['delete_before']})" if args.dry_run and r["delete_before"] > 0 else ""))
        for r in rows)
    emit(args, {"topic": args.topic, "groups": plan.groups, "partitions": rows}, text)
    return 1 if failed else 0
