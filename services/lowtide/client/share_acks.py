"""What a share consumer holds and how it acknowledges it: the pure bookkeeping behind
``ShareConsumer`` (``share_consumer.py``), no I/O.

A ShareFetch answers acquired ranges ``[first, last]``; the consumer keeps each run of adjacent
ranges as one ``HeldSpan`` with the offsets that are records (a range may hold offsets with no
record: control batches, compacted-away records). Acknowledging gives records a type (accept,
release, reject), one by one or all at once; ``take`` turns what was given a type into
ShareFetch's acknowledgement batches and forgets it. The offsets of a span with no record are
acknowledged as gaps (type 0) together with the span's last records, so the share-partition never
waits on them (a released gap would only come back with nothing in it).

Cost: a span whose every offset is a record and whose records all got one type (implicit mode,
Spark's end-of-task accept) is one batch of one type, whatever its size. Only a span with gaps or
with records of several types is acknowledged offset by offset.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from lowtide.errors import InvalidRequest
from lowtide.messages import TopicPartition
from lowtide.messages.share import ACCEPT, GAP, REJECT, RELEASE, AcquiredRange, ShareAckBatch

FINAL_TYPES = (ACCEPT, RELEASE, REJECT)


@dataclass(slots=True)
class HeldSpan:
    """Offsets ``first``..``last`` acquired by this member, not yet acknowledged.

    ``records``: the record offsets, sorted; None when every offset of the span is a record.
    ``ranges``: the acquired ranges the span is made of (their delivery counts).
    ``typed``: records given a type, not yet taken; ``bulk``: a type for every other record not
    yet taken; ``sent``: records already taken (acknowledged earlier, one by one).
    """

    first: int
    last: int
    records: tuple[int, ...] | None
    ranges: tuple[AcquiredRange, ...]
    typed: dict[int, int] = field(default_factory=dict)
    bulk: int | None = None
    sent: set[int] = field(default_factory=set)

    @property
    def record_count(self) -> int:
        return self.last - self.first + 1 if self.records is None else len(self.records)

    def is_record(self, offset: int) -> bool:
        if not self.first <= offset <= self.last:
            return False
        if self.records is None:
            return True
        i = bisect_left(self.records, offset)
        return i < len(self.records) and self.records[i] == offset

    def delivery_count(self, offset: int) -> int:
        for r in self.ranges:
            if r.first <= offset <= r.last:
                return r.delivery_count
        return 0

    def pending(self) -> int:
        """Records still without a type."""
        if self.bulk is not None:
            return 0
        return self.record_count - len(self.sent) - len(self.typed)


def merge_ranges(acquired: Iterable[AcquiredRange]) -> list[tuple[int, int, tuple[AcquiredRange, ...]]]:
    """Adjacent acquired ranges as one (first, last, ranges): one decode and one span per run."""
    out: list[tuple[int, int, list[AcquiredRange]]] = []
    for r in sorted(acquired, key=lambda r: r.first):
        if out and out[-1][1] + 1 == r.first:
            out[-1] = (out[-1][0], r.last, [*out[-1][2], r])
        else:
            out.append((r.first, r.last, [r]))
    return [(first, last, tuple(ranges)) for first, last, ranges in out]


def to_batches(types: Sequence[tuple[int, int]]) -> list[ShareAckBatch]:
    """(offset, type) pairs, sorted by offset, as acknowledgement batches: one per run of
    consecutive offsets, with one type when the run has one, else one type per offset."""
    out: list[ShareAckBatch] = []
    start = 0
    for i in range(1, len(types) + 1):
        if i == len(types) or types[i][0] != types[i - 1][0] + 1:
            run = types[start:i]
            kinds = tuple(t for _, t in run)
            out.append(ShareAckBatch(first=run[0][0], last=run[-1][0],
                                     types=kinds[:1] if len(set(kinds)) == 1 else kinds))
            start = i
    return out


class HeldRecords:
    """The spans a share consumer holds, per partition (module doc). Not thread-safe: the
    consumer's own thread only."""

    def __init__(self) -> None:
        self._spans: dict[TopicPartition, list[HeldSpan]] = {}

    def add(self, tp: TopicPartition, first: int, last: int, records: tuple[int, ...] | None,
            ranges: tuple[AcquiredRange, ...]) -> HeldSpan:
        """A run of acquired ranges; ``records`` None when every offset in it is a record."""
        if records is not None and len(records) == last - first + 1:
            records = None
        span = HeldSpan(first=first, last=last, records=records, ranges=ranges)
        self._spans.setdefault(tp, []).append(span)
        return span

    def partitions(self) -> list[TopicPartition]:
        return [tp for tp, spans in self._spans.items() if spans]

    def count(self) -> int:
        """Records held and not yet given a type."""
        return sum(s.pending() for spans in self._spans.values() for s in spans)

    def find(self, tp: TopicPartition, offset: int) -> HeldSpan | None:
        for span in self._spans.get(tp, ()):
            if span.is_record(offset):
                return span
        return None

    def acknowledge(self, tp: TopicPartition, offset: int, kind: int) -> None:
        """One record's type; INVALID_REQUEST for a record not held or already given one."""
        if kind not in FINAL_TYPES:
            raise InvalidRequest(f"acknowledge type {kind} is not accept (1), release (2) or reject (3)")
        span = self.find(tp, offset)
        if span is None or offset in span.sent or offset in span.typed or span.bulk is not None:
            raise InvalidRequest(f"record {tp[0]}-{tp[1]}@{offset} is not held by this consumer "
                                 "(not delivered to it, or already acknowledged)")
        span.typed[offset] = kind

    def acknowledge_all(self, kind: int, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Every held record without a type (of ``partitions``, default all) gets ``kind``."""
        if kind not in FINAL_TYPES:
            raise InvalidRequest(f"acknowledge type {kind} is not accept (1), release (2) or reject (3)")
        for tp in self._spans if partitions is None else partitions:
            for span in self._spans.get(tp, ()):
                if span.bulk is None:
                    span.bulk = kind

    def take(self) -> dict[TopicPartition, list[ShareAckBatch]]:
        """The acknowledgements to send: every record given a type (and the gaps of spans done),
        forgotten here (what must be sent again, the caller keeps)."""
        out: dict[TopicPartition, list[ShareAckBatch]] = {}
        for tp in list(self._spans):
            batches: list[ShareAckBatch] = []
            kept = []
            for span in self._spans[tp]:
                taken, finished = _take_span(span)
                batches.extend(taken)
                if not finished:
                    kept.append(span)
            if kept:
                self._spans[tp] = kept
            else:
                del self._spans[tp]
            if batches:
                out[tp] = batches
        return out

    def drop(self, tp: TopicPartition) -> None:
        """Forget a partition's spans (their records went back: a closed session, a new leader)."""
        self._spans.pop(tp, None)

    def clear(self) -> None:
        self._spans.clear()


def _take_span(span: HeldSpan) -> tuple[list[ShareAckBatch], bool]:
    """The span's batches to send now, and whether the span is finished (all of it sent)."""
    if span.bulk is None and span.pending() > 0:
        # Some records still have no type: send the typed ones now, keep the span.
        pairs = sorted(span.typed.items())
        span.sent.update(span.typed)
        span.typed.clear()
        return to_batches(pairs), False
    if span.records is None and not span.typed and not span.sent:
        return [ShareAckBatch(first=span.first, last=span.last, types=(span.bulk,))], True  # the common case
    # Every record has a type: the rest of the span goes, its offsets without a record as gaps.
    records = None if span.records is None else set(span.records)
    pairs = [(o, span.typed.get(o, span.bulk) if records is None or o in records else GAP)
             for o in range(span.first, span.last + 1) if o not in span.sent]
    return to_batches(pairs), True
