"""A cleaned segment's files, and replacing old segments with it crash-safely (Kafka's order).

A pass writes the cleaned copy of a group of consecutive segments [s1 .. sk] (base offset B = s1's,
replacing offsets [B, E) with E = sk's next offset) next to them, then swaps it in::

    step                                      files after the step             after a crash here
    1. write + fsync B.log.cleaned,           old segments live,               *.cleaned removed on open:
       B.index.cleaned, B.timeindex.cleaned;  B.*.cleaned, B.cleaner-swap      the old segments stay
       write B.cleaner-swap = "B E" (.tmp,
       fsync, rename, fsync dir)
       --- under the log's lock from here on: no reader sees a step in between ---
    2. rename B.log.cleaned -> B.log.swap     COMMIT POINT: a B.log.swap means  open finishes the swap:
       (then the indexes), fsync dir          "the old segments are replaced"   steps 3-5
    3. rename s1 .. sk files -> *.deleted     (delayed deletion, file_deleter)  *.deleted removed on open
    4. rename B.*index.swap -> B.*index,      the cleaned segment is live       (open: the same)
       B.log.swap -> B.log, fsync dir
    5. the segment set holds the new segment in place of s1 .. sk; B.cleaner-swap removed

Recovery after a crash is the core log's (``lowtide/log/swap_recovery.py``, which also names the
files: ``SegmentSet.open`` runs it before it lists segments), so opening a log never needs the
cleaner.

Not thread-safe by itself: ``swap_in`` must run under the PartitionLog's lock
(``PartitionLog.segments_locked``); the writing of a ``CleanedSegment`` needs no lock (it touches
only its own files).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lowtide.errors import KafkaStorageError
from lowtide.log import filenames
from lowtide.log.checkpoint import fsync_directory, write_file_atomically
from lowtide.log.index import OffsetIndex, TimeIndex
from lowtide.log.segment import DEFAULT_MAX_MESSAGE_BYTES, LogSegment
from lowtide.log.swap_recovery import CLEANED_SUFFIX, SWAP_SUFFIX, swap_range_file_name
from lowtide.record import BatchHeader

if TYPE_CHECKING:
    from lowtide.log.segment_set import SegmentSet

log = logging.getLogger(__name__)

# Names of the steps of a swap, for tests that stop a swap after one (see Cleaner's swap_hook).
STEP_CLEANED = "cleaned"  # after step 1
STEP_COMMITTED = "committed"  # after step 2
STEP_OLD_DELETED = "old-deleted"  # after step 3
STEP_INDEXES_LIVE = "indexes-live"  # in step 4, between the index renames and the log rename
STEP_LIVE = "live"  # after step 4
SWAP_STEPS = (STEP_CLEANED, STEP_COMMITTED, STEP_OLD_DELETED, STEP_INDEXES_LIVE, STEP_LIVE)

SwapHook = Callable[[str], None]


class CleanedSegment:
    """The cleaned copy of a group of segments being written: ``<base>.*.cleaned``.

    Contract: ``append`` whole batches in offset order (indexed exactly as a live segment indexes
    them: the same LogSegment code writes them); ``finish`` makes every file durable and records the
    replaced range; ``discard`` removes every file (idempotent). Not thread-safe: one pass owns it.
    """

    def __init__(self, dir: Path, base_offset: int, *, index_interval_bytes: int) -> None:
        self.dir = dir
        self.base_offset = base_offset
        live = filenames.segment_file_names(base_offset)
        self.cleaned_paths = [dir / (name + CLEANED_SUFFIX) for name in live]
        self.range_path = dir / swap_range_file_name(base_offset)
        for path in self.cleaned_paths:
            path.unlink(missing_ok=True)  # left by a pass that failed in this process
        log_path, index_path, time_path = self.cleaned_paths
        fd = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            offset_index = OffsetIndex.open(index_path, base_offset=base_offset)
            time_index = TimeIndex.open(time_path, base_offset=base_offset)
        except BaseException:
            os.close(fd)
            raise
        # A LogSegment over the .cleaned files: appends index exactly as the live segment would.
        self._segment = LogSegment(dir=dir, base_offset=base_offset, index_interval_bytes=index_interval_bytes,
                                   fd=fd, offset_index=offset_index, time_index=time_index)
        self.finished = False

    @property
    def size_bytes(self) -> int:
        return self._segment.size_bytes

    @property
    def next_offset(self) -> int:
        return self._segment.next_offset

    def append(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader]) -> None:
        self._segment.append(data, headers)

    def finish(self, *, replaced_end: int, mtime_ms: int | None = None) -> None:
        """Step 1 of the swap: fsync the three files, give the log ``mtime_ms``, write the range file."""
        self._segment.seal()
        self._segment.close()
        if mtime_ms is not None:
            ns = mtime_ms * 1_000_000
            os.utime(self.cleaned_paths[0], ns=(ns, ns))
        # The range file's own fsync + rename + directory fsync also makes the .cleaned names durable.
        write_file_atomically(self.range_path, f"{self.base_offset} {replaced_end}\n".encode())
        self.finished = True

    def discard(self) -> None:
        """Remove every file of this cleaned segment (after a failed or abandoned pass)."""
        self._segment.close()
        for path in [*self.cleaned_paths, self.range_path]:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # the next open removes *.cleaned anyway
                log.warning("cannot remove %s: %s", path, exc)


def swap_in(segments: SegmentSet, old: list[LogSegment], cleaned: CleanedSegment, *, index_interval_bytes: int,
            max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, hook: SwapHook | None = None,
            ) -> tuple[LogSegment, list[Path]]:
    """Steps 2-5: replace ``old`` (consecutive segments of ``segments``, validated by the caller)
    with the finished ``cleaned`` segment. Returns the new live segment and the ``*.deleted`` paths
    of the old files, for the caller to schedule their deletion. Must run under the log's lock.

    Raises KafkaStorageError when a file operation fails. Before the commit (step 2) nothing has
    changed and the cleaned files are removed; after it the directory is completed by the next
    open (``complete_interrupted_swaps``) and this log must not be used meanwhile.
    """
    if not cleaned.finished:
        raise ValueError("swap_in needs a finished cleaned segment")
    dir = cleaned.dir
    base = cleaned.base_offset
    live = [dir / name for name in filenames.segment_file_names(base)]
    swaps = [dir / (name + SWAP_SUFFIX) for name in filenames.segment_file_names(base)]
    try:
        os.rename(cleaned.cleaned_paths[0], swaps[0])  # the commit point
    except OSError as exc:
        cleaned.discard()
        raise KafkaStorageError(f"cannot commit the cleaned segment {cleaned.cleaned_paths[0]}: {exc}") from exc
    try:
        for source, target in zip(cleaned.cleaned_paths[1:], swaps[1:], strict=True):
            os.rename(source, target)
        fsync_directory(dir)
        _step(hook, STEP_COMMITTED)
        deleted: list[Path] = []
        for segment in old:
            deleted.extend(segment.rename_to_deleted())
        _step(hook, STEP_OLD_DELETED)
        for source, target in zip(swaps[1:], live[1:], strict=True):
            os.rename(source, target)
        _step(hook, STEP_INDEXES_LIVE)
        os.rename(swaps[0], live[0])
        fsync_directory(dir)
        _step(hook, STEP_LIVE)
        segment = LogSegment.open(dir, base, index_interval_bytes=index_interval_bytes,
                                  max_message_bytes=max_message_bytes)
    except OSError as exc:
        raise KafkaStorageError(f"swapping the cleaned segment {base} into {dir} failed after its commit "
                                f"(reopening the log completes it): {exc}") from exc
    segments.replace_segments(old, segment)
    cleaned.range_path.unlink(missing_ok=True)  # not needed once no .swap file is left
    return segment, deleted


def _step(hook: SwapHook | None, step: str) -> None:
    if hook is not None:
        hook(step)
