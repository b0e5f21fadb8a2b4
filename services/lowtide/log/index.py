"""Sparse per-segment indexes: offset -> file position, and timestamp -> offset.

Offset index file ``<base>.index``: fixed 8-byte entries, big-endian, appended in offset order::

    +--------------------------+--------------------------+
    | relative offset  (u32)   | position in .log  (u32)  |   relative offset = offset - base offset
    +--------------------------+--------------------------+
      key                        value

An entry (o, p) says: the batch starting at byte p of the .log file has last offset base + o. Every
offset above base + o lives in a batch at or after byte p.

Time index file ``<base>.timeindex``: fixed 12-byte entries, big-endian::

    +----------------------------------------------+--------------------------+
    | max timestamp so far in the segment  (i64)   | relative offset  (u32)   |
    +----------------------------------------------+--------------------------+
      key                                            value

An entry (t, o) says: the largest timestamp up to and including the batch with last offset base + o
is t; entries are only added when t grows, so they are sorted by both fields.

Both are an ``AbstractIndex`` (as in Kafka): a file of (key, value) entries sorted by key, looked up by
binary search over the key column; the subclasses only say what the key and the value mean. Both
indexes are sparse (an entry roughly every ``index_interval_bytes`` of log), unlike Kafka they are
not preallocated or memory-mapped: entries live in ``array`` columns (bisect lookups) and reach the
file when the segment is flushed (a roll, a clean close) or renamed; no file descriptor stays open
between, so a partition costs one descriptor (its .log), not three. They are derived data: a
missing, short or inconsistent index is rebuilt from the .log by the segment, and one short of its
last entries after a crash is still right (sparse: a lookup lands earlier and scans forward), so
the files need no version header and no checksum.

Not thread-safe: the owning segment's caller (PartitionLog) holds the lock.
"""

from __future__ import annotations

import operator
import os
import struct
import sys
from abc import ABC, abstractmethod
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Self

from lowtide.errors import KafkaStorageError
from lowtide.log.checkpoint import fsync

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
OFFSET_ENTRY_SIZE = _OFFSET_ENTRY.size
TIME_ENTRY_SIZE = _TIME_ENTRY.size
_MAX_RELATIVE = 0xFFFFFFFF


class AbstractIndex(ABC):
    """A sparse index file of one segment: fixed-size (key, value) entries, sorted by key.

    Contract: a subclass sets ``ENTRY`` (the big-endian struct of one entry: key then value, each an
    integer format the ``array`` module shares, "I" or "q"), ``NAME`` (for error messages),
    ``VALUES_STRICTLY_INCREASING`` and ``OFFSET_IS_KEY`` (which field is the offset relative to
    ``base_offset``; the other one is not an offset), then adds its append and lookup methods. Keys
    always strictly increase; values strictly increase or never decrease, as the subclass says;
    ``open`` refuses a file that breaks this. Not thread-safe: the caller serializes every call.
    """

    ENTRY: ClassVar[struct.Struct]
    NAME: ClassVar[str]
    VALUES_STRICTLY_INCREASING: ClassVar[bool]
    OFFSET_IS_KEY: ClassVar[bool]
    _key_typecode: ClassVar[str]
    _value_typecode: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # The in-memory columns use the entry's own format characters as array type codes; check the
        # sizes agree, so that nothing is silently truncated on an unusual platform.
        codes = cls.ENTRY.format.removeprefix(">")
        if len(codes) != 2 or any(array(c).itemsize != struct.calcsize(">" + c) for c in codes):
            raise TypeError(f"{cls.__name__}.ENTRY must be '>' and two array-compatible integer fields")
        cls._key_typecode, cls._value_typecode = codes

    def __init__(self, path: Path, *, base_offset: int) -> None:
        self.base_offset = base_offset
        self._path = path
        self._keys = array(self._key_typecode)
        self._values = array(self._value_typecode)
        self._written = 0  # entries the file holds (the rest wait for the next flush, close or rename)

    @classmethod
    def open(cls, path: Path, *, base_offset: int) -> Self:
        """Open (creating if missing) and load; raises KafkaStorageError if the file is inconsistent."""
        index = cls(path, base_offset=base_offset)
        index._keys, index._values = index._decode(index._read_all())
        index._written = len(index._keys)
        values_in_order = operator.lt if cls.VALUES_STRICTLY_INCREASING else operator.le
        if not (_is_ordered(index._keys, operator.lt) and _is_ordered(index._values, values_in_order)):
            raise KafkaStorageError(f"{cls.NAME} file {path} entries are not increasing")
        return index

    @property
    def path(self) -> Path:
        return self._path

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """(key, value) of the last entry with its offset made absolute, or None: (offset, position)
        for the offset index, (timestamp, offset) for the time index."""
        last = self._last()
        if last is None:
            return None
        key, value = last
        if self.OFFSET_IS_KEY:
            return self.base_offset + key, value
        return key, self.base_offset + value

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= ``offset``."""
        offsets = self._keys if self.OFFSET_IS_KEY else self._values
        keep = bisect_left(offsets, offset - self.base_offset) if offset > self.base_offset else 0
        self._truncate_entries(keep)

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._truncate_entries(0)

    def flush(self) -> None:
        """Write the entries the file lacks, then fsync it."""
        self._write_pending(sync=True)

    def close(self) -> None:
        """Write the entries the file lacks (the segment fsyncs on its own flush)."""
        self._write_pending(sync=False)

    def delete(self) -> None:
        self._written = len(self._keys)  # nothing left to write to a file that goes
        self._path.unlink(missing_ok=True)

    def rename(self, path: Path) -> None:
        self._write_pending(sync=False)
        os.rename(self._path, path)
        self._path = path

    def _write_pending(self, *, sync: bool) -> None:
        pending = range(self._written, len(self._keys))
        if not pending and not sync:
            return
        data = b"".join(self.ENTRY.pack(self._keys[i], self._values[i]) for i in pending)
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if sync:
                    fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise KafkaStorageError(f"cannot write {self.NAME} file {self._path}: {exc}") from exc
        self._written = len(self._keys)

    # -- for the subclasses ------------------------------------------------------------------------

    @abstractmethod
    def lookup(self, key: int, /) -> int:
        """Where a read for ``key`` may start, found by binary search over the key column."""

    def _relative_offset(self, offset: int) -> int:
        relative = offset - self.base_offset
        if relative < 0 or relative > _MAX_RELATIVE:
            raise KafkaStorageError(f"offset {offset} does not fit the {self.NAME} {self.path}")
        return relative

    def _last(self) -> tuple[int, int] | None:
        """(key, value) of the last entry, as stored (offsets relative), or None."""
        if not self._keys:
            return None
        return self._keys[-1], self._values[-1]

    def _value_of_floor(self, key: int, *, inclusive: bool) -> int | None:
        """Value of the last entry whose key is <= ``key`` (``inclusive``) or < ``key``; None if none."""
        i = (bisect_right if inclusive else bisect_left)(self._keys, key)
        return self._values[i - 1] if i else None

    def _append_entry(self, key: int, value: int) -> None:
        self._keys.append(key)
        self._values.append(value)

    def _truncate_entries(self, keep: int) -> None:
        if keep < len(self._keys):
            del self._keys[keep:]
            del self._values[keep:]
        if keep < self._written:
            try:
                os.truncate(self._path, keep * self.ENTRY.size)
            except OSError as exc:
                raise KafkaStorageError(f"cannot truncate {self.NAME} file {self._path}: {exc}") from exc
            self._written = keep

    # -- file contents -----------------------------------------------------------------------------

    def _read_all(self) -> bytes:
        # Created when missing, as the segment expects its three files to exist once open.
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_CREAT, 0o644)
            try:
                data = os.pread(fd, os.fstat(fd).st_size, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            raise KafkaStorageError(f"cannot read {self.NAME} file {self._path}: {exc}") from exc
        if len(data) % self.ENTRY.size:
            raise KafkaStorageError(
                f"index file {self.path} has {len(data)} bytes, not a multiple of {self.ENTRY.size}"
            )
        return data

    def _decode(self, data: bytes) -> tuple[array, array]:
        """Split the file's entries into the key and value columns."""
        key_width = struct.calcsize(">" + self._key_typecode)
        return (_column(data, entry_size=self.ENTRY.size, start=0, typecode=self._key_typecode),
                _column(data, entry_size=self.ENTRY.size, start=key_width, typecode=self._value_typecode))


def _column(data: bytes, *, entry_size: int, start: int, typecode: str) -> array:
    """The big-endian field at byte ``start`` of every entry, as an array of ``typecode``."""
    # Strided slice copies gather the field's bytes in C, one pass per byte of the field: no Python
    # work per entry, and a full segment's index has a quarter of a million entries.
    width = struct.calcsize(">" + typecode)
    raw = bytearray(len(data) // entry_size * width)
    for byte in range(width):
        raw[byte::width] = data[start + byte::entry_size]
    column = array(typecode, raw)
    if sys.byteorder == "little":
        column.byteswap()
    return column


def _is_ordered(column: array, in_order: Callable[[int, int], bool]) -> bool:
    # map() over the column and its shifted copy runs the comparisons in C: a full segment's index
    # has a quarter of a million entries.
    return all(map(in_order, column, column[1:]))


class OffsetIndex(AbstractIndex):
    """Sparse offset index of one segment: key = relative offset, value = position in the .log.

    Contract: entries strictly increase in offset and position; ``lookup(o)`` returns a position at or
    before the batch containing o. Not thread-safe.
    """

    ENTRY = _OFFSET_ENTRY
    NAME = "index"
    VALUES_STRICTLY_INCREASING = True
    OFFSET_IS_KEY = True

    def append(self, *, offset: int, position: int) -> None:
        """Add an entry; ignored unless it is past the last one (re-indexing is harmless)."""
        relative = self._relative_offset(offset)
        last = self._last()
        if last is not None and (relative <= last[0] or position <= last[1]):
            return
        self._append_entry(relative, position)

    def lookup(self, offset: int) -> int:
        """Position of the largest entry with offset <= ``offset`` (0 if there is none)."""
        position = self._value_of_floor(offset - self.base_offset, inclusive=True)
        return 0 if position is None else position

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or after ``position`` (the log was cut there)."""
        self._truncate_entries(bisect_left(self._values, position))


class TimeIndex(AbstractIndex):
    """Sparse time index of one segment: key = max timestamp so far, value = relative offset.

    Contract: entries strictly increase in timestamp and never decrease in offset; ``lookup(ts)``
    returns an offset at or before the first batch whose max timestamp >= ts. Not thread-safe.
    """

    ENTRY = _TIME_ENTRY
    NAME = "time index"
    VALUES_STRICTLY_INCREASING = False
    OFFSET_IS_KEY = False

    def maybe_append(self, *, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if the timestamp is larger than the last entry's."""
        last = self._last()
        if last is not None and timestamp <= last[0]:
            return
        relative = self._relative_offset(offset)
        if last is not None and relative < last[1]:
            return
        self._append_entry(timestamp, relative)

    def lookup(self, timestamp: int) -> int:
        """Absolute offset to start a scan for the first batch with max timestamp >= ``timestamp``.

        That is the offset of the largest entry whose timestamp is < ``timestamp`` (every batch up to
        it has a smaller max timestamp), or the base offset if there is none. Note: "the first entry
        with ts >= target" would be wrong for a sparse index, it can skip unindexed batches.
        """
        relative = self._value_of_floor(timestamp, inclusive=False)
        return self.base_offset + (0 if relative is None else relative)
