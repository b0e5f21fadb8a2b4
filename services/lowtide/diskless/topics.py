"""Which topics are diskless, which coordinator shard serves each of their partitions, where the
shards run, and which brokers are a shard's produce gateways.

* ``assign_shards``: partition p of topic T goes to shard crc32(T's 16-byte id || p as int32 BE)
  mod n_shards, computed once at creation and stored in the topic's metadata
  (``TopicInfo.diskless_shards``), so adding shards later never moves a partition.
* ``produce_gateways`` (KIP-1164 "produce gateways"): per shard and rack,
  max(1, n_brokers // n_shards // n_racks) brokers, picked so that consecutive shards land on
  different brokers; Metadata names one of a partition's shard's gateways as its "leader", so
  clients send produce and fetch there (any broker could serve them; a gateway commits to fewer shards).
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterable

from lowtide.coordinator.leadership import ShardAddress, read_shards, shards_section
from lowtide.errors import MetadataStoreUnavailable, UnknownTopicOrPartition
from lowtide.metadata.model import BrokerInfo, TopicInfo
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)

# How stale the topic cache may get before the metadata version is looked at again.
TOPIC_CACHE_CHECK_S = 0.2


def topic_id_bytes(info: TopicInfo) -> bytes:
    """The topic's Uuid as the coordinator takes it (16 bytes; TopicInfo keeps it as hex)."""
    return bytes.fromhex(info.topic_id)


def assign_shards(*, topic_id: bytes, partitions: int, shards: int) -> list[int]:
    """Shard of each partition (see module doc); stable for a topic id whatever the order asked."""
    if shards < 1:
        raise ValueError(f"need at least one coordinator shard, got {shards}")
    return [zlib.crc32(topic_id + p.to_bytes(4, "big")) % shards for p in range(partitions)]


def shard_of(info: TopicInfo, partition: int) -> int:
    """Partition ``partition``'s shard; UNKNOWN_TOPIC_OR_PARTITION when the topic has no such partition."""
    if not 0 <= partition < len(info.diskless_shards):
        raise UnknownTopicOrPartition(f"partition {info.name}-{partition} does not exist")
    return info.diskless_shards[partition]


def produce_gateways(brokers: Iterable[BrokerInfo], *, shards: int) -> dict[int, list[int]]:
    """Shard -> its gateway broker ids (live brokers given), racks in name order."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers, key=lambda b: b.id):
        by_rack.setdefault(b.rack, []).append(b.id)
    n_brokers = sum(len(ids) for ids in by_rack.values())
    if not n_brokers or shards < 1:
        return {}
    per_rack = max(1, n_brokers // shards // len(by_rack))
    out: dict[int, list[int]] = {}
    for shard in range(shards):
        chosen: list[int] = []
        for rack in sorted(by_rack):
            ids = by_rack[rack]
            take = min(per_rack, len(ids))
            chosen.extend(ids[(shard * take + j) % len(ids)] for j in range(take))
        out[shard] = chosen
    return out


def gateway_for(gateways: dict[int, list[int]], *, shard: int, partition: int) -> int:
    """The broker Metadata names as the partition's leader: one of its shard's gateways (-1: none)."""
    ids = gateways.get(shard) or sorted({i for ids in gateways.values() for i in ids})
    return ids[partition % len(ids)] if ids else -1


class DisklessTopics:
    """Diskless topics by name and by id, from the metadata store.

    Contract: ``get(name)`` is the TopicInfo of a diskless topic, or None for a classic or unknown
    one; the cache is reloaded when the metadata version moved (looked at every 0.2 s), and at
    once for a name the cache does not know, so a topic created a moment ago is found.

    With ``start()`` the 0.2 s look happens on a thread of its own, so ``get`` of a known name
    is two dict lookups: every Produce asks it on the replica's event loop, where a Redis round
    trip stalled every connection of the loop, and a Redis outage failed produces to topics
    the cache already knew. Without it (tools, tests) ``get`` looks when 0.2 s have passed.
    Thread-safety: thread-safe (readers see one immutable dict; reloads are serialised).
    """

    def __init__(self, *, store: MetadataStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._by_name: dict[str, TopicInfo] = {}
        self._known: frozenset[str] = frozenset()
        self._version = -1
        self._checked = 0.0
        self._refreshing = False
        self._stop = threading.Event()

    def start(self) -> None:
        """Look at the metadata version on a daemon thread every 0.2 s (``stop`` ends it)."""
        self._refreshing = True
        threading.Thread(target=self._refresh, name="diskless-topics", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _refresh(self) -> None:
        while not self._stop.wait(TOPIC_CACHE_CHECK_S):
            try:
                with self._lock:
                    self._load_if_moved()
            except MetadataStoreUnavailable as exc:  # keep serving what is known; look again next time
                log.warning("diskless topics: reading the metadata store failed: %s", exc)

    def _reload(self, *, force: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if not force and now - self._checked < TOPIC_CACHE_CHECK_S:
                return
            self._checked = now
            self._load_if_moved()

    def _load_if_moved(self) -> None:
        version = self._store.version()
        if version == self._version:
            return
        topics = self._store.topics()
        self._by_name = {n: t for n, t in topics.items() if t.diskless}
        self._known = frozenset(topics)
        self._version = version

    def get(self, name: str) -> TopicInfo | None:
        if not self._refreshing:
            self._reload(force=False)
        if name not in self._known:
            # A topic created a moment ago elsewhere: catch the image up with etcd first (a short
            # wait: with the store away, an unknown name is answered as not diskless).
            self._store.sync(timeout_s=0.3)
            self._reload(force=True)
        return self._by_name.get(name)

    def is_diskless(self, name: str) -> bool:
        return self.get(name) is not None


class ShardDirectory:
    """Where each coordinator shard's leader runs: the shard registry in the metadata store
    (``coordinator.leadership``, the ``shards`` section), read from the process's metadata image
    (no round trip; with etcd away, the addresses the image has).

    ``lookup(shard, refresh)`` is the ``ShardLookup`` of ``DisklessCoordinatorClient``: decoded
    again whenever the image moved on (a new leader registered) and ``refresh`` is asked (after
    NOT_COORDINATOR) or the shard is unknown; ``lookup_framed`` the same for the shard's framed
    listener (None: it has none). ``count()`` is the number of shards (highest registered shard +
    1). Thread-safe.
    """

    def __init__(self, *, store: MetadataStore) -> None:
        self._section = shards_section(store)
        self._lock = threading.Lock()
        self._addresses: dict[int, ShardAddress] = {}
        self._revision = -1

    def _read(self) -> dict[int, ShardAddress]:
        try:
            revision = self._section.revision()
            if revision == self._revision:
                return self._addresses
            addresses = read_shards(self._section)
        except MetadataStoreUnavailable as exc:
            # Never loaded (etcd away since the start): route with the addresses known, if any.
            if not self._addresses:
                raise
            log.warning("coordinator shard registry unreadable, using the addresses known: %s", exc)
            return self._addresses
        with self._lock:
            self._addresses, self._revision = addresses, revision
        return addresses

    def _entry(self, shard: int, refresh: bool) -> ShardAddress | None:
        addresses = self._addresses
        if refresh or shard not in addresses:
            addresses = self._read()
        return addresses.get(shard)

    def lookup(self, shard: int, refresh: bool = False) -> str | None:
        entry = self._entry(shard, refresh)
        return entry.grpc if entry is not None else None

    def lookup_framed(self, shard: int, refresh: bool = False) -> str | None:
        entry = self._entry(shard, refresh)
        return (entry.framed or None) if entry is not None else None

    def count(self) -> int:
        # Asked on every Metadata answer that names a diskless topic: a revision compare, decoded
        # only when the metadata moved on.
        addresses = self._read()
        return max(addresses) + 1 if addresses else 0
