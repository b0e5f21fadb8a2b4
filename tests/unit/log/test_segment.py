"""One segment: append, read, offset translation, recovery, truncation."""

from __future__ import annotations

import os

from lowtide.log import filenames
from lowtide.log.segment import LogSegment
from lowtide.log.segment_set import SegmentSet
from lowtide.record import decode_batch, encode_batch, iter_batches, validate_batches


def batch(base_offset: int, count: int = 2, *, ts: int = 1000, size: int = 100) -> bytes:
    return encode_batch([bytes([65 + i % 26]) * size for i in range(count)], timestamp_ms=ts, base_offset=base_offset)


def fill(segment: LogSegment, batches: int, *, start: int = 0, count: int = 2) -> list[int]:
    """Append ``batches`` batches one by one; return their positions."""
    positions = []
    offset = start
    for i in range(batches):
        raw = batch(offset, count, ts=1000 + i)
        positions.append(segment.size_bytes)
        segment.append(raw, validate_batches(raw))
        offset += count
    return positions


def test_new_segment_is_empty_at_its_base_offset(tmp_path):
    segment = LogSegment.create(tmp_path, 42)
    assert (segment.base_offset, segment.next_offset, segment.size_bytes) == (42, 42, 0)
    assert segment.max_timestamp == -1
    assert sorted(os.listdir(tmp_path)) == sorted(filenames.segment_file_names(42))
    segment.close()


def test_append_then_read_returns_the_same_bytes(tmp_path):
    segment = LogSegment.create(tmp_path, 0)
    raw = batch(0, 3) + batch(3, 2)
    segment.append(raw, validate_batches(raw))
    assert segment.next_offset == 5
    assert segment.read(0, 1 << 20) == raw
    assert segment.read(10, 5) == raw[10:15]
    segment.close()


def test_translate_offset_finds_the_batch_containing_an_offset(tmp_path):
    segment = LogSegment.create(tmp_path, 0, index_interval_bytes=300)
    positions = fill(segment, 20)
    assert len(segment.offset_index) > 0
    for offset in range(40):
        assert segment.translate_offset(offset) == positions[offset // 2]
    assert segment.translate_offset(40) is None
    assert segment.position_of_offset_bound(10) == positions[5]
    assert segment.position_of_offset_bound(40) == segment.size_bytes
    segment.close()


def test_read_batches_returns_whole_batches_and_at_least_one(tmp_path):
    segment = LogSegment.create(tmp_path, 0)
    positions = fill(segment, 5)
    size = positions[1]
    data = segment.read_batches(0, end_position=segment.size_bytes, max_bytes=int(size * 2.5))
    assert len(data) == 2 * size
    assert len(segment.read_batches(0, end_position=segment.size_bytes, max_bytes=1)) == size
    assert segment.read_batches(positions[2], end_position=positions[2], max_bytes=10_000) == b""
    segment.close()


def test_reopen_restores_next_offset_and_max_timestamp(tmp_path):
    segment = LogSegment.create(tmp_path, 0, index_interval_bytes=300)
    fill(segment, 10)
    segment.seal()
    segment.close()
    reopened = LogSegment.open(tmp_path, 0, index_interval_bytes=300)
    assert (reopened.next_offset, reopened.max_timestamp) == (20, 1009)
    reopened.close()


def test_index_is_rebuilt_when_the_index_file_is_deleted(tmp_path):
    segment = LogSegment.create(tmp_path, 0, index_interval_bytes=300)
    positions = fill(segment, 20)
    entries = len(segment.offset_index)
    segment.close()
    (tmp_path / filenames.offset_index_file_name(0)).unlink()
    reopened = LogSegment.open(tmp_path, 0, index_interval_bytes=300)
    assert len(reopened.offset_index) == entries
    assert reopened.translate_offset(33) == positions[16]
    reopened.close()  # the rebuilt entries reach the file
    assert (tmp_path / filenames.offset_index_file_name(0)).stat().st_size == entries * 8


def test_recover_truncates_a_partial_batch_at_the_tail(tmp_path):
    segment = LogSegment.create(tmp_path, 0)
    fill(segment, 3)
    good_size = segment.size_bytes
    with open(tmp_path / filenames.log_file_name(0), "ab") as f:
        f.write(batch(6)[:50])
    assert segment.recover() == 50
    assert (segment.size_bytes, segment.next_offset) == (good_size, 6)
    assert os.path.getsize(tmp_path / filenames.log_file_name(0)) == good_size
    segment.close()


def test_open_recovers_a_torn_tail_even_without_being_asked(tmp_path):
    segment = LogSegment.create(tmp_path, 0)
    fill(segment, 3)
    good_size = segment.size_bytes
    segment.close()
    with open(tmp_path / filenames.log_file_name(0), "ab") as f:
        f.write(batch(6)[:70])
    reopened = LogSegment.open(tmp_path, 0)
    assert (reopened.size_bytes, reopened.next_offset) == (good_size, 6)
    reopened.close()


def test_recover_truncates_a_last_batch_with_a_flipped_byte(tmp_path):
    segment = LogSegment.create(tmp_path, 0)
    positions = fill(segment, 3)
    end = segment.size_bytes
    segment.close()
    path = tmp_path / filenames.log_file_name(0)
    data = bytearray(path.read_bytes())
    data[positions[2] + 70] ^= 0x55
    path.write_bytes(data)
    reopened = LogSegment.open(tmp_path, 0, recover=True)
    assert (reopened.size_bytes, reopened.next_offset) == (positions[2], 4)
    assert os.path.getsize(path) == positions[2] < end
    reopened.close()


def test_truncate_to_drops_the_batch_containing_the_offset_and_after(tmp_path):
    segment = LogSegment.create(tmp_path, 0, index_interval_bytes=200)
    positions = fill(segment, 10)
    removed = segment.truncate_to(10)
    assert removed == positions[-1] + positions[1] - positions[5]
    assert (segment.next_offset, segment.size_bytes, segment.max_timestamp) == (10, positions[5], 1004)
    raw = batch(10)
    segment.append(raw, validate_batches(raw))
    assert segment.translate_offset(11) == positions[5]
    segment.close()


def test_find_offset_by_timestamp_returns_the_first_record_at_or_after_it(tmp_path):
    segment = LogSegment.create(tmp_path, 0, index_interval_bytes=150)
    offset = 0
    for ts in (100, 300, 200, 500):
        raw = encode_batch([b"a", b"b"], timestamp_ms=[ts, ts + 10], base_offset=offset)
        segment.append(raw, validate_batches(raw))
        offset += 2
    assert segment.find_offset_by_timestamp(50) == (0, 100)
    assert segment.find_offset_by_timestamp(105) == (1, 110)
    assert segment.find_offset_by_timestamp(201) == (2, 300)
    assert segment.find_offset_by_timestamp(505) == (7, 510)
    assert segment.find_offset_by_timestamp(511) is None
    assert segment.find_offset_by_timestamp(50, starting_offset=5) == (5, 210)
    assert segment.find_max_timestamp_offset() == (7, 510)
    segment.close()


def test_delete_removes_all_three_files_and_tolerates_missing_ones(tmp_path):
    segment = LogSegment.create(tmp_path, 7)
    (tmp_path / filenames.time_index_file_name(7)).unlink()
    segment.delete()
    assert os.listdir(tmp_path) == []


def test_segment_set_open_removes_leftovers_and_recovers_only_the_last_segment(tmp_path):
    segments = SegmentSet.open(tmp_path, index_interval_bytes=200)
    for i in range(3):
        raw = batch(i * 2)
        segments.active.append(raw, validate_batches(raw))
        segments.roll(segments.next_offset)
    raw = batch(6)
    segments.active.append(raw, validate_batches(raw))
    segments.close()
    (tmp_path / "00000000000000000000.log.deleted").write_bytes(b"old")
    (tmp_path / "replication-offset-checkpoint.tmp").write_bytes(b"half")
    with open(tmp_path / filenames.log_file_name(6), "ab") as f:
        f.write(b"garbage!")
    reopened = SegmentSet.open(tmp_path, index_interval_bytes=200)
    assert [s.base_offset for s in reopened] == [0, 2, 4, 6]
    assert reopened.next_offset == 8
    assert not any(filenames.is_leftover_file_name(n) for n in os.listdir(tmp_path))
    assert reopened.segment_for(5).base_offset == 4
    assert reopened.segment_for(100).base_offset == 6
    data = reopened.active.read(0, 1 << 20)
    assert [h.base_offset for h, _ in iter_batches(data)] == [6]
    assert decode_batch(data)[1][0].offset == 6
    reopened.close()


def test_segment_set_remove_below_rolls_when_the_active_segment_goes(tmp_path):
    segments = SegmentSet.open(tmp_path)
    raw = batch(0)
    segments.active.append(raw, validate_batches(raw))
    removed = segments.remove_below(2)
    assert [s.base_offset for s in removed] == [0]
    assert (segments.active.base_offset, segments.next_offset, len(segments)) == (2, 2, 1)
    for segment in removed:
        segment.delete()
    assert sorted(os.listdir(tmp_path)) == sorted(filenames.segment_file_names(2))
    assert segments.remove_below(2) == []
    segments.close()


def test_segment_set_remove_below_recycles_a_small_active_segment_instead_of_creating_files(tmp_path):
    segments = SegmentSet.open(tmp_path)
    raw = batch(0)
    segments.active.append(raw, validate_batches(raw))
    active = segments.active
    inode = os.stat(tmp_path / filenames.log_file_name(0)).st_ino
    assert segments.remove_below(5, recycle_active_up_to=1 << 20) == []
    assert segments.active is active
    assert (active.base_offset, active.next_offset, active.size_bytes, active.max_timestamp) == (5, 5, 0, -1)
    assert sorted(os.listdir(tmp_path)) == sorted(filenames.segment_file_names(5))
    assert os.stat(tmp_path / filenames.log_file_name(5)).st_ino == inode  # same file, renamed
    segments.close()


def test_a_recycled_segment_takes_appends_at_its_new_base_and_reopens_intact(tmp_path):
    segment = LogSegment.create(tmp_path, 0)
    fill(segment, 3)
    segment.recycle(10)
    fill(segment, 2, start=10)
    assert (segment.next_offset, segment.offset_index.base_offset) == (14, 10)
    assert segment.translate_offset(12) is not None
    segment.close()
    reopened = LogSegment.open(tmp_path, 10)
    assert (reopened.base_offset, reopened.next_offset, reopened.max_timestamp) == (10, 14, 1001)
    assert [h.base_offset for h, _ in iter_batches(reopened.read(0, 1 << 20))] == [10, 12]
    reopened.close()


def test_a_segment_cannot_be_recycled_below_its_next_offset(tmp_path):
    import pytest

    from lowtide.errors import KafkaStorageError

    segment = LogSegment.create(tmp_path, 0)
    fill(segment, 2)
    with pytest.raises(KafkaStorageError, match="below its next offset 4"):
        segment.recycle(3)
    segment.close()
