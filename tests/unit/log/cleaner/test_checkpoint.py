"""``cleaner-offset-checkpoint``: Kafka's checkpoint format, crash-safe, a hint only."""

from __future__ import annotations

from lowtide.log.cleaner.checkpoint import CLEANER_OFFSET_CHECKPOINT, CleanerCheckpoint


def test_the_file_is_kafkas_format_version_count_and_topic_partition_offset_lines(tmp_path):
    checkpoint = CleanerCheckpoint(tmp_path)
    checkpoint.update(("orders", 1), 40)
    checkpoint.update(("__consumer_offsets", 0), 7)
    assert (tmp_path / CLEANER_OFFSET_CHECKPOINT).read_text() == "0\n2\n__consumer_offsets 0 7\norders 1 40\n"
    assert not list(tmp_path.glob("*.tmp"))
    assert CleanerCheckpoint(tmp_path).entries() == {("orders", 1): 40, ("__consumer_offsets", 0): 7}


def test_entries_of_partitions_no_longer_hosted_are_dropped_at_the_next_write(tmp_path):
    checkpoint = CleanerCheckpoint(tmp_path)
    checkpoint.update(("a", 0), 1)
    checkpoint.update(("b", 0), 2)
    checkpoint.update(("a", 0), 3, hosted=[("a", 0)])
    assert CleanerCheckpoint(tmp_path).entries() == {("a", 0): 3}
    checkpoint.remove(("a", 0))
    assert CleanerCheckpoint(tmp_path).entries() == {}


def test_an_unreadable_file_means_every_log_is_dirty_not_a_failure(tmp_path):
    (tmp_path / CLEANER_OFFSET_CHECKPOINT).write_text("7\nnonsense\n")
    checkpoint = CleanerCheckpoint(tmp_path)
    assert checkpoint.get(("a", 0)) is None
    checkpoint.update(("a", 0), 5)
    assert CleanerCheckpoint(tmp_path).get(("a", 0)) == 5
