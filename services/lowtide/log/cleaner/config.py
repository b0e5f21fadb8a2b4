"""What the cleaner is configured by: topic configs (per log) and broker settings (per process).

Topic keys (Kafka's names and defaults). ``cleanup.policy``, ``delete.retention.ms``,
``segment.bytes``, ``segment.ms`` and ``index.interval.bytes`` are read from the log's own
``LogConfig``; the three keys only the cleaner uses are parsed here::

    min.cleanable.dirty.ratio   0.5     clean when dirty bytes / (clean + dirty bytes) > this
    min.compaction.lag.ms       0       a record younger than this is never compacted
    max.compaction.lag.ms       2^63-1  a dirty record older than this is compacted whatever the ratio

Broker keys (the replica's ``--config KEY=VALUE``; Kafka's names)::

    log.cleaner.enable                    true     no cleaner thread when false
    log.cleaner.io.max.bytes.per.second   inf      bytes read + written per second, all logs
    log.cleaner.backoff.ms                15000    idle re-check period (delete horizons and
                                                   segment rolls wake the thread on time anyway)
    log.cleaner.io.buffer.size            1 MiB    read window (grows to fit a larger batch)
    log.cleaner.dedupe.buffer.size        128 MiB  memory for the key -> offset map of one pass

Why the dedupe size is an estimate: Kafka's map is a fixed array of 24-byte slots (16-byte MD5
of the key + offset); here it is a dict of the keys themselves (no hash collisions to reason about),
so its size is estimated as ``entries * (MAP_ENTRY_OVERHEAD + average key length)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from lowtide.errors import InvalidConfig
from lowtide.log.log_config import parse_config_int

LONG_MAX = 2**63 - 1
# CPython: dict slot + hash/key/value (~40 bytes at 2/3 load), a bytes object's header (33), an int
# offset (32): what one key -> offset entry costs besides the key's own bytes.
MAP_ENTRY_OVERHEAD = 110


def _integer(config: Mapping[str, str], key: str, default: int, minimum: int) -> int:
    raw = config.get(key)
    return default if raw is None else parse_config_int(key, raw, minimum)


def _number(config: Mapping[str, str], key: str, default: float, minimum: float, maximum: float) -> float:
    raw = config.get(key)
    if raw is None:
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise InvalidConfig(f"{key} must be a number, got {raw!r}") from None
    if math.isnan(value) or not minimum <= value <= maximum:
        raise InvalidConfig(f"{key} must be between {minimum} and {maximum}, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """The topic-level knobs of compaction that ``LogConfig`` does not carry."""

    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX

    @classmethod
    def from_topic_config(cls, config: Mapping[str, str]) -> CompactionConfig:
        """From Kafka topic config strings (other keys are ignored). Raises InvalidConfig naming
        the key for a bad value (the front door refuses those first; this guards broker defaults)."""
        return cls(
            min_cleanable_dirty_ratio=_number(config, "min.cleanable.dirty.ratio", 0.5, 0.0, 1.0),
            min_compaction_lag_ms=_integer(config, "min.compaction.lag.ms", 0, 0),
            max_compaction_lag_ms=_integer(config, "max.compaction.lag.ms", LONG_MAX, 1),
        )


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """Broker-level settings of the cleaner (one per replica process)."""

    enabled: bool = True
    io_max_bytes_per_second: float = math.inf
    backoff_ms: int = 15000
    io_buffer_size: int = 1 << 20
    dedupe_buffer_size: int = 128 << 20

    @classmethod
    def from_broker_config(cls, config: Mapping[str, str]) -> CleanerSettings:
        """From the replica's ``--config`` pairs (``log.cleaner.*``; other keys are ignored)."""
        enable = str(config.get("log.cleaner.enable", "true")).strip().lower()
        if enable not in ("true", "false"):
            raise InvalidConfig(f"log.cleaner.enable must be true or false, got {enable!r}")
        return cls(
            enabled=enable == "true",
            io_max_bytes_per_second=_number(config, "log.cleaner.io.max.bytes.per.second", math.inf, 1.0,
                                            math.inf),
            backoff_ms=_integer(config, "log.cleaner.backoff.ms", 15000, 1),
            io_buffer_size=_integer(config, "log.cleaner.io.buffer.size", 1 << 20, 1),
            dedupe_buffer_size=_integer(config, "log.cleaner.dedupe.buffer.size", 128 << 20, 1),
        )
