"""LeaderEpochCache: Kafka's endOffsetFor rules, truncation, and the checkpoint file byte for byte."""

from __future__ import annotations

import pytest

from lowtide.errors import KafkaStorageError
from lowtide.log import filenames
from lowtide.log.leader_epoch import LeaderEpochCache
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.record import encode_batch


def cache(tmp_path, entries=()):
    c = LeaderEpochCache.load(tmp_path, log_is_empty=True)
    for epoch, start in entries:
        c.assign(epoch, start)
    return c


def test_the_file_is_kafkas_leader_epoch_checkpoint_format(tmp_path):
    cache(tmp_path, [(0, 0), (3, 1200)])
    assert (tmp_path / filenames.LEADER_EPOCH_CHECKPOINT).read_bytes() == b"0\n2\n0 0\n3 1200\n"
    assert LeaderEpochCache.load(tmp_path, log_is_empty=False).entries() == [(0, 0), (3, 1200)]


def test_the_latest_epoch_ends_at_the_log_end_offset(tmp_path):
    assert cache(tmp_path, [(0, 0), (3, 1200)]).end_offset_for(3, log_end_offset=1500) == (3, 1500)


def test_an_older_epoch_ends_where_the_next_known_epoch_starts(tmp_path):
    c = cache(tmp_path, [(0, 0), (3, 1200), (5, 1300)])
    assert c.end_offset_for(0, log_end_offset=2000) == (0, 1200)
    # epoch 4 was never written here: the answer is the largest epoch below it and where it ended
    assert c.end_offset_for(4, log_end_offset=2000) == (3, 1300)


def test_an_epoch_older_than_any_known_ends_where_the_first_starts(tmp_path):
    assert cache(tmp_path, [(2, 100)]).end_offset_for(1, log_end_offset=500) == (1, 100)


def test_an_epoch_newer_than_any_known_is_undefined(tmp_path):
    assert cache(tmp_path, [(2, 100)]).end_offset_for(7, log_end_offset=500) == (-1, -1)


def test_an_empty_cache_knows_no_epoch(tmp_path):
    assert cache(tmp_path).end_offset_for(0, log_end_offset=0) == (-1, -1)


def test_assign_ignores_an_epoch_that_is_not_newer(tmp_path):
    c = cache(tmp_path, [(3, 100)])
    assert c.assign(3, 200) is False
    assert c.assign(2, 200) is False
    assert c.entries() == [(3, 100)]


def test_assign_drops_epochs_that_start_at_or_after_the_new_start(tmp_path):
    c = cache(tmp_path, [(1, 0), (2, 50), (3, 80)])
    c.assign(4, 50)
    assert c.entries() == [(1, 0), (4, 50)]


def test_truncate_from_end_forgets_epochs_starting_at_or_past_the_cut_and_persists(tmp_path):
    c = cache(tmp_path, [(1, 0), (2, 50), (3, 80)])
    assert c.truncate_from_end(50) is True
    assert LeaderEpochCache.load(tmp_path, log_is_empty=False).entries() == [(1, 0)]
    assert c.truncate_from_end(60) is False


def test_truncate_from_start_moves_the_covering_entry_up_to_the_new_start(tmp_path):
    c = cache(tmp_path, [(1, 0), (2, 50), (3, 80)])
    c.truncate_from_start(60)
    assert c.entries() == [(2, 60), (3, 80)]


def test_a_file_with_a_wrong_count_names_its_path(tmp_path):
    (tmp_path / filenames.LEADER_EPOCH_CHECKPOINT).write_text("0\n3\n0 0\n")
    with pytest.raises(KafkaStorageError, match=str(tmp_path)):
        LeaderEpochCache.load(tmp_path, log_is_empty=False)


def test_a_file_whose_entries_go_back_is_refused(tmp_path):
    (tmp_path / filenames.LEADER_EPOCH_CHECKPOINT).write_text("0\n2\n3 10\n2 20\n")
    with pytest.raises(KafkaStorageError, match="increase"):
        LeaderEpochCache.load(tmp_path, log_is_empty=False)


def test_a_log_with_data_but_no_epoch_file_has_unknown_epochs(tmp_path):
    assert LeaderEpochCache.load(tmp_path, log_is_empty=False).known is False
    assert LeaderEpochCache.load(tmp_path, log_is_empty=True).known is True


def test_a_follower_log_learns_epochs_from_the_batches_it_appends(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=LogConfig())
    log.append_as_follower(encode_batch([b"a"] * 3, base_offset=0, partition_leader_epoch=0))
    log.append_as_follower(encode_batch([b"b"] * 2, base_offset=3, partition_leader_epoch=2))
    log.append_as_follower(encode_batch([b"c"] * 2, base_offset=5, partition_leader_epoch=2))
    assert log.leader_epochs() == [(0, 0), (2, 3)]
    assert log.end_offset_for_epoch(0) == (0, 3)
    assert log.end_offset_for_epoch(2) == (2, 7)
    log.truncate_to(5)
    assert log.leader_epochs() == [(0, 0), (2, 3)]
    log.truncate_to(4)  # inside the batch 3..4: it goes, and epoch 2 with it
    assert (log.log_end_offset, log.leader_epochs()) == (3, [(0, 0)])
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=LogConfig())
    assert reopened.leader_epochs() == [(0, 0)]
    reopened.close()


def test_a_leader_assigns_its_epoch_at_the_log_end_offset(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=LogConfig())
    log.assign_leader_epoch(4)
    log.append_as_leader(encode_batch([b"a"] * 3), leader_epoch=4)
    log.assign_leader_epoch(6)
    assert log.leader_epochs() == [(4, 0), (6, 3)]
    assert log.end_offset_for_epoch(5) == (4, 3)
    log.close()
