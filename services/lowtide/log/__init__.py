"""lowtide storage engine: segments, partition logs, checkpoint files (the batch codec is
``lowtide.record``).

Layers: index / segment (one segment's files) -> segment_set (ordered segments)
-> partition_log (offsets, retention, the lock). File names live only in ``filenames``.
"""

from lowtide.log.checkpoint import CheckpointFile
from lowtide.log.index import OffsetIndex, TimeIndex
from lowtide.log.partition_log import AppendInfo, LogConfig, PartitionLog
from lowtide.log.segment import LogSegment
from lowtide.log.segment_set import SegmentSet

__all__ = [
    "AppendInfo",
    "CheckpointFile",
    "LogConfig",
    "LogSegment",
    "OffsetIndex",
    "PartitionLog",
    "SegmentSet",
    "TimeIndex",
]
