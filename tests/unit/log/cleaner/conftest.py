"""Helpers of the log cleaner tests: real PartitionLogs in tmp_path, keyed batches, reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lowtide.log.cleaner.cleaner import Cleaner, PassResult
from lowtide.log.cleaner.config import CleanerSettings, CompactionConfig
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.record import Record, decode_batches, encode_batch

RETENTION_MS = 1000
# Small segments so a few batches span several; a short delete.retention.ms for the horizon.
COMPACT = LogConfig(segment_bytes=1024, cleanup_policy="compact", delete_retention_ms=RETENTION_MS,
                    index_interval_bytes=100)
NOW = 1_700_000_000_000  # the wall clock of the tests' first pass
Pair = tuple[bytes | None, bytes | None]


def open_log(path: Path, config: LogConfig = COMPACT) -> PartitionLog:
    return PartitionLog.open(path, topic="t", partition=0, config=config)


def append(log: PartitionLog, pairs: list[Pair], *, ts: int = NOW - 60_000, **kwargs) -> int:
    """One batch of (key, value) records appended as leader (value None = tombstone); its base offset."""
    raw = encode_batch([v for _, v in pairs], keys=[k for k, _ in pairs], timestamp_ms=ts, **kwargs)
    return log.append_as_leader(raw, leader_epoch=1).base_offset


def fill(log: PartitionLog, keys: int, rounds: int, *, ts: int = NOW - 60_000,
         roll_each: bool = False) -> dict[bytes, tuple[int, bytes]]:
    """``rounds`` batches, each writing every one of ``keys`` keys (a segment each with
    ``roll_each``); then roll and commit. Returns key -> (offset, value) of the latest write."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    for r in range(rounds):
        pairs = [(b"key-%d" % k, b"value-%d-%d" % (k, r)) for k in range(keys)]
        base = append(log, pairs, ts=ts + r)
        for i, (k, v) in enumerate(pairs):
            latest[k] = (base + i, v)
        if roll_each:
            log.roll()
    log.roll()
    commit(log)
    return latest


def commit(log: PartitionLog) -> None:
    """Everything written is replicated: HW = LEO (the cleaner never goes past the HW)."""
    log.set_high_watermark(log.log_end_offset)


def records_of(log: PartitionLog) -> list[Record]:
    """Every record from the log start offset to the log end offset, as a follower reads them."""
    out: list[Record] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, max_bytes=1 << 20, max_offset=log.log_end_offset)
        if not data:
            break
        for header, records in decode_batches(data):
            out.extend(r for r in records if r.offset >= offset)
            offset = header.next_offset
    return out


def batches_of(log: PartitionLog) -> list:
    """(header, records) of every batch from the log start offset to the end."""
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, max_bytes=1 << 20, max_offset=log.log_end_offset)
        if not data:
            break
        for header, records in decode_batches(data):
            out.append((header, records))
            offset = header.next_offset
    return out


def by_key(log: PartitionLog) -> dict[bytes | None, tuple[int, bytes | None]]:
    """key -> (offset, value) of the last record of each key in the log."""
    return {r.key: (r.offset, r.value) for r in records_of(log)}


def clean(log: PartitionLog, now_ms: int = NOW, *, checkpoint: int | None = None,
          compaction: CompactionConfig = CompactionConfig(), cleaner: Cleaner | None = None,
          horizons: dict[int, int] | None = None) -> PassResult:
    return (cleaner or Cleaner()).clean(log, compaction, checkpoint=checkpoint, now_ms=now_ms, horizons=horizons)


def leftovers(path: Path) -> list[str]:
    """Files a finished swap must not leave behind."""
    return sorted(n for n in os.listdir(path)
                  if n.endswith((".cleaned", ".swap", ".cleaner-swap", ".deleted", ".tmp")))


@pytest.fixture
def log(tmp_path):
    plog = open_log(tmp_path / "t-0")
    yield plog
    plog.close()


@pytest.fixture
def small_reads() -> Cleaner:
    """A cleaner reading 100 bytes at a time: every batch is a window of its own (or larger)."""
    return Cleaner(settings=CleanerSettings(io_buffer_size=100))
