"""Kafka's text checkpoint files."""

from __future__ import annotations

import pytest

from lowtide.errors import KafkaStorageError
from lowtide.log.checkpoint import CheckpointFile
from lowtide.log.filenames import LOG_START_OFFSET_CHECKPOINT


def test_write_produces_kafkas_text_format_sorted_by_topic_and_partition(tmp_path):
    path = tmp_path / LOG_START_OFFSET_CHECKPOINT
    CheckpointFile(path).write({("orders", 1): 5230, ("orders", 0): 10000})
    assert path.read_bytes() == b"0\n2\norders 0 10000\norders 1 5230\n"


def test_write_of_no_entries_is_version_and_zero_count(tmp_path):
    path = tmp_path / "cp"
    CheckpointFile(path).write({})
    assert path.read_bytes() == b"0\n0\n"


def test_round_trip_preserves_entries_and_leaves_no_tmp_file(tmp_path):
    entries = {("orders", 0): 10000, ("my-topic.v2", 17): 0, ("x", 3): 2**62}
    checkpoint = CheckpointFile(tmp_path / "cp")
    checkpoint.write(entries)
    checkpoint.write(entries)  # overwrite goes through .tmp + rename as well
    assert checkpoint.read() == entries
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp"]


def test_read_of_a_missing_file_is_empty(tmp_path):
    assert CheckpointFile(tmp_path / "absent").read() == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1\n0\n", "unsupported version"),
        ("0\n2\norders 0 1\n", "declares 2 entries but has 1"),
        ("0\n1\norders 0\n", "line 3 is malformed"),
        ("0\n1\norders zero 1\n", "line 3 is malformed"),
        ("0\nx\n", "malformed count"),
        ("0\n", "truncated"),
        ("", "truncated"),
    ],
)
def test_read_of_a_bad_file_raises_kafka_storage_error_naming_the_path(tmp_path, text, message):
    path = tmp_path / "replication-offset-checkpoint"
    path.write_text(text)
    with pytest.raises(KafkaStorageError, match=message) as info:
        CheckpointFile(path).read()
    assert str(path) in str(info.value)


def test_write_rejects_topic_names_with_spaces(tmp_path):
    with pytest.raises(ValueError):
        CheckpointFile(tmp_path / "cp").write({("bad topic", 0): 1})
