"""`lowtide produce`, `lowtide consume` and `lowtide offsets`: moving records in and out.

    lowtide produce --bootstrap-server B --topic T --num-records N --record-size S   (generated records)
    lowtide produce --bootstrap-server B --topic T [--key-separator SEP] < lines     (one record per line)
        [--compression-type none|gzip|lz4|zstd] [--batch-size BYTES] [--acks all|1|0] [--partition P]
    lowtide consume --bootstrap-server B --topic T [--partition P --offset O | --group G] [--max-records N]
        [--max-partition-fetch-bytes BYTES]
    lowtide consume --bootstrap-server B --topic T --share-group G [--from-beginning] [--max-records N]
    lowtide offsets --bootstrap-server B --topic T --time earliest|latest|max-timestamp|MS

produce json: ``{"records", "bytes", "seconds", "records_per_second", "mb_per_second"}`` (bytes =
key + value payload). consume json: one line per record ``{"topic", "partition", "offset",
"timestamp", "key", "value"}`` with key/value base64 (null stays null); text prints one value per
line (``--print-key``: KEY<TAB>VALUE), escaped Python-style by ``escape_bytes`` so binary data never
reaches the terminal raw.
consume stops after --max-records or when nothing new arrived for --timeout-ms; with --group it
commits the positions it reached; with --share-group it reads as a member of that KIP-932 share
group, acknowledging what it printed (cli/share_consume.py; json lines add ``delivery_count``).
offsets json: ``{"partitions": [{"topic", "partition", "offset"}]}``.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import io
import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterable, Iterator, Sequence

from lowtide.cli.client_args import add_cluster_command, build_admin, read_call_metadata
from lowtide.cli.output import CliError, emit, progress
from lowtide.client import Consumer, OffsetSpec, Producer
from lowtide.client.consumer import ConsumerRecord, column_cells
from lowtide.client.producer import COMPRESSION_BY_NAME
from lowtide.errors import LowtideError, UnknownTopicOrPartition
from lowtide.record.columns import Columns, text_lines
from lowtide.rpc.channels import validate_address

MiB = 1 << 20
ACKS = {"all": -1, "-1": -1, "1": 1, "0": 0}
TIME_SPECS = {"earliest": OffsetSpec.EARLIEST, "latest": OffsetSpec.LATEST, "max-timestamp": OffsetSpec.MAX_TIMESTAMP}
# Records handed to the producer per call: bounds memory and sets the progress granularity.
CHUNK_BYTES = 32 * MiB
PROGRESS_EVERY_S = 2.0
# consume's per-partition fetch size: 8 MiB a fetch where Kafka's consumer takes 1 MiB. Each Fetch
# costs a replica about a millisecond of CPU besides its bytes, so a reader draining a topic is
# cheaper (and faster) with fewer, larger ones: 1.7x the MB/s into a pipe on a 2-core box.
CLI_PARTITION_FETCH_BYTES = 8 * MiB


def register(subparsers: argparse._SubParsersAction) -> None:
    produce = add_cluster_command(subparsers, "produce", func=run_produce,
                                  help="produce generated records or lines from stdin")
    produce.add_argument("--topic", required=True)
    produce.add_argument("--num-records", type=int, help="generate this many records (else read stdin)")
    produce.add_argument("--record-size", type=int, default=1024, help="bytes per generated record")
    produce.add_argument("--key-separator", help="stdin lines are KEY<SEP>VALUE (e.g. a tab)")
    produce.add_argument("--acks", choices=sorted(ACKS), default="all")
    produce.add_argument("--batch-size", type=int, default=MiB, metavar="BYTES",
                         help="bytes per record batch at most (also capped by the topic's max.message.bytes and "
                              "half its segment.bytes; a batch the broker refuses as too large is split)")
    produce.add_argument("--compression-type", "--compression-codec", "--compression", dest="compression_type",
                         choices=list(COMPRESSION_BY_NAME), default="none",
                         help="compression.type of the batches (Kafka's codecs; --compression-codec as Kafka's "
                              "console producer names it)")
    produce.add_argument("--partition", type=int, help="send every record to this partition")
    produce.add_argument("--max-in-flight", type=int, default=8, help="concurrent Produce requests")
    produce.add_argument("--transactional-id", metavar="ID",
                         help="wrap the whole run in one transaction of this transactional id: committed at the "
                              "end, aborted on an error or Ctrl-C (needs --acks all)")
    produce.add_argument("--abort", action="store_true",
                         help="with --transactional-id: abort the transaction at the end instead of committing")

    consume = add_cluster_command(
        subparsers, "consume", func=run_consume, help="consume records (json: one line per record)",
        description="Text output prints one record value per line. Bytes that are not printable UTF-8 are "
                    "escaped Python-style: \\xNN for a byte that is not UTF-8 or an ASCII control "
                    "character, \\n \\r \\t, \\uNNNN for other unprintable characters, and a backslash is "
                    "doubled, so every line is the record and nothing is sent raw to the terminal. A null "
                    "key or value prints as null. --output json gives the exact bytes (base64).")
    consume.add_argument("--topic", required=True)
    consume.add_argument("--partition", type=int, help="read only this partition")
    consume.add_argument("--offset", help="start offset: a number, earliest or latest (needs --partition)")
    consume.add_argument("--group", help="consumer group: start from its committed offsets and commit")
    consume.add_argument("--share-group", metavar="G",
                         help="read as a member of this share group (KIP-932, as kafka-console-share-consumer): "
                              "records are split between its members; what is printed is acknowledged "
                              "(accepted), what is not is released")
    consume.add_argument("--from-beginning", action="store_true",
                         help="with --share-group: a partition the group never consumed starts at the log start "
                              "offset (else where the replicas' share.auto.offset.reset default says)")
    consume.add_argument("--max-records", type=int, help="stop after this many records")
    consume.add_argument("--timeout-ms", type=int, default=2000, help="stop when nothing new arrives for this long")
    consume.add_argument("--max-partition-fetch-bytes", type=_positive_int, default=CLI_PARTITION_FETCH_BYTES,
                         metavar="BYTES", help="bytes one Fetch may bring per partition (Kafka's "
                         "max.partition.fetch.bytes; default 8 MiB: a bulk reader is cheaper with fewer, "
                         "larger fetches)")
    consume.add_argument("--print-key", action="store_true", help="text output: print KEY<TAB>VALUE")
    consume.add_argument("--isolation-level", choices=["read_uncommitted", "read_committed"],
                         default="read_uncommitted",
                         help="read_committed: only records of committed transactions (and non-transactional "
                              "ones), up to the last stable offset")

    offsets = add_cluster_command(subparsers, "offsets", help="list offsets of a topic's partitions", func=run_offsets)
    offsets.add_argument("--topic", required=True)
    offsets.add_argument("--time", default="latest", help="earliest | latest | max-timestamp | epoch ms")
    offsets.add_argument("--partition", type=int, action="append", help="partition (repeatable; default all)")


# --- produce --------------------------------------------------------------------------------------


def generate_chunks(*, num_records: int, record_size: int) -> Iterator[tuple[list[bytes | None], None]]:
    """Generated values (random bytes, one payload shared by all, like kafka-producer-perf-test)."""
    payload = os.urandom(record_size)
    per_chunk = max(1, CHUNK_BYTES // max(1, record_size))
    left = num_records
    while left > 0:
        n = min(per_chunk, left)
        yield [payload] * n, None
        left -= n


def read_line_chunks(stream, *, key_separator: str | None) -> Iterator[tuple[list[bytes | None], list | None]]:
    """Records from text lines; with ``key_separator`` each line is KEY<SEP>VALUE (no SEP = null key)."""
    sep = key_separator.encode() if key_separator is not None else None
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    size = 0
    for raw in stream:
        line = raw.rstrip(b"\r\n") if isinstance(raw, bytes) else raw.rstrip("\r\n").encode()
        if sep is not None:
            key, found, value = line.partition(sep)
            keys.append(key if found else None)
            values.append(value if found else line)
        else:
            values.append(line)
        size += len(line)
        if size >= CHUNK_BYTES:
            yield values, (keys if sep is not None else None)
            values, keys, size = [], [], 0
    if values:
        yield values, (keys if sep is not None else None)


def run_produce(args: argparse.Namespace) -> int:
    if args.num_records is not None and (args.num_records < 0 or args.record_size < 0):
        raise CliError("INVALID_REQUEST", "--num-records and --record-size must be >= 0")
    if args.batch_size < 1024:
        raise CliError("INVALID_REQUEST", f"--batch-size must be >= 1024 bytes, got {args.batch_size}")
    if args.abort and not args.transactional_id:
        raise CliError("INVALID_REQUEST", "--abort needs --transactional-id")
    if args.num_records is not None:
        chunks = generate_chunks(num_records=args.num_records, record_size=args.record_size)
    else:
        chunks = read_line_chunks(sys.stdin.buffer, key_separator=args.key_separator)
    records = payload_bytes = 0
    started = last_progress = time.monotonic()
    with Producer(validate_address(args.bootstrap_server), acks=ACKS[args.acks], compression_type=args.compression_type,
                  batch_bytes=args.batch_size, max_in_flight=args.max_in_flight,
                  metadata=read_call_metadata(args), transactional_id=args.transactional_id) as producer:
        # Ask for the topic before reading any input: an unknown topic or partition must fail even
        # when there is nothing to send (--num-records 0, empty stdin), not report "0 records sent".
        producer.cluster.add_topics([args.topic])
        meta = producer.cluster.refresh().topic(args.topic)
        if args.partition is not None and not 0 <= args.partition < len(meta.partitions):
            raise UnknownTopicOrPartition(f"partition {args.topic}-{args.partition} does not exist")
        if args.transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
        try:
            for values, keys in chunks:
                report = producer.produce_values(args.topic, values, keys=keys, partition=args.partition)
                records += report.records
                payload_bytes += report.bytes
                now = time.monotonic()
                if now - last_progress >= PROGRESS_EVERY_S:
                    last_progress = now
                    progress(args, f"{records} records sent, {records / (now - started):.0f} records/s")
            if args.transactional_id:
                producer.abort_transaction() if args.abort else producer.commit_transaction()
        except BaseException:  # an error or Ctrl-C: nothing of the run may become visible
            if args.transactional_id and producer.transactions.state == "in_transaction":
                try:
                    producer.abort_transaction()
                except LowtideError as err:
                    progress(args, f"abort of the transaction failed: {err.name}: {err.message}")
            raise
    seconds = max(time.monotonic() - started, 1e-9)
    doc = {"records": records, "bytes": payload_bytes, "seconds": round(seconds, 6),
           "records_per_second": round(records / seconds, 1), "mb_per_second": round(payload_bytes / MiB / seconds, 3)}
    if args.transactional_id:
        doc["transactional_id"] = args.transactional_id
        doc["transaction"] = "aborted" if args.abort else "committed"
    emit(args, doc, f"{records} records sent, {doc['records_per_second']} records/sec "
                    f"({doc['mb_per_second']} MB/sec) in {doc['seconds']} s")
    return 0


# --- consume --------------------------------------------------------------------------------------


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


# Everything but printable ASCII, and the backslash itself (so an escape in the output is never
# ambiguous with the same characters in the data). Non-ASCII printable characters are kept below.
_NEEDS_ESCAPE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")
_SHORT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: re.Match[str]) -> str:
    c = match.group()
    code = ord(c)
    if c in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[c]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape): show the byte
        return f"\\x{code - 0xDC00:02x}"
    if c.isprintable():
        return c
    if code < 0x80:  # C0 controls and DEL: the character is the byte
        return f"\\x{code:02x}"
    # \u even below U+0100, so \xNN always means exactly one byte of the record (U+0085 is c2 85).
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


# _escape_char's answers for every ASCII character and every byte that is not UTF-8, as one table
# for str.translate (in C): binary values are mostly those, and one Python call per character made
# a text consume of random 1 KiB values spend most of its CPU here. What the table leaves is beyond
# ASCII (and valid UTF-8): _escape_char decides it, escaped unless printable.
_ESCAPE_TABLE = {code: _escape_char(_NEEDS_ESCAPE.match(chr(code)))
                 for code in (*range(0x80), *range(0xDC80, 0xDD00)) if _NEEDS_ESCAPE.match(chr(code))}
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def escape_bytes(data: bytes | None) -> str:
    """Key or value for a terminal: printable UTF-8 as is, the rest escaped as Python would in a
    string literal (``\\xNN``, ``\\n``, ``\\uNNNN``, ``\\\\``); None is ``null``, as Kafka's console
    consumer prints it."""
    if data is None:
        return "null"
    text = data.decode("utf-8", errors="surrogateescape").translate(_ESCAPE_TABLE)
    return text if text.isascii() else _NON_ASCII.sub(_escape_char, text)


def columns_to_text(columns: Columns, *, print_key: bool) -> bytes | str:
    """Every row as a line, ``escape_bytes(value)`` (``print_key``: ``KEY<TAB>VALUE``), as one
    buffer. Text data (no null, nothing to escape) is cut straight from the column buffers: bytes,
    the same characters, without a Python call per record (a text consume of 1 KiB values spent
    most of its CPU in those). Otherwise each cell goes through ``escape_bytes``: str, for the text
    stream to encode."""
    n = columns.count
    lines = text_lines(values=columns.values, keys=columns.keys if print_key else None, count=n)
    if lines is not None:
        return lines
    texts = map(escape_bytes, column_cells(columns.values, n))
    if print_key:
        texts = map("{}\t{}".format, map(escape_bytes, column_cells(columns.keys, n)), texts)
    return "\n".join(texts) + "\n"


def write_text(out, text: bytes | str) -> None:
    """Write what ``columns_to_text`` made: bytes straight to the stream's buffer when it has one."""
    if isinstance(text, bytes):
        if (raw := getattr(out, "buffer", None)) is None:
            out.write(text.decode("ascii"))  # a stream without bytes beneath: text is ASCII here
        else:
            out.flush()
            raw.write(text)
    else:
        out.write(text)


def write_columns(out, batches: Iterable[Columns], *, print_key: bool) -> int:
    """Each batch's rows as text (``columns_to_text``), one write per batch, then a flush: how many
    rows. Raises BrokenPipeError when the reader went away."""
    got = 0
    for columns in batches:
        write_text(out, columns_to_text(columns, print_key=print_key))
        got += columns.count
    out.flush()
    return got


def write_json_lines(out, docs: Sequence[dict]) -> int:
    """One compact JSON document a line, then a flush: how many. Raises BrokenPipeError when the
    reader went away."""
    for doc in docs:
        out.write(json.dumps(doc, separators=(",", ":")) + "\n")
    out.flush()
    return len(docs)


def record_to_json(r: ConsumerRecord) -> dict:
    return {"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
            "key": _b64(r.key), "value": _b64(r.value)}


def parse_start_offset(text: str) -> int | str:
    if text in ("earliest", "latest"):
        return text
    try:
        offset = int(text)
    except ValueError:
        raise CliError("INVALID_REQUEST", f"--offset must be a number, earliest or latest, got {text!r}") from None
    if offset < 0:
        raise CliError("INVALID_REQUEST", f"--offset must be >= 0, got {offset}")
    return offset


def _poll_and_print(consumer: Consumer, left: int | None, *, json_mode: bool, print_key: bool) -> int | None:
    """One poll, its records written to stdout: how many (None when the reader went away). Text
    goes by columns (``columns_to_text``), one write per partition's rows."""
    out = sys.stdout
    try:
        if json_mode:
            return write_json_lines(out, [record_to_json(r) for r in consumer.poll(max_records=left)])
        batches = (columns for _tp, columns in consumer.poll_columns(max_records=left))
        return write_columns(out, batches, print_key=print_key)
    except BrokenPipeError:
        return None


# Linux's pipes hold 64 KiB: a consume writing ~1 MiB a poll into one would wait for the reader 16
# times a poll. 1 MiB is the most an unprivileged process may ask for (/proc/sys/fs/pipe-max-size).
_PIPE_BYTES = 1 << 20


def _widen_stdout_pipe() -> None:
    """Grow stdout's pipe to ``_PIPE_BYTES`` when it is one; nothing otherwise, or when refused."""
    try:
        fd = sys.stdout.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode) and hasattr(fcntl, "F_SETPIPE_SZ"):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def run_consume(args: argparse.Namespace) -> int:
    if args.share_group:
        from lowtide.cli.share_consume import run_share_consume  # it uses this module's printers
        return run_share_consume(args)
    if args.from_beginning:
        raise CliError("INVALID_REQUEST", "--from-beginning is for --share-group; use --offset earliest")
    if args.offset is not None and args.partition is None:
        raise CliError("INVALID_REQUEST", "--offset needs --partition")
    if args.offset is not None and args.group:
        raise CliError("INVALID_REQUEST", "use either --offset or --group, not both")
    start = parse_start_offset(args.offset) if args.offset is not None else None
    json_mode = args.output == "json"
    consumed = 0
    _widen_stdout_pipe()
    with Consumer(validate_address(args.bootstrap_server), group_id=args.group,
                  partition_max_bytes=args.max_partition_fetch_bytes,
                  metadata=read_call_metadata(args), max_wait_ms=min(500, max(1, args.timeout_ms)),
                  isolation_level=args.isolation_level) as consumer:
        if args.partition is not None:
            consumer.assign([(args.topic, args.partition)])
            consumer.cluster.refresh().leader_address(args.topic, args.partition)  # unknown partition fails here
        else:
            consumer.subscribe(args.topic)
        tp = (args.topic, args.partition)
        if start == "earliest":
            consumer.seek_to(OffsetSpec.EARLIEST, [tp])
        elif start == "latest":
            consumer.seek_to(OffsetSpec.LATEST, [tp])
        elif start is not None:
            consumer.seek(tp, start)
        idle_since = time.monotonic()
        while args.max_records is None or consumed < args.max_records:
            left = None if args.max_records is None else args.max_records - consumed
            got = _poll_and_print(consumer, left, json_mode=json_mode, print_key=args.print_key)
            if got is None:
                # The reader went away (`| head`): stop quietly, and commit nothing it may not have seen.
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit
                return 0
            if got:
                idle_since = time.monotonic()
                consumed += got
                if args.group:
                    consumer.commit()
            elif (time.monotonic() - idle_since) * 1000 >= args.timeout_ms:
                break
        if args.group:
            consumer.commit()
    if not json_mode:
        sys.stderr.write(f"Processed a total of {consumed} messages\n")
    return 0


# --- offsets --------------------------------------------------------------------------------------


def parse_time_spec(text: str) -> int:
    if text in TIME_SPECS:
        return TIME_SPECS[text]
    try:
        value = int(text)
    except ValueError:
        raise CliError("INVALID_REQUEST",
                       f"--time must be earliest, latest, max-timestamp or epoch milliseconds, got {text!r}") from None
    if value < 0:
        raise CliError("INVALID_REQUEST", f"--time in milliseconds must be >= 0, got {value}")
    return value


def run_offsets(args: argparse.Namespace) -> int:
    spec = parse_time_spec(args.time)
    with build_admin(args) as admin:
        meta = admin.describe_cluster([args.topic]).topic(args.topic)
        partitions = args.partition or [p.partition for p in meta.partitions]
        answers = admin.list_offsets({(args.topic, p): spec for p in partitions})
    rows, failed = [], 0
    for p in partitions:
        answer = answers.get((args.topic, p))
        if answer is None or answer.error is not None:
            failed += 1
            rows.append({"topic": args.topic, "partition": p,
                         "error": answer.error.name if answer is not None else "UNKNOWN_SERVER_ERROR"})
        else:
            rows.append({"topic": args.topic, "partition": p, "offset": answer.offset})
    emit(args, {"partitions": rows},
         "\n".join(f"{r['topic']}:{r['partition']}:{r.get('offset', r.get('error'))}" for r in rows))
    return 1 if failed else 0


