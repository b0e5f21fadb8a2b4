"""Validation of topic configs: Kafka's topic-level keys plus lowtide's KIP-68 keys.

Unknown keys and bad values raise INVALID_CONFIG naming the key (and the value), as Kafka's
``LogConfig.validate`` does, so a typo never silently creates a topic with default retention.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from lowtide.errors import InvalidConfig

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
}


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
        out[key] = value.replace(" ", "") if key == "cleanup.policy" else value
    return out
