"""Where each partition's leader is: one consistent read of the metadata for a set of partitions.

Used by every fan-out (ListOffsets, DeleteRecords). A first attempt routes from the process's
``MetadataCache`` snapshot when it knows every partition asked for; a retry, or a partition the
snapshot does not know, reads the metadata store, which looks up a name its image lacks after
catching up with etcd (one round trip), so a topic created a moment ago elsewhere is found.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from lowtide.errors import BrokerNotAvailable, LeaderNotAvailable, LowtideError, UnknownTopicOrPartition
from lowtide.messages import TopicPartition
from lowtide.metadata.cache import MetadataCache
from lowtide.metadata.model import BrokerInfo, PartitionState
from lowtide.metadata.store import MetadataStore


@dataclass
class Routes:
    """Partitions grouped by their leader's address, plus the ones that cannot be routed now.

    ``unknown`` failures are final (the topic or partition does not exist); ``unroutable`` ones
    (no leader, leader not live, no address) may heal after the controller's next election.
    """

    by_address: dict[str, list[TopicPartition]] = field(default_factory=dict)
    unknown: dict[TopicPartition, LowtideError] = field(default_factory=dict)
    unroutable: dict[TopicPartition, LowtideError] = field(default_factory=dict)
    states: dict[TopicPartition, PartitionState] = field(default_factory=dict)


def route_partitions(store: MetadataStore, keys: Iterable[TopicPartition], *,
                     cache: MetadataCache | None = None) -> Routes:
    """Group ``keys`` by the address of their current live leader: from ``cache`` when it has a
    current snapshot that knows every key, else from the store."""
    keys = list(keys)
    snap = cache.snapshot() if cache is not None else None
    if snap is not None and snap.covers(keys):
        states = {k: snap.states[k] for k in keys}
        return _group(keys, snap.topics.keys(), states, snap.brokers, snap.live)
    topics = sorted({t for t, _ in keys})
    known_topics: set[str] = set()
    states: dict[TopicPartition, PartitionState] = {}
    for t in topics:
        try:
            store.topic(t)  # a name the image lacks is looked up after catching up with etcd
        except UnknownTopicOrPartition:
            continue
        known_topics.add(t)
        for s in store.partition_states(t):
            states[(s.topic, s.partition)] = s
    leaders = {s.leader for s in states.values() if s.leader >= 0}
    brokers = store.brokers() if leaders else {}
    live = store.live_broker_ids(leaders) if leaders else set()
    return _group(keys, known_topics, states, brokers, live)


def _group(keys: list[TopicPartition], known_topics: Container[str],
           states: dict[TopicPartition, PartitionState], brokers: dict[int, BrokerInfo],
           live: set[int] | frozenset[int]) -> Routes:
    routes = Routes(states=states)
    for key in keys:
        topic, partition = key
        state = states.get(key)
        if topic not in known_topics:
            routes.unknown[key] = UnknownTopicOrPartition(f"topic '{topic}' does not exist")
        elif state is None:
            routes.unknown[key] = UnknownTopicOrPartition(f"partition {topic}-{partition} does not exist")
        elif state.leader < 0:
            routes.unroutable[key] = LeaderNotAvailable(f"{topic}-{partition} has no leader")
        elif state.leader not in live:
            routes.unroutable[key] = LeaderNotAvailable(
                f"{topic}-{partition}: leader {state.leader} is not live (an election is pending)")
        elif state.leader not in brokers:
            routes.unroutable[key] = BrokerNotAvailable(f"{topic}-{partition}: leader {state.leader} has no address")
        else:
            routes.by_address.setdefault(brokers[state.leader].address, []).append(key)
    return routes
