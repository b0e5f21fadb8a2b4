"""The ordered set of segments of one partition directory (Kafka's LocalLog role).

Directory contents and names: filenames.py. Segments are kept sorted by base offset; the last one
is the active segment, the only one appended to. There is always at least one segment.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path

from lowtide.errors import KafkaStorageError
from lowtide.log import filenames
from lowtide.log.checkpoint import fsync_directory
from lowtide.log.segment import DEFAULT_MAX_MESSAGE_BYTES, LogSegment
from lowtide.log.swap_recovery import complete_interrupted_swaps


class SegmentSet:
    """Segments of one partition, sorted by base offset, with an active (last) segment.

    Contract: segment offset ranges do not overlap and increase; ``remove_below`` / ``truncate_to``
    take segments out of the set and hand back the removed segments (or delete them, for truncation)
    so the caller decides when their files go. Opening a directory removes leftover ``*.deleted`` and
    ``*.tmp`` files, rebuilds missing indexes and recovers the last segment (torn tail).

    Not thread-safe: PartitionLog holds its lock around every call.
    """

    def __init__(self, dir: Path, segments: list[LogSegment], *, index_interval_bytes: int) -> None:
        if not segments:
            raise ValueError("a segment set needs at least one segment")
        self.dir = dir
        self._segments = segments
        self._base_offsets = [s.base_offset for s in segments]
        self._index_interval_bytes = index_interval_bytes

    @classmethod
    def open(
        cls,
        dir: Path,
        *,
        initial_offset: int = 0,
        index_interval_bytes: int = 4096,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        recover: bool = True,
    ) -> SegmentSet:
        """Load every segment of ``dir`` (created if missing); an empty directory gets one empty
        segment at ``initial_offset``. ``recover``: scan the last segment whole (CRCs included);
        False after a clean shutdown, when every segment was flushed and closed (Kafka skips
        recovery then too): a segment whose indexes or tail do not check out is scanned anyway."""
        try:
            dir.mkdir(parents=True, exist_ok=True)
            # A log cleaner swap that a crash interrupted is finished or discarded first (swap_recovery.py).
            complete_interrupted_swaps(dir)
            names = os.listdir(dir)
        except OSError as exc:
            raise KafkaStorageError(f"cannot open partition directory {dir}: {exc}") from exc
        log_offsets: set[int] = set()
        index_files: list[tuple[int, str]] = []
        for name in names:
            if filenames.is_leftover_file_name(name):
                # An interrupted delayed delete or crash-safe write: the data is already gone or
                # superseded, so finishing the job is always right.
                (dir / name).unlink(missing_ok=True)
                continue
            try:
                base = filenames.parse_base_offset(name)
            except ValueError:
                continue
            if name.endswith(filenames.LOG_SUFFIX):
                log_offsets.add(base)
            else:
                index_files.append((base, name))
        for base, name in index_files:
            if base not in log_offsets:
                (dir / name).unlink(missing_ok=True)  # index of a deleted segment
        ordered = sorted(log_offsets)
        segments: list[LogSegment] = []
        try:
            for i, base in enumerate(ordered):
                segments.append(
                    LogSegment.open(
                        dir,
                        base,
                        index_interval_bytes=index_interval_bytes,
                        recover=recover and i == len(ordered) - 1,
                        max_message_bytes=max_message_bytes,
                    )
                )
            if not segments:
                segments.append(LogSegment.create(dir, initial_offset, index_interval_bytes=index_interval_bytes))
                fsync_directory(dir)
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        return cls(dir, segments, index_interval_bytes=index_interval_bytes)

    # -- queries ----------------------------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self._segments[-1]

    @property
    def first(self) -> LogSegment:
        return self._segments[0]

    @property
    def next_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self._segments)

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[LogSegment]:
        return iter(list(self._segments))

    def segment_for(self, offset: int) -> LogSegment | None:
        """The segment whose range could contain ``offset`` (largest base offset <= offset)."""
        i = bisect_right(self._base_offsets, offset)
        return self._segments[i - 1] if i else None

    def segments_from(self, offset: int) -> list[LogSegment]:
        """Segments that may hold offsets >= ``offset``, in order."""
        i = max(bisect_right(self._base_offsets, offset) - 1, 0)
        return self._segments[i:]

    # -- changes ----------------------------------------------------------------------------------

    def roll(self, base_offset: int) -> LogSegment:
        """Seal the active segment and start a new one at ``base_offset`` (>= its next offset).

        An empty active segment is replaced instead of sealed, so rolls never leave empty segments.
        """
        active = self.active
        if base_offset < active.next_offset:
            raise KafkaStorageError(
                f"cannot roll {self.dir} at offset {base_offset} below log end offset {active.next_offset}"
            )
        if active.size_bytes == 0:
            if active.base_offset == base_offset:
                return active
            active.delete()
            self._segments.pop()
            self._base_offsets.pop()
        else:
            active.seal()
        segment = LogSegment.create(self.dir, base_offset, index_interval_bytes=self._index_interval_bytes)
        self._segments.append(segment)
        self._base_offsets.append(base_offset)
        fsync_directory(self.dir)
        return segment

    def remove_below(self, offset: int, *, recycle_active_up_to: int = -1,
                     defer_recycle: bool = False) -> list[LogSegment]:
        """Take out the segments whose offsets are all < ``offset`` (next_offset <= offset).

        If that includes the non-empty active segment, an empty one at max(offset,
        active.next_offset) takes its place so an active segment always remains: the active
        segment itself, recycled (LogSegment.recycle), when it holds at most
        ``recycle_active_up_to`` bytes, else a new one. With ``defer_recycle`` an active segment
        that would be recycled is left as it is instead (its base offset stays below ``offset``,
        the bytes it holds are dead), for the caller to recycle later with another call. The
        removed segments are still open; the caller deletes them.
        """
        count = 0
        for segment in self._segments:
            if segment.next_offset > offset:
                break
            if segment is self.active and segment.size_bytes == 0:
                break  # nothing below offset in it, and it must stay
            count += 1
        if count == 0:
            return []
        if count == len(self._segments):
            # Everything goes, the active segment too. Its replacement needs neither a seal (the
            # old data is being deleted, flushing it is wasted) nor a directory fsync: after a
            # crash, recovery rebuilds the empty segment from the durable log start offset.
            base_offset = max(offset, self.active.next_offset)
            if recycle_active_up_to >= self.active.size_bytes:
                if not defer_recycle:
                    self.active.recycle(base_offset)
                    self._base_offsets[-1] = base_offset
                count -= 1
            else:
                self._segments.append(LogSegment.create(self.dir, base_offset,
                                                        index_interval_bytes=self._index_interval_bytes))
                self._base_offsets.append(base_offset)
        removed = self._segments[:count]
        del self._segments[:count]
        del self._base_offsets[:count]
        return removed

    def replace_segments(self, old: list[LogSegment], new: LogSegment) -> None:
        """For the log cleaner: put ``new`` where the consecutive non-active segments ``old`` are
        (same objects, in order); ``new`` starts at the first one's base offset. The caller has
        already renamed or deleted the old files (cleaner/swap.py)."""
        start = next((i for i, s in enumerate(self._segments) if s is old[0]), -1)
        end = start + len(old)
        if start < 0 or end >= len(self._segments) or any(
                a is not b for a, b in zip(self._segments[start:end], old, strict=True)):
            raise KafkaStorageError(f"segments to replace in {self.dir} are not consecutive non-active segments")
        if new.base_offset != old[0].base_offset:
            raise KafkaStorageError(f"replacement of segment {old[0].base_offset} in {self.dir} starts at "
                                    f"{new.base_offset}")
        self._segments[start:end] = [new]
        self._base_offsets[start:end] = [new.base_offset]

    def truncate_to(self, offset: int) -> int:
        """Drop everything from the batch containing ``offset`` on; delete emptied segments' files.

        Returns the bytes removed. If ``offset`` is at or below the first segment's base offset the
        set restarts empty at ``offset``.
        """
        if offset <= self.first.base_offset:
            removed = self.size_bytes
            self.truncate_fully_and_start_at(offset)
            return removed
        removed = 0
        while len(self._segments) > 1 and self.active.base_offset >= offset:
            segment = self._segments.pop()
            self._base_offsets.pop()
            removed += segment.size_bytes
            segment.delete()
        removed += self.active.truncate_to(offset)
        fsync_directory(self.dir)
        return removed

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start over with one empty segment at ``offset``."""
        for segment in self._segments:
            segment.delete()
        segment = LogSegment.create(self.dir, offset, index_interval_bytes=self._index_interval_bytes)
        self._segments = [segment]
        self._base_offsets = [offset]
        fsync_directory(self.dir)

    def flush(self) -> None:
        self.active.flush()

    def close(self) -> None:
        for segment in self._segments:
            segment.close()
