"""OffsetForLeaderEpoch, DescribeTopicPartitions and the ACL APIs over the Kafka protocol.

Filled in by issue 34's client-surface work.
"""

from __future__ import annotations

from lowtide.kafka.broker import Api

APIS: list[Api] = []
