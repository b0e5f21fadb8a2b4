"""A process-local copy of the cluster metadata, kept current by Redis pub/sub, for request routing.

Why: every DeleteRecords and ListOffsets used to read topics, partition states, brokers and their
liveness from Redis before calling a leader: four round trips to another process on the latency
path, each a scheduler wake-up that costs milliseconds at the tail on a busy machine. Kafka's
brokers route from a metadata cache the controller keeps up to date; this is the same for the
front door. A stale route costs nothing but a retry: the leader checks leadership itself and
answers NOT_LEADER_OR_FOLLOWER, an unreachable one fails the call, and the caller's retry reads
Redis afresh (``route_partitions(..., cache=None)``).

How it stays current:

* one thread subscribes to ``lowtide:events:metadata`` (every metadata write publishes there) and
  reloads everything after each burst of events;
* every ``check_interval_s`` (250 ms) it reads the metadata version and the brokers' ``alive``
  keys in one pipeline, because session expiry is silent (a TTL), and reloads on a version it has
  not seen, so a lost pub/sub message heals within one interval;
* ``mark_stale()`` (called by this process after its own topic deletions) hides the snapshot
  until a reload that started afterwards has finished;
* a snapshot whose last successful check is older than ``max_age_s`` (Redis unreachable, thread
  stuck) is not offered: callers read Redis, and see its errors, as before.

Thread-safety: ``snapshot()`` may be called from any thread; the snapshot it returns is immutable.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import redis as redis_lib

from lowtide.messages import TopicPartition
from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo
from lowtide.metadata.store import BROKERS, METADATA_CHANNEL, TOPICS, VERSION, alive_key, partitions_key

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class MetadataSnapshot:
    """The cluster metadata as read at one metadata ``version`` (immutable)."""

    version: int
    topics: dict[str, TopicInfo]
    states: dict[TopicPartition, PartitionState]
    brokers: dict[int, BrokerInfo]
    live: frozenset[int]
    checked_at: float = field(default=0.0, compare=False)

    def covers(self, keys: list[TopicPartition]) -> bool:
        """True when every partition is known here: a miss (a topic just created elsewhere) must
        read Redis rather than answer UNKNOWN_TOPIC_OR_PARTITION from a stale copy."""
        return all(k in self.states for k in keys)


class MetadataCache:
    """Keeps a ``MetadataSnapshot`` current (module doc: how, and why staleness is safe).

    Contract: ``snapshot()`` returns the newest snapshot, or None while none is trustworthy (not
    loaded yet, marked stale, or not confirmed against Redis within ``max_age_s``).
    ``start()``/``stop()`` once each. Redis failures are logged and retried, never raised.
    """

    def __init__(self, *, redis: redis_lib.Redis, check_interval_s: float = 0.25, max_age_s: float = 2.0) -> None:
        self._redis = redis
        self._check_interval_s = check_interval_s
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._snapshot: MetadataSnapshot | None = None
        self._generation = 0  # bumped by mark_stale: a reload begun before it may not install
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading ------------------------------------------------------------------------------
    def snapshot(self) -> MetadataSnapshot | None:
        snap = self._snapshot
        if snap is None or time.monotonic() - snap.checked_at > self._max_age_s:
            return None
        return snap

    def mark_stale(self) -> None:
        """Hide the snapshot until a fresh reload (after this process changed the metadata)."""
        with self._lock:
            self._generation += 1
            self._snapshot = None
        self._wake.set()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="metadata-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    # -- loading ------------------------------------------------------------------------------
    def reload(self) -> MetadataSnapshot:
        """Read everything from Redis and install it (unless marked stale meanwhile)."""
        with self._lock:
            generation = self._generation
        # The version is read first: a change racing this read leaves a newer version in Redis
        # than the one recorded here, so the next check reloads again.
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(VERSION)
        pipe.hgetall(TOPICS)
        pipe.hgetall(BROKERS)
        raw_version, raw_topics, raw_brokers = pipe.execute()
        topics = {k.decode(): TopicInfo.from_json(v) for k, v in raw_topics.items()}
        brokers = {int(k): BrokerInfo.from_json(v) for k, v in raw_brokers.items()}
        names = sorted(topics)
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(partitions_key(name))
        for b in sorted(brokers):
            pipe.exists(alive_key(b))
        raw = pipe.execute()
        states: dict[TopicPartition, PartitionState] = {}
        for value in raw[:len(names)]:
            for v in value.values():
                s = PartitionState.from_json(v)
                states[(s.topic, s.partition)] = s
        live = frozenset(b for b, alive in zip(sorted(brokers), raw[len(names):], strict=True) if alive)
        snap = MetadataSnapshot(version=int(raw_version or 0), topics=topics, states=states, brokers=brokers,
                                live=live, checked_at=time.monotonic())
        with self._lock:
            if generation == self._generation:
                self._snapshot = snap
        return snap

    def _check(self) -> None:
        """Confirm the snapshot (same version) and refresh liveness; reload on a new version."""
        snap = self._snapshot
        if snap is None:
            self.reload()
            return
        ids = sorted(snap.brokers)
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(VERSION)
        for b in ids:
            pipe.exists(alive_key(b))
        raw_version, *alive = pipe.execute()
        if int(raw_version or 0) != snap.version:
            self.reload()
            return
        live = frozenset(b for b, a in zip(ids, alive, strict=True) if a)
        with self._lock:
            if self._snapshot is snap:
                self._snapshot = MetadataSnapshot(version=snap.version, topics=snap.topics, states=snap.states,
                                                  brokers=snap.brokers, live=live, checked_at=time.monotonic())

    def _run(self) -> None:
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(METADATA_CHANNEL)
                self.reload()  # after subscribing: no event between the read and the listening is lost
                next_check = time.monotonic() + self._check_interval_s
                while not self._stop.is_set():
                    timeout = 0.0 if self._wake.is_set() else max(0.0, next_check - time.monotonic())
                    msg = pubsub.get_message(timeout=timeout)
                    if msg is not None or self._wake.is_set():
                        # Drain the burst (a topic creation publishes once, an election per
                        # partition): one reload answers all of it.
                        while pubsub.get_message(timeout=0.0) is not None:
                            pass
                        self._wake.clear()
                        self.reload()
                        next_check = time.monotonic() + self._check_interval_s
                    elif time.monotonic() >= next_check:
                        self._check()
                        next_check = time.monotonic() + self._check_interval_s
            except (redis_lib.RedisError, OSError) as exc:
                log.warning("metadata cache: reading redis failed, retrying: %s", exc)
                self._stop.wait(0.5)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except (redis_lib.RedisError, OSError):
                        pass
