"""``cleaner-offset-checkpoint``: where the dirty part of each compacted log begins.

One file per data directory, Kafka's checkpoint format (``log/checkpoint.py``: version 0, count,
``topic partition offset`` lines), written crash-safely (.tmp, fsync, rename, fsync dir). The
offset is a log's first dirty offset: every record below it has been through a cleaning pass
whose offset map covered it, so the next pass builds its map from there on.

An entry is a hint, never a correctness condition: an offset outside [log start offset, log end
offset] is ignored and the log treated as all dirty (Kafka does the same), so a lost or stale file
costs one extra full pass, never a wrong answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path

from lowtide.errors import KafkaStorageError
from lowtide.log.checkpoint import CheckpointFile
from lowtide.messages import TopicPartition

log = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"


class CleanerCheckpoint:
    """The first dirty offset of every cleaned log of one data directory.

    Contract: ``get`` answers from memory (the file is read once, at construction; an unreadable
    file is logged and treated as empty); ``update`` changes one entry and rewrites the file before
    it returns; ``retain`` drops the entries of logs no longer hosted at the next write.

    Thread-safety: thread-safe (one lock around the map and the file writes).
    """

    def __init__(self, data_dir: Path | str) -> None:
        self._file = CheckpointFile(Path(data_dir) / CLEANER_OFFSET_CHECKPOINT)
        self._lock = threading.Lock()
        try:
            self._offsets: dict[TopicPartition, int] = self._file.read()
        except KafkaStorageError as exc:
            log.warning("ignoring an unreadable cleaner checkpoint (every compacted log is dirty): %s", exc)
            self._offsets = {}

    @property
    def path(self) -> Path:
        return self._file.path

    def get(self, tp: TopicPartition) -> int | None:
        with self._lock:
            return self._offsets.get(tp)

    def entries(self) -> dict[TopicPartition, int]:
        with self._lock:
            return dict(self._offsets)

    def update(self, tp: TopicPartition, offset: int, *, hosted: Iterable[TopicPartition] | None = None) -> None:
        """Set ``tp``'s first dirty offset and write the file; with ``hosted``, entries of other
        partitions are dropped first (deleted or moved logs)."""
        with self._lock:
            if hosted is not None:
                keep = set(hosted) | {tp}
                self._offsets = {k: v for k, v in self._offsets.items() if k in keep}
            self._offsets[tp] = offset
            self._file.write(self._offsets)

    def remove(self, tp: TopicPartition) -> None:
        """Forget ``tp`` (its log was truncated or recreated) and write the file if it changed."""
        with self._lock:
            if self._offsets.pop(tp, None) is not None:
                self._file.write(self._offsets)
