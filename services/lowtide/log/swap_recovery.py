"""Finishing or discarding a log cleaner swap that a crash interrupted, and the names of its files.

The log cleaner (``lowtide/log/cleaner/swap.py``) replaces a group of consecutive segments
[s1 .. sk] (base offset B = s1's, offsets [B, E) with E = sk's next offset) by a cleaned copy in
Kafka's order: it writes ``B.*.cleaned`` and the range file ``B.cleaner-swap`` ("B E"), renames
``B.log.cleaned`` to ``B.log.swap`` (the commit point) and its indexes likewise, renames the old
segments' files away, then the ``.swap`` files to their live names.

Recovery (``complete_interrupted_swaps``, run by ``SegmentSet.open`` before it lists segments):
every ``*.cleaned`` file goes; for each ``B.log.swap`` the live segment files with base offsets in
[B, E) go (E from ``B.cleaner-swap``; B + 1 if that file is missing, i.e. only s1's names), its
index ``.swap`` files go live, then the log; stray ``.swap`` index files and ``.cleaner-swap``
files go last. Running it twice (a crash during recovery) gives the same result, because the
``B.log.swap`` rename is its last step. An index that does not survive is rebuilt by
``LogSegment.open`` from the log.

Why the range file: a cleaned segment can end before E (a trailing batch lost all its records),
so its own next offset cannot tell recovery which old segments it replaces (Kafka uses the swap
segment's next offset and can bring back a segment whose records were all cleaned away).

Why here and not in the cleaner: every log open runs it (``SegmentSet.open``), compacted topic or
not, and the core log must not depend on the cleaner, which depends on it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lowtide.errors import KafkaStorageError
from lowtide.log import filenames
from lowtide.log.checkpoint import fsync_directory

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
SWAP_RANGE_SUFFIX = ".cleaner-swap"


def swap_range_file_name(base_offset: int) -> str:
    """``B.cleaner-swap``: the range [B, E) of offsets the swap of segment B replaces."""
    return filenames.format_base_offset(base_offset) + SWAP_RANGE_SUFFIX


def _read_swap_end(dir: Path, base: int) -> int:
    try:
        first, end = (dir / swap_range_file_name(base)).read_text().split()
        if int(first) == base and int(end) > base:
            return int(end)
    except (OSError, ValueError):
        pass
    log.warning("no readable range for the interrupted swap of segment %d in %s: replacing that segment only",
                base, dir)
    return base + 1


def complete_interrupted_swaps(dir: Path) -> list[int]:
    """Finish or discard what a cleaning pass left in ``dir`` (module docstring); return the base
    offsets of the swaps completed. A directory that does not exist has nothing to do."""
    try:
        names = os.listdir(dir)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise KafkaStorageError(f"cannot list partition directory {dir}: {exc}") from exc
    log_swap_suffix = filenames.LOG_SUFFIX + SWAP_SUFFIX
    if not any(n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, SWAP_RANGE_SUFFIX)) for n in names):
        return []
    try:
        for name in names:
            if name.endswith(CLEANED_SUFFIX):
                os.unlink(dir / name)  # a pass that never committed: the old segments stand
        completed: list[int] = []
        for name in sorted(names):
            if not name.endswith(log_swap_suffix):
                continue
            base = filenames.parse_base_offset(name[:-len(SWAP_SUFFIX)])
            end = _read_swap_end(dir, base)
            for other in names:
                try:
                    other_base = filenames.parse_base_offset(other)
                except ValueError:
                    continue  # not a live segment file
                if base <= other_base < end:
                    (dir / other).unlink(missing_ok=True)  # replaced by the swap
            for live_name in filenames.segment_file_names(base)[1:]:
                if (dir / (live_name + SWAP_SUFFIX)).exists():
                    os.replace(dir / (live_name + SWAP_SUFFIX), dir / live_name)
            os.replace(dir / name, dir / filenames.log_file_name(base))
            completed.append(base)
            log.info("completed an interrupted log cleaner swap", extra={"fields": {"dir": str(dir), "base": base,
                                                                                    "replaced_end": end}})
        for name in os.listdir(dir):
            if name.endswith((SWAP_SUFFIX, SWAP_RANGE_SUFFIX)):
                (dir / name).unlink(missing_ok=True)  # index of a swap whose log is live; ranges
        fsync_directory(dir)
    except OSError as exc:
        raise KafkaStorageError(f"cannot complete an interrupted log cleaner swap in {dir}: {exc}") from exc
    return completed
