"""`lowtide consume --share-group G`: read a topic as a member of a KIP-932 share group, as Kafka's
``kafka-console-share-consumer`` does (implicit acknowledgement).

The member joins the group through the front door and takes what the share-partitions hand it
(``client/share_consumer.py``): several `consume --share-group G` side by side split the records
between them, each printed by one of them. Every record a poll printed is accepted with the next
poll (or at the end); records fetched but not printed (past ``--max-records``, or after the reader
went away: ``| head``) are released, so another member gets them. ``--from-beginning``: a partition
the group never consumed starts at its log start offset instead of where the replicas' default
(``--group-share-auto-offset-reset``, Kafka's ``latest``) puts it.

Output as `lowtide consume`'s (cli/data_cmd.py); json lines carry ``delivery_count`` too. Stops
after ``--max-records`` or when nothing arrived for ``--timeout-ms``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator

from lowtide.cli.client_args import read_call_metadata
from lowtide.cli.data_cmd import record_to_json, write_columns, write_json_lines
from lowtide.cli.output import CliError
from lowtide.client.share_consumer import ShareConsumer
from lowtide.messages import TopicPartition
from lowtide.messages.share import RELEASE
from lowtide.record.columns import Columns
from lowtide.record.columns import head as head_columns
from lowtide.rpc.channels import validate_address


def check_share_args(args: argparse.Namespace) -> None:
    for flag, given in (("--partition", args.partition is not None), ("--offset", args.offset is not None),
                        ("--group", bool(args.group)), ("--isolation-level read_committed",
                                                        args.isolation_level == "read_committed")):
        if given:
            raise CliError("INVALID_REQUEST", f"{flag} cannot be used with --share-group: a share group's "
                                              "partitions and positions are the group's")


def run_share_consume(args: argparse.Namespace) -> int:
    check_share_args(args)
    json_mode = args.output == "json"
    consumed = 0
    with ShareConsumer(validate_address(args.bootstrap_server), group_id=args.share_group,
                       metadata=read_call_metadata(args), max_wait_ms=min(500, max(1, args.timeout_ms)),
                       client_id="lowtide-console-share-consumer", max_bytes=args.max_partition_fetch_bytes,
                       auto_offset_reset="earliest" if args.from_beginning else None) as consumer:
        consumer.subscribe([args.topic])
        idle_since = time.monotonic()
        while args.max_records is None or consumed < args.max_records:
            left = None if args.max_records is None else args.max_records - consumed
            got = _poll_and_print(consumer, left, json_mode=json_mode, print_key=args.print_key)
            if got is None:
                # The reader went away: what this poll fetched may not have been seen. Released.
                consumer.acknowledge_all(RELEASE)
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit
                return 0
            if got:
                idle_since = time.monotonic()
                consumed += got
            elif (time.monotonic() - idle_since) * 1000 >= args.timeout_ms:
                break
    if not json_mode:
        sys.stderr.write(f"Processed a total of {consumed} messages\n")
    return 0


def _release_beyond(consumer: ShareConsumer, tp: TopicPartition, columns: Columns, keep: int) -> None:
    """Records past the first ``keep`` of ``columns`` go back to the group (not printed)."""
    for offset in memoryview(columns.offsets).cast("q").tolist()[keep:]:
        consumer.acknowledge((tp[0], tp[1], offset), RELEASE)


def _columns_within(consumer: ShareConsumer, left: int | None) -> Iterator[Columns]:
    """One poll's partitions as columns, ``left`` rows in all at most (None: every row); the rows
    past that go back to the group, each partition's before its rows are handed on."""
    kept = 0
    for tp, columns in consumer.poll_columns():
        if left is not None and columns.count > left - kept:
            _release_beyond(consumer, tp, columns, left - kept)
            columns = head_columns(columns, left - kept)
        if columns.count:
            kept += columns.count
            yield columns


def _poll_and_print(consumer: ShareConsumer, left: int | None, *, json_mode: bool, print_key: bool) -> int | None:
    """One poll printed to stdout: how many records (None when the reader went away)."""
    out = sys.stdout
    try:
        if json_mode:
            records = consumer.poll()
            if left is not None:
                for r in records[left:]:
                    consumer.acknowledge(r, RELEASE)
                records = records[:left]
            return write_json_lines(out, [{**record_to_json(r), "delivery_count": r.delivery_count} for r in records])
        return write_columns(out, _columns_within(consumer, left), print_key=print_key)
    except BrokenPipeError:
        return None
