"""Topic administration and cluster metadata: the domain behind Admin.CreateTopics / DeleteTopics /
ListTopics / Metadata / ListOffsets.

Topic creation validates the name, the partition count, the replication factor against the live
brokers and every config key, then places replicas round-robin from a random start over the live
brokers (as Kafka does) and writes topic + partition states in one atomic Redis script.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from lowtide.auth.acl import AclOperation, Authorizer, ResourceType
from lowtide.client.replica import ReplicaClient
from lowtide.errors import (
    ClusterAuthorizationFailed,
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
    LowtideError,
    NotLeaderOrFollower,
    TopicAlreadyExists,
    TopicAuthorizationFailed,
    UnknownServerError,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.admin.diskless import DisklessTopicAdmin
from lowtide.frontdoor.admin.topic_config import take_diskless_enable, validate_topic_config
from lowtide.frontdoor.routing import route_partitions
from lowtide.messages import TopicPartition
from lowtide.messages.admin import (
    BrokerView,
    ClusterView,
    OffsetQuery,
    PartitionView,
    TopicOutcome,
    TopicRequest,
    TopicView,
)
from lowtide.messages.replica import PartitionOffset
from lowtide.metadata.cache import MetadataCache
from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo
from lowtide.metadata.store import MetadataStore, assign_replicas, validate_topic_name

DEFAULT_MAX_REPLICATION_FACTOR = 3
LIST_OFFSETS_TIMEOUT_S = 10.0


class TopicAdmin:
    """Creates, deletes, lists and describes topics; answers ListOffsets by asking the leaders.

    Stateless apart from its collaborators; thread-safe (the store, authorizer, gateway and pool
    are). Authorization when enabled: CreateTopics needs ALTER on CLUSTER (the proto has no CREATE
    operation), DeleteTopics DELETE on the topic, ListOffsets DESCRIBE on the topic; ListTopics and
    Metadata show only topics the caller may DESCRIBE (as Kafka filters Metadata), and a topic
    named explicitly without DESCRIBE is TOPIC_AUTHORIZATION_FAILED whether it exists or not.
    """

    def __init__(self, *, store: MetadataStore, authorizer: Authorizer, replicas: ReplicaClient,
                 pool: ThreadPoolExecutor, rng: random.Random | None = None,
                 diskless: DisklessTopicAdmin | None = None, cache: MetadataCache | None = None) -> None:
        self._store = store
        self._cache = cache  # ListOffsets' first attempt routes from it; told when we delete a topic
        self._diskless = diskless  # None: this front door cannot reach coordinators (diskless refused)
        self._authorizer = authorizer
        self._replicas = replicas
        self._pool = pool
        self._rng = rng or random.Random()

    # -- topics ------------------------------------------------------------------------------
    def create_topics(self, *, principal: str, requests: Sequence[TopicRequest],
                      validate_only: bool = False) -> list[TopicOutcome]:
        allowed = self._authorizer.authorize_cluster(principal=principal, operation=AclOperation.ALTER)
        outcomes = []
        for request in requests:
            try:
                if not allowed:
                    raise ClusterAuthorizationFailed(f"{principal} is not authorized to create topics "
                                                     "(needs ALTER on CLUSTER)")
                self.create_topic(request, validate_only=validate_only)
                outcomes.append(TopicOutcome(name=request.name))
            except LowtideError as err:
                outcomes.append(TopicOutcome(name=request.name, error=err))
        return outcomes

    def create_topic(self, request: TopicRequest, *, validate_only: bool = False) -> TopicInfo | None:
        """Validate and create one topic; raises the LowtideError that stops it."""
        validate_topic_name(request.name)
        diskless, config = take_diskless_enable(request.config, diskless=request.diskless)
        request = replace(request, diskless=diskless, config=config)
        if request.assignments:
            return self._create_assigned(request, validate_only=validate_only)
        if request.partitions < 1:
            raise InvalidPartitions(f"number of partitions must be >= 1, got {request.partitions}")
        if request.diskless and self._diskless is None:
            raise InvalidConfig("this front door has no diskless coordinators configured; create the topic "
                                "without diskless")
        config = validate_topic_config(request.config)
        if request.diskless:  # KIP-1164: partitions live in the coordinator shards, no replicas
            if request.name in self._store.topics():
                raise TopicAlreadyExists(f"topic '{request.name}' already exists")
            if validate_only:
                return None
            return self._diskless.create(name=request.name, partitions=request.partitions, config=config)
        live = sorted(self._store.live_broker_ids())
        rf = request.replication_factor
        if rf <= 0:
            rf = min(DEFAULT_MAX_REPLICATION_FACTOR, len(live))
        if rf < 1 or rf > len(live):
            raise InvalidReplicationFactor(
                f"replication factor {rf} is larger than the {len(live)} live brokers" if live
                else "no live brokers: cannot place replicas")
        min_isr = int(config.get("min.insync.replicas", "1"))
        if min_isr > rf:
            raise InvalidConfig(f"min.insync.replicas={min_isr} is larger than the replication factor {rf}")
        if request.name in self._store.topics():
            raise TopicAlreadyExists(f"topic '{request.name}' already exists")
        assignment = assign_replicas(broker_ids=live, partitions=request.partitions, replication_factor=rf,
                                     start=self._rng.randrange(len(live)), racks=self._store.broker_racks())
        if validate_only:
            return None
        return self._store.create_topic(name=request.name, partitions=request.partitions, replication_factor=rf,
                                        config=config, diskless=request.diskless, assignment=assignment)

    def _create_assigned(self, request: TopicRequest, *, validate_only: bool) -> TopicInfo | None:
        """A topic placed by the client (Kafka's CreateTopics ``assignments``): exactly the
        partitions and replicas asked for, or Kafka's refusal in Kafka's words."""
        if request.diskless:
            raise InvalidRequest("A manual partition assignment cannot be specified for diskless topics.")
        if request.replication_factor != -1:
            raise InvalidRequest("A manual partition assignment was specified, but replication factor was not "
                                 "set to -1.")
        if request.partitions != -1:
            raise InvalidRequest("A manual partition assignment was specified, but numPartitions was not set to -1.")
        config = validate_topic_config(request.config)
        live = self._store.live_broker_ids()
        assignment = manual_assignment(request.assignments, registered=set(self._store.brokers()), live=live)
        min_isr = int(config.get("min.insync.replicas", "1"))
        if min_isr > len(assignment[0]):
            raise InvalidConfig(f"min.insync.replicas={min_isr} is larger than the replication factor "
                                f"{len(assignment[0])}")
        if request.name in self._store.topics():
            raise TopicAlreadyExists(f"topic '{request.name}' already exists")
        if validate_only:
            return None
        return self._store.create_topic(name=request.name, partitions=len(assignment),
                                        replication_factor=len(assignment[0]), config=config,
                                        assignment=assignment, live=live)

    def delete_topics(self, *, principal: str, names: Sequence[str]) -> list[TopicOutcome]:
        outcomes = []
        for name in names:
            try:
                if not self._authorizer.authorize(principal=principal, operation=AclOperation.DELETE,
                                                  resource_type=ResourceType.TOPIC, resource_name=name):
                    raise TopicAuthorizationFailed(f"{principal} is not authorized to DELETE on TOPIC {name!r}")
                info = self._store.topics().get(name) if self._diskless is not None else None
                if info is not None and info.diskless:
                    self._diskless.delete(info)
                else:
                    self._store.delete_topic(name)
                if self._cache is not None:
                    # Our own caller's next request must not be routed to the deleted topic.
                    self._cache.mark_stale()
                outcomes.append(TopicOutcome(name=name))
            except LowtideError as err:
                outcomes.append(TopicOutcome(name=name, error=err))
        return outcomes

    def _may_describe(self, principal: str, topic: str) -> bool:
        return self._authorizer.authorize(principal=principal, operation=AclOperation.DESCRIBE,
                                          resource_type=ResourceType.TOPIC, resource_name=topic)

    def list_topics(self, *, principal: str, include_internal: bool = False) -> list[str]:
        """The topics ``principal`` may DESCRIBE (others are left out, as if they did not exist)."""
        return sorted(name for name, info in self._store.topics().items()
                      if (include_internal or not info.internal) and self._may_describe(principal, name))

    def describe_cluster(self, *, principal: str, topics: Sequence[str] = ()) -> ClusterView:
        """Brokers (with liveness) and the named topics; all non-internal topics ``principal`` may
        DESCRIBE when none are named. A named topic it may not DESCRIBE is TOPIC_AUTHORIZATION_FAILED
        (checked before existence, so a refused caller cannot probe which names exist)."""
        revision = self._store.version()  # read first: what follows reflects at least this revision
        brokers = self._store.brokers()
        live = self._store.live_broker_ids(brokers)
        all_topics = self._store.topics()
        if any(n not in all_topics for n in topics) and self._store.sync():
            # A topic made a moment ago through another process may not have reached this image
            # yet: catch up with etcd before saying it does not exist (one revision read, only then).
            revision, all_topics = self._store.version(), self._store.topics()
        if topics:
            names = list(topics)
        else:
            names = sorted(n for n, i in all_topics.items() if not i.internal and self._may_describe(principal, n))
        refused = {n for n in names if not self._may_describe(principal, n)}
        views = []
        known = [n for n in names if n in all_topics and n not in refused]
        partitions = {n: self._store.partition_states(n) for n in known}
        for name in names:
            info = all_topics.get(name)
            if name in refused:
                views.append(TopicView(name=name, error=TopicAuthorizationFailed(
                    f"{principal} is not authorized to DESCRIBE on TOPIC {name!r}")))
                continue
            if info is None:
                views.append(TopicView(name=name, error=UnknownTopicOrPartition(f"topic '{name}' does not exist")))
                continue
            states = partitions[name]
            if info.diskless and self._diskless is not None:
                states = list(self._diskless.partition_states(info, brokers=brokers, live=live))
            views.append(_topic_view(info, states))
        broker_views = tuple(_broker_view(b, live=b.id in live) for _, b in sorted(brokers.items()))
        return ClusterView(cluster_id=self._store.cluster_id(), brokers=broker_views, topics=tuple(views),
                           revision=revision)

    # -- offsets -----------------------------------------------------------------------------
    def list_offsets(self, *, principal: str, queries: Sequence[OffsetQuery],
                     isolation_level: int = 0) -> list[PartitionOffset]:
        """Ask each partition's leader (one request per leader, leaders in parallel); one retry
        after a metadata refresh for partitions whose leader moved. ``isolation_level`` 1
        (READ_COMMITTED): latest is the last stable offset."""
        answers: dict[TopicPartition, PartitionOffset] = {}
        timestamps: dict[TopicPartition, int] = {}
        epochs = {(q.topic, q.partition): q.current_leader_epoch for q in queries if q.current_leader_epoch >= 0}
        for q in queries:
            if self._authorizer.authorize(principal=principal, operation=AclOperation.DESCRIBE,
                                          resource_type=ResourceType.TOPIC, resource_name=q.topic):
                timestamps[(q.topic, q.partition)] = q.timestamp
            else:
                answers[(q.topic, q.partition)] = _failed(q.topic, q.partition, TopicAuthorizationFailed(
                    f"{principal} is not authorized to DESCRIBE on TOPIC {q.topic!r}"))
        deadline = time.monotonic() + LIST_OFFSETS_TIMEOUT_S
        diskless = self._diskless.split(timestamps) if self._diskless is not None else {}
        if diskless:  # answered by the partitions' coordinator shards
            answers.update(self._diskless.list_offsets({k: timestamps.pop(k) for k in diskless}, diskless,
                                                       isolation_level=isolation_level))
        pending = dict(timestamps)
        for attempt in range(3):
            routes = route_partitions(self._store, pending, cache=self._cache if attempt == 0 else None)
            for key, error in {**routes.unknown, **routes.unroutable}.items():
                answers[key] = _failed(*key, error)
            got = self._ask_leaders(routes.by_address, pending, max(0.1, deadline - time.monotonic()),
                                    isolation_level=isolation_level, epochs=epochs)
            retry = {}
            for key, answer in got.items():
                answers[key] = answer
                if answer.error is not None and answer.error.invalid_metadata:
                    retry[key] = pending[key]
            for key in routes.unroutable:
                retry[key] = pending[key]
            if not retry or attempt == 2 or time.monotonic() > deadline:
                break
            pending = retry
            time.sleep(0.05 * (attempt + 1))
        return [answers.get((q.topic, q.partition)) or _failed(q.topic, q.partition, UnknownServerError(
            "no answer")) for q in queries]

    def _ask_leaders(self, by_address: dict[str, list[TopicPartition]], timestamps: dict[TopicPartition, int],
                     timeout_s: float, *, isolation_level: int = 0,
                     epochs: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, PartitionOffset]:
        def ask(address: str, keys: list[TopicPartition]) -> dict[TopicPartition, PartitionOffset]:
            try:
                got = self._replicas.list_offsets(address, [(t, p, timestamps[(t, p)]) for t, p in keys],
                                                  timeout_s=timeout_s, isolation_level=isolation_level,
                                                  leader_epochs=epochs)
            except LowtideError as err:
                return {k: _failed(*k, err) for k in keys}
            by_key = {(a.topic, a.partition): a for a in got}
            return {k: by_key.get(k) or _failed(*k, NotLeaderOrFollower(
                f"leader at {address} did not answer for {k[0]}-{k[1]}")) for k in keys}

        futures = [self._pool.submit(ask, address, keys) for address, keys in by_address.items()]
        out: dict[TopicPartition, PartitionOffset] = {}
        for f in futures:
            out.update(f.result())
        return out


def manual_assignment(assignments: Sequence[tuple[int, Sequence[int]]], *, registered: set[int],
                      live: set[int]) -> list[list[int]]:
    """The replica lists of a client's own placement, by partition, checked as Kafka's controller
    checks them (``ReplicationControlManager.createTopic``), with its messages: each partition
    once, numbered 0..n-1; no empty list, no broker twice, only registered brokers, the same
    count of replicas everywhere; and in each, at least one broker that is live (it leads)."""
    by_partition: dict[int, list[int]] = {}
    replication_factor: int | None = None
    for partition, brokers in assignments:
        if partition in by_partition:
            raise InvalidReplicaAssignment(f"Found multiple manual partition assignments for partition {partition}")
        if not brokers:
            raise InvalidReplicaAssignment("The manual partition assignment includes an empty replica list.")
        previous = None
        for broker in sorted(brokers):
            if broker not in registered:
                raise InvalidReplicaAssignment(f"The manual partition assignment includes broker {broker}, but no "
                                               "such broker is registered.")
            if broker == previous:
                raise InvalidReplicaAssignment(f"The manual partition assignment includes the broker {broker} more "
                                               "than once.")
            previous = broker
        if replication_factor is not None and len(brokers) != replication_factor:
            raise InvalidReplicaAssignment(
                f"The manual partition assignment includes a partition with {len(brokers)} replica(s), but this is "
                f"not consistent with previous partitions, which have {replication_factor} replica(s).")
        replication_factor = len(brokers)
        if not any(b in live for b in brokers):
            raise InvalidReplicaAssignment(f"All brokers specified in the manual partition assignment for partition "
                                           f"{partition} are fenced or in controlled shutdown.")
        by_partition[partition] = list(brokers)
    if sorted(by_partition) != list(range(len(by_partition))):
        raise InvalidReplicaAssignment("partitions should be a consecutive 0-based integer sequence")
    return [by_partition[p] for p in range(len(by_partition))]


def _broker_view(b: BrokerInfo, *, live: bool) -> BrokerView:
    return BrokerView(id=b.id, host=b.host, port=b.port, rack=b.rack, live=live, kafka_port=b.kafka_port,
                      kafka_listeners=dict(b.kafka_listeners))


def _topic_view(info: TopicInfo, states: Sequence[PartitionState]) -> TopicView:
    """The store's records of a topic as Metadata reports them (copies: the views are messages)."""
    return TopicView(name=info.name, topic_id=info.topic_id, replication_factor=info.replication_factor,
                     config=dict(info.config), diskless=info.diskless,
                     diskless_shards=tuple(info.diskless_shards) if info.diskless else (), partitions=tuple(
                         PartitionView(partition=s.partition, leader=s.leader, leader_epoch=s.leader_epoch,
                                       replicas=tuple(s.replicas), isr=tuple(s.isr),
                                       adding_replicas=tuple(s.adding_replicas),
                                       removing_replicas=tuple(s.removing_replicas)) for s in states))


def _failed(topic: str, partition: int, error: LowtideError) -> PartitionOffset:
    return PartitionOffset(topic=topic, partition=partition, error=error)
