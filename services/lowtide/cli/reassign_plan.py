"""Planning partition moves: which replicas go where for `lowtide reassign plan`, `lowtide drain`
and `lowtide rebalance` (pure functions, no cluster; tests/unit/cli/test_reassign_plan.py).

The rules are those of ``lowtide.metadata.store.assign_replicas``, the placement of new
partitions: replicas spread evenly over the brokers, the first replica (the preferred leader)
too, and, when every broker has a rack and there are at least two racks, each partition's
replicas span min(RF, racks) racks with at most ceil(RF / racks) in one rack. But a plan starts
from the current assignment and changes as little of it as it can: every replica copied is a
partition's worth of disk and network traffic, so a fresh ``assign_replicas`` layout (which moves
almost everything) is only what a partition with no usable replica left gets, in effect.

Steps (``plan_moves``): keep each partition's replicas that are on an eligible broker and do not
break the rack rule, fill the gaps with the least-loaded brokers the rule allows, then, when
balancing, swap replicas from the most to the least loaded broker (preferring swaps that undo or
redirect a move already planned) until no broker holds more than one replica above another; given
partition sizes, exchange replicas of a bigger and a smaller partition between the brokers holding
the most and the fewest bytes (replica counts stay as they are) until the bytes are within
``BYTES_TOLERANCE`` of the mean or no exchange narrows the gap; finally reorder replicas so
preferred leaders are even as well (a reorder copies nothing).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from lowtide.errors import InvalidReplicationFactor

TopicPartition = tuple[str, int]
Assignment = dict[TopicPartition, tuple[int, ...]]
# (partition, hi, lo): a replica or the leadership of a partition moves from broker hi to lo.
_Move = tuple[TopicPartition, int, int]
# Bytes per broker are even enough when the fullest and the emptiest differ by at most this share
# of the mean: closer than that, each exchange copies a partition for little gain.
BYTES_TOLERANCE = 0.10


class _Racks:
    """The rack rule for one set of eligible brokers (off when some broker has no rack, or there is
    only one rack: then the cluster is rack-unaware, as in ``assign_replicas``)."""

    def __init__(self, brokers: Sequence[int], racks: Mapping[int, str] | None) -> None:
        racks = racks or {}
        self.on = bool(brokers) and all(racks.get(b) for b in brokers) and len({racks[b] for b in brokers}) >= 2
        self.of = {b: racks.get(b, "") for b in brokers}
        self.count = len(set(self.of.values())) if self.on else 1

    def _limits(self, rf: int) -> tuple[int, int]:
        return math.ceil(rf / self.count), min(rf, self.count)  # per-rack cap, racks to span

    def can_add(self, chosen: Sequence[int], broker: int, rf: int) -> bool:
        """``broker`` may join ``chosen`` (a partial replica list) and the list can still be
        completed to ``rf`` replicas that obey the rule."""
        if broker in chosen:
            return False
        if not self.on:
            return True
        cap, span = self._limits(rf)
        per_rack = Counter(self.of[b] for b in (*chosen, broker))
        return max(per_rack.values()) <= cap and span - len(per_rack) <= rf - len(chosen) - 1

    def valid(self, replicas: Sequence[int], rf: int) -> bool:
        if not self.on:
            return len(set(replicas)) == len(replicas)
        cap, span = self._limits(rf)
        per_rack = Counter(self.of[b] for b in replicas)
        return len(set(replicas)) == len(replicas) and max(per_rack.values()) <= cap and len(per_rack) >= span


def count_moves(before: Mapping[TopicPartition, Sequence[int]], after: Mapping[TopicPartition, Sequence[int]]) -> int:
    """Replicas copied to a broker that did not hold them: the cost of a plan."""
    return sum(len(set(after[tp]) - set(before.get(tp, ()))) for tp in after)


def changed(before: Mapping[TopicPartition, Sequence[int]],
            after: Mapping[TopicPartition, Sequence[int]]) -> Assignment:
    """The partitions whose replica list (order included: the preferred leader) differs."""
    return {tp: tuple(r) for tp, r in after.items() if tuple(before.get(tp, ())) != tuple(r)}


def plan_moves(*, current: Mapping[TopicPartition, Sequence[int]], brokers: Iterable[int],
               racks: Mapping[int, str] | None = None, balance: bool = True,
               load: Mapping[TopicPartition, Sequence[int]] | None = None,
               sizes: Mapping[TopicPartition, int] | None = None) -> Assignment:
    """New replica lists for the partitions of ``current`` (replication factors kept), all on
    ``brokers``. ``balance`` evens replicas and preferred leaders per broker; without it only the
    replicas that must move (not on ``brokers``, or breaking the rack rule) move. ``load`` is the
    assignment the per-broker counts are taken over (default ``current``; pass the whole cluster's
    to fill the least-loaded brokers of the cluster rather than of these partitions). ``sizes``
    (bytes per partition) also evens the bytes per broker when balancing. Raises
    InvalidReplicationFactor when a partition has more replicas than there are brokers."""
    eligible = sorted(set(brokers))
    rule = _Racks(eligible, racks)
    for tp, replicas in sorted(current.items()):
        if len(replicas) > len(eligible):
            raise InvalidReplicationFactor(
                f"{tp[0]}-{tp[1]} has {len(replicas)} replicas but only {len(eligible)} brokers "
                f"({', '.join(map(str, eligible)) or 'none'}) may hold them")
    planned: dict[TopicPartition, list[int]] = {}
    # Replica counts of the brokers over everything that stays outside the planned partitions,
    # plus the planned partitions as they are being placed.
    counts: Counter[int] = Counter({b: 0 for b in eligible})
    for tp, replicas in (load if load is not None else current).items():
        if tp not in current:
            counts.update(r for r in replicas if r in counts)
    slots: dict[TopicPartition, list[int | None]] = {}
    for tp, replicas in sorted(current.items()):
        kept: list[int] = []
        row: list[int | None] = []
        for r in replicas:
            if r in counts and rule.can_add(kept, r, len(replicas)):
                kept.append(r)
                row.append(r)
            else:
                row.append(None)
        counts.update(kept)
        slots[tp] = row
    for tp, row in sorted(slots.items()):
        rf = len(row)
        for i, r in enumerate(row):
            if r is not None:
                continue
            chosen = [b for b in row if b is not None]
            candidates = [b for b in eligible if rule.can_add(chosen, b, rf)]
            pick = min(candidates, key=lambda b: (counts[b], b))
            row[i] = pick
            counts[pick] += 1
        planned[tp] = [b for b in row if b is not None]
    if balance:
        _even_replicas(planned, current, counts, rule)
        if sizes:
            _even_bytes(planned, counts, sizes, rule)
        _even_leaders(planned, current, eligible)
    return {tp: tuple(r) for tp, r in planned.items()}


def _even_replicas(planned: dict[TopicPartition, list[int]], current: Mapping[TopicPartition, Sequence[int]],
                   counts: Counter[int], rule: _Racks) -> None:
    """Swap single replicas from the most to the least loaded broker until the spread is at most
    one (or no swap the rack rule allows is left)."""
    for _ in range(sum(len(r) for r in planned.values()) * 2 + 1):
        swap = _first_move(counts, lambda hi, lo: _find_swap(planned, current, rule, hi, lo))
        if swap is None:
            return
        tp, hi, lo = swap
        row = planned[tp]
        row[row.index(hi)] = lo
        counts[hi] -= 1
        counts[lo] += 1


def _first_move(counts: Counter[int], find: Callable[[int, int], _Move | None]) -> _Move | None:
    """The first move ``find(hi, lo)`` offers, trying the most loaded brokers ``hi`` against the
    least loaded ``lo`` while their counts differ by more than one; None when it offers none."""
    by_load = sorted(counts, key=lambda b: (counts[b], b))
    for hi in reversed(by_load):
        for lo in by_load:
            if counts[hi] - counts[lo] <= 1:
                break
            move = find(hi, lo)
            if move:
                return move
    return None


def _find_swap(planned: dict[TopicPartition, list[int]], current: Mapping[TopicPartition, Sequence[int]],
               rule: _Racks, hi: int, lo: int) -> tuple[TopicPartition, int, int] | None:
    best = None
    for tp, row in sorted(planned.items()):
        if hi not in row or lo in row:
            continue
        trial = [lo if b == hi else b for b in row]
        if not rule.valid(trial, len(row)):
            continue
        before = set(current.get(tp, ()))
        # Cost of this swap in copies: -1 when lo held the partition (a planned move undone),
        # 0 when hi was itself an addition (the copy just goes elsewhere), else 1.
        cost = -1 if lo in before else (0 if hi not in before else 1)
        if best is None or cost < best[0]:
            best = (cost, tp)
            if cost < 0:
                break
    return (best[1], hi, lo) if best else None


def _even_bytes(planned: dict[TopicPartition, list[int]], counts: Counter[int],
                sizes: Mapping[TopicPartition, int], rule: _Racks) -> None:
    """Narrow the bytes gap between the fullest and the emptiest broker, one step at a time: move
    one replica from the fullest to the emptiest when the fullest also holds more replicas, else
    exchange a replica of a bigger partition on the fullest for one of a smaller partition on the
    emptiest; each step picks the size (difference) closest to half the gap, so the two end up as
    close as the partitions allow. The replica spread stays within one."""
    held: dict[int, int] = {b: 0 for b in counts}
    for tp, row in planned.items():
        for b in row:
            held[b] += sizes.get(tp, 0)
    for _ in range(len(planned) * 2 + 1):
        lo, hi = min(held, key=lambda b: (held[b], b)), max(held, key=lambda b: (held[b], -b))
        gap = held[hi] - held[lo]
        mean = sum(held.values()) / len(held) if held else 0
        if mean <= 0 or gap <= BYTES_TOLERANCE * mean:
            return
        step = _best_bytes_step(planned, counts, sizes, rule, hi=hi, lo=lo, gap=gap)
        if step is None:
            return
        a, b, delta = step
        planned[a][planned[a].index(hi)] = lo
        if b is not None:
            planned[b][planned[b].index(lo)] = hi
        else:
            counts[hi] -= 1
            counts[lo] += 1
        held[hi] -= delta
        held[lo] += delta


def _best_bytes_step(planned: dict[TopicPartition, list[int]], counts: Counter[int],
                     sizes: Mapping[TopicPartition, int], rule: _Racks, *, hi: int, lo: int,
                     gap: int) -> tuple[TopicPartition, TopicPartition | None, int] | None:
    """(partition moving hi -> lo, partition moving lo -> hi or None, bytes moved net) whose net
    is closest to gap / 2 and in (0, gap): the only steps that narrow the gap."""
    def movable(src: int, dst: int) -> list[tuple[int, TopicPartition]]:
        out = []
        for tp, row in planned.items():
            if src in row and dst not in row and rule.valid([dst if x == src else x for x in row], len(row)):
                out.append((sizes.get(tp, 0), tp))
        return sorted(out)

    down, up = movable(hi, lo), movable(lo, hi)
    best: tuple[float, TopicPartition, TopicPartition | None, int] | None = None
    if counts[hi] > counts[lo]:
        for size, tp in down:
            if 0 < size < gap and (best is None or abs(gap / 2 - size) < best[0]):
                best = (abs(gap / 2 - size), tp, None, size)
    up_sizes = [size for size, _ in up]
    for size, tp in down:
        # the partner whose size makes the net closest to gap / 2
        i = bisect.bisect_left(up_sizes, size - gap / 2)
        for j in (i - 1, i):
            if 0 <= j < len(up):
                net = size - up[j][0]
                if 0 < net < gap and (best is None or abs(gap / 2 - net) < best[0]):
                    best = (abs(gap / 2 - net), tp, up[j][1], net)
    return None if best is None else (best[1], best[2], best[3])


def _even_leaders(planned: dict[TopicPartition, list[int]], current: Mapping[TopicPartition, Sequence[int]],
                  eligible: Sequence[int]) -> None:
    """Reorder replica lists so each broker is the preferred leader of about as many partitions
    as any other; partitions that already change are reordered first (a reorder alone is one more
    reassignment to record, though nothing is copied)."""
    leaders: Counter[int] = Counter({b: 0 for b in eligible})
    leaders.update(row[0] for row in planned.values() if row)

    def leadership_move(hi: int, lo: int) -> _Move | None:
        options = [tp for tp, row in sorted(planned.items()) if row and row[0] == hi and lo in row]
        if not options:
            return None
        options.sort(key=lambda tp: (list(current.get(tp, ())) == planned[tp], tp))
        return options[0], hi, lo

    for _ in range(len(planned) * 2 + 1):
        move = _first_move(leaders, leadership_move)
        if move is None:
            return
        tp, hi, lo = move
        row = planned[tp]
        i = row.index(lo)
        row[0], row[i] = lo, hi
        leaders[hi] -= 1
        leaders[lo] += 1


def plan_drain(*, current: Mapping[TopicPartition, Sequence[int]], broker: int, live: Iterable[int],
               racks: Mapping[int, str] | None = None) -> Assignment:
    """New replica lists for every partition ``broker`` holds, with ``broker`` replaced by the
    least-loaded other live broker the rack rule allows (the rest of each list, its order and
    every other partition stay); replication factors are kept. Raises InvalidReplicationFactor
    naming the topics when fewer other live brokers remain than a partition has replicas."""
    others = sorted(set(live) - {broker})
    holding = {tp: tuple(r) for tp, r in current.items() if broker in r}
    short = sorted({tp[0]: len(r) for tp, r in holding.items() if len(r) > len(others)}.items())
    if short:
        raise InvalidReplicationFactor(
            f"cannot drain broker {broker}: only {len(others)} other live broker(s) "
            f"({', '.join(map(str, others)) or 'none'}) remain, fewer than the replication factor of "
            + ", ".join(f"topic '{t}' ({rf})" for t, rf in short))
    rule = _Racks(others, racks)
    counts: Counter[int] = Counter({b: 0 for b in others})
    for replicas in current.values():
        counts.update(r for r in replicas if r in counts)
    out: Assignment = {}
    for tp, replicas in sorted(holding.items()):
        row = list(replicas)
        i = row.index(broker)
        rest = [b for b in row if b != broker]
        allowed = [b for b in others if b not in rest and rule.can_add(rest, b, len(row))]
        # Should the partition already break the rack rule, any broker not holding it will do.
        pick = min(allowed or [b for b in others if b not in rest], key=lambda b: (counts[b], b))
        row[i] = pick
        counts[pick] += 1
        out[tp] = tuple(row)
    return out


def brokers_load(assignment: Mapping[TopicPartition, Sequence[int]],
                 brokers: Iterable[int]) -> dict[int, tuple[int, int]]:
    """Per broker: (replicas, preferred leaderships) under ``assignment``."""
    replicas: Counter[int] = Counter({b: 0 for b in brokers})
    leaders: Counter[int] = Counter({b: 0 for b in brokers})
    for row in assignment.values():
        replicas.update(row)
        if row:
            leaders[row[0]] += 1
    return {b: (replicas[b], leaders[b]) for b in sorted(replicas)}
