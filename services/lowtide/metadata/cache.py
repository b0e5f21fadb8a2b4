"""Routing snapshots of the cluster metadata, for the request path: immutable views of the store's
image (lowtide.metadata.image), rebuilt only when the image moved.

Why: every DeleteRecords and ListOffsets routes its partitions to their leaders; Kafka's brokers
route from a metadata cache the controller keeps current. The image already is that cache (one
watch per process); this module hands the request path a consistent, immutable
``MetadataSnapshot`` of it, built once per metadata revision rather than per request. A stale
route costs nothing but a retry: the leader checks leadership itself and answers
NOT_LEADER_OR_FOLLOWER, and the caller's retry routes again.

While etcd is unreachable the image keeps its last state, and so do the snapshots: the data plane
keeps routing (docs/design/metadata.md). ``mark_stale()`` (called by this process after its own
topic deletions) makes the next ``snapshot()`` catch the image up with etcd first.

Thread-safety: ``snapshot()`` may be called from any thread; the snapshot it returns is immutable.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from lowtide.messages import TopicPartition
from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetadataSnapshot:
    """The cluster metadata as read at one metadata ``version`` (immutable)."""

    version: int
    topics: dict[str, TopicInfo]
    states: dict[TopicPartition, PartitionState]
    brokers: dict[int, BrokerInfo]
    live: frozenset[int]

    def covers(self, keys: list[TopicPartition]) -> bool:
        """True when every partition is known here: a miss (a topic just created elsewhere) must
        read the store (which catches up with etcd) rather than answer UNKNOWN_TOPIC_OR_PARTITION."""
        return all(k in self.states for k in keys)


class MetadataCache:
    """Builds ``MetadataSnapshot``s of ``store``'s image (module doc).

    Contract: ``snapshot()`` returns a snapshot of the newest revision the image has, or None
    while the image is not loaded yet. ``start()``/``stop()`` are kept for the servers' lifecycle
    (the image follows etcd by itself).
    """

    def __init__(self, *, store: MetadataStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._snapshot: MetadataSnapshot | None = None
        self._stale = False

    def start(self) -> None:
        self._store.image.start(wait=False)

    def stop(self) -> None:
        pass

    def snapshot(self) -> MetadataSnapshot | None:
        if not self._store.image.loaded.is_set():
            return None
        if self._stale:
            self._stale = False
            self._store.sync()
        snap = self._snapshot
        if snap is not None and snap.version == self._store.version():
            return snap
        return self.reload()

    def mark_stale(self) -> None:
        """Catch up with etcd before the next snapshot (after this process changed the metadata)."""
        self._stale = True

    def reload(self) -> MetadataSnapshot:
        """Build a snapshot of the image as it is now."""
        with self._lock:
            store = self._store
            version = store.version()
            topics = store.topics()
            states = {(s.topic, s.partition): s for s in store.all_partition_states().values()}
            brokers = store.brokers()
            snap = MetadataSnapshot(version=version, topics=topics, states=states, brokers=brokers,
                                    live=frozenset(store.live_broker_ids()))
            self._snapshot = snap
            return snap
