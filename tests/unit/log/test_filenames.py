"""File names of a replica data directory."""

from __future__ import annotations

import pytest

from lowtide.log import filenames


def test_log_file_name_is_the_base_offset_zero_padded_to_20_digits():
    assert filenames.log_file_name(0) == "00000000000000000000.log"
    assert filenames.offset_index_file_name(42) == "00000000000000000042.index"
    assert filenames.time_index_file_name(2**63 - 1) == "09223372036854775807.timeindex"


def test_parse_base_offset_reads_back_every_segment_file_name():
    for name in filenames.segment_file_names(12345):
        assert filenames.parse_base_offset(name) == 12345


@pytest.mark.parametrize("name", ["42.log", "00000000000000000042.txt", "abc", "0000000000000000004x.log"])
def test_parse_base_offset_rejects_other_names(name):
    with pytest.raises(ValueError):
        filenames.parse_base_offset(name)


def test_partition_dir_name_splits_on_the_last_dash():
    assert filenames.partition_dir_name("my-topic", 3) == "my-topic-3"
    assert filenames.parse_partition_dir("my-topic-3") == ("my-topic", 3)


@pytest.mark.parametrize("name", ["topic", "topic-", "-3", "topic-x"])
def test_parse_partition_dir_rejects_names_without_a_partition(name):
    with pytest.raises(ValueError):
        filenames.parse_partition_dir(name)


def test_leftover_files_are_deleted_and_tmp_names():
    assert filenames.is_leftover_file_name(filenames.deleted_file_name("00000000000000000000.log"))
    assert filenames.is_leftover_file_name(filenames.tmp_file_name(filenames.LOG_START_OFFSET_CHECKPOINT))
    assert not filenames.is_leftover_file_name("00000000000000000000.log")


def test_a_partition_directory_being_deleted_has_a_name_no_partition_has():
    name = filenames.deleted_partition_dir_name("my.orders-3", "0123456789abcdef0123456789abcdef")
    assert name == "my.orders-3.0123456789abcdef0123456789abcdef-delete"
    assert filenames.is_deleted_partition_dir(name)
    with pytest.raises(ValueError):
        filenames.parse_partition_dir(name)
    for other in ("orders-3", "orders-delete", "orders-3.tmp-delete", "orders.0123-delete"):
        assert not filenames.is_deleted_partition_dir(other), other
