"""``LogStartOffsetCommit``: group commit of log start offset (LSO) durability over many logs.

Lives beside ``partition_log`` (which re-exports it) and calls back into the logs it holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lowtide.log.start_offset_file import StartOffsetSyncGroup

if TYPE_CHECKING:
    from lowtide.log.partition_log import PartitionLog


class LogStartOffsetCommit:
    """Raises the log start offsets of many logs with one flush: group commit of LSO durability.

    A DeleteRecords over many partitions, or a follower fetch answer bringing the leader's LSOs
    of many partitions, used to flush each partition's LSO file on its own (see
    start_offset_file.py). Instead: ``PartitionLog.increment_log_start_offset(offset, commit=c)``
    for each log writes the new value without a flush; ``c.commit()`` then flushes all of them
    once and only then takes each new LSO (readers see it, fetches report it, segments below it
    go), so an LSO is still durable before it can be acknowledged or reported.

    Contract: ``commit()`` returns the logs whose LSO moved, or raises KafkaStorageError when the
    flush failed: then no LSO of the commit moves (the values written may still reach the disk
    and be found on restart, as for any write that failed before it was acknowledged).
    One commit per instance; ``close()`` (or the ``with`` block) releases it without committing.

    Thread-safety: one thread adds to and commits an instance; the logs stay usable from any
    thread meanwhile (their LSO simply has not moved yet).
    """

    def __init__(self) -> None:
        self.sync_group = StartOffsetSyncGroup()
        self._pending: list[tuple[PartitionLog, int, int | None]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def __enter__(self) -> LogStartOffsetCommit:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add(self, log: PartitionLog, offset: int, sequence: int | None) -> None:
        """For PartitionLog: take ``offset`` at commit (``sequence``: its write, if it made one)."""
        self._pending.append((log, offset, sequence))

    def commit(self) -> list[PartitionLog]:
        pending, self._pending = self._pending, []
        if not pending:
            self.sync_group.close()
            return []
        self.sync_group.flush()
        return [log for log, offset, sequence in pending if log.take_committed(offset, sequence)]

    def close(self) -> None:
        self._pending = []
        self.sync_group.close()
