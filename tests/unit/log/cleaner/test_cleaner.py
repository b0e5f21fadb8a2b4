"""One cleaning pass over a real PartitionLog, named after the behaviours of Kafka's LogCleanerTest
that apply to tombstones (Kafka drives them with two passes: at t and at t + delete.retention.ms + 1)."""

from __future__ import annotations

import os

import pytest

from lowtide.errors import InvalidRecord, OffsetOutOfRange
from lowtide.log.cleaner.cleaner import Cleaner, CleanerStopped, plan_clean
from lowtide.log.cleaner.config import CleanerSettings, CompactionConfig
from lowtide.log.cleaner.swap import STEP_CLEANED
from lowtide.log.cleaner.throttler import Throttler
from lowtide.log.partition_log import LogConfig
from lowtide.record import encode_batch, read_header
from tests.unit.log.cleaner.conftest import (
    COMPACT,
    NOW,
    RETENTION_MS,
    append,
    batches_of,
    by_key,
    clean,
    commit,
    fill,
    leftovers,
    open_log,
    records_of,
)

# --- KIP-534: tombstones and their delete horizon -----------------------------------------------


def test_clean_tombstone_survives_its_first_pass_with_the_horizon_set_and_is_gone_after_a_pass_past_it(log):
    append(log, [(b"k", b"v1"), (b"other", b"o")])
    tombstone_ts = NOW - 5_000
    tombstone_offset = append(log, [(b"k", None)], ts=tombstone_ts)
    log.roll()
    commit(log)

    first = clean(log, NOW)

    [(header, records)] = [(h, r) for h, r in batches_of(log) if any(x.key == b"k" for x in r)]
    assert [(r.offset, r.value, r.timestamp) for r in records] == [(tombstone_offset, None, tombstone_ts)]
    assert header.has_delete_horizon and header.delete_horizon_ms == NOW + RETENTION_MS
    assert header.base_timestamp == NOW + RETENTION_MS and header.attributes & 0x40
    assert first.stats.horizons_set == 1 and first.horizons

    second = clean(log, NOW + RETENTION_MS + 1, checkpoint=first.end_offset, horizons=first.horizons)

    assert b"k" not in by_key(log)
    assert by_key(log)[b"other"][1] == b"o"
    assert second.stats.tombstones_removed == 1


def test_a_consumer_reading_a_key_within_delete_retention_sees_its_tombstone(log):
    # A consumer that read k=v1 before the first pass must see the deletion as long as it reads
    # within delete.retention.ms of that pass.
    append(log, [(b"k", b"v1")])
    append(log, [(b"k", None)])
    log.roll()
    commit(log)
    first = clean(log, NOW)
    for now in (NOW + 1, NOW + RETENTION_MS - 1):
        clean(log, now, checkpoint=first.end_offset, horizons=first.horizons)
        assert [(r.key, r.value) for r in records_of(log)] == [(b"k", None)]
    clean(log, NOW + RETENTION_MS, checkpoint=first.end_offset, horizons=first.horizons)
    assert records_of(log) == []


def test_a_tombstone_keeps_its_first_horizon_over_later_passes(log):
    append(log, [(b"k", None), (b"x", b"1")])
    log.roll()
    commit(log)
    first = clean(log, NOW)
    append(log, [(b"x", b"2")])  # makes the log dirty again
    log.roll()
    commit(log)
    clean(log, NOW + 500, checkpoint=first.end_offset)
    [header] = [h for h, r in batches_of(log) if any(x.key == b"k" for x in r)]
    assert header.delete_horizon_ms == NOW + RETENTION_MS  # not NOW + 500 + RETENTION_MS


def test_a_tombstone_removes_the_older_values_of_its_key_at_once(log):
    append(log, [(b"k", b"v1"), (b"k", b"v2")])
    append(log, [(b"k", None)])
    log.roll()
    commit(log)
    clean(log, NOW)
    assert [(r.key, r.value) for r in records_of(log)] == [(b"k", None)]


def test_a_value_written_after_a_tombstone_supersedes_it(log):
    append(log, [(b"k", None)])
    append(log, [(b"k", b"back")])
    log.roll()
    commit(log)
    clean(log, NOW)
    assert [(r.key, r.value) for r in records_of(log)] == [(b"k", b"back")]


# --- compaction ---------------------------------------------------------------------------------


def test_the_latest_value_of_every_key_stays_at_its_offset(log):
    latest = fill(log, keys=10, rounds=8)
    before = len(records_of(log))

    result = clean(log, NOW)

    assert by_key(log) == latest
    assert len(records_of(log)) == 10 < before
    assert result.end_offset == log.log_end_offset  # the whole non-active log is clean now
    assert leftovers(log.dir) == [] or all(n.endswith(".deleted") for n in leftovers(log.dir))


def test_offsets_of_kept_records_never_change_and_batches_keep_their_base_offsets(log):
    fill(log, keys=5, rounds=6)
    bases_before = {h.base_offset: h.last_offset_delta for h, _ in batches_of(log)}
    offsets_before = {r.offset: (r.key, r.value) for r in records_of(log)}

    clean(log, NOW)

    for header, _ in batches_of(log):
        assert bases_before[header.base_offset] == header.last_offset_delta
    assert all(offsets_before[r.offset] == (r.key, r.value) for r in records_of(log))


def test_deleted_batches_with_no_messages_read(log, small_reads):
    # Kafka's testDeletedBatchesWithNoMessagesRead: whole read windows lose every record; the pass
    # must still move on through them (here every window holds one batch).
    for i in range(6):
        append(log, [(b"same", b"v%d" % i)])
    append(log, [(b"last", b"x")])
    log.roll()
    commit(log)

    result = clean(log, NOW, cleaner=small_reads)

    assert [(r.offset, r.key, r.value) for r in records_of(log)] == [(5, b"same", b"v5"), (6, b"last", b"x")]
    assert result.stats.batches_removed == 5


def test_a_batch_larger_than_the_read_window_is_read_whole(log, small_reads):
    append(log, [(b"big-%d" % i, b"x" * 50) for i in range(10)])
    append(log, [(b"big-0", b"new")])
    log.roll()
    commit(log)
    clean(log, NOW, cleaner=small_reads)
    assert by_key(log)[b"big-0"] == (10, b"new") and len(records_of(log)) == 10


def test_a_batch_that_keeps_all_its_records_is_copied_byte_for_byte(log):
    append(log, [(b"a", b"1")])
    kept = append(log, [(b"b", b"2"), (b"c", b"3")])
    append(log, [(b"a", b"4")])
    log.roll()
    commit(log)
    raw_before = log.read(kept, max_bytes=1, max_offset=log.log_end_offset)

    result = clean(log, NOW)

    assert log.read(kept, max_bytes=1, max_offset=log.log_end_offset) == raw_before
    assert result.stats.batches_copied >= 1 and result.stats.batches_removed == 1


def test_a_batch_that_loses_records_keeps_its_producer_fields(log):
    raw = encode_batch([b"1", b"2"], keys=[b"a", b"b"], timestamp_ms=NOW, producer_id=7, producer_epoch=2,
                       base_sequence=40)
    base = log.append_as_leader(raw, leader_epoch=3).base_offset
    append(log, [(b"a", b"newer")])
    log.roll()
    commit(log)
    clean(log, NOW)
    header, records = batches_of(log)[0]
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (base, 1, 1)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 40)
    assert header.partition_leader_epoch == 3 and [r.key for r in records] == [b"b"]


def test_small_cleaned_segments_merge_up_to_segment_bytes(log):
    fill(log, keys=3, rounds=30)  # ~30 small segments of one key-set each after cleaning
    clean(log, NOW)
    cleaned_once = log.num_segments
    append(log, [(b"key-0", b"again")])
    log.roll()
    commit(log)
    clean(log, NOW)  # no checkpoint: the whole log is dirty again
    assert log.num_segments < cleaned_once
    for _, _, size in log.describe()["segments"]:
        assert size <= COMPACT.segment_bytes


def test_the_active_segment_and_records_above_the_high_watermark_are_never_cleaned(log):
    append(log, [(b"k", b"1")])
    append(log, [(b"k", b"2")])
    log.roll()
    append(log, [(b"k", b"3")])  # active segment
    append(log, [(b"k", b"4")])
    log.set_high_watermark(2)
    clean(log, NOW)
    assert [(r.offset, r.value) for r in records_of(log)] == [(1, b"2"), (2, b"3"), (3, b"4")]


def test_records_without_a_key_written_before_the_topic_compacted_are_dropped(tmp_path):
    plog = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1024, cleanup_policy="delete"))
    plog.append_as_leader(encode_batch([b"no key", b"keyed"], keys=[None, b"k"], timestamp_ms=NOW), leader_epoch=1)
    plog.roll()
    commit(plog)
    plog.update_config(COMPACT)
    result = clean(plog, NOW)
    assert [(r.key, r.value) for r in records_of(plog)] == [(b"k", b"keyed")]
    assert result.stats.keyless_removed == 1
    plog.close()


# --- when a log is cleanable ----------------------------------------------------------------------


def test_a_log_below_min_cleanable_dirty_ratio_does_not_need_cleaning(log):
    fill(log, keys=20, rounds=4)
    first = clean(log, NOW)
    append(log, [(b"key-0", b"one more")])
    log.roll()
    commit(log)
    plan = plan_clean(log, CompactionConfig(min_cleanable_dirty_ratio=0.5), checkpoint=first.end_offset, now_ms=NOW)
    assert 0 < plan.dirty_ratio < 0.5 and not plan.needs_cleaning(CompactionConfig(min_cleanable_dirty_ratio=0.5))
    assert plan.needs_cleaning(CompactionConfig(min_cleanable_dirty_ratio=0.01))


def test_a_record_past_max_compaction_lag_needs_cleaning_whatever_the_ratio(log):
    fill(log, keys=20, rounds=4)
    first = clean(log, NOW)
    append(log, [(b"key-0", b"old")], ts=NOW - 10_000)
    log.roll()
    commit(log)
    lagging = CompactionConfig(min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=5_000)
    plan = plan_clean(log, lagging, checkpoint=first.end_offset, now_ms=NOW)
    assert plan.max_compaction_delay_ms == 5_000 and plan.needs_cleaning(lagging)
    patient = CompactionConfig(min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=60_000)
    assert not plan_clean(log, patient, checkpoint=first.end_offset, now_ms=NOW).needs_cleaning(patient)


def test_records_younger_than_min_compaction_lag_are_not_compacted(log):
    append(log, [(b"k", b"old")], ts=NOW - 60_000)
    log.roll()
    append(log, [(b"k", b"young")], ts=NOW - 1_000)
    log.roll()
    commit(log)
    lag = CompactionConfig(min_compaction_lag_ms=10_000)
    plan = plan_clean(log, lag, checkpoint=None, now_ms=NOW)
    assert plan.first_uncleanable_offset == 1

    clean(log, NOW, compaction=lag)

    assert [(r.offset, r.value) for r in records_of(log)] == [(0, b"old"), (1, b"young")]
    clean(log, NOW + 10_000, compaction=lag)
    assert [(r.offset, r.value) for r in records_of(log)] == [(1, b"young")]


def test_a_full_offset_map_cleans_up_to_where_it_reached_and_the_rest_next_pass(log, small_reads):
    latest = fill(log, keys=20, rounds=6)
    tiny = Cleaner(settings=CleanerSettings(io_buffer_size=100, dedupe_buffer_size=2_000))
    first = clean(log, NOW, cleaner=tiny)
    assert 0 < first.end_offset < log.log_end_offset - 1
    assert by_key(log) == latest  # nothing above the map's end was dropped
    while True:
        result = clean(log, NOW, cleaner=tiny, checkpoint=first.end_offset)
        if result.end_offset == first.end_offset:
            break
        first = result
    assert first.end_offset == log.log_end_offset and by_key(log) == latest


def test_a_pass_with_nothing_dirty_and_no_expired_horizon_rewrites_nothing(log):
    fill(log, keys=5, rounds=3)
    first = clean(log, NOW)
    files = {n: os.stat(log.dir / n).st_ino for n in os.listdir(log.dir) if n.endswith(".log")}
    again = clean(log, NOW + 1, checkpoint=first.end_offset, horizons=first.horizons)
    assert again.groups_cleaned == 0 and again.bytes_read == 0
    assert {n: os.stat(log.dir / n).st_ino for n in os.listdir(log.dir) if n.endswith(".log")} == files


# --- concurrency and the produce / replicate paths ----------------------------------------------


def test_a_group_whose_segments_change_during_the_pass_is_not_swapped(tmp_path):
    plog = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1024, cleanup_policy="compact,delete",
                                               delete_retention_ms=RETENTION_MS))
    fill(plog, keys=4, rounds=6)

    def delete_records_meanwhile(step: str) -> None:
        assert step == STEP_CLEANED
        plog.increment_log_start_offset(plog.log_end_offset)  # DeleteRecords: every segment goes

    result = clean(plog, NOW, cleaner=Cleaner(swap_hook=delete_records_meanwhile))

    assert result.groups_aborted >= 1 and result.groups_cleaned == 0
    assert records_of(plog) == []
    assert not [n for n in os.listdir(plog.dir) if n.endswith((".cleaned", ".swap", ".cleaner-swap"))]
    plog.close()


def test_a_compacted_log_refuses_a_keyless_record_and_stores_nothing(log):
    with pytest.raises(InvalidRecord):
        log.append_as_leader(encode_batch([b"v"]), leader_epoch=1)
    assert log.log_end_offset == 0


def test_a_follower_of_a_compacted_log_accepts_batches_after_offsets_the_leader_cleaned_away(tmp_path):
    leader = open_log(tmp_path / "leader" / "t-0")
    follower = open_log(tmp_path / "follower" / "t-0")
    append(leader, [(b"k", b"1")])
    append(leader, [(b"k", b"2")])
    append(leader, [(b"j", b"3")])
    leader.roll()
    commit(leader)
    clean(leader, NOW)  # offset 0 is gone on the leader

    follower.append_as_follower(leader.read(0, max_bytes=1 << 20, max_offset=leader.log_end_offset))

    assert [(r.offset, r.value) for r in records_of(follower)] == [(1, b"2"), (2, b"3")]
    assert follower.log_end_offset == 3
    delete_policy = open_log(tmp_path / "plain" / "t-0", LogConfig(segment_bytes=1024))
    with pytest.raises(OffsetOutOfRange):
        delete_policy.append_as_follower(leader.read(0, max_bytes=1 << 20, max_offset=leader.log_end_offset))
    for plog in (leader, follower, delete_policy):
        plog.close()


def test_a_cleaned_log_reopens_with_the_same_records_and_indexes(tmp_path):
    plog = open_log(tmp_path / "t-0")
    latest = fill(plog, keys=8, rounds=10)
    clean(plog, NOW)
    before = records_of(plog)
    first_ts = plog.offset_for_timestamp(0)
    plog.close()
    reopened = open_log(tmp_path / "t-0")
    reopened.set_high_watermark(reopened.log_end_offset)
    assert records_of(reopened) == before and by_key(reopened) == latest
    assert reopened.offset_for_timestamp(0) == first_ts
    assert read_header(reopened.read(before[0].offset, max_bytes=1, max_offset=10**9)).base_offset <= before[0].offset
    reopened.close()


def test_a_cleaner_told_to_stop_mid_pass_leaves_the_log_as_it_was_and_no_files_behind(log):
    latest = fill(log, keys=6, rounds=10, roll_each=True)
    before = records_of(log)

    class StopOnceWriting(Throttler):
        """Stops the cleaner as soon as a cleaned segment is being written."""

        def maybe_throttle(self, observed: float) -> None:
            if any(n.endswith(".cleaned") for n in os.listdir(log.dir)):
                cleaner.stop.set()

    cleaner = Cleaner(settings=CleanerSettings(io_buffer_size=100))
    cleaner.throttler = StopOnceWriting(1.0)
    with pytest.raises(CleanerStopped):
        clean(log, NOW, cleaner=cleaner)

    assert records_of(log) == before and by_key(log) == latest
    assert not [n for n in os.listdir(log.dir) if n.endswith((".cleaned", ".swap", ".cleaner-swap"))]
