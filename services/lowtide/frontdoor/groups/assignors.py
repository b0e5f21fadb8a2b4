"""The server-side assignors of KIP-848 consumer groups: pure functions from the members'
subscriptions (and what each is assigned now) and the topics' partition counts to a target
assignment. ``consumer_group.py`` calls the one the group uses; nothing here knows of epochs,
records or time (docs/design/kip-848-consumer-groups.md#assignors).

* ``uniform`` (Kafka's default, ``UniformAssignor``): every partition of a subscribed topic goes
  to one of the members subscribed to it, the members' partition counts differ by at most one
  among members that could swap, and it is sticky: a member keeps what it has while that is still
  balanced, so a member joining or leaving moves only the partitions it must.
* ``range`` (``RangeAssignor``): per topic, its subscribers in member-id order each get a
  contiguous range (the first ``partitions % members`` one more). Topics with the same partition
  count and the same subscribers are co-partitioned: partition p of each goes to the same member,
  which is what a join of two topics keyed alike needs.

Both are deterministic (members and topics are walked in sorted order), so two coordinators that
compute the same target from the same records agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# topic name -> partition indexes
Assignment = dict[str, frozenset[int]]

UNIFORM, RANGE = "uniform", "range"


@dataclass(frozen=True)
class MemberSpec:
    """What an assignor knows of one member."""

    subscribed_topics: frozenset[str]
    current: Mapping[str, frozenset[int]] = field(default_factory=dict)  # its current target


def _empty_result(members: Mapping[str, MemberSpec]) -> dict[str, dict[str, set[int]]]:
    return {m: {} for m in members}


def _freeze(result: dict[str, dict[str, set[int]]]) -> dict[str, Assignment]:
    return {m: {t: frozenset(ps) for t, ps in sorted(topics.items()) if ps} for m, topics in result.items()}


def uniform_assign(*, members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Balanced and sticky (module doc). ``partitions``: topic -> partition count (a subscribed
    topic missing there does not exist and is skipped)."""
    subscribers = {t: sorted(m for m, spec in members.items() if t in spec.subscribed_topics)
                   for t in sorted(partitions)}
    subscribers = {t: ms for t, ms in subscribers.items() if ms}
    owner: dict[tuple[str, int], str] = {}
    counts = dict.fromkeys(members, 0)
    # Which members a partition could go to, and how many partitions each member could take: the
    # quota below only keeps partitions a member may hold and that it could hold fairly.
    for m in sorted(members):
        for t, ps in sorted(members[m].current.items()):
            if m not in subscribers.get(t, ()):
                continue
            for p in sorted(ps):
                if p < partitions[t] and (t, p) not in owner:
                    owner[(t, p)] = m
                    counts[m] += 1
    # A sticky start can be far from balanced (a new member owns nothing): trim each member to
    # the ceiling of an even share of the partitions it could be given, then hand the rest out.
    total = sum(partitions[t] for t in subscribers)
    share = -(-total // max(1, len(members)))
    for m in sorted(members):
        if counts[m] > share:
            mine = sorted((k for k, v in owner.items() if v == m), reverse=True)
            for key in mine[:counts[m] - share]:
                del owner[key]
                counts[m] -= 1
    # Unowned partitions, topics with the fewest subscribers first (they have the fewest choices),
    # each to its least loaded subscriber.
    for t in sorted(subscribers, key=lambda t: (len(subscribers[t]), t)):
        for p in range(partitions[t]):
            if (t, p) not in owner:
                m = min(subscribers[t], key=lambda m: (counts[m], m))
                owner[(t, p)] = m
                counts[m] += 1
    _balance(owner, counts, subscribers)
    result = _empty_result(members)
    for (t, p), m in owner.items():
        result[m].setdefault(t, set()).add(p)
    return _freeze(result)


def _balance(owner: dict[tuple[str, int], str], counts: dict[str, int], subscribers: Mapping[str, list[str]]) -> None:
    """Move single partitions from a loaded member to a subscriber with at least two fewer, until
    no such move exists (each move narrows the spread, so this ends)."""
    while True:
        moved = False
        for key in sorted(owner, key=lambda k: (-counts[owner[k]], k)):
            donor = owner[key]
            receiver = min(subscribers[key[0]], key=lambda m: (counts[m], m))
            if counts[donor] - counts[receiver] >= 2:
                owner[key] = receiver
                counts[donor] -= 1
                counts[receiver] += 1
                moved = True
                break
        if not moved:
            return


def range_assign(*, members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Per-topic ranges over the topic's subscribers in member-id order (module doc)."""
    result = _empty_result(members)
    for t in sorted(partitions):
        subs = sorted(m for m, spec in members.items() if t in spec.subscribed_topics)
        if not subs:
            continue
        base, extra = divmod(partitions[t], len(subs))
        start = 0
        for i, m in enumerate(subs):
            size = base + (1 if i < extra else 0)
            if size:
                result[m][t] = set(range(start, start + size))
            start += size
    return _freeze(result)


ASSIGNORS: dict[str, Callable[..., dict[str, Assignment]]] = {UNIFORM: uniform_assign, RANGE: range_assign}
DEFAULT_ASSIGNOR = UNIFORM
