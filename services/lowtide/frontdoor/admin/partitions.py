"""More partitions for existing topics: Kafka's CreatePartitions (API 37), for the gRPC Admin
service, the Kafka listener and ``lowtide topics alter --partitions``.

What Kafka users rely on, kept: partitions are only ever added (never removed or renumbered), so
existing records keep their partitions; a keyed producer sees the new count at its next metadata
refresh, after which new records of a key may land elsewhere (Kafka says the same). New classic
partitions get the topic's replication factor, placed round-robin over the live brokers from a
random start (or as the request says); they start empty, with every replica in the ISR, exactly
like the partitions of a new topic. A diskless topic's new partitions go to coordinator shards
(``assign_shards``, by topic id and partition index), created there before the topic record says
they exist. Docs: docs/operations.md#more-partitions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from lowtide.auth.acl import AclOperation, Authorizer, ResourceType
from lowtide.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    LowtideError,
    RequestTimedOut,
    TopicAuthorizationFailed,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.admin.diskless import DisklessTopicAdmin
from lowtide.messages.admin import PartitionsRequest, TopicOutcome
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore, assign_replicas

# Kafka's limit on a topic's partitions is the cluster's memory; lowtide keeps one state per
# partition in one Redis hash and one log directory per replica: refuse the absurd.
MAX_PARTITIONS = 10_000
ATTEMPTS = 10


class PartitionCreator:
    """Adds partitions to topics. Contract of ``create_partitions``: one outcome per request, in
    order; a refused request changes nothing; with ``validate_only`` nothing is written. Needs
    ALTER on each topic (Kafka's rule). Thread-safe (the store, authorizer and diskless admin are);
    two concurrent requests for one topic cannot both win: the topic record is compared and set.
    """

    def __init__(self, *, store: MetadataStore, authorizer: Authorizer, diskless: DisklessTopicAdmin | None,
                 rng: random.Random | None = None) -> None:
        self._store = store
        self._authorizer = authorizer
        self._diskless = diskless
        self._rng = rng or random.Random()

    def create_partitions(self, *, principal: str, requests: Sequence[PartitionsRequest],
                          validate_only: bool = False) -> list[TopicOutcome]:
        outcomes = []
        seen: set[str] = set()
        for request in requests:
            try:
                if request.name in seen:
                    raise InvalidPartitions(f"topic '{request.name}' appears twice in the request")
                seen.add(request.name)
                if not self._authorizer.authorize(principal=principal, operation=AclOperation.ALTER,
                                                  resource_type=ResourceType.TOPIC, resource_name=request.name):
                    raise TopicAuthorizationFailed(f"{principal} may not add partitions to '{request.name}' "
                                                   "(needs ALTER on the topic)")
                self._grow(request, validate_only=validate_only)
                outcomes.append(TopicOutcome(name=request.name))
            except LowtideError as err:
                outcomes.append(TopicOutcome(name=request.name, error=err))
        return outcomes

    def _grow(self, request: PartitionsRequest, *, validate_only: bool) -> None:
        for _ in range(ATTEMPTS):
            raw, topic = self._store.topic_record(request.name)
            added = self._check_count(topic, request)
            if topic.diskless:
                if request.assignments:
                    raise InvalidReplicaAssignment(f"topic '{topic.name}' is diskless: its partitions have no "
                                                   "replicas to assign")
                if self._diskless is None:
                    raise InvalidPartitions("this front door has no diskless coordinators configured")
                if validate_only:
                    return
                shards = self._diskless.create_more_partitions(topic, added)
                if self._store.add_partitions(expected=raw, topic=topic, assignment=(), diskless_shards=shards):
                    return
                continue
            assignment = self._assignment(topic, request, added)
            if validate_only:
                return
            if self._store.add_partitions(expected=raw, topic=topic, assignment=assignment):
                return
        raise RequestTimedOut(f"topic '{request.name}' changed under too many concurrent writers; retry")

    @staticmethod
    def _check_count(topic: TopicInfo, request: PartitionsRequest) -> int:
        # Kafka's messages, word for word where it has them (kafka-topics prints them).
        if request.count == topic.partitions:
            raise InvalidPartitions(f"Topic already has {topic.partitions} partitions.")
        if request.count < topic.partitions:
            raise InvalidPartitions(f"Topic currently has {topic.partitions} partitions, which is higher than the "
                                    f"requested {request.count}.")
        if request.count > MAX_PARTITIONS:
            raise InvalidPartitions(f"{request.count} partitions is more than the {MAX_PARTITIONS} a topic may have")
        return request.count - topic.partitions

    def _replication_factor(self, topic: TopicInfo) -> int:
        """Partition 0's replica count, as Kafka's controller takes it: a reassignment may have
        changed the topic's replication factor since it was created (``TopicInfo`` keeps the one it
        was created with), and new partitions should match the existing ones."""
        try:
            return len(self._store.partition_state(topic.name, 0).target_replicas) or topic.replication_factor
        except UnknownTopicOrPartition:
            return topic.replication_factor

    def _assignment(self, topic: TopicInfo, request: PartitionsRequest, added: int) -> list[list[int]]:
        rf = self._replication_factor(topic)
        if not request.assignments:
            live = sorted(self._store.live_broker_ids())
            if rf > len(live):
                raise InvalidReplicationFactor(f"replication factor {rf} of '{topic.name}' is larger than the "
                                               f"{len(live)} live brokers")
            return assign_replicas(broker_ids=live, partitions=added, replication_factor=rf,
                                   start=self._rng.randrange(len(live)), racks=self._store.broker_racks())
        if len(request.assignments) != added:
            raise InvalidReplicaAssignment(f"Increasing the number of partitions by {added} but "
                                           f"{len(request.assignments)} assignments provided.")
        known = set(self._store.brokers())
        out = []
        for i, replicas in enumerate(request.assignments):
            p = topic.partitions + i
            if len(replicas) != rf:
                raise InvalidReplicaAssignment(f"partition {p}: {len(replicas)} replicas given, the topic's "
                                               f"replication factor is {rf}")
            if len(set(replicas)) != len(replicas):
                raise InvalidReplicaAssignment(f"partition {p}: duplicate brokers in {list(replicas)}")
            unknown = sorted(set(replicas) - known)
            if unknown:
                raise InvalidReplicaAssignment(f"partition {p}: unknown broker ids {unknown}")
            out.append(list(replicas))
        return out
