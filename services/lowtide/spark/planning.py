"""Driver side of a read: which partitions, which offsets, how the ranges become Spark partitions.

Everything here runs on the Spark driver and talks to the front door only (metadata, ListOffsets,
OffsetCommit); no pyspark import, so the job entry points and tests use it directly.

Offsets of a streaming query are JSON-able dicts ``{"topic": {"0": 42, "1": 7}}`` (string partition
keys: Spark stores them in its checkpoint as JSON), the same shape Spark's Kafka source uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lowtide.client.admin import Admin, OffsetSpec
from lowtide.errors import InvalidConfig, OffsetOutOfRange, UnknownTopicOrPartition
from lowtide.messages import TopicPartition
from lowtide.spark.options import EARLIEST, LATEST, Connection, OffsetChoice, Subscription

OffsetMap = dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``start <= offset < end`` of one topic partition: one Spark task reads it."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def open_admin(connection: Connection, *, timeout_s: float = 30.0) -> Admin:
    return Admin(connection.bootstrap, metadata=connection.call_metadata(), timeout_s=timeout_s, tls=connection.tls)


def resolve_partitions(admin: Admin, subscription: Subscription) -> list[TopicPartition]:
    """The partitions a subscription covers now; a named topic that does not exist is an error."""
    if subscription.pattern is not None:
        regex = re.compile(subscription.pattern)
        topics = sorted(t for t in admin.list_topics() if regex.fullmatch(t))
        if not topics:
            return []
    elif subscription.assigned:
        topics = sorted(subscription.assigned)
    else:
        topics = list(subscription.topics)
    described = admin.describe_topics(topics)
    out: list[TopicPartition] = []
    for topic in topics:
        meta = described.get(topic)
        if meta is None or meta.error is not None:
            raise UnknownTopicOrPartition(f"topic {topic!r} ({subscription.describe()}) does not exist"
                                          + (f": {meta.error.message}" if meta is not None and meta.error else ""))
        existing = sorted(p.partition for p in meta.partitions)
        if subscription.assigned:
            missing = sorted(set(subscription.assigned[topic]) - set(existing))
            if missing:
                raise UnknownTopicOrPartition(f"assign names {topic}-{missing[0]}, but {topic} has partitions "
                                              f"{existing[0]}..{existing[-1]}")
            out.extend((topic, p) for p in sorted(set(subscription.assigned[topic])))
        else:
            out.extend((topic, p) for p in existing)
    return out


def list_offsets(admin: Admin, partitions: Iterable[TopicPartition], spec: int) -> OffsetMap:
    """ListOffsets earliest (log start offset) or latest (high watermark); any error is raised."""
    wanted = list(partitions)
    if not wanted:
        return {}
    answers = admin.list_offsets({tp: spec for tp in wanted})
    out: OffsetMap = {}
    for tp in wanted:
        answer = answers.get(tp)
        if answer is None:
            raise UnknownTopicOrPartition(f"no offset for {tp[0]}-{tp[1]}")
        if answer.error is not None:
            raise type(answer.error)(f"ListOffsets for {tp[0]}-{tp[1]}: {answer.error.message}")
        out[tp] = answer.offset
    return out


def resolve_offsets(admin: Admin, partitions: list[TopicPartition], choice: OffsetChoice) -> OffsetMap:
    """Concrete offsets: explicit ones as given, earliest/latest (-2/-1) through ListOffsets."""
    out: OffsetMap = {}
    symbolic: dict[int, list[TopicPartition]] = {EARLIEST: [], LATEST: []}
    for tp in partitions:
        wanted = choice.for_partition(*tp)
        if wanted >= 0:
            out[tp] = wanted
        else:
            symbolic[wanted].append(tp)
    out.update(list_offsets(admin, symbolic[EARLIEST], OffsetSpec.EARLIEST))
    out.update(list_offsets(admin, symbolic[LATEST], OffsetSpec.LATEST))
    return out


def data_loss_message(topic: str, partition: int, *, wanted: int, log_start: int) -> str:
    return (f"records of {topic}-{partition} at offsets {wanted}..{log_start - 1} were deleted before this query "
            f"read them (the log start offset is now {log_start}; DeleteRecords or retention moved it). Set "
            f"failOnDataLoss=false to skip ahead to the log start offset instead.")


def check_data_loss(admin: Admin, starts: Mapping[TopicPartition, int], *, fail: bool) -> OffsetMap:
    """Start offsets below the log start offset: raise (fail) or move them up to it."""
    earliest = list_offsets(admin, starts, OffsetSpec.EARLIEST)
    out = dict(starts)
    for tp, start in starts.items():
        if start < earliest[tp]:
            if fail:
                raise OffsetOutOfRange(data_loss_message(*tp, wanted=start, log_start=earliest[tp]))
            out[tp] = earliest[tp]
    return out


def plan_ranges(starts: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int], *,
                min_partitions: int | None = None) -> list[OffsetRange]:
    """One range per partition with data (end > start), split further when ``min_partitions`` asks
    for more Spark partitions than there are ranges: each range gets a share proportional to its
    size (at least one), as Spark's Kafka source does."""
    ranges = [OffsetRange(t, p, starts[(t, p)], ends[(t, p)]) for (t, p) in sorted(starts)
              if (t, p) in ends and ends[(t, p)] > starts[(t, p)]]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        pieces = max(1, min(r.size, round(r.size / total * min_partitions)))
        step, extra = divmod(r.size, pieces)
        at = r.start
        for i in range(pieces):
            n = step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, at, at + n))
            at += n
    return out


def limit_offsets(starts: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
                  max_records: int) -> OffsetMap:
    """End offsets taking at most ``max_records`` in all, shared by how much each partition has
    (Spark's Kafka source ``maxOffsetsPerTrigger`` rule); every partition with data advances by at
    least one record so a query never stalls on rounding."""
    available = {tp: max(0, latest[tp] - starts.get(tp, latest[tp])) for tp in latest}
    total = sum(available.values())
    if total <= max_records:
        return dict(latest)
    out: OffsetMap = {}
    for tp, end in latest.items():
        start = starts.get(tp, end)
        share = available[tp] * max_records // total
        out[tp] = start + (max(1, share) if available[tp] else 0)
    return out


def to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json_offsets(offsets: Mapping[str, Mapping[str, int]]) -> OffsetMap:
    try:
        return {(str(t), int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}
    except (AttributeError, TypeError, ValueError):
        raise InvalidConfig(f"not a lowtide offsets document: {offsets!r}") from None


def commit_group(admin: Admin, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
    """Commit a micro-batch's end offsets for ``group_id`` (KIP-68 retention then sees the query)."""
    if not offsets:
        return
    for tp, error in admin.commit_offsets(group_id, dict(offsets)).items():
        if error is not None:
            raise type(error)(f"committing {tp[0]}-{tp[1]} for group {group_id}: {error.message}")

