"""Which leading segments time and size retention (retention.ms, retention.bytes) delete.

A pure rule over the segments' sizes, timestamps and offsets, kept apart from PartitionLog, which
holds the lock and carries the deletion out (partition_log.py ``delete_retention_segments``).
Kafka's rules (UnifiedLog.deleteRetentionMsBreachedSegments / deleteRetentionSizeBreachedSegments):
- only a prefix of the log goes, and only segments whose every offset is below the high watermark,
  so nothing a consumer may still be owed an acknowledgement for is removed;
- time: a segment goes when its newest timestamp is older than retention.ms;
- size: the oldest segments go while at least retention.bytes would remain afterwards;
- an empty active segment is never a candidate (deleting it would gain nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lowtide.log.log_config import LogConfig


class RetainedSegment(Protocol):
    """The parts of a LogSegment the rule reads."""

    @property
    def size_bytes(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def max_timestamp(self) -> int: ...


def count_segments_past_retention(segments: Sequence[RetainedSegment], *, high_watermark: int,
                                  config: LogConfig, now_ms: int) -> int:
    """How many of ``segments`` (oldest first, the last one active) retention deletes, from the front."""
    eligible = 0
    for segment in segments:
        if segment.next_offset > high_watermark or (segment is segments[-1] and segment.size_bytes == 0):
            break
        eligible += 1
    by_time = 0
    if config.retention_ms >= 0:
        while by_time < eligible and now_ms - segments[by_time].max_timestamp > config.retention_ms:
            by_time += 1
    by_size = 0
    if config.retention_bytes >= 0:
        excess = sum(s.size_bytes for s in segments) - config.retention_bytes
        while by_size < eligible and excess - segments[by_size].size_bytes >= 0:
            excess -= segments[by_size].size_bytes
            by_size += 1
    return max(by_time, by_size)
