"""Defaults of topic and broker configs: what a topic gets for a key it does not set, and the
broker-level settings Kafka's tools ask a broker about. Plain data, shared by the front door
(validation, AlterConfigs) and the Kafka listener (DescribeConfigs).

The values are lowtide's own defaults (``LogConfig``, ``CompactionConfig``,
``ConsumedRetentionConfig``, ``ReplicaConfig``, the front door's CreateTopics defaults; unit tests
check they agree) and Kafka's for the keys lowtide validates but does not act on
(compression.type, flush.*, ...). A replica started with ``--config KEY=VALUE`` overrides the
topic defaults for the partitions it hosts; that is not visible here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lowtide.messages.admin import BROKER_RESOURCE_PREFIX

LONG_MAX = str(2**63 - 1)

# Topic key -> its default.
# KIP-1150's / Inkless's creation-time switch for a diskless topic (frontdoor/admin/topic_config.py).
DISKLESS_ENABLE = "diskless.enable"
# Read-only, shown by DescribeConfigs of a diskless topic (so by ``kafka-topics --describe``):
# each partition's coordinator shard as partition:shard pairs ("0:1,1:0,2:1"), the form of Kafka's
# ``leader.replication.throttled.replicas``. Never stored in the config.
DISKLESS_SHARDS = "diskless.coordinator.shards"


def format_diskless_shards(shards: Iterable[int]) -> str:
    """``DISKLESS_SHARDS``'s value: "partition:shard" pairs in partition order."""
    return ",".join(f"{p}:{s}" for p, s in enumerate(shards))

TOPIC_CONFIG_DEFAULTS: Mapping[str, str] = {
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "segment.bytes": "1073741824",
    "segment.ms": "604800000",
    "segment.index.bytes": "10485760",
    "segment.jitter.ms": "0",
    "min.insync.replicas": "1",
    "max.message.bytes": "1048588",
    "delete.retention.ms": "86400000",
    "file.delete.delay.ms": "0",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": LONG_MAX,
    "message.timestamp.type": "CreateTime",
    "message.timestamp.difference.max.ms": LONG_MAX,
    "flush.messages": LONG_MAX,
    "flush.ms": LONG_MAX,
    "index.interval.bytes": "4096",
    "preallocate": "false",
    "unclean.leader.election.enable": "false",
    "consumed.retention.ms": "-1",
    "consumed.retention.groups": "",
    "consumed.retention.mode": "all",
    "consumed.retention.group.inactive.ms": "-1",
    # KIP-73 replication throttles: which replicas of the topic the broker rates apply to
    # ("*" or "partition:broker,..."; empty = none), read by replica/quota.py.
    "leader.replication.throttled.replicas": "",
    "follower.replication.throttled.replicas": "",
}

# The broker-level key Kafka derives each topic key's default from (its synonym).
BROKER_SYNONYMS: Mapping[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "min.insync.replicas": "min.insync.replicas",
    "max.message.bytes": "message.max.bytes",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "message.timestamp.type": "log.message.timestamp.type",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "preallocate": "log.preallocate",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

# What CreateTopics gets for -1 partitions, and the cap of its default replication factor, which
# is min(this, live brokers) (frontdoor/admin/admin.py).
DEFAULT_NUM_PARTITIONS = 1
DEFAULT_MAX_REPLICATION_FACTOR = 3

# Broker-wide keys with no topic counterpart (ReplicaConfig's and the cleaner's defaults).
BROKER_ONLY_DEFAULTS: Mapping[str, str] = {
    "num.partitions": str(DEFAULT_NUM_PARTITIONS),
    "auto.create.topics.enable": "false",
    "delete.topic.enable": "true",
    "log.cleaner.enable": "true",
    "log.cleaner.backoff.ms": "15000",
    "log.retention.check.interval.ms": "5000",
    "producer.id.expiration.ms": "86400000",
    "producer.id.expiration.check.interval.ms": "600000",
    "replica.lag.time.max.ms": "10000",
}


def broker_config_defaults(*, live_brokers: int) -> dict[str, str]:
    """The settings a lowtide broker runs with unless its replica was started with other flags:
    the topic defaults under their broker names, plus the broker-wide keys."""
    configs = {broker: TOPIC_CONFIG_DEFAULTS[topic] for topic, broker in BROKER_SYNONYMS.items()}
    configs.update(BROKER_ONLY_DEFAULTS)
    configs["default.replication.factor"] = str(max(1, min(DEFAULT_MAX_REPLICATION_FACTOR, live_brokers)))
    return configs


# -- dynamic broker configs (KIP-73 throttle rates) ---------------------------------------------
# The only broker keys that change at run time: set per broker id or cluster-wide (the default,
# Kafka's resource name ""), stored in Redis (MetadataStore.broker_configs), read by each replica's
# quota watcher (replica/quota.py). Bytes per second; unset = unlimited (Kafka's Long.MAX_VALUE).
LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
# Kafka's tool deletes this one on --verify; lowtide has one data directory per broker (no
# log-dir moves), so deleting it is accepted and does nothing, and setting it is refused.
ALTER_LOG_DIRS_RATE = "replica.alter.log.dirs.io.max.bytes.per.second"
DYNAMIC_BROKER_CONFIGS = frozenset({LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE})
DYNAMIC_BROKER_CONFIG_DEFAULTS: Mapping[str, str] = {
    LEADER_THROTTLED_RATE: LONG_MAX, FOLLOWER_THROTTLED_RATE: LONG_MAX, ALTER_LOG_DIRS_RATE: LONG_MAX}

# Admin.AlterConfigs names topics; a broker resource (Kafka's ConfigResource type BROKER) is
# named "broker:<id>", and "broker:" is the cluster-wide default (lowtide.messages.admin, which the
# client shares).


def broker_resource(broker: str) -> str:
    """The AlterConfigs resource name of broker ``broker`` (its id, or "" for the default)."""
    return BROKER_RESOURCE_PREFIX + broker


def parse_broker_resource(name: str) -> str | None:
    """The broker ("" = default) an AlterConfigs resource name refers to, or None for a topic."""
    return name[len(BROKER_RESOURCE_PREFIX):] if name.startswith(BROKER_RESOURCE_PREFIX) else None
