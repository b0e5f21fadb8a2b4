"""Recovery time of a classic log (issue 34): how long ``PartitionLog.open`` takes on a log of
idempotent batches, with its producer-state snapshots and without.

In process, over a real PartitionLog on the bench data disk (no cluster: the figure is the log's).
The log holds 1 GiB (quick: 64 MiB) of 4 KiB batches (8 records of 480 bytes, Kafka's RecordBatch
v2) from 1,000 idempotent producers in turn, in 64 MiB segments (quick: 16 MiB); the active
segment is left half full, as a running log's is. Each open is timed three times, the median
reported; the page cache is warm (the data was just written), so this is the CPU cost of reading
the producer state back, not the disk's.

* ``recovery_open_snapshot_ms``: after a clean shutdown, which wrote a snapshot at the log end:
  the snapshot alone is read, no batch header.
* ``recovery_open_crash_ms``: as after a crash, no snapshot at the log end: the snapshot of the
  last roll, then the headers of the active segment.
* ``recovery_open_no_snapshot_ms``: no snapshot at all (a log written before they existed):
  every batch header of every segment, as every open did before issue 34.

Every open also recovers the active segment (a CRC check of each of its batches, the same in the
three cases): the differences are the producer state's.
"""

from __future__ import annotations

import os
import shutil
import statistics
import struct
import time
from pathlib import Path

from tests.bench.common import Figure, MiB, failed, say

RECORDS = 8
VALUE = 480
PRODUCERS = 1000
BATCHES_PER_APPEND = 64
REPEATS = 3
_PID_EPOCH_SEQ = struct.Struct(">qhi")  # producer id, epoch, base sequence at byte 43 of a batch
_CRC = struct.Struct(">I")  # at byte 17, over bytes 21..end


def _build(path: Path, *, total_bytes: int, segment_bytes: int) -> int:
    """Write the log; returns how many batches it holds."""
    from lowtide.log.partition_log import LogConfig, PartitionLog
    from lowtide.record import crc32c, encode_batch

    plog = PartitionLog.open(path, topic="bench", partition=0, config=LogConfig(segment_bytes=segment_bytes))
    now = int(time.time() * 1000)
    template = bytearray(encode_batch([os.urandom(VALUE) for _ in range(RECORDS)], timestamp_ms=now, producer_id=0,
                                      producer_epoch=0, base_sequence=0))
    # Full segments, then the active one half full (as a running log's is).
    target = total_bytes - segment_bytes // 2
    sequences = [0] * PRODUCERS
    batches = 0
    try:
        while plog.size_bytes < target:
            chunk = bytearray()
            for _ in range(BATCHES_PER_APPEND):
                pid = batches % PRODUCERS
                _PID_EPOCH_SEQ.pack_into(template, 43, pid + 1, 0, sequences[pid])
                _CRC.pack_into(template, 17, crc32c(memoryview(template)[21:]))
                chunk += template
                sequences[pid] += RECORDS
                batches += 1
            plog.append_as_leader(chunk, leader_epoch=0)
    finally:
        plog.close()  # a clean shutdown: a snapshot at the log end
    return batches


def _open_ms(path: Path, *, segment_bytes: int, snapshots: dict[Path, bytes]) -> float:
    """Median wall time of opening the log with exactly the snapshot files ``snapshots`` (path ->
    bytes) in its directory: each open's close writes one at the log end, which goes again."""
    from lowtide.log.partition_log import LogConfig, PartitionLog

    samples = []
    for _ in range(REPEATS):
        for p in path.glob("*.snapshot"):
            p.unlink()
        for p, data in snapshots.items():
            p.write_bytes(data)
        began = time.perf_counter()
        plog = PartitionLog.open(path, topic="bench", partition=0, config=LogConfig(segment_bytes=segment_bytes))
        samples.append((time.perf_counter() - began) * 1000)
        plog.close()
    return statistics.median(samples)


def recovery_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    """The three open times of module docstring, on a log of 1 GiB (quick: 64 MiB)."""
    total = (64 if quick else 1024) * MiB
    segment_bytes = (16 if quick else 64) * MiB
    path = data_dir / "recovery" / "bench-0"
    shutil.rmtree(path.parent, ignore_errors=True)
    name = f"open a {total // MiB} MiB log of idempotent batches"
    try:
        say(f"recovery: writing {total // MiB} MiB of 4 KiB idempotent batches from {PRODUCERS} producers")
        began = time.perf_counter()
        batches = _build(path, total_bytes=total, segment_bytes=segment_bytes)
        say(f"recovery: {batches} batches written in {time.perf_counter() - began:.1f}s")
        snapshots = {p: p.read_bytes() for p in sorted(path.glob("*.snapshot"))}
        newest = max(snapshots, default=None)
        segments = len(list(path.glob("*.log")))
        with_snapshot = _open_ms(path, segment_bytes=segment_bytes, snapshots=snapshots)
        after_crash = _open_ms(path, segment_bytes=segment_bytes,
                               snapshots={p: d for p, d in snapshots.items() if p != newest})
        without = _open_ms(path, segment_bytes=segment_bytes, snapshots={})
    except Exception as exc:  # noqa: BLE001 - reported as an error figure
        return [failed("recovery_open_snapshot_ms", name + ", with snapshots", "ms", None, exc)]
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    say(f"recovery: open {with_snapshot:.0f} ms with the shutdown snapshot, {after_crash:.0f} ms from the last "
        f"roll's, {without:.0f} ms without snapshots ({batches} batches, {segments} segments)")
    params = {"log_bytes": total, "segment_bytes": segment_bytes, "segments": segments, "batches": batches,
              "producers": PRODUCERS, "batch_records": RECORDS, "repeats": REPEATS,
              "snapshot_bytes": len(snapshots[newest]) if newest else 0}
    return [
        Figure(key="recovery_open_snapshot_ms", name=name + ", after a clean shutdown (snapshot at its end)",
               value=with_snapshot, unit="ms", ratio=with_snapshot / without if without else None,
               ratio_of="the open without snapshots", params=params,
               note="reads the snapshot, no batch header; the active segment's CRC recovery is in every figure"),
        Figure(key="recovery_open_crash_ms", name=name + ", as after a crash (last roll's snapshot + tail)",
               value=after_crash, unit="ms", ratio=after_crash / without if without else None,
               ratio_of="the open without snapshots", params=params,
               note="the snapshot of the last roll, then the active segment's headers"),
        Figure(key="recovery_open_no_snapshot_ms", name=name + ", without snapshots (every batch header)",
               value=without, unit="ms", params=params, note="what every open did before producer snapshots"),
    ]

