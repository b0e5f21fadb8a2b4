"""Kafka's default partitioner for keyed records: ``toPositive(murmur2(key)) % partitions``.

Same hash as ``org.apache.kafka.common.utils.Utils.murmur2`` (seed 0x9747b28c), so a key lands on
the same partition number in lowtide as in Kafka. The hash itself lives with the record codec
(``lowtide.record.columns``: C, with a Python twin), which also routes whole Arrow columns at once.
"""

from __future__ import annotations

from lowtide.record.columns import murmur2

__all__ = ["murmur2", "partition_for_key"]


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's ``Utils.toPositive(Utils.murmur2(key)) % numPartitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
