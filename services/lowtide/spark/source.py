"""The PySpark Python Data Source ``"lowtide"``: batch and streaming reads and writes.

Use it as Spark's Kafka source and sink are used (option names: ``lowtide.spark.options``)::

    from lowtide.spark import register
    register(spark)
    df = (spark.read.format("lowtide").option("bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "orders").load())
    (df.selectExpr("key", "upper(cast(value as string)) as value")
       .write.format("lowtide").option("bootstrap.servers", B).option("topic", "out").save())

Reads: the driver plans one range per topic partition (more with ``minPartitions``); each task
fetches its range from the partition leader as whole record batches and hands Spark Arrow batches
built column-wise in C (``spark/arrow.py``). Streaming reads keep their progress in Spark's
checkpoint (offsets ``{"topic": {"partition": offset}}``), honour ``maxOffsetsPerTrigger`` and
``Trigger.AvailableNow``, and with ``lowtide.group.id`` commit every finished micro-batch's end
offsets to that consumer group so KIP-68 consumed retention counts the query.

Share group reads (``lowtide.share.group``, KIP-932: ``spark/share.py``): the topic is a queue;
several jobs reading with one group split its records, each task acknowledging what it read once
Spark drained its iterator. At least once; no offsets in the checkpoint (the group keeps the
progress); a micro-batch takes what the group has not finished, bounded by
``lowtide.share.max.records`` / ``maxOffsetsPerTrigger``.

Writes: acks=all, at-least-once (a retried task may append its rows again, as with Kafka's sink);
any error fails the task. ``value`` is required; ``key``, ``partition``, ``headers`` and ``topic``
(unless the ``topic`` option names it) are optional columns.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from lowtide.client.admin import OffsetSpec
from lowtide.client.producer import COMPRESSION_BY_NAME, Producer
from lowtide.clock import now_ms
from lowtide.errors import InvalidConfig, InvalidRecord, MessageTooLarge, RecordListTooLarge
from lowtide.spark import planning as plan
from lowtide.spark.arrow import encode_rows, route
from lowtide.spark.options import ReadOptions, WriteOptions, parse_read_options, parse_write_options
from lowtide.spark.reading import RangeReader, ReadSettings
from lowtide.spark.share import ShareBatchReader, ShareStreamReader

log = logging.getLogger("lowtide.spark")

SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
              "timestampType int")
HEADERS_DDL = ", headers array<struct<key: string, value: binary>>"


class RangePartition(InputPartition):
    """One Spark partition: a range of offsets of one topic partition."""

    def __init__(self, rng: plan.OffsetRange) -> None:
        super().__init__((rng.topic, rng.partition, rng.start, rng.end))

    @property
    def range(self) -> plan.OffsetRange:
        return plan.OffsetRange(*self.value)


def _read(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    settings = ReadSettings(include_headers=options.include_headers, fail_on_data_loss=options.fail_on_data_loss,
                            fetch_max_bytes=options.fetch_max_bytes, timeout_ms=options.read_timeout_ms)
    with RangeReader(options.connection, settings) as reader:
        yield from reader.read(partition.range)


class LowtideDataSource(DataSource):
    """Format ``"lowtide"``: Spark's Kafka source/sink, over lowtide's gRPC."""

    @classmethod
    def name(cls) -> str:
        return "lowtide"

    def schema(self) -> str:
        include = str(self.options.get("includeHeaders", self.options.get("includeheaders", "false"))).lower()
        return SCHEMA_DDL + (HEADERS_DDL if include == "true" else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        return ShareBatchReader(options) if options.share else BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_read_options(self.options, streaming=True)
        return ShareStreamReader(options) if options.share else StreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return BatchWriter(_check_write_schema(schema, overwrite, parse_write_options(self.options)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return StreamWriter(_check_write_schema(schema, overwrite, parse_write_options(self.options)))


# ---- batch read ---------------------------------------------------------------------------------

class BatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        with plan.open_admin(options.connection) as admin:
            tps = plan.resolve_partitions(admin, options.subscription)
            starts = plan.resolve_offsets(admin, tps, options.starting)
            ends = plan.resolve_offsets(admin, tps, options.ending)
            starts = plan.check_data_loss(admin, {tp: o for tp, o in starts.items() if o < ends[tp]},
                                          fail=options.fail_on_data_loss)
        self.ranges = plan.plan_ranges(starts, ends, min_partitions=options.min_partitions)

    def partitions(self) -> Sequence[InputPartition]:
        return [RangePartition(r) for r in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


# ---- streaming read -----------------------------------------------------------------------------

class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the subscription; offsets are Spark's checkpoint (module doc)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._available_now: plan.OffsetMap | None = None
        self._committed: dict | None = None

    def _latest(self) -> plan.OffsetMap:
        with plan.open_admin(self.options.connection) as admin:
            tps = plan.resolve_partitions(admin, self.options.subscription)
            return plan.list_offsets(admin, tps, OffsetSpec.LATEST)

    def initialOffset(self) -> dict:
        with plan.open_admin(self.options.connection) as admin:
            tps = plan.resolve_partitions(admin, self.options.subscription)
            return plan.to_json_offsets(plan.resolve_offsets(admin, tps, self.options.starting))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        starts = plan.from_json_offsets(start)
        # Spark asks for the next batch's end only once the batch ending at `start` is done, so
        # `start` is safe to commit here too (commit() alone would leave the last batch of an
        # AvailableNow run uncommitted: Spark calls it when it plans the *next* batch).
        self.commit(start)
        latest = self._available_now if self._available_now is not None else self._latest()
        new = [tp for tp in latest if tp not in starts]
        if new:  # a topic or partition that appeared since the query started is read from its start
            with plan.open_admin(self.options.connection) as admin:
                starts.update(plan.list_offsets(admin, new, OffsetSpec.EARLIEST))
        latest = {tp: self._capped(tp, o) for tp, o in latest.items()}
        latest = {tp: max(o, starts[tp]) for tp, o in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = plan.limit_offsets(starts, latest, limit.max_rows)
        return plan.to_json_offsets({**starts, **latest})

    def _capped(self, tp: plan.TopicPartition, latest: int) -> int:
        # endingOffsets: a partition given an offset is read no further (AvailableNow then ends there).
        end = self.options.ending.for_partition(*tp)
        return min(latest, end) if end >= 0 else latest

    def reportLatestOffset(self) -> dict | None:
        return plan.to_json_offsets(self._latest())

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        starts, ends = plan.from_json_offsets(start), plan.from_json_offsets(end)
        starts = {tp: starts.get(tp, 0) for tp in ends}
        return [RangePartition(r) for r in plan.plan_ranges(starts, ends, min_partitions=self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict) -> None:
        if not self.options.group_id or end == self._committed:
            return
        with plan.open_admin(self.options.connection) as admin:
            plan.commit_group(admin, self.options.group_id, plan.from_json_offsets(end))
        self._committed = end


# ---- writes -------------------------------------------------------------------------------------

@dataclass
class WriteReport(WriterCommitMessage):
    records: int
    batches: int


def _check_write_schema(schema: StructType, overwrite: bool, options: WriteOptions) -> WriteOptions:
    if overwrite:
        raise InvalidConfig("lowtide topics are append-only: use mode('append') (overwrite is not supported)")
    names = {f.name for f in schema.fields}
    if "value" not in names:
        raise InvalidRecord(f"the DataFrame to write needs a value column (it has {', '.join(sorted(names))})")
    if options.topic is None and "topic" not in names:
        raise InvalidConfig("name the topic: the option topic, or a topic column")
    return options


# Encoded batches a task buffers before producing them in one pipelined call: the producer keeps
# up to 8 requests in flight inside a call, but waits for every acknowledgement at its end.
_FLUSH_BYTES = 16 << 20


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteReport:
    """Produce every row (acks=all) and return once all are acknowledged; errors propagate."""
    compression = COMPRESSION_BY_NAME[options.compression]
    rng = random.Random()
    report = WriteReport(records=0, batches=0)
    pending: dict[str, dict[int, list[bytes]]] = {}
    pending_bytes = 0
    with Producer(options.connection.bootstrap, acks=-1, batch_bytes=options.batch_bytes,
                  metadata=options.connection.call_metadata(), tls=options.connection.tls) as producer:

        def flush() -> None:
            for topic, encoded in pending.items():
                try:
                    producer.produce_encoded(topic, encoded)
                except (MessageTooLarge, RecordListTooLarge) as err:
                    raise type(err)(f"{err.message}; set the write option lowtide.batch.bytes below it") from err
            pending.clear()

        for batch in batches:
            if batch.num_rows == 0:
                continue
            for topic, rows in _split_by_topic(batch, options.topic):
                producer.cluster.add_topics([topic])
                meta = producer.cluster.snapshot().topic(topic)
                partitions = len(meta.partitions)
                batch_bytes = _batch_bytes_for(meta.config, options.batch_bytes)
                routed = route(rows, partitions=partitions, rng=rng)
                targets = pc.unique(routed).to_pylist()
                encoded = pending.setdefault(topic, {})
                timestamp = now_ms()
                for p in targets:
                    # One target (no key, no partition column: the sticky case) needs no filtering copy.
                    part_rows = rows.filter(pc.equal(routed, p)) if len(targets) > 1 else rows
                    made = list(encode_rows(part_rows, batch_bytes=batch_bytes, timestamp_ms=timestamp,
                                            compression=compression))
                    encoded.setdefault(p, []).extend(made)
                    pending_bytes += sum(len(b) for b in made)
                    report.batches += len(made)
                report.records += rows.num_rows
            if pending_bytes >= _FLUSH_BYTES:
                flush()
                pending_bytes = 0
        flush()
    return report


def _batch_bytes_for(config: dict[str, str], wanted: int) -> int:
    """``wanted``, capped by the topic's own segment.bytes / max.message.bytes when it sets them (a
    batch must fit both; broker-wide defaults are not visible to a client, hence the option)."""
    limits = [wanted]
    for key in ("segment.bytes", "max.message.bytes"):
        try:
            limits.append(int(config[key]) - 12 if key == "max.message.bytes" else int(config[key]) // 2)
        except (KeyError, ValueError):
            pass
    return max(1024, min(limits))


def _split_by_topic(batch: pa.RecordBatch, topic: str | None) -> Iterator[tuple[str, pa.RecordBatch]]:
    if topic is not None:
        yield topic, batch
        return
    column = batch.column("topic")
    if column.null_count:
        raise InvalidRecord("a row has a null topic and no topic option is set")
    for name in pc.unique(column).to_pylist():
        yield name, batch.filter(pc.equal(column, name))


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.records for m in messages if isinstance(m, WriteReport))
        log.info("lowtide write committed: %d records", total)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Acknowledged rows stay (at-least-once, as Kafka's sink): nothing to undo.
        log.warning("lowtide write aborted; rows acknowledged before the failure remain in the topic")


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 (Spark's name)
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("lowtide stream write of micro-batch %d aborted; acknowledged rows remain", batchId)
