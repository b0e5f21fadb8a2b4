"""Cluster metadata as the client sees it, and a cache with refresh for producers and consumers."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lowtide.errors import LeaderNotAvailable, LowtideError, UnknownTopicOrPartition, error_for_code

if TYPE_CHECKING:
    from lowtide.client.admin import Admin


@dataclass(frozen=True, slots=True)
class BrokerMetadata:
    id: int
    host: str
    port: int
    rack: str = ""
    live: bool = True

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """A topic's metadata; ``error`` is set (partitions empty) when the topic is unknown."""

    name: str
    partitions: tuple[PartitionMetadata, ...] = ()
    replication_factor: int = 0
    config: dict[str, str] = field(default_factory=dict)
    diskless: bool = False
    topic_id: str = ""
    error: LowtideError | None = None

    def as_dict(self) -> dict:
        """The ``topics describe`` JSON shape (docs/operations.md#the-cli-output-contract)."""
        return {"name": self.name,
                "partitions": [{"partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                                "replicas": list(p.replicas), "isr": list(p.isr)} for p in self.partitions],
                "config": dict(self.config), "replication_factor": self.replication_factor,
                "diskless": self.diskless}


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    cluster_id: str
    brokers: dict[int, BrokerMetadata]
    topics: dict[str, TopicMetadata]

    def topic(self, name: str) -> TopicMetadata:
        """The topic, or raise its error (UNKNOWN_TOPIC_OR_PARTITION when absent)."""
        meta = self.topics.get(name)
        if meta is None:
            raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
        if meta.error is not None:
            raise meta.error
        return meta

    def leader_address(self, topic: str, partition: int) -> str:
        """Address of the partition's leader; LEADER_NOT_AVAILABLE when none is known/live."""
        meta = self.topic(topic)
        if not 0 <= partition < len(meta.partitions):
            raise UnknownTopicOrPartition(f"partition {topic}-{partition} does not exist")
        leader = meta.partitions[partition].leader
        broker = self.brokers.get(leader)
        if leader < 0 or broker is None:
            raise LeaderNotAvailable(f"{topic}-{partition} has no leader right now")
        return broker.address


def topic_from_error(name: str, code: int, message: str) -> TopicMetadata:
    return TopicMetadata(name=name, error=error_for_code(code, message))


class ClusterMetadata:
    """A cached ClusterSnapshot of some topics, refreshed on demand.

    ``refresh()`` always asks the front door; ``snapshot()`` returns the cached one, refreshing when
    it is older than ``max_age_s``. Callers that hit NOT_LEADER_OR_FOLLOWER call ``refresh()``;
    concurrent refreshes within ``min_refresh_interval_s`` are coalesced into one RPC.
    Thread-safe.
    """

    def __init__(self, admin: Admin, *, topics: list[str] | None = None, max_age_s: float = 300.0,
                 min_refresh_interval_s: float = 0.05) -> None:
        self._admin = admin
        self._topics = list(topics or [])
        self._max_age_s = max_age_s
        self._min_refresh_interval_s = min_refresh_interval_s
        self._lock = threading.Lock()
        self._snapshot: ClusterSnapshot | None = None
        self._fetched_at = 0.0

    def add_topics(self, topics: list[str]) -> None:
        with self._lock:
            new = [t for t in topics if t not in self._topics]
            if new:
                self._topics.extend(new)
                self._snapshot = None

    def snapshot(self) -> ClusterSnapshot:
        snap = self._snapshot
        if snap is None or time.monotonic() - self._fetched_at > self._max_age_s:
            return self.refresh()
        return snap

    def refresh(self) -> ClusterSnapshot:
        with self._lock:
            if self._snapshot is not None and time.monotonic() - self._fetched_at < self._min_refresh_interval_s:
                return self._snapshot
            snap = self._admin.describe_cluster(self._topics)
            self._snapshot, self._fetched_at = snap, time.monotonic()
            return snap
