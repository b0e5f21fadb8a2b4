"""Sparse offset and time indexes."""

from __future__ import annotations

import os

import pytest

from lowtide.errors import KafkaStorageError
from lowtide.log.index import OffsetIndex, TimeIndex


def test_offset_index_lookup_returns_position_of_largest_entry_at_or_below_offset(tmp_path):
    index = OffsetIndex.open(tmp_path / "a.index", base_offset=100)
    index.append(offset=110, position=1000)
    index.append(offset=120, position=2000)
    assert index.lookup(105) == 0
    assert index.lookup(110) == 1000
    assert index.lookup(119) == 1000
    assert index.lookup(500) == 2000
    index.close()


def test_offset_index_entries_are_big_endian_relative_offset_and_position(tmp_path):
    path = tmp_path / "a.index"
    index = OffsetIndex.open(path, base_offset=100)
    index.append(offset=110, position=1000)
    index.close()
    assert path.read_bytes() == bytes.fromhex("0000000a" "000003e8")


def test_offset_index_reloads_from_file(tmp_path):
    path = tmp_path / "a.index"
    index = OffsetIndex.open(path, base_offset=0)
    for i in range(1, 50):
        index.append(offset=i * 10, position=i * 4096)
    index.flush()
    index.close()
    reopened = OffsetIndex.open(path, base_offset=0)
    assert len(reopened) == 49
    assert reopened.lookup(255) == 25 * 4096
    assert reopened.last_entry == (490, 49 * 4096)
    reopened.close()


def test_offset_index_ignores_entries_that_do_not_move_forward(tmp_path):
    index = OffsetIndex.open(tmp_path / "a.index", base_offset=0)
    index.append(offset=10, position=100)
    index.append(offset=10, position=200)
    index.append(offset=5, position=300)
    assert len(index) == 1
    index.close()


def test_offset_index_truncate_drops_entries_at_and_after_offset_in_memory_and_on_disk(tmp_path):
    path = tmp_path / "a.index"
    index = OffsetIndex.open(path, base_offset=0)
    for i in range(1, 6):
        index.append(offset=i * 10, position=i * 100)
    index.flush()
    assert path.stat().st_size == 5 * 8
    index.truncate_to(30)
    assert index.last_entry == (20, 200)
    assert path.stat().st_size == 2 * 8
    index.truncate_to_position(200)
    assert index.last_entry == (10, 100)
    index.delete()
    assert not path.exists()


def test_offset_index_with_partial_entry_raises_kafka_storage_error_naming_the_path(tmp_path):
    path = tmp_path / "a.index"
    path.write_bytes(b"\x00" * 9)
    with pytest.raises(KafkaStorageError, match=str(path)):
        OffsetIndex.open(path, base_offset=0)


def test_time_index_lookup_gives_a_safe_starting_offset_for_a_timestamp(tmp_path):
    index = TimeIndex.open(tmp_path / "a.timeindex", base_offset=100)
    index.maybe_append(timestamp=1000, offset=110)
    index.maybe_append(timestamp=2000, offset=120)
    index.maybe_append(timestamp=1500, offset=130)  # not larger: skipped
    assert len(index) == 2
    assert index.lookup(500) == 100
    assert index.lookup(1000) == 100
    assert index.lookup(1001) == 110
    assert index.lookup(9999) == 120
    index.close()


def test_time_index_entries_are_big_endian_timestamp_and_relative_offset(tmp_path):
    path = tmp_path / "a.timeindex"
    index = TimeIndex.open(path, base_offset=100)
    index.maybe_append(timestamp=1, offset=102)
    index.close()
    assert path.read_bytes() == bytes.fromhex("0000000000000001" "00000002")
    reopened = TimeIndex.open(path, base_offset=100)
    assert reopened.last_entry == (1, 102)
    reopened.truncate_to(102)
    assert reopened.last_entry is None
    reopened.close()


def test_entries_reach_the_file_at_flush_close_or_rename_and_no_descriptor_stays_open(tmp_path):
    fds = len(os.listdir("/proc/self/fd"))
    index = OffsetIndex.open(tmp_path / "a.index", base_offset=0)
    index.append(offset=10, position=100)
    assert len(os.listdir("/proc/self/fd")) == fds
    assert (tmp_path / "a.index").read_bytes() == b""
    index.flush()
    assert (tmp_path / "a.index").read_bytes() == bytes.fromhex("0000000a" "00000064")
    index.append(offset=20, position=200)
    index.rename(tmp_path / "b.index")
    assert (tmp_path / "b.index").read_bytes() == bytes.fromhex("0000000a" "00000064"
                                                                  "00000014" "000000c8")
    index.append(offset=30, position=300)
    index.close()
    assert OffsetIndex.open(tmp_path / "b.index", base_offset=0).last_entry == (30, 300)
