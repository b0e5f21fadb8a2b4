"""Replication throttles (KIP-73): one token bucket per direction per broker, and which replicas
they apply to.

Configs (docs/design/reassignment.md section 6):

* broker, dynamic: ``leader.replication.throttled.rate`` / ``follower.replication.throttled.rate``
  (bytes/s; per broker id, else the cluster-wide default; unset = unlimited), read from the
  metadata store by ``QuotaConfigWatcher``;
* topic: ``leader.replication.throttled.replicas`` / ``follower.replication.throttled.replicas``
  (``*`` or ``partition:broker,...``), read from each partition's topic config.

A partition is throttled on the leader for a fetching replica when the leader list is ``*`` or
names ``<partition>:<this broker>`` and the fetching replica is not in the ISR; on a follower when
the follower list is ``*`` or names ``<partition>:<this broker>`` and this broker is not in the
ISR (Kafka's ``shouldLeaderThrottle`` / ``shouldFollowerThrottle``): catching-up replicas are
slowed, in-sync ones never, so a throttle cannot push the ISR's own replication behind.

Rate: the bucket refills at the configured rate up to a capacity of ``BURST_S`` of it (at least
``min_capacity_bytes``, one max batch). A reader may read while the bucket holds anything, capped
at what it holds, and is charged what it actually got afterwards; a log read returns at least one
whole batch, so the bucket may go into debt, which later refills pay back first. So the long-run
rate is the configured one whatever the batch sizes; over a copy of T seconds the error is at most
one capacity (the burst an idle bucket holds), i.e. ``BURST_S / T`` once the rate dominates.
A limit set on an unlimited bucket starts it empty (no free burst on top of a new throttle).

Where it is applied: ``replica/requests.py`` (leader: a follower fetch's per-partition byte cap)
and ``replica/fetcher.py`` (follower: each request's per-partition ``max_bytes``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.config_defaults import FOLLOWER_THROTTLED_RATE, LEADER_THROTTLED_RATE
from lowtide.replica import metrics as replica_metrics

if TYPE_CHECKING:  # the store is only called, and partition.py must not depend on this module
    from lowtide.metadata.store import MetadataStore
    from lowtide.replica.partition import Partition

log = logging.getLogger(__name__)

LEADER, FOLLOWER = "leader", "follower"
LEADER_REPLICAS_KEY = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS_KEY = "follower.replication.throttled.replicas"
# Capacity of a bucket in seconds of its rate, and at least one max batch (Kafka's default
# max.message.bytes, rounded up): a smaller bucket would only split reads into more rounds.
BURST_S = 0.1
MIN_CAPACITY_BYTES = 1 << 20
# What ``available`` answers for an unlimited bucket (no cap on any read).
UNLIMITED = 1 << 62
# Shortest wait a caller is told to sleep: below this a sleep costs more than the bytes it buys.
MIN_WAIT_S = 0.001
# How often the watcher re-reads the rates when no metadata event woke it.
RELOAD_S = 5.0


class TokenBucket:
    """Bytes per second, with debt (module doc). ``clock`` is injectable (seconds, monotonic).

    Contract: ``available()`` is how many bytes a reader may ask for now (0: none; ``UNLIMITED``
    when no rate is set); ``charge(n)`` takes what was read, possibly into debt; ``wait_s()`` is
    how long until ``available()`` is positive again. ``set_rate(None)`` removes the limit.

    Thread-safety: thread-safe (one lock, a few float operations per call); shared by every
    fetch handler (leader) or every fetcher (follower, on a thread or the Kafka listener loop) of one broker.
    """

    def __init__(self, *, rate: float | None = None, clock: Callable[[], float] = time.monotonic,
                 burst_s: float = BURST_S, min_capacity_bytes: int = MIN_CAPACITY_BYTES) -> None:
        self._clock = clock
        self._burst_s = burst_s
        self._min_capacity = min_capacity_bytes
        self._lock = threading.Lock()
        self._rate: float | None = None
        self._capacity = 0.0
        self._tokens = 0.0
        self._stamp = clock()
        self.set_rate(rate)

    @property
    def rate(self) -> float | None:
        return self._rate

    @property
    def capacity(self) -> float:
        return self._capacity

    def set_rate(self, rate: float | None) -> None:
        """Change the rate (bytes/s; None or < 0 = unlimited). Tokens earned so far at the old
        rate are kept, up to the new capacity; a limit on an unlimited bucket starts empty."""
        if rate is not None and rate < 0:
            rate = None
        with self._lock:
            now = self._clock()
            if self._rate is not None:
                self._refill(now)
            else:
                self._tokens = 0.0
            self._stamp = now
            self._rate = rate
            self._capacity = 0.0 if rate is None else max(rate * self._burst_s, float(self._min_capacity))
            self._tokens = min(self._tokens, self._capacity)

    def _refill(self, now: float) -> None:
        # Caller holds the lock and has checked that a rate is set.
        elapsed = now - self._stamp
        if elapsed > 0:
            self._tokens = min(self._capacity, self._tokens + elapsed * self._rate)  # type: ignore[operator]
            self._stamp = now

    def available(self) -> int:
        with self._lock:
            if self._rate is None:
                return UNLIMITED
            self._refill(self._clock())
            return int(self._tokens) if self._tokens >= 1 else 0

    def charge(self, size: int) -> None:
        if size <= 0:
            return
        with self._lock:
            if self._rate is None:
                return
            self._refill(self._clock())
            self._tokens -= size

    def wait_s(self) -> float:
        """Seconds until at least one byte is available (0 when it is now or no rate is set)."""
        with self._lock:
            if self._rate is None:
                return 0.0
            self._refill(self._clock())
            if self._tokens >= 1:
                return 0.0
            if self._rate <= 0:
                return RELOAD_S  # a zero rate: nothing until the rate changes
            return max(MIN_WAIT_S, (1 - self._tokens) / self._rate)


@dataclass(frozen=True, slots=True)
class ThrottledReplicas:
    """One parsed ``*.replication.throttled.replicas`` value."""

    every: bool = False
    replicas: frozenset[tuple[int, int]] = frozenset()  # (partition, broker)

    def names(self, partition: int, broker: int) -> bool:
        return self.every or (partition, broker) in self.replicas


NO_REPLICAS = ThrottledReplicas()


def parse_throttled_replicas(value: str) -> ThrottledReplicas:
    """``*`` -> every replica; ``0:1,0:2`` -> those (partition, broker) pairs; empty -> none.
    The front door validates the value (``frontdoor/admin/topic_config.py``); an entry that is not a
    pair of numbers (a config written by hand) is skipped rather than failing the replica."""
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if "*" in entries:
        return ThrottledReplicas(every=True)
    pairs = set()
    for entry in entries:
        partition, _, broker = entry.partition(":")
        if partition.strip().isdigit() and broker.strip().isdigit():
            pairs.add((int(partition), int(broker)))
    return ThrottledReplicas(replicas=frozenset(pairs)) if pairs else NO_REPLICAS


@dataclass(frozen=True, slots=True)
class TopicThrottles:
    leader: ThrottledReplicas
    follower: ThrottledReplicas


_NO_THROTTLES = TopicThrottles(leader=NO_REPLICAS, follower=NO_REPLICAS)
# Parsed lists by topic config identity: a partition's ``topic_info.config`` is replaced (never
# mutated) when the topic record changes, so the same object always parses the same. The entry
# keeps the config alive, so its id cannot be reused while cached.
_parsed: dict[int, tuple[Mapping[str, str], TopicThrottles]] = {}
_PARSED_MAX = 4096


def topic_throttles(config: Mapping[str, str]) -> TopicThrottles:
    """The throttled replica lists of a topic config, parsed once per config object."""
    hit = _parsed.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    leader, follower = config.get(LEADER_REPLICAS_KEY, ""), config.get(FOLLOWER_REPLICAS_KEY, "")
    parsed = (TopicThrottles(leader=parse_throttled_replicas(leader), follower=parse_throttled_replicas(follower))
              if leader or follower else _NO_THROTTLES)
    if len(_parsed) >= _PARSED_MAX:
        _parsed.clear()  # old configs of changed topics; the live ones parse again once
    _parsed[id(config)] = (config, parsed)
    return parsed


def parse_rate(value: str | None) -> int | None:
    """A stored rate (bytes/s) -> int, None for unset or unreadable (= unlimited)."""
    if value is None:
        return None
    try:
        rate = int(str(value).strip())
    except ValueError:
        return None
    return rate if rate >= 0 else None


class ReplicationQuotas:
    """This broker's two buckets and the throttling decisions (module doc).

    Thread-safety: thread-safe; the buckets lock, the decisions read immutable snapshots
    (a partition's ISR and topic config are replaced, never mutated).
    """

    def __init__(self, *, broker_id: int, clock: Callable[[], float] = time.monotonic,
                 min_capacity_bytes: int = MIN_CAPACITY_BYTES) -> None:
        self.broker_id = broker_id
        self.leader = TokenBucket(clock=clock, min_capacity_bytes=min_capacity_bytes)
        self.follower = TokenBucket(clock=clock, min_capacity_bytes=min_capacity_bytes)

    def set_rates(self, *, leader: int | None, follower: int | None) -> None:
        """New rates (bytes/s, None = unlimited); a bucket whose rate did not change is untouched."""
        for direction, bucket, rate in ((LEADER, self.leader, leader), (FOLLOWER, self.follower, follower)):
            if bucket.rate != rate:
                log.info("replication throttle rate changed", extra={"fields": {
                    "direction": direction, "bytes_per_s": rate if rate is not None else "unlimited"}})
                bucket.set_rate(rate)
            replica_metrics.set_replication_throttle_rate(direction, rate)

    def leader_throttled(self, p: Partition, replica_id: int) -> bool:
        """Whether a fetch by ``replica_id`` of led partition ``p`` goes through the leader bucket."""
        if self.leader.rate is None or replica_id in p.isr:
            return False
        return topic_throttles(p.topic_info.config).leader.names(p.partition, self.broker_id)

    def follower_throttled(self, p: Partition) -> bool:
        """Whether this broker's fetches of followed partition ``p`` go through the follower bucket."""
        if self.follower.rate is None or self.broker_id in p.isr:
            return False
        return topic_throttles(p.topic_info.config).follower.names(p.partition, self.broker_id)

    def charge(self, direction: str, size: int) -> None:
        """Take ``size`` replicated bytes from the ``direction`` bucket and count them."""
        if size > 0:
            (self.leader if direction == LEADER else self.follower).charge(size)
            replica_metrics.count_throttled_bytes(direction, size)


class QuotaConfigWatcher:
    """Keeps ``quotas``' rates equal to this broker's stored ones (the cluster default overridden
    by its own entry, ``MetadataStore.effective_broker_config``).

    Contract: ``start()`` reads once (so the rates apply before the first fetch) and then again on
    every ``wake()`` (each metadata event: a rate change publishes one) and every ``RELOAD_S``
    (a missed event). A Redis failure keeps the last rates and is retried at the next look.

    Thread-safety: ``wake`` from any thread; ``start``/``stop`` once each.
    """

    def __init__(self, *, store: MetadataStore, quotas: ReplicationQuotas, reload_s: float = RELOAD_S) -> None:
        self._store = store
        self._quotas = quotas
        self._reload_s = reload_s
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quota-watcher", daemon=True)

    def start(self) -> None:
        self.reload()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wanted.set()

    def wake(self) -> None:
        self._wanted.set()

    def reload(self) -> None:
        try:
            config = self._store.effective_broker_config(self._quotas.broker_id)
        except MetadataStoreUnavailable as exc:
            log.warning("cannot read the replication throttle rates: %s", exc)
            return
        self._quotas.set_rates(leader=parse_rate(config.get(LEADER_THROTTLED_RATE)),
                               follower=parse_rate(config.get(FOLLOWER_THROTTLED_RATE)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wanted.wait(self._reload_s)
            self._wanted.clear()
            if not self._stop.is_set():
                self.reload()
