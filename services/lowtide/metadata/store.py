"""Cluster metadata in Redis: topics, partition leadership and ISR, brokers and their liveness.

Why Redis: Redis is already a required component (purgatory timers), the front door must be
stateless, and the metadata is small and changes rarely. Writes that race (ISR changes by a leader
vs. a leader election by the controller) compare-and-set on ``partition_epoch`` in a Lua script,
which Redis runs atomically. With AOF on (chart default) it survives a Redis restart.

Key layout::

    lowtide:topics                  HASH   topic name -> TopicInfo JSON
    lowtide:partitions:{topic}      HASH   partition  -> PartitionState JSON
    lowtide:brokers                 HASH   broker id  -> BrokerInfo JSON (last registration)
    lowtide:broker:{id}:alive       STRING incarnation id, PX = session timeout (heartbeats renew)
    lowtide:metadata:version        INT    INCR on every topic/partition change
    lowtide:controller              STRING owner of the controller role, PX lease
    lowtide:cluster_id              STRING random id set once by the first reader (Metadata)
    lowtide:broker_configs          HASH   broker id ("" = cluster default) -> JSON of its dynamic
                                           configs (KIP-73 throttle rates); a change bumps the version
    channel lowtide:events:metadata        version number, published after every change

A broker is *live* while its ``alive`` key exists (Kafka: a broker with a live session).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

import redis as redis_lib

from lowtide.clock import now_ms
from lowtide.errors import (
    FencedLeaderEpoch,
    InvalidPartitions,
    InvalidReplicationFactor,
    InvalidTopic,
    InvalidUpdateVersion,
    RequestTimedOut,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo

TOPICS = "lowtide:topics"
BROKERS = "lowtide:brokers"
VERSION = "lowtide:metadata:version"
CONTROLLER = "lowtide:controller"
CLUSTER_ID = "lowtide:cluster_id"
METADATA_CHANNEL = "lowtide:events:metadata"
TOPIC_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def partitions_key(topic: str) -> str:
    return f"lowtide:partitions:{topic}"


def alive_key(broker_id: int) -> str:
    return f"lowtide:broker:{broker_id}:alive"


# Compare-and-set one partition state on partition_epoch; bump the version; publish.
_CAS_PARTITION = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -1 end
local doc = cjson.decode(cur)
if tonumber(doc['partition_epoch']) ~= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', KEYS[3], v)
return 1
"""

_CREATE_TOPIC = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('DEL', KEYS[2])
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
local v = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', KEYS[4], v)
return 1
"""


# Grow a topic: replace its record if it is still exactly what the caller read (no concurrent
# CreatePartitions or config change slipped in) and add the new partitions' states, never
# overwriting one that exists; bump the version; publish (replicas pick their new partitions up).
_ADD_PARTITIONS = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -1 end
if cur ~= ARGV[2] then return 0 end
for i = 4, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then return -2 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
local v = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', KEYS[4], v)
return 1
"""


# Replace a topic's record if it is still exactly what the caller read; bump the version; publish.
_CAS_TOPIC = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -1 end
if cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', KEYS[3], v)
return 1
"""


def validate_topic_name(name: str) -> None:
    if not name or name in (".", "..") or len(name) > 249 or not set(name) <= TOPIC_NAME_CHARS:
        raise InvalidTopic(f"invalid topic name {name!r}: use 1-249 of [a-zA-Z0-9._-]")


def assign_replicas(*, broker_ids: Iterable[int], partitions: int, replication_factor: int,
                    start: int = 0, racks: Mapping[int, str] | None = None) -> list[list[int]]:
    """Round-robin placement: partition p's replicas start at broker start+p; the first is the
    preferred leader, so leaders spread evenly.

    Rack-aware when every broker has a rack (``racks``, the replicas' ``--rack``), as Kafka's
    rack-aware assignment: the brokers are listed alternating racks (a0, b0, c0, a1, b1, ...), and
    each partition takes, walking that list from its start, first one broker of each rack it has
    no replica on yet, then any broker it lacks. So the replicas of a partition span
    min(replication factor, racks) racks, and a rack's outage takes at most
    ceil(RF / racks) of them. Brokers without a rack (some or all): rack-unaware, as plain Kafka
    clusters are."""
    brokers = sorted(broker_ids)
    if replication_factor < 1 or replication_factor > len(brokers):
        raise InvalidReplicationFactor(
            f"replication factor {replication_factor} must be between 1 and the {len(brokers)} live brokers")
    if partitions < 1:
        raise InvalidPartitions(f"number of partitions must be >= 1, got {partitions}")
    n = len(brokers)
    if not racks or not all(racks.get(b) for b in brokers) or len({racks[b] for b in brokers}) < 2:
        return [[brokers[(start + p + i) % n] for i in range(replication_factor)] for p in range(partitions)]
    by_rack: dict[str, list[int]] = {}
    for b in brokers:
        by_rack.setdefault(racks[b], []).append(b)
    columns = [by_rack[r] for r in sorted(by_rack)]
    arranged = [column[i] for i in range(max(map(len, columns))) for column in columns if i < len(column)]
    out = []
    for p in range(partitions):
        order = [arranged[(start + p + i) % n] for i in range(n)]
        chosen: list[int] = []
        for b in order:  # one per rack first
            if len(chosen) < replication_factor and racks[b] not in {racks[c] for c in chosen}:
                chosen.append(b)
        for b in order:  # then any broker not chosen yet
            if len(chosen) < replication_factor and b not in chosen:
                chosen.append(b)
        out.append(chosen)
    return out


class MetadataStore:
    """Reads and writes cluster metadata in Redis. Thread-safe (redis-py pools connections)."""

    def __init__(self, *, redis: redis_lib.Redis) -> None:
        self.redis = redis
        self._cas = redis.register_script(_CAS_PARTITION)
        self._create = redis.register_script(_CREATE_TOPIC)
        self._cas_topic = redis.register_script(_CAS_TOPIC)
        self._add_partitions = redis.register_script(_ADD_PARTITIONS)

    @classmethod
    def from_url(cls, url: str) -> MetadataStore:
        return cls(redis=redis_lib.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5))

    # -- brokers -----------------------------------------------------------------------------
    def register_broker(self, info: BrokerInfo, *, incarnation: str, session_timeout_ms: int) -> None:
        pipe = self.redis.pipeline()
        pipe.hset(BROKERS, str(info.id), info.to_json())
        pipe.set(alive_key(info.id), incarnation, px=session_timeout_ms)
        pipe.incr(VERSION)
        pipe.execute()
        self.redis.publish(METADATA_CHANNEL, "broker")

    def heartbeat(self, broker_id: int, *, incarnation: str, session_timeout_ms: int) -> None:
        self.redis.set(alive_key(broker_id), incarnation, px=session_timeout_ms)

    def unregister_broker(self, broker_id: int, *, incarnation: str) -> None:
        if self.redis.get(alive_key(broker_id)) == incarnation.encode():
            self.redis.delete(alive_key(broker_id))
            self.redis.publish(METADATA_CHANNEL, "broker")

    def brokers(self) -> dict[int, BrokerInfo]:
        return {int(k): BrokerInfo.from_json(v) for k, v in self.redis.hgetall(BROKERS).items()}

    def broker_racks(self) -> dict[int, str]:
        """Broker id -> its ``--rack`` ("" for none), for rack-aware placement."""
        return {b: info.rack for b, info in self.brokers().items()}

    def live_broker_ids(self, candidates: Iterable[int] | None = None) -> set[int]:
        ids = sorted(candidates if candidates is not None else self.brokers())
        if not ids:
            return set()
        alive = self.redis.mget([alive_key(i) for i in ids])
        return {i for i, a in zip(ids, alive, strict=True) if a is not None}

    # -- topics ------------------------------------------------------------------------------
    def create_topic(self, *, name: str, partitions: int, replication_factor: int,
                     config: dict[str, str], diskless: bool = False,
                     assignment: list[list[int]], topic_id: str | None = None,
                     diskless_shards: list[int] | None = None) -> TopicInfo:
        validate_topic_name(name)
        info = TopicInfo(name=name, topic_id=topic_id or uuid.uuid4().hex, partitions=partitions,
                         replication_factor=replication_factor, config=dict(config), diskless=diskless,
                         created_ms=now_ms(), diskless_shards=list(diskless_shards or []))
        args: list[str] = [name, info.to_json()]
        for p, replicas in enumerate(assignment):
            state = PartitionState(topic=name, partition=p, leader=replicas[0], leader_epoch=0,
                                   replicas=tuple(replicas), isr=tuple(replicas), partition_epoch=0)
            args += [str(p), state.to_json()]
        created = self._create(keys=[TOPICS, partitions_key(name), VERSION, METADATA_CHANNEL], args=args)
        if not created:
            raise TopicAlreadyExists(f"topic '{name}' already exists")
        return info

    def delete_topic(self, name: str) -> None:
        pipe = self.redis.pipeline()
        pipe.hdel(TOPICS, name)
        pipe.delete(partitions_key(name))
        pipe.incr(VERSION)
        removed, _, version = pipe.execute()
        if not removed:
            raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
        self.redis.publish(METADATA_CHANNEL, version)

    def topics(self) -> dict[str, TopicInfo]:
        return {k.decode(): TopicInfo.from_json(v) for k, v in self.redis.hgetall(TOPICS).items()}

    def topic(self, name: str) -> TopicInfo:
        raw = self.redis.hget(TOPICS, name)
        if raw is None:
            raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
        return TopicInfo.from_json(raw)

    def update_topic_config(self, name: str, change: Callable[[TopicInfo], dict[str, str]], *,
                            dry_run: bool = False) -> TopicInfo:
        """Set the topic's config to ``change(current topic)``; returns the topic as written.

        A compare-and-set on the whole topic record, retried when another writer got in between
        (``change`` is called again on what it wrote), so two concurrent changes to different keys
        both land. The write bumps the metadata version and publishes it, as every metadata
        change does: that is how the replicas learn the new config. ``change`` may raise (the
        LowtideError propagates, nothing is written); ``dry_run`` computes without writing.
        """
        for _ in range(20):
            raw = self.redis.hget(TOPICS, name)
            if raw is None:
                raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
            current = TopicInfo.from_json(raw)
            updated = dataclasses.replace(current, config=dict(change(current)))
            if dry_run or updated.config == current.config:
                return updated
            written = self._cas_topic(keys=[TOPICS, VERSION, METADATA_CHANNEL], args=[name, raw, updated.to_json()])
            if written == -1:
                raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
            if written == 1:
                return updated
        raise RequestTimedOut(f"topic '{name}': its config changed under too many concurrent writers; retry")

    def topic_record(self, name: str) -> tuple[bytes, TopicInfo]:
        """The topic's stored record as read (for ``add_partitions``' compare) and decoded."""
        raw = self.redis.hget(TOPICS, name)
        if raw is None:
            raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
        return raw, TopicInfo.from_json(raw)

    def add_partitions(self, *, expected: bytes, topic: TopicInfo, assignment: Sequence[Sequence[int]],
                       diskless_shards: Sequence[int] = ()) -> TopicInfo | None:
        """Grow ``topic`` (as read, ``expected`` its stored bytes) by ``len(assignment)`` partitions
        (classic: one replica list each) or ``len(diskless_shards)`` (diskless: their shards).
        Returns the topic as written, or None when its record changed since it was read (the
        caller reads again and decides again). Partitions are only ever added at the end."""
        added = len(diskless_shards) if topic.diskless else len(assignment)
        grown = dataclasses.replace(topic, partitions=topic.partitions + added,
                                    diskless_shards=[*topic.diskless_shards, *diskless_shards])
        args: list[str | bytes] = [topic.name, expected, grown.to_json()]
        for i, replicas in enumerate(assignment):
            p = topic.partitions + i
            state = PartitionState(topic=topic.name, partition=p, leader=replicas[0], leader_epoch=0,
                                   replicas=tuple(replicas), isr=tuple(replicas), partition_epoch=0)
            args += [str(p), state.to_json()]
        written = self._add_partitions(keys=[TOPICS, partitions_key(topic.name), VERSION, METADATA_CHANNEL], args=args)
        if written == -1:
            raise UnknownTopicOrPartition(f"topic '{topic.name}' does not exist")
        if written == -2:
            return None  # a partition state is there already: someone else grew it
        return grown if written == 1 else None

    # -- partitions --------------------------------------------------------------------------
    def partition_states(self, topic: str) -> list[PartitionState]:
        states = [PartitionState.from_json(v) for v in self.redis.hgetall(partitions_key(topic)).values()]
        return sorted(states, key=lambda s: s.partition)

    def all_partition_states(self) -> dict[tuple[str, int], PartitionState]:
        topics = list(self.topics())
        pipe = self.redis.pipeline()
        for t in topics:
            pipe.hgetall(partitions_key(t))
        out: dict[tuple[str, int], PartitionState] = {}
        for raw in pipe.execute():
            for v in raw.values():
                s = PartitionState.from_json(v)
                out[(s.topic, s.partition)] = s
        return out

    def partition_state(self, topic: str, partition: int) -> PartitionState:
        raw = self.redis.hget(partitions_key(topic), str(partition))
        if raw is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        return PartitionState.from_json(raw)

    def compare_and_set_partition(self, expected: PartitionState, new: PartitionState) -> bool:
        """Write ``new`` if the stored state still has ``expected.partition_epoch``."""
        new = dataclasses.replace(new, partition_epoch=expected.partition_epoch + 1)
        r = self._cas(keys=[partitions_key(new.topic), VERSION, METADATA_CHANNEL],
                      args=[str(new.partition), expected.partition_epoch, new.to_json()])
        if r == -1:
            raise UnknownTopicOrPartition(f"{new.topic}-{new.partition} does not exist")
        return r == 1

    def update_isr(self, *, topic: str, partition: int, leader: int, leader_epoch: int,
                   isr: Iterable[int], expected_partition_epoch: int | None = None) -> PartitionState:
        """A leader changes its ISR (Kafka's AlterPartition). Fenced if leadership moved.

        ``expected_partition_epoch`` is the partition epoch of the leader's own view; when the
        stored record moved on since (a reassignment started or finished, KIP-455), the leader's
        ISR was computed over a replica set that may no longer be the partition's, so the change
        is refused with INVALID_UPDATE_VERSION and the leader retries after it reconciled (Kafka's
        AlterPartition does the same). The ISR written never names a broker outside ``replicas``,
        and every other field (a move in progress) is kept as stored.
        """
        for _ in range(10):
            cur = self.partition_state(topic, partition)
            if cur.leader != leader or cur.leader_epoch != leader_epoch:
                raise FencedLeaderEpoch(f"{topic}-{partition}: leader {leader} epoch {leader_epoch} is stale "
                                        f"(now leader {cur.leader} epoch {cur.leader_epoch})")
            if expected_partition_epoch is not None and cur.partition_epoch != expected_partition_epoch:
                raise InvalidUpdateVersion(
                    f"{topic}-{partition}: partition epoch {expected_partition_epoch} is stale "
                    f"(now {cur.partition_epoch})")
            members = set(cur.replicas)
            new = dataclasses.replace(cur, isr=tuple(sorted(r for r in set(isr) if r in members)))
            if self.compare_and_set_partition(cur, new):
                return dataclasses.replace(new, partition_epoch=cur.partition_epoch + 1)
        raise FencedLeaderEpoch(f"{topic}-{partition}: ISR update lost too many races")

    def version(self) -> int:
        return int(self.redis.get(VERSION) or 0)

    def cluster_id(self) -> str:
        """The cluster's id, created on first use (SET NX, so every reader agrees)."""
        raw = self.redis.get(CLUSTER_ID)
        if raw is None:
            self.redis.set(CLUSTER_ID, uuid.uuid4().hex, nx=True)
            raw = self.redis.get(CLUSTER_ID)
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    # -- controller lease -------------------------------------------------------------------
    def try_acquire_controller(self, owner: str, *, lease_ms: int) -> bool:
        if self.redis.set(CONTROLLER, owner, nx=True, px=lease_ms):
            return True
        if self.redis.get(CONTROLLER) == owner.encode():
            self.redis.pexpire(CONTROLLER, lease_ms)
            return True
        return False

    # -- dynamic broker configs (KIP-73 throttle rates) ---------------------------------------
    # Region owned by the throttle work (docs/design/reassignment.md section 6); its key and Lua
    # script are at the end of the module.
    def broker_configs(self) -> dict[str, dict[str, str]]:
        """Every stored dynamic broker config: broker id as a string ("" = the cluster default)
        -> its keys; brokers with none are absent."""
        return {k.decode(): json.loads(v) for k, v in self.redis.hgetall(BROKER_CONFIGS).items()}

    def broker_config(self, broker: str) -> dict[str, str]:
        """The dynamic configs set on ``broker`` itself ("" = the cluster default); {} for none."""
        raw = self.redis.hget(BROKER_CONFIGS, broker)
        return dict(json.loads(raw)) if raw else {}

    def effective_broker_config(self, broker_id: int) -> dict[str, str]:
        """What applies to ``broker_id``: the cluster default overridden by its own keys (one
        round trip; a replica reads this on every metadata event)."""
        default, own = self.redis.hmget(BROKER_CONFIGS, ["", str(broker_id)])
        return {**(json.loads(default) if default else {}), **(json.loads(own) if own else {})}

    def update_broker_config(self, broker: str, change: Callable[[dict[str, str]], dict[str, str]], *,
                             dry_run: bool = False) -> dict[str, str]:
        """Set ``broker``'s dynamic configs ("" = the cluster default) to ``change(current)``;
        returns them as written. A compare-and-set on the stored entry, retried when another
        writer got in between (``change`` is called again); an empty result removes the entry. The
        write bumps the metadata version and publishes it, so replicas re-read their rates.
        ``change`` may raise (nothing is written); ``dry_run`` computes without writing."""
        script = self.redis.register_script(_CAS_BROKER_CONFIG)
        for _ in range(20):
            raw = self.redis.hget(BROKER_CONFIGS, broker)
            current = dict(json.loads(raw)) if raw else {}
            updated = dict(change(dict(current)))
            if dry_run or updated == current:
                return updated
            encoded = json.dumps(updated, sort_keys=True) if updated else ""
            if script(keys=[BROKER_CONFIGS, VERSION, METADATA_CHANNEL], args=[broker, raw or "", encoded]):
                return updated
        raise RequestTimedOut(f"broker config {broker or '<default>'!s}: changed under too many concurrent writers; "
                              "retry")


def decode_event(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


# -- dynamic broker configs (KIP-73 throttle rates; MetadataStore.broker_configs) ----------------
BROKER_CONFIGS = "lowtide:broker_configs"

# Replace one broker's entry if it is still what the caller read ("" = absent); an empty new value
# removes it; bump the version; publish.
_CAS_BROKER_CONFIG = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', KEYS[3], v)
return 1
"""


__all__ = ["MetadataStore", "assign_replicas", "validate_topic_name", "METADATA_CHANNEL", "json"]
