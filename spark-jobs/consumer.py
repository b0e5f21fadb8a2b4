"""Spark consumer job: read a topic as a consumer group, transform, write a result topic or Parquet files.

Streaming with Trigger.AvailableNow from the group's committed offsets; every finished micro-batch
is committed to the group (lowtide.group.id), so KIP-68 retention sees how far this job got.

    python spark-jobs/consumer.py --bootstrap-server B --topic T --group G --output-topic T2 \\
        --checkpoint-dir /tmp/ckpt-G
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="consumer.py", description=__doc__.splitlines()[0])
    _common.add_connection_flags(parser)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True, help="consumer group whose offsets are committed")
    parser.add_argument("--checkpoint-dir", required=True, help="Spark checkpoint of the streaming query")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--output-topic", help="write the transformed records to this lowtide topic")
    out.add_argument("--output-path", help="write the transformed records as Parquet files here")
    parser.add_argument("--max-offsets-per-trigger", type=int, help="records per micro-batch")
    parser.add_argument("--max-batches", type=int, help="stop after this many micro-batches (a slow consumer)")
    args = parser.parse_args(argv)

    from lowtide.spark import build_session
    from lowtide.spark.jobs import run_consumer

    spark = build_session(f"lowtide-consumer-{args.group}", master=args.master)
    try:
        report = run_consumer(spark, _common.connection(args), topic=args.topic, group=args.group,
                              checkpoint_dir=args.checkpoint_dir, output_topic=args.output_topic,
                              output_path=args.output_path, max_offsets_per_trigger=args.max_offsets_per_trigger,
                              max_batches=args.max_batches, progress=_common.progress(args))
    finally:
        spark.stop()
    committed = ", ".join(f"{p}:{o}" for p, o in report["committed"].items())
    _common.emit(args, report, f"group '{report['group']}' consumed {report['records']:,} records of "
                               f"'{report['topic']}' in {report['micro_batches']} micro-batches; committed {committed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
