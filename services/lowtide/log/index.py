"""Sparse per-segment indexes: offset -> file position, and timestamp -> offset.

Offset index file ``<base>.index``: fixed 8-byte entries, big-endian, appended in offset order::

    +--------------------------+--------------------------+
    | relative offset  (u32)   | position in .log  (u32)  |   relative offset = offset - base offset
    +--------------------------+--------------------------+

An entry (o, p) says: the batch starting at byte p of the .log file has last offset base + o. Every
offset above base + o lives in a batch at or after byte p.

Time index file ``<base>.timeindex``: fixed 12-byte entries, big-endian::

    +----------------------------------------------+--------------------------+
    | max timestamp so far in the segment  (i64)   | relative offset  (u32)   |
    +----------------------------------------------+--------------------------+

An entry (t, o) says: the largest timestamp up to and including the batch with last offset base + o
is t; entries are only added when t grows, so they are sorted by both fields.

Both indexes are sparse (an entry roughly every ``index_interval_bytes`` of log), unlike Kafka they are
not preallocated or memory-mapped: entries are appended to the file with os.write and mirrored in
``array`` columns for bisect lookups. They are derived data: a missing or inconsistent index is
rebuilt from the .log by the segment, so the files need no version header and no checksum.

Not thread-safe: the owning segment's caller (PartitionLog) holds the lock.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from lowtide.errors import KafkaStorageError

OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
_TIME_ENTRY = struct.Struct(">qI")
_MAX_RELATIVE = 0xFFFFFFFF


class _IndexFile:
    """The file half of an index: an append-only fd, plus truncate/flush/close/delete."""

    def __init__(self, path: Path, entry_size: int) -> None:
        self.path = path
        self._entry_size = entry_size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)

    def read_all(self) -> bytes:
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0)
        if len(data) % self._entry_size:
            raise KafkaStorageError(
                f"index file {self.path} has {len(data)} bytes, not a multiple of {self._entry_size}"
            )
        return data

    def write(self, data: bytes) -> None:
        os.write(self._fd, data)

    def truncate_entries(self, count: int) -> None:
        os.ftruncate(self._fd, count * self._entry_size)

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def rename(self, path: Path) -> None:
        os.rename(self.path, path)
        self.path = path


class OffsetIndex:
    """Sparse offset index of one segment. Contract: entries strictly increase in offset and
    position; ``lookup(o)`` returns a position at or before the batch containing o. Not thread-safe."""

    def __init__(self, path: Path, *, base_offset: int) -> None:
        self.base_offset = base_offset
        self._file = _IndexFile(path, OFFSET_ENTRY_SIZE)
        self._offsets = array("I")
        self._positions = array("I")

    @classmethod
    def open(cls, path: Path, *, base_offset: int) -> OffsetIndex:
        """Open (creating if missing) and load; raises KafkaStorageError if the file is inconsistent."""
        index = cls(path, base_offset=base_offset)
        try:
            both = array("I", index._file.read_all())
            if sys.byteorder == "little":
                both.byteswap()
            index._offsets = both[0::2]
            index._positions = both[1::2]
            for column in (index._offsets, index._positions):
                if any(column[i] >= column[i + 1] for i in range(len(column) - 1)):
                    raise KafkaStorageError(f"index file {path} entries are not increasing")
        except BaseException:
            index.close()
            raise
        return index

    @property
    def path(self) -> Path:
        return self._file.path

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """(absolute offset, position) of the last entry, or None."""
        if not self._offsets:
            return None
        return self.base_offset + self._offsets[-1], self._positions[-1]

    def append(self, *, offset: int, position: int) -> None:
        """Add an entry; ignored unless it is past the last one (re-indexing is harmless)."""
        relative = offset - self.base_offset
        if relative < 0 or relative > _MAX_RELATIVE:
            raise KafkaStorageError(f"offset {offset} does not fit the index {self.path}")
        if self._offsets and (relative <= self._offsets[-1] or position <= self._positions[-1]):
            return
        self._file.write(struct.pack(">II", relative, position))
        self._offsets.append(relative)
        self._positions.append(position)

    def lookup(self, offset: int) -> int:
        """Position of the largest entry with offset <= ``offset`` (0 if there is none)."""
        i = bisect_right(self._offsets, offset - self.base_offset)
        return self._positions[i - 1] if i else 0

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= ``offset``."""
        keep = bisect_left(self._offsets, offset - self.base_offset) if offset > self.base_offset else 0
        self._truncate_entries(keep)

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or after ``position`` (the log was cut there)."""
        self._truncate_entries(bisect_left(self._positions, position))

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._truncate_entries(0)

    def _truncate_entries(self, keep: int) -> None:
        if keep < len(self._offsets):
            del self._offsets[keep:]
            del self._positions[keep:]
            self._file.truncate_entries(keep)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def delete(self) -> None:
        self._file.delete()

    def rename(self, path: Path) -> None:
        self._file.rename(path)


class TimeIndex:
    """Sparse time index of one segment. Contract: entries strictly increase in timestamp and offset;
    ``lookup(ts)`` returns an offset at or before the first batch whose max timestamp >= ts.
    Not thread-safe."""

    def __init__(self, path: Path, *, base_offset: int) -> None:
        self.base_offset = base_offset
        self._file = _IndexFile(path, TIME_ENTRY_SIZE)
        self._timestamps = array("q")
        self._offsets = array("I")

    @classmethod
    def open(cls, path: Path, *, base_offset: int) -> TimeIndex:
        """Open (creating if missing) and load; raises KafkaStorageError if the file is inconsistent."""
        index = cls(path, base_offset=base_offset)
        try:
            for ts, rel in _TIME_ENTRY.iter_unpack(index._file.read_all()):
                if index._timestamps and (ts <= index._timestamps[-1] or rel < index._offsets[-1]):
                    raise KafkaStorageError(f"time index file {path} entries are not increasing")
                index._timestamps.append(ts)
                index._offsets.append(rel)
        except BaseException:
            index.close()
            raise
        return index

    @property
    def path(self) -> Path:
        return self._file.path

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, absolute offset) of the last entry, or None."""
        if not self._timestamps:
            return None
        return self._timestamps[-1], self.base_offset + self._offsets[-1]

    def maybe_append(self, *, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if the timestamp is larger than the last entry's."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        relative = offset - self.base_offset
        if relative < 0 or relative > _MAX_RELATIVE:
            raise KafkaStorageError(f"offset {offset} does not fit the time index {self.path}")
        if self._offsets and relative < self._offsets[-1]:
            return
        self._file.write(_TIME_ENTRY.pack(timestamp, relative))
        self._timestamps.append(timestamp)
        self._offsets.append(relative)

    def lookup(self, timestamp: int) -> int:
        """Absolute offset to start a scan for the first batch with max timestamp >= ``timestamp``.

        That is the offset of the largest entry whose timestamp is < ``timestamp`` (every batch up to
        it has a smaller max timestamp), or the base offset if there is none. Note: "the first entry
        with ts >= target" would be wrong for a sparse index, it can skip unindexed batches.
        """
        i = bisect_left(self._timestamps, timestamp)
        return self.base_offset + (self._offsets[i - 1] if i else 0)

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= ``offset``."""
        keep = bisect_left(self._offsets, offset - self.base_offset) if offset > self.base_offset else 0
        if keep < len(self._offsets):
            del self._timestamps[keep:]
            del self._offsets[keep:]
            self._file.truncate_entries(keep)

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self.truncate_to(self.base_offset)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def delete(self) -> None:
        self._file.delete()

    def rename(self, path: Path) -> None:
        self._file.rename(path)
