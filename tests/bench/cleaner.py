"""The log cleaner's throughput (issue 12): MB/s of dirty log one pass cleans.

In process, over a real PartitionLog on the bench data disk (no cluster: the figure is the cleaner's,
not the network's). The log holds 1 KiB values over a fixed key space, keys in random order, each key written about
four times, 1 % tombstones, in 1 MiB producer batches and 16 MiB segments, committed and rolled.

* ``cleaner_mbs``: the first pass (all of it dirty): offset map over every record, then each group
  rewritten; almost every batch loses records, so this is the re-encoding path (plus KIP-534
  horizons on the tombstones' batches). The headline: dirty bytes / pass seconds.
* ``cleaner_copy_mbs``: a second pass over the cleaned log with the checkpoint dropped (all dirty
  again, nothing superseded): every batch is copied as bytes, the path a mostly-clean log takes.

The ratio column relates each to the sequential disk write bandwidth measured in the same run. The
data was just written, so reads come from the page cache: this is the cleaner's CPU cost bound.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

from tests.bench.common import Figure, MiB, failed, say

VALUE = 1024
BATCH_RECORDS = 1000


def _build(path: Path, total_bytes: int, keys: int):
    from lowtide.log.partition_log import LogConfig, PartitionLog
    from lowtide.record import encode_batch

    config = LogConfig(segment_bytes=16 * MiB, cleanup_policy="compact", delete_retention_ms=86_400_000)
    plog = PartitionLog.open(path, topic="bench", partition=0, config=config)
    payload = os.urandom(VALUE)
    pick = random.Random(534).randrange  # keys in random order: almost every batch loses records
    written = 0
    now = int(time.time() * 1000)
    while written < total_bytes:
        batch_keys = [b"key-%08d" % pick(keys) for _ in range(BATCH_RECORDS)]
        values = [None if pick(100) == 0 else payload for _ in range(BATCH_RECORDS)]
        raw = encode_batch(values, keys=batch_keys, timestamp_ms=now)
        plog.append_as_leader(raw, leader_epoch=0)
        written += len(raw)
    plog.roll()
    plog.set_high_watermark(plog.log_end_offset)
    return plog


def cleaner_throughput(data_dir: Path, *, quick: bool, disk_write_mbs: float | None) -> list[Figure]:
    from lowtide.log.cleaner.cleaner import Cleaner
    from lowtide.log.cleaner.config import CompactionConfig

    total = (64 if quick else 256) * MiB
    keys = total // VALUE // 4  # each key written about four times
    path = data_dir / "cleaner" / "bench-0"
    shutil.rmtree(path.parent, ignore_errors=True)
    try:
        say(f"cleaner: writing {total // MiB} MiB of keyed records ({keys} keys)")
        plog = _build(path, total, keys)
        try:
            before = plog.size_bytes
            cleaner = Cleaner()
            now = int(time.time() * 1000)
            t0 = time.perf_counter()
            first = cleaner.clean(plog, CompactionConfig(), checkpoint=None, now_ms=now)
            first_s = time.perf_counter() - t0
            after = plog.size_bytes
            t0 = time.perf_counter()
            second = cleaner.clean(plog, CompactionConfig(), checkpoint=None, now_ms=now)
            second_s = time.perf_counter() - t0
        finally:
            plog.close()
    except Exception as exc:  # noqa: BLE001 - reported as an error figure
        return [failed("cleaner_mbs", "log cleaner (compaction, KIP-534 delete horizon) throughput", "MB/s", None,
                       exc)]
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    dirty_mbs = first.dirty_bytes / first_s / 1e6
    copy_mbs = second.dirty_bytes / second_s / 1e6
    say(f"cleaner: first pass {before / MiB:.0f} -> {after / MiB:.0f} MiB in {first_s:.2f}s = {dirty_mbs:.0f} MB/s; "
        f"copy pass {copy_mbs:.0f} MB/s")
    figures = [
        Figure(key="cleaner_mbs", name="log cleaner (compaction, KIP-534 delete horizon) throughput",
               value=dirty_mbs, unit="MB/s", target="(named by its issue)",
               params={"dirty_bytes": first.dirty_bytes, "after_bytes": after, "seconds": first_s, "keys": keys,
                       "records_removed": first.stats.records_removed,
                       "batches_rewritten": first.stats.batches_rewritten,
                       "delete_horizons_set": first.stats.horizons_set},
               note=f"first pass, all dirty: {first.dirty_bytes / MiB:.0f} MiB -> {after / MiB:.0f} MiB, "
                    f"{first.stats.batches_rewritten} batches re-encoded, {first.stats.horizons_set} horizons set"),
        Figure(key="cleaner_copy_mbs", name="log cleaner pass where every batch is kept (byte copy)",
               value=copy_mbs, unit="MB/s",
               params={"dirty_bytes": second.dirty_bytes, "seconds": second_s,
                       "batches_copied": second.stats.batches_copied},
               note="a second pass over the cleaned log, checkpoint dropped: nothing superseded"),
    ]
    for figure in figures:
        if disk_write_mbs:
            figure.ratio, figure.ratio_of = figure.value / disk_write_mbs, "sequential disk write"
        figure.judge()
    return figures
