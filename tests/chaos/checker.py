"""History checker for the fault-injection suite (docs/design/invariants.md#what-checks-them).

Workers record what the cluster *acknowledged* and what it *served*; ``check`` then looks for:

``lost_record``       an acknowledged acks=all record at offset o >= the final log start offset is
                      missing from the final full read (or o is at/above the final HW), or it is
                      below the final LSO although no DeleteRecords (acknowledged or not — a
                      timed-out one still raises the leader's LSO) ever asked to delete past it.
``wrong_payload``     the final read has another payload at an acknowledged offset.
``duplicate_offset``  two different acknowledged payloads at one offset (an offset assigned twice).
``read_conflict``     a read (below the HW) served a payload other than the one acknowledged there.
``served_below_lw``   a read that started after a DeleteRecords was acknowledged with low watermark
                      W was served a record at an offset < W.
``lso_regressed``     a log start offset observed from a leader (Fetch answer, ListOffsets earliest,
                      the final read) after low watermark W was acknowledged is < W.
``lw_regressed``      a DeleteRecords that started after one acknowledged W returned a low
                      watermark < W. (The workload only asks for offsets >= the highest acknowledged
                      low watermark, and a leader answers a LW >= the requested offset, so this
                      cannot fire on a correct cluster.)

Every timestamp is ``time.monotonic()`` of the one process that runs the workers. "Started" is taken
before the request is sent and "acknowledged" after the answer arrived, so the checker only orders
events that cannot overlap.

Payload ids: every record value is ``encode_value(id)`` with a unique id; ``decode_id`` gets it back
(None for a value this suite did not write).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from lowtide.messages import TopicPartition

VALUE_PREFIX = b"chaos:"

VIOLATION_KINDS = ("lost_record", "wrong_payload", "duplicate_offset", "read_conflict", "served_below_lw",
                   "lso_regressed", "lw_regressed")


def encode_value(payload_id: str, *, pad: int = 0) -> bytes:
    return VALUE_PREFIX + payload_id.encode() + b":" + b"x" * pad


def decode_id(value: bytes | None) -> str | None:
    if not value or not value.startswith(VALUE_PREFIX):
        return None
    return value[len(VALUE_PREFIX):].split(b":", 1)[0].decode(errors="replace")


# ------------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class ProduceAck:
    """An acks=all Produce the leader acknowledged: ``ids[i]`` is at ``base_offset + i``."""

    topic: str
    partition: int
    base_offset: int
    ids: tuple[str, ...]
    started: float
    acked: float


@dataclass(frozen=True)
class DeleteAttempt:
    """A DeleteRecords that was sent (whatever its outcome): it may have raised the leader's LSO."""

    topic: str
    partition: int
    offset: int
    started: float


@dataclass(frozen=True)
class DeleteAck:
    """A DeleteRecords acknowledged with ``low_watermark``."""

    topic: str
    partition: int
    offset: int
    low_watermark: int
    started: float
    acked: float


@dataclass(frozen=True)
class ReadObs:
    """One read answered by a leader. ``records``: (offset, payload id) the reader was handed
    (offsets >= ``fetch_offset``; ids None for foreign values); ``log_start_offset`` the LSO the
    answer carried (-1 when it carried none). ``source``: fetch | list_offsets | probe."""

    topic: str
    partition: int
    started: float
    ended: float
    fetch_offset: int = -1
    records: tuple[tuple[int, str | None], ...] = ()
    log_start_offset: int = -1
    high_watermark: int = -1
    source: str = "fetch"


@dataclass(frozen=True)
class FinalRead:
    """The full read after healing: every record from ``log_start_offset`` to ``high_watermark``."""

    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    records: tuple[tuple[int, str | None], ...]
    at: float = 0.0


@dataclass(frozen=True)
class Violation:
    kind: str
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    detail: str

    def __str__(self) -> str:
        where = (f"offset {self.first_offset}" if self.first_offset == self.last_offset
                 else f"offsets {self.first_offset}..{self.last_offset}")
        return f"{self.kind}: {self.topic}-{self.partition} {where}: {self.detail}"


# ----------------------------------------------------------------------------------- history


class History:
    """What the workers saw. Thread-safe: every method takes one lock."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.produces: list[ProduceAck] = []
        self.delete_attempts: list[DeleteAttempt] = []
        self.deletes: list[DeleteAck] = []
        self.reads: list[ReadObs] = []
        self.finals: dict[TopicPartition, FinalRead] = {}
        self.errors: Counter[str] = Counter()
        self._floor: dict[TopicPartition, int] = {}

    def now(self) -> float:
        return self.clock()

    def produce_acked(self, topic: str, partition: int, base_offset: int, ids: Sequence[str], *,
                      started: float, acked: float | None = None) -> ProduceAck:
        ack = ProduceAck(topic, partition, base_offset, tuple(ids), started, self.clock() if acked is None else acked)
        with self._lock:
            self.produces.append(ack)
        return ack

    def low_watermark_floor(self, topic: str, partition: int) -> int:
        """The highest low watermark acknowledged so far for the partition (0 if none)."""
        with self._lock:
            return self._floor.get((topic, partition), 0)

    def delete_started(self, topic: str, partition: int, offset: int, *, started: float | None = None) -> float:
        """Record a DeleteRecords attempt before sending it; returns its start time."""
        with self._lock:
            t = self.clock() if started is None else started
            self.delete_attempts.append(DeleteAttempt(topic, partition, offset, t))
            return t

    def delete_acked(self, topic: str, partition: int, offset: int, low_watermark: int, *, started: float,
                     acked: float | None = None) -> DeleteAck:
        ack = DeleteAck(topic, partition, offset, low_watermark, started, self.clock() if acked is None else acked)
        with self._lock:
            self.deletes.append(ack)
            key = (topic, partition)
            self._floor[key] = max(self._floor.get(key, 0), low_watermark)
        return ack

    def read(self, obs: ReadObs) -> None:
        with self._lock:
            self.reads.append(obs)

    def final(self, final: FinalRead) -> None:
        with self._lock:
            self.finals[(final.topic, final.partition)] = final

    def error(self, name: str) -> None:
        with self._lock:
            self.errors[name] += 1

    def partitions(self) -> set[TopicPartition]:
        with self._lock:
            return ({(a.topic, a.partition) for a in self.produces} | {(d.topic, d.partition) for d in self.deletes}
                    | set(self.finals))


# ----------------------------------------------------------------------------------- checking


class _LowWatermarks:
    """Per partition: the highest LW acknowledged strictly before a given time."""

    def __init__(self, deletes: Iterable[DeleteAck]) -> None:
        by_tp: dict[TopicPartition, list[DeleteAck]] = {}
        for d in deletes:
            by_tp.setdefault((d.topic, d.partition), []).append(d)
        self._times: dict[TopicPartition, list[float]] = {}
        self._max: dict[TopicPartition, list[tuple[int, DeleteAck]]] = {}
        for tp, acks in by_tp.items():
            acks.sort(key=lambda d: d.acked)
            running: list[tuple[int, DeleteAck]] = []
            best: tuple[int, DeleteAck] | None = None
            for d in acks:
                if best is None or d.low_watermark > best[0]:
                    best = (d.low_watermark, d)
                running.append(best)
            self._times[tp] = [d.acked for d in acks]
            self._max[tp] = running

    def before(self, tp: TopicPartition, t: float) -> tuple[int, DeleteAck | None]:
        times = self._times.get(tp)
        if not times:
            return -1, None
        i = bisect.bisect_left(times, t)
        if i == 0:
            return -1, None
        return self._max[tp][i - 1]


def _ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for o in sorted(offsets):
        if out and o == out[-1][1] + 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


def check(history: History) -> list[Violation]:
    """Every violation of the invariants in the module doc (empty list = the history is clean)."""
    violations: list[Violation] = []
    acked: dict[TopicPartition, dict[int, ProduceAck]] = {}
    acked_id: dict[TopicPartition, dict[int, str]] = {}

    # duplicate_offset: two different acknowledged payloads at one offset (reported per range)
    duplicates: dict[TopicPartition, dict[int, str]] = {}
    for ack in sorted(history.produces, key=lambda a: a.acked):
        tp = (ack.topic, ack.partition)
        ids, by = acked_id.setdefault(tp, {}), acked.setdefault(tp, {})
        for i, pid in enumerate(ack.ids):
            o = ack.base_offset + i
            if o in ids and ids[o] != pid:
                duplicates.setdefault(tp, {}).setdefault(
                    o, f"acknowledged twice: {ids[o]!r} (at t={by[o].acked:.3f}) and {pid!r} (at t={ack.acked:.3f})")
                continue
            ids[o], by[o] = pid, ack
    for (topic, partition), found in duplicates.items():
        for first, last in _ranges(found):
            violations.append(Violation("duplicate_offset", topic, partition, first, last,
                                        found[first] + (" (first of the range)" if last > first else "")))

    lws = _LowWatermarks(history.deletes)

    # lw_regressed: a later DeleteRecords answered a lower low watermark
    for d in history.deletes:
        before, prior = lws.before((d.topic, d.partition), d.started)
        if prior is not None and d.low_watermark < before:
            violations.append(Violation("lw_regressed", d.topic, d.partition, d.low_watermark, d.low_watermark,
                                        f"DeleteRecords(offset {d.offset}) started at t={d.started:.3f} returned "
                                        f"low watermark {d.low_watermark}, but {before} was acknowledged at "
                                        f"t={prior.acked:.3f}"))

    # reads: served below an acknowledged LW, LSO below it, payload conflicts
    for r in history.reads:
        tp = (r.topic, r.partition)
        lw, prior = lws.before(tp, r.started)
        if prior is not None:
            below = [o for o, _ in r.records if o < lw]
            for first, last in _ranges(below):
                violations.append(Violation("served_below_lw", r.topic, r.partition, first, last,
                                            f"{r.source} from offset {r.fetch_offset} started at t={r.started:.3f} "
                                            f"was served these records, but low watermark {lw} was acknowledged "
                                            f"at t={prior.acked:.3f}"))
            if 0 <= r.log_start_offset < lw:
                violations.append(Violation("lso_regressed", r.topic, r.partition, r.log_start_offset,
                                            r.log_start_offset,
                                            f"{r.source} started at t={r.started:.3f} saw log start offset "
                                            f"{r.log_start_offset} < low watermark {lw} acknowledged at "
                                            f"t={prior.acked:.3f}"))
        ids = acked_id.get(tp, {})
        conflicts = {o: pid for o, pid in r.records if o in ids and pid != ids[o]}
        for first, last in _ranges(conflicts):
            violations.append(Violation("read_conflict", r.topic, r.partition, first, last,
                                        f"{r.source} at t={r.started:.3f} served {conflicts[first]!r} at {first}, "
                                        f"acknowledged there: {ids[first]!r}"))

    # final read: every acknowledged record at or above the final LSO is there with its payload
    for tp in sorted(set(acked_id) | set(history.finals)):
        ids = acked_id.get(tp, {})
        final = history.finals.get(tp)
        topic, partition = tp
        if final is None:
            if ids:
                first, last = min(ids), max(ids)
                violations.append(Violation("lost_record", topic, partition, first, last,
                                            "no final read of this partition (it had no leader at the end?)"))
            continue
        lw, prior = lws.before(tp, final.at if final.at else float("inf"))
        if prior is not None and final.log_start_offset < lw:
            violations.append(Violation("lso_regressed", topic, partition, final.log_start_offset,
                                        final.log_start_offset,
                                        f"final log start offset {final.log_start_offset} < acknowledged low "
                                        f"watermark {lw}"))
        deletable_below = max((a.offset for a in history.delete_attempts if (a.topic, a.partition) == tp),
                              default=0)
        deletable_below = max(deletable_below, max((d.low_watermark for d in history.deletes
                                                    if (d.topic, d.partition) == tp), default=0))
        got = dict(final.records)
        missing, above_hw, undeleted, wrong = [], [], [], []
        for o, pid in ids.items():
            if o < final.log_start_offset:
                if o >= deletable_below:
                    undeleted.append(o)
            elif o >= final.high_watermark:
                above_hw.append(o)
            elif o not in got:
                missing.append(o)
            elif got[o] != pid:
                wrong.append(o)
        for first, last in _ranges(missing):
            violations.append(Violation("lost_record", topic, partition, first, last,
                                        f"acknowledged, missing from the final read [{final.log_start_offset}, "
                                        f"{final.high_watermark})"))
        for first, last in _ranges(above_hw):
            violations.append(Violation("lost_record", topic, partition, first, last,
                                        f"acknowledged, but at/above the final high watermark "
                                        f"{final.high_watermark}"))
        for first, last in _ranges(undeleted):
            violations.append(Violation("lost_record", topic, partition, first, last,
                                        f"acknowledged, below the final log start offset {final.log_start_offset}"
                                        f" although no DeleteRecords asked for more than {deletable_below}"))
        for first, last in _ranges(wrong):
            sample = ", ".join(f"{o}: got {got[o]!r} want {ids[o]!r}" for o in range(first, min(last, first + 2) + 1))
            violations.append(Violation("wrong_payload", topic, partition, first, last,
                                        f"the final read has other payloads ({sample})"))
    return violations


# ----------------------------------------------------------------------------------- summary


@dataclass
class Summary:
    records_acked: int = 0
    produces_acked: int = 0
    deletes_attempted: int = 0
    deletes_acked: int = 0
    reads: int = 0
    records_read: int = 0
    final_records: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, history: History, violations: Sequence[Violation]) -> Summary:
        return cls(records_acked=sum(len(a.ids) for a in history.produces), produces_acked=len(history.produces),
                   deletes_attempted=len(history.delete_attempts), deletes_acked=len(history.deletes),
                   reads=len(history.reads), records_read=sum(len(r.records) for r in history.reads),
                   final_records=sum(len(f.records) for f in history.finals.values()),
                   errors=dict(history.errors), violations=dict(Counter(v.kind for v in violations)))
