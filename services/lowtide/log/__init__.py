"""lowtide storage engine: RecordBatch v2 codec, segments, partition logs, checkpoint files.

Layers: records (bytes) -> index / segment (one segment's files) -> segment_set (ordered segments)
-> partition_log (offsets, retention, the lock). File names live only in ``filenames``.
"""

from lowtide.log.checkpoint import CheckpointFile
from lowtide.log.index import OffsetIndex, TimeIndex
from lowtide.log.partition_log import AppendInfo, LogConfig, PartitionLog
from lowtide.log.records import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchBuilder,
    BatchHeader,
    Compression,
    Record,
    assign_offsets,
    crc32c,
    decode_batch,
    decode_batches,
    encode_batch,
    iter_batches,
    read_header,
    validate_batches,
)
from lowtide.log.segment import LogSegment
from lowtide.log.segment_set import SegmentSet

__all__ = [
    "BATCH_HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "AppendInfo",
    "BatchBuilder",
    "BatchHeader",
    "CheckpointFile",
    "Compression",
    "LogConfig",
    "LogSegment",
    "OffsetIndex",
    "PartitionLog",
    "Record",
    "SegmentSet",
    "TimeIndex",
    "assign_offsets",
    "crc32c",
    "decode_batch",
    "decode_batches",
    "encode_batch",
    "iter_batches",
    "read_header",
    "validate_batches",
]
