"""Share group reads of the ``"lowtide"`` data source (option ``lowtide.share.group``): a topic read
as a queue (KIP-932), several Spark jobs taking work from it, each record to one of them.

    df = (spark.read.format("lowtide").option("bootstrap.servers", B).option("subscribe", "jobs")
          .option("lowtide.share.group", "etl").load())

**Plan (driver).** One Spark task per topic partition with records the group has not finished
(more with ``minPartitions``: several tasks then share a partition, each acquiring its own
records), each bounded by the partition's high watermark at planning time and, with
``lowtide.share.max.records`` (streaming: or ``maxOffsetsPerTrigger``), by its share of that many
records. ``startingOffsets`` earliest (a batch read's default) first sets the group's
``share.auto.offset.reset`` config to earliest (where it starts on the partitions it never
consumed, as Kafka's share consumer tools set it); latest (a stream's default) leaves the group's
config, else the replicas' default, as it is.

**Task (executor).** A task is a share group member of its own (``ShareConsumer``, explicit
acknowledgement: it joins, so ``share-groups describe`` shows it and a reset is refused while it
reads) that fetches the partition it was planned for, not the one the coordinator's assignor names:
a share-partition hands each member its own records whoever fetches, and Spark, not the assignor,
decides the parallelism. It hands Spark each fetch's records as an Arrow batch (decoded in C, only
the acquired offsets) and fetches again until a fetch brings nothing, its bound is reached, or it
acquired up to the planned high watermark. **When Spark has drained its iterator, the task accepts
everything it acquired** (acks=all at the leader, before the task ends); a task that fails, or whose
iterator Spark abandons (a ``limit``), accepts nothing and closes its share sessions, which releases
its records at once; a task killed outright releases them when their acquisition locks run out
(``group.share.record.lock.duration.ms``, 30 s by default).

**Semantics: at least once.** The acceptance is made when the source's iterator is exhausted,
which is before the task's own output is committed: a task that fails after that point (its
write, say) loses nothing for the group only if its records are delivered again, and they are not
(they were accepted). Within a task, the window is the end of the task's pipeline; make it short, or
use an idempotent sink. A task that outlives its locks (records held longer than the lock duration,
from its first fetch to its end) gets its acceptance refused (INVALID_RECORD_STATE) and fails:
those records went back to the group meanwhile and were, or will be, delivered again.

**No offsets in the checkpoint.** The group keeps the progress (its share-partition start offsets
in ``__share_group_state``); a streaming query's offsets are only a micro-batch counter
``{"share_group": G, "batch": n}``. A micro-batch is planned when the group has records not yet
acknowledged below the high watermarks (or a partition it never read: the first batch creates its
state); ``Trigger.AvailableNow`` ends once nothing is left below the high watermarks of its start.
A restarted query re-plans from the group, not from the checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, SupportsTriggerAvailableNow

from lowtide.client.admin import Admin, OffsetSpec
from lowtide.client.share_consumer import EXPLICIT, ShareConsumer, set_auto_offset_reset
from lowtide.errors import InvalidConfig
from lowtide.messages import TopicPartition
from lowtide.messages.share import ACCEPT
from lowtide.spark import planning as plan
from lowtide.spark.arrow import to_record_batch
from lowtide.spark.options import ReadOptions

log = logging.getLogger("lowtide.spark")

# How long a task's fetch waits for records before it decides the queue has nothing more for it.
_FETCH_WAIT_MS = 500
# Records a task acquires per ShareFetch (Kafka's max.poll.records default).
_FETCH_RECORDS = 500


@dataclass(frozen=True, slots=True)
class ShareTask:
    """One Spark task of a share read: acquire from ``topic``-``partition`` up to the high
    watermark ``end`` of planning time, at most ``max_records`` (None: no bound)."""

    topic: str
    partition: int
    end: int
    max_records: int | None = None


def plan_share_tasks(pending: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int], *,
                     min_partitions: int | None = None, max_records: int | None = None) -> list[ShareTask]:
    """Tasks for the partitions with ``pending`` records: one each, more on the bigger ones when
    ``min_partitions`` asks for more (shares proportional to what each has, as ``plan_ranges``);
    ``max_records`` shared out the same way, at least one record a task so none stalls."""
    wanted = {tp: n for tp, n in sorted(pending.items()) if n > 0}
    total = sum(wanted.values())
    if not total:
        return []
    pieces = {tp: 1 for tp in wanted}
    if min_partitions and min_partitions > len(wanted):
        pieces = {tp: max(1, min(n, round(n / total * min_partitions))) for tp, n in wanted.items()}
    tasks = []
    for tp, n in wanted.items():
        share = None if max_records is None else max(1, max_records * n // total)
        for i in range(pieces[tp]):
            bound = None if share is None else max(1, share // pieces[tp] + (1 if i < share % pieces[tp] else 0))
            tasks.append(ShareTask(topic=tp[0], partition=tp[1], end=ends[tp], max_records=bound))
    return tasks


def pending_records(admin: Admin, group: str, partitions: Sequence[TopicPartition],
                    ends: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Per partition, records below ``ends`` the group has not acknowledged or archived; a partition
    the group has no state for counts as at least one (a task must read it to create its state)."""
    starts = {(s.topic, s.partition): s for s in admin.share_group_start_offsets(group)}
    out = {}
    for tp in partitions:
        state = starts.get(tp)
        out[tp] = max(1, ends[tp]) if state is None else state.lag(ends[tp])
    return out


class SharePartition(InputPartition):
    """A Spark partition of a share read: one ``ShareTask``."""

    def __init__(self, task: ShareTask) -> None:
        super().__init__((task.topic, task.partition, task.end, task.max_records))

    @property
    def task(self) -> ShareTask:
        return ShareTask(*self.value)


def _plan(options: ReadOptions, *, ends: Mapping[TopicPartition, int] | None = None) -> list[SharePartition]:
    share = options.share
    assert share is not None
    with plan.open_admin(options.connection) as admin:
        tps = plan.resolve_partitions(admin, options.subscription)
        latest = plan.list_offsets(admin, tps, OffsetSpec.LATEST)
        ends = latest if ends is None else {tp: ends.get(tp, o) for tp, o in latest.items()}
        pending = pending_records(admin, share.group, tps, ends)
    return [SharePartition(t) for t in plan_share_tasks(pending, ends, min_partitions=options.min_partitions,
                                                         max_records=share.max_records)]


def _start(options: ReadOptions) -> None:
    """startingOffsets earliest: the group's share.auto.offset.reset set to earliest."""
    share = options.share
    assert share is not None
    if share.start == "earliest":
        with plan.open_admin(options.connection) as admin:
            set_auto_offset_reset(admin, share.group, "earliest")


def read_share(options: ReadOptions, task: ShareTask) -> Iterator[pa.RecordBatch]:
    """One task (module doc): acquire, hand Spark Arrow batches, accept all once drained."""
    share = options.share
    assert share is not None
    connection = options.connection
    consumer = ShareConsumer(connection.bootstrap, group_id=share.group, metadata=connection.call_metadata(),
                             tls=connection.tls, acknowledgement_mode=EXPLICIT, client_id="lowtide-spark",
                             max_bytes=options.fetch_max_bytes, max_wait_ms=_FETCH_WAIT_MS)
    drained = False
    try:
        consumer.subscribe([task.topic])
        consumer.assign([(task.topic, task.partition)])
        taken = 0
        while task.max_records is None or taken < task.max_records:
            consumer.max_records = _FETCH_RECORDS if task.max_records is None else \
                min(_FETCH_RECORDS, task.max_records - taken)
            got = consumer.poll_columns(with_headers=options.include_headers)
            if not got:
                break
            for (topic, partition), columns in got:
                taken += columns.count
                yield to_record_batch(columns, topic=topic, partition=partition)
            if max(c.next_offset for _, c in got) >= task.end:
                break  # what was there when the read was planned is taken; the rest is the next read's
        drained = True
    finally:
        try:
            if drained:
                consumer.acknowledge_all(ACCEPT)
                refused = {tp: e for tp, e in consumer.commit().items() if e is not None}
                if refused:
                    (topic, partition), error = next(iter(refused.items()))
                    raise type(error)(
                        f"share group {share.group!r}: accepting the records this task read from {topic}-{partition} "
                        f"was refused ({error.name}: {error.message}); they are delivered again (the task held "
                        "them longer than their acquisition lock, group.share.record.lock.duration.ms?)")
        finally:
            consumer.close()  # releases whatever was not accepted


def _read(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    # With no partitions planned (nothing pending), Spark still runs one task with a plain
    # InputPartition: it reads nothing.
    return read_share(options, partition.task) if isinstance(partition, SharePartition) else iter(())


class ShareBatchReader(DataSourceReader):
    """A batch read as a share group (module doc)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        _start(options)
        self._partitions = _plan(options)

    def partitions(self) -> Sequence[InputPartition]:
        return self._partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class ShareStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches as a share group: the offsets are a batch counter (module doc)."""

    def __init__(self, options: ReadOptions) -> None:
        if options.share is None:
            raise InvalidConfig("a share stream reader needs lowtide.share.group")
        self.options = options
        self._available_now: dict[TopicPartition, int] | None = None

    def _offset(self, batch: int) -> dict:
        assert self.options.share is not None
        return {"share_group": self.options.share.group, "batch": batch}

    def _batch_of(self, offset: Mapping) -> int:
        assert self.options.share is not None
        if offset.get("share_group") != self.options.share.group or not isinstance(offset.get("batch"), int):
            raise InvalidConfig(f"the checkpoint's offset {dict(offset)!r} is not a share read of group "
                                f"{self.options.share.group!r}: use a new checkpoint location")
        return offset["batch"]

    def initialOffset(self) -> dict:  # noqa: N802 (Spark's name)
        _start(self.options)
        return self._offset(0)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadAllAvailable()  # the bound is the tasks' (lowtide.share.max.records)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        with plan.open_admin(self.options.connection) as admin:
            tps = plan.resolve_partitions(admin, self.options.subscription)
            self._available_now = plan.list_offsets(admin, tps, OffsetSpec.LATEST)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        batch = self._batch_of(start)
        share = self.options.share
        assert share is not None
        with plan.open_admin(self.options.connection) as admin:
            tps = plan.resolve_partitions(admin, self.options.subscription)
            latest = plan.list_offsets(admin, tps, OffsetSpec.LATEST)
            ends = latest if self._available_now is None else {tp: self._available_now.get(tp, 0) for tp in tps}
            pending = pending_records(admin, share.group, tps, ends)
        return self._offset(batch + 1) if any(n > 0 for n in pending.values()) else start

    def reportLatestOffset(self) -> dict | None:  # noqa: N802
        return None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if self._batch_of(end) == self._batch_of(start):
            return []
        return _plan(self.options, ends=self._available_now)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict) -> None:
        pass  # each task acknowledged its records itself: the group holds the progress
