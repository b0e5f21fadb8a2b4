"""Kafka's key rule for compacted topics, checked by the core log on every append.

Why a module of its own in the core: ``PartitionLog.append_as_leader`` refuses a keyless record
on a compacted topic whether or not a cleaner runs, and the core log must not import the log
cleaner (``lowtide/log/cleaner/``), which imports the log.
"""

from __future__ import annotations

from lowtide.errors import InvalidRecord
from lowtide.record.columns import columnize

_ALL_OFFSETS = (1 << 63) - 1


def require_keys(buf: bytes | bytearray | memoryview, *, topic_partition: str) -> None:
    """Kafka's ``LogValidator.validateKey`` for a compacted topic: raise InvalidRecord (INVALID_RECORD)
    if any record of ``buf`` (validated batches) has a null key.

    One C call over the batches (no per-record Python); CRCs are not checked again.
    """
    cols = columnize(buf, min_offset=0, max_offset=_ALL_OFFSETS, with_headers=False, verify_crc=False)
    if cols.keys.null_count:
        raise InvalidRecord(f"Compacted topic cannot accept message without key in topic partition "
                            f"{topic_partition}.")
