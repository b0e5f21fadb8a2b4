"""Group configs (Kafka's ConfigResource type GROUP, KIP-848/KIP-932): per-group settings an admin
sets with ``kafka-configs --entity-type groups`` or ``Admin.incrementalAlterConfigs``, as Kafka 4's
``GroupConfig`` defines them. Kafka's own share consumer tools set ``share.auto.offset.reset`` this
way (VerifiableShareConsumer, ShareConsumerPerformance, kafka-console-share-consumer).

This module is the keys, their checks and the resource naming, shared by servers and clients.
They are stored in the cluster metadata (``metadata/group_configs.py``), and read from each
process's metadata image: the replicas leading share-partitions read a group's keys when they load
one of its share-partitions and when a member opens a share session of it; the front door's share
group coordinator reads its timeouts at each heartbeat. A group's configs outlive the group (as in
Kafka, they are the admin's, not the group's) until deleted key by key.

Keys (``GROUP_CONFIG_KEYS``) and what acts on them here:

* ``share.auto.offset.reset`` (latest|earliest): where a share-partition with no state starts;
* ``share.record.lock.duration.ms``: the acquisition lock of the group's records;
* ``share.session.timeout.ms``, ``share.heartbeat.interval.ms``: its members' liveness;
* ``share.isolation.level`` (read_uncommitted|read_committed): read_committed share groups acquire
  records only below the last stable offset and never deliver those of aborted transactions;
* ``consumer.session.timeout.ms``, ``consumer.heartbeat.interval.ms``: accepted and stored (they
  are the KIP-848 consumer protocol's, which this cluster does not serve yet).

Any other key is INVALID_CONFIG, as in Kafka; values are checked before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lowtide.errors import InvalidConfig, InvalidRequest
from lowtide.messages.admin import ConfigOp, ConfigOpType

GROUP_RESOURCE_PREFIX = "group:"

SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_RECORD_LOCK_DURATION_MS = "share.record.lock.duration.ms"
SHARE_SESSION_TIMEOUT_MS = "share.session.timeout.ms"
SHARE_HEARTBEAT_INTERVAL_MS = "share.heartbeat.interval.ms"
SHARE_ISOLATION_LEVEL = "share.isolation.level"
READ_COMMITTED = "read_committed"


def _milliseconds(low: int, high: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not value.strip().isdigit() or not low <= int(value) <= high:
            raise ValueError(f"must be a whole number of milliseconds in [{low}, {high}]")
        return str(int(value))
    return check


def _one_of(*allowed: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.strip().lower() not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return value.strip().lower()
    return check


@dataclass(frozen=True)
class GroupConfigKey:
    """One key: its default (what DescribeConfigs shows when unset) and its validator (returns the
    value as stored, or raises ValueError saying what is allowed)."""

    name: str
    default: str
    check: Callable[[str], str]


GROUP_CONFIG_KEYS: dict[str, GroupConfigKey] = {k.name: k for k in (
    GroupConfigKey(SHARE_AUTO_OFFSET_RESET, "latest", _one_of("latest", "earliest")),
    GroupConfigKey(SHARE_RECORD_LOCK_DURATION_MS, "30000", _milliseconds(1_000, 3_600_000)),
    GroupConfigKey(SHARE_SESSION_TIMEOUT_MS, "45000", _milliseconds(1_000, 3_600_000)),
    GroupConfigKey(SHARE_HEARTBEAT_INTERVAL_MS, "5000", _milliseconds(100, 3_600_000)),
    GroupConfigKey(SHARE_ISOLATION_LEVEL, "read_uncommitted", _one_of("read_uncommitted", "read_committed")),
    GroupConfigKey("consumer.session.timeout.ms", "45000", _milliseconds(1_000, 3_600_000)),
    GroupConfigKey("consumer.heartbeat.interval.ms", "5000", _milliseconds(100, 3_600_000)),
)}


def group_resource(group_id: str) -> str:
    """The AlterConfigs resource name of a group's configs (beside topics and ``broker:<id>``)."""
    return GROUP_RESOURCE_PREFIX + group_id


def parse_group_resource(name: str) -> str | None:
    """The group an AlterConfigs resource name refers to, or None for another resource."""
    return name[len(GROUP_RESOURCE_PREFIX):] if name.startswith(GROUP_RESOURCE_PREFIX) else None


def apply_group_config_ops(current: Mapping[str, str], ops: Sequence[ConfigOp], *,
                           replace: bool = False) -> dict[str, str]:
    """``current`` after ``ops`` (SET or DELETE; ``replace``: the SETs are the whole new config).
    Raises INVALID_CONFIG (an unknown key, a bad value, APPEND/SUBTRACT: no group key is a list)
    or INVALID_REQUEST (a SET without a value); nothing is half-applied."""
    config = {} if replace else dict(current)
    for o in ops:
        spec = GROUP_CONFIG_KEYS.get(o.key)
        if spec is None:
            raise InvalidConfig(f"unknown group config '{o.key}' (group configs: {', '.join(GROUP_CONFIG_KEYS)})")
        try:
            kind = ConfigOpType(o.op)
        except ValueError:
            raise InvalidRequest(f"unknown config operation {o.op} for group config '{o.key}'") from None
        if kind is ConfigOpType.DELETE:
            config.pop(o.key, None)
            continue
        if kind is not ConfigOpType.SET:
            raise InvalidConfig(f"{kind.name} applies to list configs only, not group config '{o.key}'")
        if o.value is None:
            raise InvalidRequest(f"group config '{o.key}': SET needs a value")
        try:
            config[o.key] = spec.check(o.value)
        except ValueError as err:
            raise InvalidConfig(f"invalid value {o.value!r} for group config '{o.key}': {err}") from None
    return config
