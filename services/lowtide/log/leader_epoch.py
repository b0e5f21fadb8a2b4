"""The leader-epoch cache of one partition replica (KIP-101, KIP-279): epoch -> start offset.

Why it exists: a replica that restarts, or becomes a follower, must drop the records the new leader
does not have, and only those. Truncating to its own high watermark is wrong both ways: the
checkpointed HW lags the leader's, so acknowledged acks=all records above it would be thrown away
(and lost for good if this replica is then elected), while records of a deposed leader's epoch past
the divergence point would be kept. Instead the follower asks the leader where its latest epoch
ends (OffsetForLeaderEpoch) and truncates to that.

File ``<partition dir>/leader-epoch-checkpoint`` (name from filenames.py), Kafka's format::

    0                      <- version (only 0 exists)
    2                      <- number of entries
    0 0                    <- epoch start_offset: the first offset written in that epoch
    3 1200

Entries are strictly increasing in both epoch and start offset. The file is replaced crash-safely
(.tmp, fsync, rename, directory fsync) on every change that matters for truncation: a new epoch
(at most once per leadership change) and truncation from the end. Moving the log start offset
only trims entries in memory (a stale entry below the LSO is harmless: a follower never truncates
below its LSO), so DeleteRecords pays no extra fsync.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from lowtide.errors import KafkaStorageError
from lowtide.log import filenames
from lowtide.log.checkpoint import CHECKPOINT_VERSION, checkpoint_body, write_file_atomically

VERSION = CHECKPOINT_VERSION  # the same file layout as checkpoint.py's (Kafka's CheckpointFile)
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    """Epoch -> start offset of one partition replica, persisted in ``leader-epoch-checkpoint``.

    Contract: ``assign`` records a new (higher) epoch; ``end_offset_for`` answers OffsetForLeaderEpoch
    with Kafka's rules; ``truncate_from_end`` forgets epochs that start at or after a truncation
    point; ``truncate_from_start`` trims below a new log start offset. ``known`` is False for a
    directory written before this file existed while it still holds data: its epochs are unknown.

    Thread-safety: none; the owning PartitionLog calls it with its lock held.
    """

    def __init__(self, path: Path, entries: list[tuple[int, int]], *, known: bool = True) -> None:
        self.path = path
        self._epochs = [e for e, _ in entries]
        self._starts = [s for _, s in entries]
        self.known = known

    # -- file ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, dir: Path, *, log_is_empty: bool) -> LeaderEpochCache:
        """Read the partition's cache; a missing file is an empty cache, ``known`` only if the log is empty."""
        path = Path(dir) / filenames.LEADER_EPOCH_CHECKPOINT
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path, [], known=log_is_empty)
        except (OSError, UnicodeDecodeError) as exc:
            raise KafkaStorageError(f"cannot read leader epoch file {path}: {exc}") from exc
        return cls(path, parse_entries(text, path=path))

    def _persist(self) -> None:
        try:
            write_file_atomically(self.path, format_entries(self.entries()).encode())
        except OSError as exc:
            raise KafkaStorageError(f"cannot write leader epoch file {self.path}: {exc}") from exc

    # -- queries --------------------------------------------------------------------------------
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, or -1 when none is known."""
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def end_offset_for(self, epoch: int, *, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= ``epoch``, where it ends) — Kafka's ``endOffsetFor``.

        The latest epoch ends at the log end offset; an older one where the next higher epoch
        starts; an epoch older than any known ends where the first known one starts (and is
        answered as itself); an epoch newer than any known, or an empty cache, is (-1, -1).
        """
        if epoch < 0 or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self._epochs[-1]:
            return epoch, log_end_offset
        higher = bisect.bisect_right(self._epochs, epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    # -- changes --------------------------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` if it is newer than every known epoch.

        Entries starting at or after ``start_offset`` are dropped first: they wrote nothing that
        survives (Kafka does the same). Returns whether the cache changed (it is then persisted).
        """
        if epoch < 0 or (self._epochs and epoch <= self._epochs[-1]):
            return False
        keep = bisect.bisect_left(self._starts, start_offset)
        del self._epochs[keep:], self._starts[keep:]
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self.known = True
        self._persist()
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Forget epochs that start at or after ``end_offset`` (the log was truncated there)."""
        keep = bisect.bisect_left(self._starts, end_offset)
        if keep == len(self._starts):
            return False
        del self._epochs[keep:], self._starts[keep:]
        self._persist()
        return True

    def truncate_from_start(self, start_offset: int) -> None:
        """Trim below a new log start offset: the entry covering it now starts there (in memory only)."""
        covering = bisect.bisect_right(self._starts, start_offset) - 1
        if covering < 0:
            return
        del self._epochs[:covering], self._starts[:covering]
        self._starts[0] = max(self._starts[0], start_offset)

    def clear_and_start(self, start_offset: int) -> None:
        """The log was emptied and restarted at ``start_offset``: keep only the latest epoch, there."""
        if self._epochs:
            latest = self._epochs[-1]
            self._epochs, self._starts = [latest], [start_offset]
            self._persist()
        self.known = True


def format_entries(entries: list[tuple[int, int]]) -> str:
    lines = [str(VERSION), str(len(entries))] + [f"{epoch} {start}" for epoch, start in entries]
    return "\n".join(lines) + "\n"


def parse_entries(text: str, *, path: Path) -> list[tuple[int, int]]:
    """Entries of a leader-epoch-checkpoint text; KafkaStorageError naming ``path`` when malformed."""
    entries: list[tuple[int, int]] = []
    for number, line in enumerate(checkpoint_body(text, what=f"leader epoch file {path}"), start=3):
        parts = line.split(" ")
        try:
            if len(parts) != 2:
                raise ValueError(line)
            epoch, start = int(parts[0]), int(parts[1])
        except ValueError:
            raise KafkaStorageError(f"leader epoch file {path} line {number} is malformed: {line!r}") from None
        if entries and (epoch <= entries[-1][0] or start < entries[-1][1]):
            raise KafkaStorageError(f"leader epoch file {path} line {number}: entries must increase, got {line!r}")
        entries.append((epoch, start))
    return entries
