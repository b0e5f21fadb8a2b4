"""Topic configs: validation (Kafka's topic-level keys plus lowtide's KIP-68 keys), their
defaults, and the semantics of changing them (Kafka's IncrementalAlterConfigs / AlterConfigs).

Unknown keys and bad values raise INVALID_CONFIG naming the key (and the value), as Kafka's
``LogConfig.validate`` does, so a typo never silently creates a topic with default retention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from lowtide.errors import InvalidConfig, InvalidRequest
from lowtide.messages.admin import ConfigOp, ConfigOpType
from lowtide.metadata.config_defaults import (
    DISKLESS_ENABLE,
    DISKLESS_SHARDS,
    TOPIC_CONFIG_DEFAULTS,
    format_diskless_shards,
)

CLEANUP_POLICIES = frozenset({"delete", "compact", "compact,delete", "delete,compact"})
TIMESTAMP_TYPES = frozenset({"CreateTime", "LogAppendTime"})
# lowtide's record codec writes none and gzip; "producer" keeps what the producer sent.
COMPRESSION_TYPES = frozenset({"producer", "uncompressed", "gzip"})
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _integer(*, minimum: int, maximum: int = INT64_MAX) -> Callable[[str], None]:
    def check(value: str) -> None:
        try:
            number = int(value.strip())
        except ValueError:
            raise ValueError("must be an integer") from None
        if not minimum <= number <= maximum:
            raise ValueError(f"must be between {minimum} and {maximum}")
    return check


def _ratio(value: str) -> None:
    try:
        number = float(value)
    except ValueError:
        raise ValueError("must be a number") from None
    if not 0.0 <= number <= 1.0:
        raise ValueError("must be between 0 and 1")


def _one_of(choices: frozenset[str]) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value.replace(" ", "") not in choices:
            raise ValueError(f"must be one of {', '.join(sorted(choices))}")
    return check


def _boolean(value: str) -> None:
    if value.lower() not in ("true", "false"):
        raise ValueError("must be true or false")


def _group_list(value: str) -> None:
    if any(not g.strip() for g in value.split(",")):
        raise ValueError("must be a comma-separated list of group ids with no empty entries")


def _throttled_replicas(value: str) -> None:
    # Kafka's ThrottledReplicaListValidator: "*" alone, or partition:broker entries (may be empty).
    entries = [e.strip() for e in value.split(",")]
    if entries == ["*"] or entries == [""]:
        return
    for entry in entries:
        partition, sep, broker = entry.partition(":")
        if not (sep and partition.strip().isdigit() and broker.strip().isdigit()):
            raise ValueError("must be * or a comma-separated list of partition:broker entries (e.g. 0:1,0:2), "
                             f"not {entry!r}")


TOPIC_CONFIG_VALIDATORS: Mapping[str, Callable[[str], None]] = {
    "cleanup.policy": _one_of(CLEANUP_POLICIES),
    "compression.type": _one_of(COMPRESSION_TYPES),
    "retention.ms": _integer(minimum=-1),
    "retention.bytes": _integer(minimum=-1),
    "segment.bytes": _integer(minimum=14, maximum=INT32_MAX),
    "segment.ms": _integer(minimum=1),
    "segment.index.bytes": _integer(minimum=4, maximum=INT32_MAX),
    "segment.jitter.ms": _integer(minimum=0),
    "min.insync.replicas": _integer(minimum=1, maximum=INT32_MAX),
    "max.message.bytes": _integer(minimum=0, maximum=INT32_MAX),
    "delete.retention.ms": _integer(minimum=0),
    "file.delete.delay.ms": _integer(minimum=0),
    "min.cleanable.dirty.ratio": _ratio,
    "min.compaction.lag.ms": _integer(minimum=0),
    "max.compaction.lag.ms": _integer(minimum=1),
    "message.timestamp.type": _one_of(TIMESTAMP_TYPES),
    "message.timestamp.difference.max.ms": _integer(minimum=0),
    "flush.messages": _integer(minimum=1),
    "flush.ms": _integer(minimum=0),
    "index.interval.bytes": _integer(minimum=0, maximum=INT32_MAX),
    "preallocate": _boolean,
    "unclean.leader.election.enable": _boolean,
    # KIP-68 consumed retention.
    "consumed.retention.ms": _integer(minimum=-1),
    "consumed.retention.groups": _group_list,
    # all = every group must have consumed it (min); any = the furthest group has (max).
    "consumed.retention.mode": _one_of(frozenset({"all", "any"})),
    # A group with no commit on the topic for this long stops holding data back; -1 = never.
    "consumed.retention.group.inactive.ms": _integer(minimum=-1),
    # KIP-73: the replicas the broker's leader / follower throttle rates apply to (replica/quota.py).
    "leader.replication.throttled.replicas": _throttled_replicas,
    "follower.replication.throttled.replicas": _throttled_replicas,
}


# Lists stored without spaces, as replicas parse them ("compact, delete" is "compact,delete").
_SPACELESS = frozenset({"cleanup.policy", "leader.replication.throttled.replicas",
                        "follower.replication.throttled.replicas"})


def validate_topic_config(config: Mapping[str, str]) -> dict[str, str]:
    """Return the config with values stripped, or raise InvalidConfig naming the bad key."""
    out: dict[str, str] = {}
    for key, value in config.items():
        check = TOPIC_CONFIG_VALIDATORS.get(key)
        if check is None:
            raise InvalidConfig(f"unknown topic config '{key}'")
        value = value.strip()
        try:
            check(value)
        except ValueError as exc:
            raise InvalidConfig(f"invalid value {value!r} for topic config '{key}': {exc}") from None
        out[key] = value.replace(" ", "") if key in _SPACELESS else value
    return out


# Kafka's LIST-typed topic configs (and lowtide's list of groups): the ones APPEND and SUBTRACT apply to.
LIST_CONFIGS = frozenset({"cleanup.policy", "consumed.retention.groups", "leader.replication.throttled.replicas",
                          "follower.replication.throttled.replicas"})

# What a diskless topic acts on: its coordinator shard runs time/size retention by cleanup.policy
# delete, and its produce path checks max.message.bytes. Segments, compaction, ISR and KIP-68
# broker-side retention have no diskless counterpart, so changing those keys would only mislead.
DISKLESS_CONFIGS = frozenset({"retention.ms", "retention.bytes", "cleanup.policy", "max.message.bytes"})


# KIP-1150's and Inkless's topic config: ``diskless.enable=true`` at creation makes a diskless
# topic, so Kafka's own tools and admin clients (kafka-topics, Terraform, KafkaTopic resources)
# can make one. It is not stored with the topic's config: the topic's ``diskless`` flag is the
# record, and DescribeConfigs shows it from there. It can never change on an existing topic.


def _diskless_enable_value(value: str) -> bool:
    flag = value.strip().lower()
    if flag not in ("true", "false"):
        raise InvalidConfig(f"invalid value {value.strip()!r} for topic config '{DISKLESS_ENABLE}': must be true "
                            "or false")
    return flag == "true"


def take_diskless_enable(config: Mapping[str, str], *, diskless: bool) -> tuple[bool, dict[str, str]]:
    """At creation: whether the topic is diskless (the request's flag or ``diskless.enable``), and
    the config without that key. INVALID_CONFIG for a value other than true/false, or for
    ``diskless.enable=false`` beside a request that asks for a diskless topic."""
    rest = dict(config)
    if DISKLESS_ENABLE not in rest:
        return diskless, rest
    enabled = _diskless_enable_value(rest.pop(DISKLESS_ENABLE))
    if diskless and not enabled:
        raise InvalidConfig(f"{DISKLESS_ENABLE}=false contradicts the request's diskless flag")
    return diskless or enabled, rest


def drop_unchanged_diskless_enable(ops: Iterable[ConfigOp], *, diskless: bool, topic: str,
                                   shards: Sequence[int] = ()) -> list[ConfigOp]:
    """An alteration's ops without those on ``diskless.enable`` and the read-only
    ``diskless.coordinator.shards`` that keep the topic as it is (a tool that sends back every
    described config); INVALID_CONFIG for one that would change it."""
    kept = []
    for o in ops:
        if o.key == DISKLESS_SHARDS:
            shown = format_diskless_shards(shards) if diskless else None
            kind = _op_type(o)
            if not ((kind is ConfigOpType.SET and o.value is not None and o.value.strip() == shown)
                    or (kind is ConfigOpType.DELETE and shown is None)):
                raise InvalidConfig(f"{DISKLESS_SHARDS} is read-only: the front door placed the partitions of "
                                    f"'{topic}' on coordinator shards when it was created")
            continue
        if o.key != DISKLESS_ENABLE:
            kept.append(o)
            continue
        kind = _op_type(o)
        unchanged = ((kind is ConfigOpType.SET and o.value is not None and _diskless_enable_value(o.value) == diskless)
                     or (kind is ConfigOpType.DELETE and not diskless))
        if not unchanged:
            raise InvalidConfig(f"{DISKLESS_ENABLE} cannot be changed on an existing topic: '{topic}' is "
                                f"{'diskless' if diskless else 'not diskless'} for its whole life; create another "
                                f"topic with {DISKLESS_ENABLE}={'false' if diskless else 'true'} and move the data")
    return kept


def _op_type(o: ConfigOp) -> ConfigOpType:
    try:
        return ConfigOpType(o.op)
    except ValueError:
        raise InvalidRequest(f"config '{o.key}': unknown operation {o.op} (SET 0, DELETE 1, APPEND 2, "
                             "SUBTRACT 3)") from None


def _as_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def apply_config_ops(current: Mapping[str, str], ops: Iterable[ConfigOp], *, replace: bool = False) -> dict[str, str]:
    """The topic config after ``ops``, validated; raises and changes nothing on any bad op.

    Kafka's IncrementalAlterConfigs: SET sets, DELETE returns the key to its default (deleting a
    key that is not set is fine, an unknown key is not), APPEND/SUBTRACT add/remove items of a
    list config starting from its current value, else its default (duplicates dropped).
    ``replace`` is the legacy AlterConfigs: the SET ops are the whole config.
    Errors: a key given twice, a missing value, or a non-SET op with ``replace`` -> INVALID_REQUEST
    (Kafka's answers); an unknown key, a bad value, APPEND/SUBTRACT on a non-list key -> INVALID_CONFIG.
    """
    typed = [(o, _op_type(o)) for o in ops]
    seen: set[str] = set()
    for o, kind in typed:
        if o.key in seen:
            raise InvalidRequest(f"config '{o.key}' is given more than once")
        seen.add(o.key)
        if kind is not ConfigOpType.DELETE and o.value is None:
            raise InvalidRequest(f"config '{o.key}': {kind.name} needs a value")
        if replace and kind is not ConfigOpType.SET:
            raise InvalidRequest(f"config '{o.key}': AlterConfigs replaces the whole config; use "
                                 f"IncrementalAlterConfigs for {kind.name}")
    config: dict[str, str] = {} if replace else dict(current)
    for o, kind in typed:
        if o.key not in TOPIC_CONFIG_VALIDATORS:
            raise InvalidConfig(f"unknown topic config '{o.key}'")
        if kind is ConfigOpType.SET:
            config[o.key] = str(o.value)
        elif kind is ConfigOpType.DELETE:
            config.pop(o.key, None)
        else:
            if o.key not in LIST_CONFIGS:
                raise InvalidConfig(f"{kind.name} applies to list configs only ({', '.join(sorted(LIST_CONFIGS))}), "
                                    f"not '{o.key}'")
            items = _as_list(config.get(o.key, TOPIC_CONFIG_DEFAULTS[o.key]))
            given = _as_list(str(o.value))
            items = list(dict.fromkeys(items + given)) if kind is ConfigOpType.APPEND else [
                i for i in items if i not in given]
            if not items and not TOPIC_CONFIG_DEFAULTS[o.key]:
                config.pop(o.key, None)  # an empty list whose default is empty: the default
            else:
                config[o.key] = ",".join(items)
    return validate_topic_config(config)


def check_diskless_config_change(old: Mapping[str, str], new: Mapping[str, str]) -> None:
    """INVALID_CONFIG when ``new`` sets or changes a key a diskless topic does not act on, or
    asks for compaction; removing any key is allowed (it may predate this check)."""
    changed = sorted(k for k, v in new.items() if old.get(k) != v and k not in DISKLESS_CONFIGS)
    if changed:
        raise InvalidConfig(f"{', '.join(changed)} has no effect on a diskless topic (it acts on "
                            f"{', '.join(sorted(DISKLESS_CONFIGS))} only)")
    if "compact" in _as_list(new.get("cleanup.policy", "delete")):
        raise InvalidConfig("a diskless topic cannot be compacted: cleanup.policy must be delete")
