"""The front door's binding of the internal topics' runtime (``lowtide.internal_topics``), shared by
``__consumer_offsets`` (groups/offsets_topic.py) and ``__transaction_state``
(transactions/txn_log.py).

What is the front door's: the topic is created through its topic admin (which picks RF = min(3,
live brokers) and validates the config), the leader is found by its router (``route_partitions``:
the live leader, no cache, since front doors are peers and any may have moved it), appends and
reads go over the replica client's gRPC, and a write that never got through is
COORDINATOR_NOT_AVAILABLE to the Kafka client (retriable: it sends the request again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from lowtide.client.replica import ReplicaClient
from lowtide.errors import CoordinatorNotAvailable, LeaderNotAvailable, LowtideError, TopicAlreadyExists
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.routing import route_partitions
from lowtide.internal_topics import Appender, AppendPolicy, InternalTopicSpec, grpc_produce
from lowtide.internal_topics.topic import Creator
from lowtide.messages.admin import TopicRequest
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore


def _did_not_take(where: str, problem: LowtideError) -> LowtideError:
    return CoordinatorNotAvailable(f"{where} did not take the write: {problem.name}: {problem.message}")


# Every retriable failure is retried (a call that failed midway too: module doc of
# internal_topics.append), each attempt with what is left of the deadline.
FRONT_DOOR_APPENDS = AppendPolicy(give_up=_did_not_take)


def create_with_admin(topics: TopicAdmin, *, extra_config: Callable[[], Mapping[str, str]] | None = None) -> Creator:
    """A creator (``InternalTopic``) going through the topic admin with RF chosen by it;
    ``extra_config()`` adds to the spec's config at creation time. Errors other than a lost race
    are COORDINATOR_NOT_AVAILABLE."""

    def create(spec: InternalTopicSpec) -> TopicInfo:
        config = dict(spec.config)
        if extra_config is not None:
            config.update(extra_config())
        try:
            return topics.create_topic(TopicRequest(name=spec.name, partitions=spec.partitions,
                                                    replication_factor=0, config=config))
        except TopicAlreadyExists:
            raise
        except LowtideError as err:
            raise CoordinatorNotAvailable(f"cannot create {spec.name}: {err.name}: {err.message}") from None

    return create


class FrontDoorRouter:
    """The live leaders of an internal topic's partitions, from the front door's router.

    Contract: ``find_leader`` returns the partition's live leader's address or raises why there is
    none (UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE: both retriable); ``route`` groups
    partitions by leader for a ``FoldReader``. Nothing is cached (``cached_leader`` is None).

    Thread-safety: thread-safe (stateless; the store is).
    """

    def __init__(self, *, store: MetadataStore, topic: str) -> None:
        self._store = store
        self.topic = topic

    def cached_leader(self, partition: int) -> str | None:
        return None

    def forget_leader(self, partition: int) -> None:
        pass

    def find_leader(self, partition: int, *, refresh: bool = False) -> str:
        key = (self.topic, partition)
        routes = route_partitions(self._store, [key])
        address = next(iter(routes.by_address), None)
        if address is None:
            raise {**routes.unknown, **routes.unroutable}.get(
                key, LeaderNotAvailable(f"{self.topic}-{partition} has no leader now"))
        return address

    def route(self, partitions: list[int]) -> tuple[dict[str, list[int]], dict[int, str]]:
        routes = route_partitions(self._store, [(self.topic, p) for p in partitions])
        failed = {p: f"{err.name}: {err.message}" for (_, p), err in {**routes.unknown, **routes.unroutable}.items()}
        return {a: [p for _, p in keys] for a, keys in routes.by_address.items()}, failed


def new_appender(*, store: MetadataStore, replicas: ReplicaClient, topic: str) -> Appender:
    """An appender to ``topic`` over gRPC with the front door's routing and policy."""
    return Appender(topic=topic, router=FrontDoorRouter(store=store, topic=topic),
                    produce=grpc_produce(replicas, topic), policy=FRONT_DOOR_APPENDS)
