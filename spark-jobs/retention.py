"""Spark retention caller (KIP-68, client side): DeleteRecords up to the minimum committed offset
over the consumer groups of a topic, and print a table per partition.

    python spark-jobs/retention.py --bootstrap-server B --topic T [--group G ...]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="retention.py", description=__doc__.splitlines()[0])
    _common.add_connection_flags(parser)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", action="append", dest="groups",
                        help="a group that must have consumed the records (repeat; default: every group "
                             "that committed offsets for the topic)")
    parser.add_argument("--timeout-ms", type=int, default=30_000)
    args = parser.parse_args(argv)

    from lowtide.spark import build_session
    from lowtide.spark.jobs import render_retention, run_retention

    # The plan is a few offsets per partition: it runs on the driver; the session makes this a Spark
    # application (spark-submit, Kubernetes CronJob) like the other jobs.
    spark = build_session("lowtide-retention", master=args.master)
    try:
        report = run_retention(_common.connection(args), topic=args.topic, groups=args.groups,
                               timeout_ms=args.timeout_ms, progress=_common.progress(args))
    finally:
        spark.stop()
    _common.emit(args, report, render_retention(report))
    return 1 if any(r["error"] for r in report["partitions"]) else 0


if __name__ == "__main__":
    sys.exit(main())
