"""Where each partition's leader is: one consistent read of the metadata for a set of partitions.

Used by every fan-out (ListOffsets, DeleteRecords) on every attempt, so it reads Redis in a bounded
number of round trips however many partitions are asked for: one pipeline for the topics' partition
hashes, one for the brokers and one MGET for their liveness.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from lowtide.client.replica import TopicPartition as TopicPartitionKey
from lowtide.errors import BrokerNotAvailable, LeaderNotAvailable, LowtideError, UnknownTopicOrPartition
from lowtide.metadata.model import PartitionState
from lowtide.metadata.store import TOPICS, MetadataStore, partitions_key


@dataclass
class Routes:
    """Partitions grouped by their leader's address, plus the ones that cannot be routed now.

    ``unknown`` failures are final (the topic or partition does not exist); ``unroutable`` ones
    (no leader, leader not live, no address) may heal after the controller's next election.
    """

    by_address: dict[str, list[TopicPartitionKey]] = field(default_factory=dict)
    unknown: dict[TopicPartitionKey, LowtideError] = field(default_factory=dict)
    unroutable: dict[TopicPartitionKey, LowtideError] = field(default_factory=dict)
    states: dict[TopicPartitionKey, PartitionState] = field(default_factory=dict)


def route_partitions(store: MetadataStore, keys: Iterable[TopicPartitionKey]) -> Routes:
    """Group ``keys`` by the address of their current live leader."""
    keys = list(keys)
    topics = sorted({t for t, _ in keys})
    pipe = store.redis.pipeline(transaction=False)
    for t in topics:
        pipe.hexists(TOPICS, t)
        pipe.hgetall(partitions_key(t))
    raw = pipe.execute()
    known_topics: set[str] = set()
    states: dict[TopicPartitionKey, PartitionState] = {}
    for i, t in enumerate(topics):
        if raw[2 * i]:
            known_topics.add(t)
            for value in raw[2 * i + 1].values():
                s = PartitionState.from_json(value)
                states[(s.topic, s.partition)] = s
    routes = Routes(states=states)
    leaders = {s.leader for s in states.values() if s.leader >= 0}
    brokers = store.brokers() if leaders else {}
    live = store.live_broker_ids(leaders) if leaders else set()
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
