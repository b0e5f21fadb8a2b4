"""Spark producer job: write generated records into a lowtide topic through format "lowtide".

    python spark-jobs/producer.py --bootstrap-server 127.0.0.1:PORT --topic T --records 100000
    spark-submit spark-jobs/producer.py --bootstrap-server ... --topic T
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="producer.py", description=__doc__.splitlines()[0])
    _common.add_connection_flags(parser)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--record-size", type=int, default=1024, help="value bytes per record")
    parser.add_argument("--tasks", type=int, help="Spark tasks writing in parallel (default: cores)")
    parser.add_argument("--batch-bytes", type=int, help="most bytes per record batch (default 512 KiB; must fit "
                                                         "the topic's segment.bytes and max.message.bytes)")
    args = parser.parse_args(argv)

    from lowtide.spark import build_session
    from lowtide.spark.jobs import run_producer

    spark = build_session("lowtide-producer", master=args.master)
    try:
        report = run_producer(spark, _common.connection(args), topic=args.topic, records=args.records,
                              record_size=args.record_size, partitions=args.tasks,
                              batch_bytes=args.batch_bytes, progress=_common.progress(args))
    finally:
        spark.stop()
    _common.emit(args, report, f"produced {report['records']:,} records ({report['bytes']:,} B) into "
                               f"'{report['topic']}' in {report['seconds']} s ({report['mb_per_s']} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
