"""The cleaner thread's scheduling: Kafka's dirty-ratio rule, plus a pass when a delete horizon passes
(so an idle compacted log loses its tombstones), idle segment rolls, the checkpoint, failures."""

from __future__ import annotations

import os

from lowtide.clock import now_ms
from lowtide.log.cleaner.checkpoint import CLEANER_OFFSET_CHECKPOINT
from lowtide.log.cleaner.config import CleanerSettings, CompactionConfig
from lowtide.log.cleaner.scheduler import LogCleaner
from lowtide.log.partition_log import LogConfig
from tests.unit.log.cleaner.conftest import COMPACT, NOW, RETENTION_MS, append, by_key, commit, open_log, records_of
from tests.waiting import wait_until


class Clock:
    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


def cleaner_for(tmp_path, plog, clock, compaction=CompactionConfig(), **settings) -> LogCleaner:
    return LogCleaner(data_dir=tmp_path, logs=lambda: [(plog, compaction)], clock=clock,
                      settings=CleanerSettings(**settings))


def log_with_a_tombstone(tmp_path, config: LogConfig = COMPACT):
    plog = open_log(tmp_path / "t-0", config)
    append(plog, [(b"k", b"v"), (b"keep", b"1")])
    append(plog, [(b"k", None)])
    plog.roll()
    commit(plog)
    return plog


def test_an_idle_log_gets_a_pass_in_the_first_round_after_its_tombstones_horizon(tmp_path):
    plog = log_with_a_tombstone(tmp_path)
    clock = Clock(NOW)
    cleaner = cleaner_for(tmp_path, plog, clock)

    assert cleaner.run_once()  # dirty: Kafka's rule cleans it; the tombstone gets its horizon
    assert by_key(plog)[b"k"][1] is None
    clock.now = NOW + 1
    assert not cleaner.run_once()  # nothing dirty, horizon not reached
    assert cleaner.next_round_ms == NOW + RETENTION_MS  # wakes at the horizon, not after the backoff

    clock.now = NOW + RETENTION_MS
    assert cleaner.run_once()
    assert b"k" not in by_key(plog) and by_key(plog)[b"keep"][1] == b"1"
    assert cleaner.metrics.snapshot().tombstones_removed == 1
    clock.now += 1
    assert not cleaner.run_once()
    assert cleaner.next_round_ms == clock.now + CleanerSettings().backoff_ms
    plog.close()


def test_a_restarted_cleaner_learns_the_horizons_from_the_batch_headers(tmp_path):
    plog = log_with_a_tombstone(tmp_path)
    clock = Clock(NOW)
    assert cleaner_for(tmp_path, plog, clock).run_once()

    restarted = cleaner_for(tmp_path, plog, clock)  # a new process: same checkpoint, no memory
    clock.now = NOW + 10
    assert not restarted.run_once()
    assert restarted.next_round_ms == NOW + RETENTION_MS
    clock.now = NOW + RETENTION_MS
    assert restarted.run_once() and b"k" not in by_key(plog)
    plog.close()


def test_after_a_pass_the_checkpoint_file_holds_the_first_dirty_offset(tmp_path):
    plog = log_with_a_tombstone(tmp_path)
    cleaner = cleaner_for(tmp_path, plog, Clock(NOW))
    cleaner.run_once()
    active_base = plog.describe()["segments"][-1][0]
    assert (tmp_path / CLEANER_OFFSET_CHECKPOINT).read_text() == f"0\n1\nt 0 {active_base}\n"
    plog.close()


def test_a_log_below_the_dirty_ratio_waits_and_one_above_it_is_cleaned(tmp_path):
    plog = open_log(tmp_path / "t-0")
    for i in range(10):
        append(plog, [(b"key-%d" % i, b"v")])
    plog.roll()
    commit(plog)
    clock = Clock(NOW)
    cleaner = cleaner_for(tmp_path, plog, clock, CompactionConfig(min_cleanable_dirty_ratio=0.4))
    assert cleaner.run_once()  # never cleaned: all dirty
    append(plog, [(b"key-0", b"w")])
    plog.roll()
    commit(plog)
    assert not cleaner.run_once()  # 1 dirty batch of 11
    for i in range(1, 10):
        append(plog, [(b"key-%d" % i, b"w")])
    plog.roll()
    commit(plog)
    assert cleaner.run_once()
    assert {k: v for k, (_, v) in by_key(plog).items()} == {b"key-%d" % i: b"w" for i in range(10)}
    plog.close()


def test_an_idle_active_segment_is_rolled_after_segment_ms_so_its_records_get_cleaned(tmp_path):
    plog = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20, segment_ms=1000, cleanup_policy="compact",
                                                delete_retention_ms=RETENTION_MS))
    append(plog, [(b"k", b"1")])
    append(plog, [(b"k", b"2")])
    commit(plog)
    clock = Clock(now_ms())
    cleaner = cleaner_for(tmp_path, plog, clock)
    assert not cleaner.run_once() and plog.num_segments == 1
    assert cleaner.next_round_ms <= clock.now + 1000

    clock.now += 1000
    cleaner.run_once()

    assert plog.num_segments == 2 and cleaner.metrics.snapshot().segments_rolled == 1
    commit(plog)
    cleaner.run_once()
    assert [(r.offset, r.value) for r in records_of(plog)] == [(1, b"2")]
    plog.close()


def test_a_log_that_cannot_be_read_is_retried_after_a_backoff_not_in_a_loop(tmp_path):
    plog = log_with_a_tombstone(tmp_path)
    first = tmp_path / "t-0" / sorted(n for n in os.listdir(tmp_path / "t-0") if n.endswith(".log"))[0]
    data = bytearray(first.read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records: its CRC no longer matches
    first.write_bytes(bytes(data))
    clock = Clock(NOW)
    cleaner = cleaner_for(tmp_path, plog, clock, backoff_ms=1000)

    assert cleaner.run_once()
    assert cleaner.metrics.snapshot().failures == 1
    assert not cleaner.run_once()  # not again at once
    assert cleaner.next_round_ms > clock.now
    assert leftovers_of(tmp_path / "t-0") == []
    plog.close()


def leftovers_of(path) -> list[str]:
    return [n for n in os.listdir(path) if n.endswith((".cleaned", ".swap", ".cleaner-swap"))]


def test_the_thread_removes_a_tombstone_shortly_after_its_horizon_with_nothing_else_happening(tmp_path):
    config = LogConfig(segment_bytes=1024, cleanup_policy="compact", delete_retention_ms=300)
    plog = log_with_a_tombstone(tmp_path, config)
    cleaner = cleaner_for(tmp_path, plog, now_ms, backoff_ms=60_000)  # only the horizon can wake it
    cleaner.start()
    try:
        wait_until(lambda: records_of(plog) and [r.key for r in records_of(plog)] == [b"keep", b"k"],
                   what="the first pass", timeout_s=10)
        set_at = now_ms()
        wait_until(lambda: [r.key for r in records_of(plog)] == [b"keep"], what="the tombstone to go",
                   timeout_s=10)
        assert now_ms() - set_at < 300 + 2000
    finally:
        cleaner.stop()
    plog.close()


def test_an_expired_horizon_of_a_segment_that_left_the_log_does_not_make_every_round_due(tmp_path):
    config = LogConfig(segment_bytes=1024, cleanup_policy="compact,delete", delete_retention_ms=RETENTION_MS)
    plog = log_with_a_tombstone(tmp_path, config)
    clock = Clock(NOW)
    cleaner = cleaner_for(tmp_path, plog, clock, CompactionConfig(min_cleanable_dirty_ratio=0.01))
    assert cleaner.run_once()  # the tombstone's segment gets its horizon
    later = append(plog, [(b"big", b"x" * 900)])  # too big to merge with it
    plog.roll()
    commit(plog)
    clock.now = NOW + 1
    assert cleaner.run_once()  # cleans the new segment; two segments remain
    plog.increment_log_start_offset(later)  # DeleteRecords takes the tombstone's segment only
    clock.now = NOW + RETENTION_MS
    cleaner.run_once()
    assert not cleaner.run_once()  # not a pass per round forever
    assert cleaner.next_round_ms == clock.now + CleanerSettings().backoff_ms
    plog.close()
