"""Per-partition results the front door's domain code returns (plain data, no protobuf).

Errors travel as ``(error_code, error_message)`` pairs with Kafka's codes, exactly as they do in the
responses: a per-partition failure is data, not an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.errors import LowtideError

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    """One partition's ListOffsets result; ``offset`` is -1 when nothing matches or on error."""

    topic: str
    partition: int
    error_code: int = 0
    error_message: str = ""
    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1

    @classmethod
    def failed(cls, topic: str, partition: int, error: LowtideError) -> OffsetAnswer:
        return cls(topic=topic, partition=partition, error_code=error.code, error_message=error.message)


@dataclass(frozen=True, slots=True)
class DeleteAnswer:
    """One partition's DeleteRecords result (KIP-107): the low watermark, or -1 with an error."""

    topic: str
    partition: int
    low_watermark: int = -1
    error_code: int = 0
    error_message: str = ""

    @classmethod
    def failed(cls, topic: str, partition: int, error: LowtideError) -> DeleteAnswer:
        return cls(topic=topic, partition=partition, low_watermark=-1, error_code=error.code,
                   error_message=error.message)
