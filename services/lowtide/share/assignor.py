"""KIP-932's ``simple`` share group assignor, a pure function.

Kafka's rules (``SimpleAssignor``), written again here:

1. each member is hashed (Java's ``String.hashCode`` of its id, modulo the number of partitions it
   subscribes to) to one of its subscribed partitions;
2. the partitions no member hashed to and no member had before are given round robin over their
   topic's subscribers;
3. members keep the partitions they had (of topics they still subscribe to).

So every subscribed partition has at least one member, a partition may have several (that is what
a share group allows), and a member joining takes nothing away from the others. Topics are taken
in name order and members in the order given (join order), so a result is reproducible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lowtide.groups.codec import java_string_hash

NAME = "simple"
TopicPartitionKey = tuple[str, int]  # (topic name, partition)


def _pick_index(member_id: str, size: int) -> int:
    # Java's Math.abs(hash % size): the remainder keeps the hash's sign.
    h = java_string_hash(member_id)
    r = abs(h) % size
    return r


def assign_simple(*, members: Sequence[str], subscriptions: Mapping[str, frozenset[str]],
                  partition_counts: Mapping[str, int],
                  current: Mapping[str, frozenset[TopicPartitionKey]]) -> dict[str, frozenset[TopicPartitionKey]]:
    """The assignment of every member (module doc). ``subscriptions``: member -> topic names;
    ``partition_counts``: topic -> partitions (a topic missing there does not exist: none of its
    partitions is assigned); ``current``: what each member has now."""
    wanted: dict[str, list[TopicPartitionKey]] = {}
    subscribers: dict[str, list[str]] = {}
    for m in members:
        topics = sorted(t for t in subscriptions.get(m, frozenset()) if partition_counts.get(t, 0) > 0)
        wanted[m] = [(t, p) for t in topics for p in range(partition_counts[t])]
        for t in topics:
            subscribers.setdefault(t, []).append(m)
    homogeneous = len({tuple(w) for w in wanted.values()}) <= 1
    fresh: dict[TopicPartitionKey, list[str]] = {}
    for m in members:
        if wanted[m]:
            fresh.setdefault(wanted[m][_pick_index(m, len(wanted[m]))], []).append(m)
    had = {tp for m in members for tp in current.get(m, frozenset())}
    every = sorted({tp for w in wanted.values() for tp in w})
    unassigned = [tp for tp in every if tp not in fresh and tp not in had]
    if homogeneous:
        takers = [m for m in members if wanted[m]]
        for k, tp in enumerate(unassigned):
            fresh.setdefault(tp, []).append(takers[k % len(takers)])
    else:
        by_topic: dict[str, list[TopicPartitionKey]] = {}
        for tp in unassigned:
            by_topic.setdefault(tp[0], []).append(tp)
        for topic, tps in by_topic.items():
            takers = subscribers[topic]
            for k, tp in enumerate(tps):
                fresh.setdefault(tp, []).append(takers[k % len(takers)])
    result: dict[str, set[TopicPartitionKey]] = {m: set() for m in members}
    for m in members:
        keep = set(wanted[m])
        result[m].update(tp for tp in current.get(m, frozenset()) if tp in keep)
    for tp, ms in fresh.items():
        for m in ms:
            result[m].add(tp)
    return {m: frozenset(tps) for m, tps in result.items()}
