"""Diskless topics (KIP-1164) at the front door: create, delete, Metadata, ListOffsets, DeleteRecords.

A diskless topic has no replica set: its metadata is the TopicInfo alone (``diskless``, its
``diskless_shards``), with no partition states, so no replica hosts it and the controller never
elects for it. Its data and offsets live in the coordinator shards:

* create: shard of each partition = ``assign_shards`` over the shards registered now; the topic
  id is chosen here; CreatePartitions on every shard concerned (in parallel); only then the topic
  enters the metadata (a failure leaves no topic behind: the shards that did create are undone).
* delete: DeleteTopics on every shard concerned (UNKNOWN_TOPIC_ID there is fine), then the metadata.
* Metadata: each partition's "leader" is one of its shard's produce gateways among the live
  brokers (``produce_gateways``), epoch 0, no replicas: clients send produce and fetch there.
* ListOffsets / DeleteRecords go to the partition's shard (LW = the shard's log start offset).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from lowtide.client.diskless import DisklessCoordinatorClient
from lowtide.diskless.offsets import DisklessOffsets, each_shard
from lowtide.diskless.topics import (
    ShardDirectory,
    assign_shards,
    gateway_for,
    produce_gateways,
    topic_id_bytes,
)
from lowtide.errors import (
    CoordinatorNotAvailable,
    InvalidPartitions,
    LowtideError,
    TopicAlreadyExists,
    UnknownTopicId,
)
from lowtide.messages import TopicPartition
from lowtide.messages.replica import DeleteRecordsResult, PartitionOffset
from lowtide.metadata.cache import MetadataCache
from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo
from lowtide.metadata.store import MetadataStore


class DisklessTopicAdmin:
    """The front door's operations on diskless topics (module doc). Thread-safe (stateless; its
    collaborators are thread-safe)."""

    def __init__(self, *, store: MetadataStore, coordinators: DisklessCoordinatorClient,
                 directory: ShardDirectory, pool: ThreadPoolExecutor, cache: MetadataCache | None = None) -> None:
        self._store = store
        self._cache = cache  # split() asks it which topics are diskless before asking Redis
        self._coordinators = coordinators
        self._directory = directory
        self._pool = pool
        self._offsets = DisklessOffsets(coordinators=coordinators, pool=pool)

    def create(self, *, name: str, partitions: int, config: dict[str, str]) -> TopicInfo:
        n_shards = self._directory.count()
        if n_shards < 1:
            raise CoordinatorNotAvailable("no diskless coordinator shard is registered: cannot create a diskless topic")
        if name in self._store.topics():
            raise TopicAlreadyExists(f"topic '{name}' already exists")
        topic_id = uuid.uuid4()
        shards = assign_shards(topic_id=topic_id.bytes, partitions=partitions, shards=n_shards)
        by_shard: dict[int, list[int]] = {}
        for p, s in enumerate(shards):
            by_shard.setdefault(s, []).append(p)

        def create_on(shard: int) -> None:
            self._coordinators.create_partitions(shard, topic_id=topic_id.bytes, name=name,
                                                 num_partitions=partitions, indexes=by_shard[shard])
        errors = each_shard(self._pool, by_shard, create_on)
        failed = [e for e in errors.values() if e is not None]
        try:
            if failed:
                raise failed[0]
            return self._store.create_topic(name=name, partitions=partitions, replication_factor=0, config=config,
                                            diskless=True, assignment=[], topic_id=topic_id.hex,
                                            diskless_shards=shards)
        except LowtideError:
            created = [s for s, e in errors.items() if e is None]
            each_shard(self._pool, created, lambda s: self._coordinators.delete_topic(s, topic_id=topic_id.bytes))
            raise

    def create_more_partitions(self, info: TopicInfo, added: int) -> list[int]:
        """Create partitions ``info.partitions .. + added`` of a diskless topic on their shards
        (KIP-1164 placement, by topic id and index, over today's shard count); returns their
        shards, which the caller then records. Idempotent per index: a retry after the record
        could not be written finds them created and goes on."""
        n_shards = self._directory.count()
        if n_shards < 1:
            raise CoordinatorNotAvailable("no diskless coordinator shard is registered: cannot add partitions")
        tid = topic_id_bytes(info)
        total = info.partitions + added
        shards = assign_shards(topic_id=tid, partitions=total, shards=n_shards)[info.partitions:]
        by_shard: dict[int, list[int]] = {}
        for i, s in enumerate(shards):
            by_shard.setdefault(s, []).append(info.partitions + i)

        def create_on(shard: int) -> None:
            try:
                self._coordinators.create_partitions(shard, topic_id=tid, name=info.name, num_partitions=total,
                                                     indexes=by_shard[shard])
            except InvalidPartitions as exc:
                if "already exist" not in exc.message:  # created by an earlier attempt: done
                    raise
        for error in each_shard(self._pool, by_shard, create_on).values():
            if error is not None:
                raise error
        return shards

    def delete(self, info: TopicInfo) -> None:
        tid = topic_id_bytes(info)
        results = each_shard(self._pool, info.diskless_shards,
                             lambda s: self._coordinators.delete_topic(s, topic_id=tid))
        for error in results.values():
            if error is not None and not isinstance(error, UnknownTopicId):
                raise error
        self._store.delete_topic(info.name)

    def partition_states(self, info: TopicInfo, *, brokers: Mapping[int, BrokerInfo],
                         live: Iterable[int]) -> tuple[PartitionState, ...]:
        shards = max([self._directory.count(), *(s + 1 for s in info.diskless_shards)])
        gateways = produce_gateways([brokers[i] for i in live if i in brokers], shards=shards)
        return tuple(PartitionState(topic=info.name, partition=p, leader=gateway_for(gateways, shard=s, partition=p),
                                    leader_epoch=0, replicas=(), isr=())
                     for p, s in enumerate(info.diskless_shards))

    def split(self, keys: Iterable[TopicPartition]) -> dict[TopicPartition, TopicInfo]:
        """The keys of diskless topics, with their topic."""
        keys = list(keys)
        if not keys:
            return {}
        snap = self._cache.snapshot() if self._cache is not None else None
        topics = snap.topics if snap is not None and all(k[0] in snap.topics for k in keys) else self._store.topics()
        return {k: topics[k[0]] for k in keys if k[0] in topics and topics[k[0]].diskless}

    def list_offsets(self, timestamps: Mapping[TopicPartition, int], infos: Mapping[TopicPartition, TopicInfo],
                     *, isolation_level: int = 0) -> dict[TopicPartition, PartitionOffset]:
        return self._offsets.list_offsets(timestamps, infos, isolation_level=isolation_level)

    def delete_records(self, offsets: Mapping[TopicPartition, int], infos: Mapping[TopicPartition, TopicInfo],
                       *, timeout_ms: int) -> dict[TopicPartition, DeleteRecordsResult]:
        return self._offsets.delete_records(offsets, infos, timeout_ms=timeout_ms)
