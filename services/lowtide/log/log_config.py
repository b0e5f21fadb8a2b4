"""Per-topic log settings (``LogConfig``): Kafka's topic config names and defaults, parsed from
their strings. A replica builds one per topic from its broker defaults (``--config``) and the
topic's own config (``replica/reconcile.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from lowtide.errors import InvalidConfig

_DAY_MS = 24 * 60 * 60 * 1000


def parse_config_int(key: str, raw: object, minimum: int) -> int:
    """A topic or broker config's integer value, or InvalidConfig naming ``key`` when it is not
    an integer or is below ``minimum`` (the log's and the cleaner's keys alike)."""
    try:
        number = int(str(raw).strip())
    except ValueError:
        raise InvalidConfig(f"{key} must be an integer, got {raw!r}") from None
    if number < minimum:
        raise InvalidConfig(f"{key} must be >= {minimum}, got {number}")
    return number


@dataclass(frozen=True)
class LogConfig:
    """Per-topic log settings, with Kafka's defaults and topic config names."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * _DAY_MS
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * _DAY_MS  # -1 = keep forever
    retention_bytes: int = -1  # -1 = no size limit
    cleanup_policy: str = "delete"  # "delete", "compact" or "compact,delete"
    max_message_bytes: int = 1048588
    file_delete_delay_ms: int = 0
    delete_retention_ms: int = _DAY_MS  # KIP-534 tombstone horizon, used by the cleaner
    # KIP-854: a producer with no batch for this long and no open transaction is forgotten
    # (producer_state.py). A broker setting in Kafka: a replica's --config sets it here.
    producer_id_expiration_ms: int = _DAY_MS

    # Kafka topic config key -> (field, minimum value). segment.index.bytes sizes Kafka's
    # preallocated index files; lowtide's indexes grow as needed, so it is validated and ignored.
    _KEYS = {
        "segment.bytes": ("segment_bytes", 14),
        "segment.ms": ("segment_ms", 1),
        "index.interval.bytes": ("index_interval_bytes", 0),
        "segment.index.bytes": (None, 8),
        "retention.ms": ("retention_ms", -1),
        "retention.bytes": ("retention_bytes", -1),
        "max.message.bytes": ("max_message_bytes", 0),
        "file.delete.delay.ms": ("file_delete_delay_ms", 0),
        "delete.retention.ms": ("delete_retention_ms", 0),
    }
    # Broker settings in Kafka (not topic configs), so only a replica's --config sets them.
    _BROKER_KEYS = {
        "producer.id.expiration.ms": ("producer_id_expiration_ms", 1),
    }

    @property
    def deletes(self) -> bool:
        """Whether time/size retention and DeleteRecords apply (policy includes "delete")."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def compacts(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @classmethod
    def from_topic_config(cls, config: Mapping[str, str], *, base: LogConfig | None = None) -> LogConfig:
        """Build from Kafka topic config strings; unknown keys are left to other layers.

        Raises InvalidConfig naming the key for a non-integer, out-of-range or unknown policy value.
        """
        values: dict[str, object] = {}
        for key, raw in config.items():
            if key == "cleanup.policy":
                policies = [p.strip() for p in str(raw).split(",") if p.strip()]
                if not policies or any(p not in ("delete", "compact") for p in policies):
                    raise InvalidConfig(f"cleanup.policy must be delete, compact or both, got {raw!r}")
                values["cleanup_policy"] = ",".join(policies)
                continue
            spec = cls._KEYS.get(key) or cls._BROKER_KEYS.get(key)
            if spec is None:
                continue
            field, minimum = spec
            number = parse_config_int(key, raw, minimum)
            if field is not None:
                values[field] = number
        return dataclasses.replace(base or cls(), **values)
