"""Errors of the diskless coordinator: its own two now live in ``lowtide.errors`` (re-exported here
so older imports keep working).

The others it uses are lowtide.errors' own: UNKNOWN_TOPIC_OR_PARTITION (3), OFFSET_OUT_OF_RANGE (1),
INVALID_REQUEST (42), INVALID_PARTITIONS (37), TOPIC_ALREADY_EXISTS (36), CORRUPT_MESSAGE (2),
UNSUPPORTED_FOR_MESSAGE_FORMAT (43), OUT_OF_ORDER_SEQUENCE_NUMBER (45), INVALID_PRODUCER_EPOCH (47),
COORDINATOR_LOAD_IN_PROGRESS (14) while a shard leader is still reading its metadata log.
"""

from __future__ import annotations

from lowtide.errors import NotCoordinator, UnknownTopicId

__all__ = ["NotCoordinator", "UnknownTopicId"]
