"""Stray partition directories: logs the metadata no longer names, set aside as
``<topic>-<p>.<32 hex>-stray`` (filenames.py) by the replica and kept (docs/design/metadata.md
#stray-partitions). They go only on the operator's word: ``lowtide strays remove`` or a replica's
``--stray-retention-ms`` (off by default).

A stray's age is counted from when it was set aside: the rename sets the directory's change time,
and nothing writes inside a stray afterwards.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from lowtide.log.filenames import STRAY_DIR_SUFFIX, is_stray_partition_dir


@dataclass(frozen=True)
class Stray:
    path: Path
    topic: str
    partition: int
    set_aside_ms: int
    bytes: int

    def age_ms(self, now_ms: int) -> int:
        return max(0, now_ms - self.set_aside_ms)


def list_strays(data_dir: Path) -> list[Stray]:
    """The stray directories in a replica data directory, oldest first."""
    out = []
    for entry in os.scandir(data_dir):
        if not entry.is_dir() or not is_stray_partition_dir(entry.name):
            continue
        base = entry.name[:-len(STRAY_DIR_SUFFIX)].rpartition(".")[0]
        topic, _, number = base.rpartition("-")
        size = sum(f.stat().st_size for f in Path(entry.path).rglob("*") if f.is_file())
        out.append(Stray(path=Path(entry.path), topic=topic, partition=int(number) if number.isdigit() else -1,
                         set_aside_ms=int(entry.stat().st_ctime * 1000), bytes=size))
    return sorted(out, key=lambda s: s.set_aside_ms)


def remove_strays(data_dir: Path, *, older_than_ms: int = 0, now_ms: int | None = None) -> list[Stray]:
    """Remove the strays set aside at least ``older_than_ms`` ago; returns the ones removed."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    removed = []
    for stray in list_strays(data_dir):
        if stray.age_ms(now) >= older_than_ms:
            shutil.rmtree(stray.path, ignore_errors=True)
            removed.append(stray)
    return removed
