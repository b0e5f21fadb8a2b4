"""PartitionLog: offsets, reads, KIP-107 log start offset, recovery, retention, truncation."""

from __future__ import annotations

import os
import threading
import time

import pytest

from lowtide.errors import (
    CorruptMessage,
    InvalidConfig,
    InvalidRecord,
    KafkaStorageError,
    MessageTooLarge,
    OffsetOutOfRange,
    RecordListTooLarge,
)
from lowtide.log import filenames
from lowtide.log.file_deleter import DELETER
from lowtide.log.partition_log import LogConfig, LogStartOffsetCommit, PartitionLog
from lowtide.log.start_offset_file import LogStartOffsetFile, StartOffsetSyncGroup
from lowtide.record import OwnedBatches, decode_batches, encode_batch, iter_batches
from tests.waiting import wait_until

SMALL = LogConfig(segment_bytes=1000, index_interval_bytes=100)


def produce(log: PartitionLog, count: int = 2, *, ts: int = 1000, size: int = 100) -> int:
    """Append one batch of ``count`` records as leader (keyed if the log compacts, which refuses
    keyless records); return its base offset."""
    keys = [b"k%d" % i for i in range(count)] if log.config.compacts else None
    raw = encode_batch([b"v" * size] * count, keys=keys, timestamp_ms=ts)
    return log.append_as_leader(raw, leader_epoch=1).base_offset


def offsets_of(data: bytes) -> list[int]:
    return [r.offset for _, records in decode_batches(data) for r in records]


def log_files(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(filenames.LOG_SUFFIX))


@pytest.fixture
def log(tmp_path):
    partition_log = PartitionLog.open(tmp_path / "orders-0", topic="orders", partition=0, config=SMALL)
    yield partition_log
    partition_log.close()


def test_open_creates_the_directory_with_an_empty_segment(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL, log_start_offset=0)
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (0, 0, 0)
    assert log_files(tmp_path / "t-0") == [filenames.log_file_name(0)]
    log.close()


def test_append_as_leader_assigns_consecutive_offsets_and_the_leader_epoch(log):
    first = log.append_as_leader(encode_batch([b"a", b"b", b"c"], timestamp_ms=5), leader_epoch=7)
    second = log.append_as_leader(encode_batch([b"d"], timestamp_ms=9), leader_epoch=7)
    assert (first.base_offset, first.last_offset, first.next_offset, first.num_batches) == (0, 2, 3, 1)
    assert (second.base_offset, second.next_offset, second.max_timestamp) == (3, 4, 9)
    data = log.read(0, max_bytes=1 << 20, max_offset=log.log_end_offset)
    assert offsets_of(data) == [0, 1, 2, 3]
    assert {h.partition_leader_epoch for h, _ in iter_batches(data)} == {7}


def test_append_and_read_across_segment_rolls(log):
    for _ in range(20):
        produce(log)
    assert log.num_segments > 3
    log.set_high_watermark(log.log_end_offset)
    seen: list[int] = []
    offset = 0
    while offset < log.high_watermark:
        data = log.read(offset, max_bytes=500, max_offset=log.high_watermark)
        got = offsets_of(data)
        assert got and got[0] == offset
        seen.extend(got)
        offset = got[-1] + 1
    assert seen == list(range(40))


def open_log_files(path) -> set[str]:
    """The .log files under ``path`` this process holds open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)) and target.endswith(filenames.LOG_SUFFIX):
            found.add(os.path.basename(target))
    return found


def test_segments_unused_for_a_pass_give_their_files_back_and_open_them_again_on_use(log, tmp_path):
    for _ in range(10):
        produce(log)
    log.set_high_watermark(log.log_end_offset)
    segments = log.num_segments
    assert len(open_log_files(tmp_path)) == segments > 2
    assert log.release_idle_files() == 0  # every segment was used since it opened
    assert log.release_idle_files() == segments  # none since the last pass
    assert open_log_files(tmp_path) == set()

    assert offsets_of(log.read(0, max_bytes=150, max_offset=log.high_watermark)) == [0, 1]  # opens one
    assert open_log_files(tmp_path) == {filenames.log_file_name(0)}
    end = log.log_end_offset
    assert produce(log) == end  # the active segment opens again to append
    log.set_high_watermark(log.log_end_offset)
    assert offsets_of(log.read(end, max_bytes=10_000, max_offset=log.high_watermark)) == [end, end + 1]
    assert log.release_idle_files() == 0  # both used since the last pass
    log.flush()  # a use too: the active segment's file is synced, so it stays open this pass
    assert log.release_idle_files() == 1
    assert open_log_files(tmp_path) == {log_files(log.dir)[-1]}  # the active segment


def test_a_log_reopened_after_its_files_were_released_has_every_record(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL, log_start_offset=0)
    for _ in range(6):
        produce(log)
    log.release_idle_files()
    log.release_idle_files()
    log.close()
    again = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    again.set_high_watermark(again.log_end_offset)
    assert again.log_end_offset == 12
    assert offsets_of(again.read(0, max_bytes=100_000, max_offset=12))[:2] == [0, 1]
    again.close()


def test_segments_roll_when_older_than_segment_ms(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=LogConfig(segment_ms=1))
    produce(log)
    time.sleep(0.01)
    produce(log)
    assert log.describe()["segments"] == [(0, 2, log.describe()["segments"][0][2]), (2, 4, log.size_bytes // 2)]
    log.close()


def test_read_caps_at_the_high_watermark(log):
    for _ in range(5):
        produce(log)
    log.set_high_watermark(6)
    assert offsets_of(log.read(0, max_bytes=1 << 20, max_offset=log.high_watermark)) == list(range(6))
    assert log.read(6, max_bytes=1 << 20, max_offset=log.high_watermark) == b""


def test_read_returns_at_least_one_batch_even_above_max_bytes(log):
    produce(log, size=300)
    assert offsets_of(log.read(1, max_bytes=10, max_offset=2)) == [0, 1]


def test_read_below_log_start_offset_raises_offset_out_of_range(log):
    for _ in range(5):
        produce(log)
    log.set_high_watermark(10)
    log.increment_log_start_offset(4)
    with pytest.raises(OffsetOutOfRange, match=r"\[4, 10\]"):
        log.read(3, max_bytes=1000, max_offset=10)


def test_read_above_log_end_offset_raises_offset_out_of_range(log):
    produce(log)
    with pytest.raises(OffsetOutOfRange):
        log.read(3, max_bytes=1000, max_offset=2)
    assert log.read(2, max_bytes=1000, max_offset=2) == b""


def test_invalid_input_stores_nothing(log):
    produce(log)
    corrupt = bytearray(encode_batch([b"x"], timestamp_ms=1))
    corrupt[-1] ^= 1
    with pytest.raises(CorruptMessage):
        log.append_as_leader(encode_batch([b"ok"], timestamp_ms=1) + corrupt, leader_epoch=1)
    with pytest.raises(InvalidRecord):
        log.append_as_leader(b"", leader_epoch=1)
    assert log.log_end_offset == 2


def test_batch_above_max_message_bytes_raises_message_too_large(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=LogConfig(max_message_bytes=200))
    with pytest.raises(MessageTooLarge, match="max.message.bytes"):
        produce(log, size=300)
    assert log.log_end_offset == 0
    log.close()


def test_a_batch_above_segment_bytes_raises_record_list_too_large_and_stores_nothing(log):
    raw = encode_batch([b"x" * 300] * 4, timestamp_ms=1)
    assert len(raw) > log.config.segment_bytes
    with pytest.raises(RecordListTooLarge):
        log.append_as_leader(raw, leader_epoch=1)
    assert log.log_end_offset == 0


def test_a_request_of_several_batches_larger_than_a_segment_spans_segments(log):
    raw = b"".join(encode_batch([b"x" * 300], timestamp_ms=1) for _ in range(4))
    assert len(raw) > log.config.segment_bytes
    info = log.append_as_leader(raw, leader_epoch=1)
    assert (info.base_offset, info.next_offset, info.num_batches) == (0, 4, 4)
    assert log.num_segments > 1
    assert all(seg[2] <= log.config.segment_bytes for seg in log.describe()["segments"])
    assert log.read(0, max_bytes=10_000, max_offset=4)[:8] == raw[:8]


def test_append_as_follower_keeps_offsets_and_requires_the_log_end_offset(log):
    info = log.append_as_follower(encode_batch([b"a", b"b"], timestamp_ms=1, base_offset=0))
    assert info.next_offset == 2
    with pytest.raises(OffsetOutOfRange, match="log end offset is 2"):
        log.append_as_follower(encode_batch([b"c"], timestamp_ms=1, base_offset=5))
    log.append_as_follower(encode_batch([b"c"], timestamp_ms=1, base_offset=2, partition_leader_epoch=4))
    assert log.log_end_offset == 3


def test_follower_restarted_inside_a_leader_batch_accepts_that_batch(log):
    log.truncate_fully_and_start_at(5)
    log.append_as_follower(encode_batch([b"a"] * 4, timestamp_ms=1, base_offset=3))
    assert (log.log_start_offset, log.log_end_offset) == (5, 7)
    log.set_high_watermark(7)
    assert offsets_of(log.read(5, max_bytes=1000, max_offset=7)) == [3, 4, 5, 6]


def test_high_watermark_is_clamped_to_the_log_end_offset_and_never_decreases(log):
    produce(log)
    assert log.set_high_watermark(100) == 2
    assert log.set_high_watermark(1) == 2


def test_increment_log_start_offset_deletes_whole_segments_below_it_but_keeps_the_one_containing_it(log):
    for _ in range(20):
        produce(log)
    log.set_high_watermark(log.log_end_offset)
    segments_before = log.describe()["segments"]
    target = segments_before[2][0] + 1  # inside the third segment
    assert log.increment_log_start_offset(target) is True
    assert log.log_start_offset == target
    assert log.describe()["segments"][0] == segments_before[2]
    assert log_files(log.dir)[0] == filenames.log_file_name(segments_before[2][0])
    assert filenames.log_file_name(0) not in os.listdir(log.dir)
    assert log.increment_log_start_offset(target - 1) is False


def test_increment_log_start_offset_above_high_watermark_raises_offset_out_of_range(log):
    produce(log)
    log.set_high_watermark(1)
    with pytest.raises(OffsetOutOfRange, match="high watermark 1"):
        log.increment_log_start_offset(2)


def test_increment_log_start_offset_to_the_log_end_soon_leaves_one_empty_segment_there(log):
    produce(log)
    log.set_high_watermark(2)
    log.increment_log_start_offset(2)
    assert log.log_start_offset == 2
    assert log.read(2, max_bytes=100, max_offset=2) == b""
    # Emptied by the file deleter's thread, off the caller's path.
    wait_until(lambda: log.describe()["segments"] == [(2, 2, 0)], what="the wholly deleted active segment emptied")
    assert log_files(log.dir) == [filenames.log_file_name(2)]
    produce(log)
    assert log.log_end_offset == 4


@pytest.fixture
def file_deleter_held():
    """The file deleter's thread blocked until the test ends (work handed to it waits)."""
    release = threading.Event()
    DELETER.schedule_call(lambda: release.wait(10))
    yield
    release.set()


def test_an_append_before_the_wholly_deleted_active_segment_is_emptied_lands_after_its_dead_bytes(
        log, file_deleter_held):
    produce(log)
    log.set_high_watermark(2)
    log.increment_log_start_offset(2)
    assert log.describe()["segments"][0][:2] == (0, 2)  # not emptied yet: the deleter is busy

    produce(log)

    assert (log.log_start_offset, log.log_end_offset) == (2, 4)
    assert offsets_of(log.read(2, max_bytes=1 << 20, max_offset=4)) == [2, 3]
    with pytest.raises(OffsetOutOfRange):
        log.read(0, max_bytes=1 << 20, max_offset=4)


def test_deleted_segment_files_leave_the_directory_soon_after_the_log_start_offset_passes_them(log):
    produce(log)
    log.set_high_watermark(2)
    log.increment_log_start_offset(2)
    wait_until(lambda: sorted(os.listdir(log.dir)) == sorted(
        [filenames.LOG_START_OFFSET_FILE, *filenames.segment_file_names(2)]), what="only the empty segment at 2 left")


def twenty_records(tmp_path, name: str = "t-0") -> PartitionLog:
    log = PartitionLog.open(tmp_path / name, topic="t", partition=0, config=SMALL)
    for _ in range(10):
        produce(log)
    log.set_high_watermark(20)
    return log


def test_a_log_start_offset_commit_moves_nothing_until_it_commits_then_every_log_with_one_flush(
        tmp_path, monkeypatch):
    logs = [twenty_records(tmp_path, f"t-{i}") for i in range(3)]
    flushes = []
    real_flush = StartOffsetSyncGroup.flush
    monkeypatch.setattr(StartOffsetSyncGroup, "flush", lambda self: (flushes.append(len(self)), real_flush(self)))
    first_segments = logs[0].describe()["segments"]

    with LogStartOffsetCommit() as commit:
        assert all(log.increment_log_start_offset(15, commit=commit) for log in logs)
        assert [log.log_start_offset for log in logs] == [0, 0, 0]  # written, not taken
        assert logs[0].describe()["segments"] == first_segments
        assert offsets_of(logs[0].read(0, max_bytes=1 << 20, max_offset=20))[0] == 0  # still readable
        assert commit.commit() == logs

    assert flushes == [3]
    assert [log.log_start_offset for log in logs] == [15, 15, 15]
    with pytest.raises(OffsetOutOfRange):
        logs[0].read(0, max_bytes=1 << 20, max_offset=20)
    assert logs[0].describe()["segments"][0][0] > 0
    for log in logs:
        log.close()
    again = PartitionLog.open(tmp_path / "t-1", topic="t", partition=0, config=SMALL)
    assert again.log_start_offset == 15
    again.close()


def test_a_plain_raise_below_an_unfinished_commit_flushes_that_write_and_takes_its_own_offset(tmp_path):
    log = twenty_records(tmp_path)
    commit = LogStartOffsetCommit()
    log.increment_log_start_offset(15, commit=commit)

    assert log.increment_log_start_offset(10) is True  # no write below 15: the file then says 15 durably

    assert log.log_start_offset == 10
    assert LogStartOffsetFile(log.dir).read() == 15
    assert commit.commit() == [log]
    assert log.log_start_offset == 15
    log.close()


def test_a_commit_does_not_take_a_log_start_offset_that_a_full_truncation_replaced(tmp_path):
    log = twenty_records(tmp_path)
    commit = LogStartOffsetCommit()
    log.increment_log_start_offset(15, commit=commit)

    log.truncate_fully_and_start_at(4)  # a follower restarting below it

    assert commit.commit() == []
    assert (log.log_start_offset, log.log_end_offset) == (4, 4)
    log.close()
    again = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    assert again.log_start_offset == 4
    again.close()


def test_when_the_commit_flush_fails_no_log_start_offset_moves(tmp_path):
    log = twenty_records(tmp_path)
    commit = LogStartOffsetCommit()
    log.increment_log_start_offset(15, commit=commit)

    def fail() -> None:
        raise KafkaStorageError("cannot flush the log start offset files: Input/output error")

    commit.sync_group.flush = fail
    with pytest.raises(KafkaStorageError, match="Input/output error"):
        commit.commit()

    assert log.log_start_offset == 0
    assert log.increment_log_start_offset(16) is True  # flushes the unflushed 15 first, then writes 16
    assert log.log_start_offset == 16
    log.close()


def test_delayed_file_deletion_renames_then_removes_segment_files(tmp_path):
    config = LogConfig(segment_bytes=1000, file_delete_delay_ms=100)
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=config)
    for _ in range(10):
        produce(log)
    log.set_high_watermark(log.log_end_offset)
    log.increment_log_start_offset(log.describe()["segments"][1][0])
    assert any(n.endswith(filenames.DELETED_SUFFIX) for n in os.listdir(log.dir))
    wait_until(lambda: not any(n.endswith(filenames.DELETED_SUFFIX) for n in os.listdir(log.dir)),
               interval_s=0.02, what="the renamed segment files removed after file_delete_delay_ms")
    log.close()


def twenty_records_with_lso(tmp_path, lso: int) -> PartitionLog:
    """A log of 10 two-record batches, HW 20, LSO moved to ``lso``."""
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    for _ in range(10):
        produce(log)
    log.set_high_watermark(20)
    log.increment_log_start_offset(lso)
    return log


def test_reopen_uses_the_larger_of_checkpointed_lso_and_first_segment_base(tmp_path):
    log = twenty_records_with_lso(tmp_path, 9)
    first_base = log.describe()["segments"][0][0]
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL, log_start_offset=9)
    assert reopened.log_start_offset == 9
    assert reopened.log_end_offset == 20
    reopened.close()
    # A directory from before the log start offset file: only the checkpoint and the segments count.
    (tmp_path / "t-0" / filenames.LOG_START_OFFSET_FILE).unlink()
    again = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL, log_start_offset=0)
    assert again.log_start_offset == first_base
    again.close()


def test_the_log_start_offset_file_outranks_a_stale_checkpoint_on_reopen(tmp_path):
    log = twenty_records_with_lso(tmp_path, 9)
    log.close()
    # The periodic checkpoint may lag (or the replica crashed before writing it): 0 is stale.
    reopened = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL, log_start_offset=0)
    assert reopened.log_start_offset == 9
    reopened.close()


def test_a_full_truncation_below_the_log_start_offset_is_remembered_across_reopen(tmp_path):
    log = twenty_records_with_lso(tmp_path, 12)
    log.truncate_fully_and_start_at(4)
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL, log_start_offset=12)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (4, 4)
    reopened.close()


@pytest.mark.parametrize("damage", ["garbage", "partial", "flipped"])
def test_reopen_truncates_a_torn_tail_to_the_last_good_batch(tmp_path, damage):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    for _ in range(7):
        produce(log)
    log.close()
    last = tmp_path / "t-0" / log_files(tmp_path / "t-0")[-1]
    good = last.read_bytes()
    if damage == "garbage":
        last.write_bytes(good + os.urandom(33))
        expected_leo = 14
    elif damage == "partial":
        last.write_bytes(good + encode_batch([b"z" * 50], timestamp_ms=1, base_offset=14)[:-10])
        expected_leo = 14
    else:
        last.write_bytes(good[:-5] + bytes([good[-5] ^ 0xFF]) + good[-4:])
        expected_leo = 12
    reopened = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    assert reopened.log_end_offset == expected_leo
    reopened.set_high_watermark(expected_leo)
    assert offsets_of(reopened.read(0, max_bytes=1 << 20, max_offset=expected_leo))[0] == 0
    assert produce(reopened) == expected_leo
    reopened.close()


def test_index_is_rebuilt_when_an_index_file_is_deleted(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    for _ in range(12):
        produce(log)
    log.close()
    for name in os.listdir(tmp_path / "t-0"):
        if name.endswith(filenames.OFFSET_INDEX_SUFFIX):
            (tmp_path / "t-0" / name).unlink()
    reopened = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    reopened.set_high_watermark(24)
    assert offsets_of(reopened.read(13, max_bytes=1 << 20, max_offset=24))[0] == 12
    assert all((tmp_path / "t-0" / filenames.offset_index_file_name(s[0])).exists()
               for s in reopened.describe()["segments"])
    reopened.close()


def test_offset_for_timestamp_finds_the_first_record_at_or_after_it(log):
    for ts in (100, 200, 300, 400, 500, 600):
        log.append_as_leader(encode_batch([b"a" * 100, b"b" * 100], timestamp_ms=[ts, ts + 5]), leader_epoch=0)
    log.set_high_watermark(12)
    assert log.offset_for_timestamp(0) == (0, 100)
    assert log.offset_for_timestamp(203) == (3, 205)
    assert log.offset_for_timestamp(450) == (8, 500)
    assert log.offset_for_timestamp(606) is None
    assert log.max_timestamp_offset() == (11, 605)
    log.set_high_watermark(12)
    log.increment_log_start_offset(5)
    assert log.offset_for_timestamp(0) == (5, 305)


def test_offset_for_timestamp_ignores_offsets_at_or_above_the_high_watermark(log):
    log.append_as_leader(encode_batch([b"a"], timestamp_ms=100), leader_epoch=0)
    assert log.offset_for_timestamp(0) is None
    assert log.offset_for_timestamp(0, max_offset=1) == (0, 100)


def test_time_retention_deletes_old_segments_below_the_high_watermark(tmp_path):
    config = LogConfig(segment_bytes=600, retention_ms=1000)
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=config)
    for ts in (1000, 1000, 1000, 5000, 5000, 5000, 9000, 9000):
        produce(log, ts=ts)
    segments = log.describe()["segments"]
    assert log.delete_retention_segments(now_ms=10_000) == 0  # HW still 0
    log.set_high_watermark(log.log_end_offset)
    freed = log.delete_retention_segments(now_ms=6_500)
    remaining = log.describe()["segments"]
    assert freed == sum(s[2] for s in segments if s not in remaining)
    assert all(s[0] >= 6 for s in remaining) and remaining[0][0] == log.log_start_offset
    assert log.delete_retention_segments(now_ms=6_500) == 0
    log.close()


def test_time_retention_never_deletes_at_or_past_the_high_watermark(tmp_path):
    config = LogConfig(segment_bytes=600, retention_ms=0)
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=config)
    for _ in range(8):
        produce(log, ts=1)
    log.set_high_watermark(7)
    log.delete_retention_segments(now_ms=10**12)
    assert log.log_start_offset <= 7
    assert log.describe()["segments"][0][1] > 7
    log.close()


def test_size_retention_deletes_oldest_segments_while_retention_bytes_remain(tmp_path):
    config = LogConfig(segment_bytes=600, retention_bytes=1200, retention_ms=-1)
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=config)
    for _ in range(12):
        produce(log)
    log.set_high_watermark(log.log_end_offset)
    before = log.size_bytes
    freed = log.delete_retention_segments(now_ms=0)
    # Kafka's rule: delete a segment only if at least retention.bytes remain afterwards.
    first_size = log.describe()["segments"][0][2]
    assert freed == before - log.size_bytes > 0
    assert 1200 <= log.size_bytes < 1200 + first_size
    assert log.log_start_offset == log.describe()["segments"][0][0] > 0
    log.close()


def test_retention_does_nothing_for_compact_only_topics(tmp_path):
    config = LogConfig(segment_bytes=600, retention_ms=0, cleanup_policy="compact")
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=config)
    for _ in range(6):
        produce(log, ts=1)
    log.set_high_watermark(12)
    assert log.delete_retention_segments(now_ms=10**12) == 0
    log.close()


def test_truncate_to_drops_batches_from_the_offset_and_clamps_the_high_watermark(log):
    for _ in range(10):
        produce(log)
    log.set_high_watermark(20)
    assert log.truncate_to(8) is True
    assert (log.log_end_offset, log.high_watermark) == (8, 8)
    assert produce(log) == 8
    assert log.truncate_to(100) is False


def test_truncating_inside_the_batch_that_holds_the_log_start_offset_keeps_the_log_start_offset(tmp_path):
    # A restarted follower truncates to its HW; with no HW checkpoint that is its LSO, which
    # DeleteRecords may have put mid-batch. Dropping that batch must not lower the LSO.
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    log.append_as_leader(encode_batch([b"x"] * 10, timestamp_ms=5), leader_epoch=0)
    log.set_high_watermark(10)
    log.increment_log_start_offset(7)
    assert log.truncate_to(7) is True
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (7, 7, 7)
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    assert reopened.log_start_offset == 7
    # the leader sends the whole batch back (base offset 0): accepted, the LSO stays 7
    reopened.append_as_follower(encode_batch([b"x"] * 10, timestamp_ms=5, base_offset=0))
    assert (reopened.log_start_offset, reopened.log_end_offset) == (7, 10)
    reopened.close()


def test_truncate_fully_and_start_at_resets_all_offsets(log):
    for _ in range(10):
        produce(log)
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (1000, 1000, 1000)
    assert log_files(log.dir) == [filenames.log_file_name(1000)]
    assert produce(log) == 1000


def test_delete_removes_the_whole_directory(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=SMALL)
    produce(log)
    log.delete()
    assert not (tmp_path / "t-0").exists()


def test_concurrent_appends_get_distinct_offsets(log):
    def worker():
        for _ in range(20):
            produce(log, size=10)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.set_high_watermark(log.log_end_offset)
    seen = []
    offset = 0
    while offset < 160:
        got = offsets_of(log.read(offset, max_bytes=1 << 20, max_offset=160))
        seen.extend(got)
        offset = got[-1] + 1
    assert seen == list(range(160))


def test_log_config_from_topic_config_maps_kafka_keys():
    config = LogConfig.from_topic_config(
        {
            "segment.bytes": "1048576",
            "segment.ms": "60000",
            "index.interval.bytes": "1024",
            "retention.ms": "-1",
            "retention.bytes": "5000",
            "cleanup.policy": "compact,delete",
            "max.message.bytes": "2000",
            "file.delete.delay.ms": "500",
            "min.insync.replicas": "2",  # another layer's key: ignored here
        }
    )
    assert config == LogConfig(
        segment_bytes=1048576,
        segment_ms=60000,
        index_interval_bytes=1024,
        retention_ms=-1,
        retention_bytes=5000,
        cleanup_policy="compact,delete",
        max_message_bytes=2000,
        file_delete_delay_ms=500,
    )
    assert config.deletes and config.compacts


@pytest.mark.parametrize(
    "entry",
    [{"segment.bytes": "big"}, {"retention.ms": "-2"}, {"cleanup.policy": "shred"}, {"segment.bytes": "1"}],
)
def test_log_config_with_bad_values_raises_invalid_config(entry):
    with pytest.raises(InvalidConfig, match=next(iter(entry))):
        LogConfig.from_topic_config(entry)


def test_a_leader_assigns_offsets_in_a_handed_over_buffer_and_copies_any_other(log):
    produce(log, 2)
    mine = bytearray(encode_batch([b"v"] * 3))
    before = bytes(mine)
    log.append_as_leader(mine, leader_epoch=1)
    assert mine == before  # the caller's bytearray is not rewritten
    owned = OwnedBatches(encode_batch([b"w"] * 3))
    log.append_as_leader(owned, leader_epoch=1)
    assert next(iter_batches(owned))[0].base_offset == 5  # assigned in place, no copy made
    assert offsets_of(log.read(0, max_bytes=1 << 20, max_offset=8)) == list(range(8))


def test_a_follower_appends_a_read_only_view_of_a_fetched_message(log):
    fetched = b"\x00" * 7 + encode_batch([b"a"] * 3, base_offset=0, partition_leader_epoch=0)
    log.append_as_follower(memoryview(fetched)[7:])
    assert offsets_of(log.read(0, max_bytes=1 << 20, max_offset=3)) == [0, 1, 2]


def test_deleting_a_partition_renames_its_directory_away_before_removing_the_files(tmp_path, monkeypatch):
    import lowtide.log.partition_log as module

    plog = PartitionLog.open(tmp_path / "orders-0", topic="orders", partition=0, config=LogConfig())
    plog.append_as_leader(encode_batch([b"x"] * 10), leader_epoch=0)
    seen: list[list[str]] = []
    # a crash during the removal of the files: what is left must not be a log named orders-0
    monkeypatch.setattr(module.shutil, "rmtree", lambda path, **_: seen.append(sorted(os.listdir(tmp_path))))
    plog.delete()
    [names] = seen
    assert "orders-0" not in names and len(names) == 1 and names[0].startswith("orders-0.")
    assert names[0].endswith("-delete")
