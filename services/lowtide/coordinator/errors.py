"""Errors of the diskless coordinator that lowtide.errors does not define yet (to move there).

The others it uses are lowtide.errors' own: UNKNOWN_TOPIC_OR_PARTITION (3), OFFSET_OUT_OF_RANGE (1),
INVALID_REQUEST (42), INVALID_PARTITIONS (37), TOPIC_ALREADY_EXISTS (36), CORRUPT_MESSAGE (2),
UNSUPPORTED_FOR_MESSAGE_FORMAT (43), OUT_OF_ORDER_SEQUENCE_NUMBER (45), INVALID_PRODUCER_EPOCH (47).
"""

from __future__ import annotations

from lowtide.errors import InvalidMetadataError, RetriableError


class NotCoordinator(RetriableError):
    # Kafka: this broker is not (or no longer) the coordinator for the key; find it again, retry.
    code, name = 16, "NOT_COORDINATOR"


class UnknownTopicId(InvalidMetadataError):
    # Kafka (KIP-516): no topic has this id here; the caller's metadata is stale.
    code, name = 100, "UNKNOWN_TOPIC_ID"
