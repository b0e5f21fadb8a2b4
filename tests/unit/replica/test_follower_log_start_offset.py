"""A follower adopts the leader's log start offset from every fetch response (KIP-107 step 6)."""

from __future__ import annotations

import pytest

from lowtide.errors import OffsetOutOfRange
from lowtide.log.partition_log import LogStartOffsetCommit


def test_a_follower_adopts_the_leader_log_start_offset_and_reports_it_on_its_next_fetch(replicas):
    replicas.leader.delete_records_before(15)
    follower = replicas.follower(1)

    replicas.fetch_once(1)
    assert follower.log.log_start_offset == 15
    assert [s[0] for s in follower.log.describe()["segments"]] == [15]
    assert replicas.leader.followers[1].log_start_offset == 0  # the leader learns it next time

    replicas.fetch_once(1)
    assert replicas.leader.followers[1].log_start_offset == 15


def test_apply_fetched_reports_whether_the_log_start_offset_moved(replicas):
    follower = replicas.follower(1)

    assert follower.apply_fetched(records=b"", leader_hw=20, leader_lso=8, leader_epoch=1) == (False, True)
    assert follower.apply_fetched(records=b"", leader_hw=20, leader_lso=8, leader_epoch=1) == (False, False)
    assert follower.apply_fetched(records=b"", leader_hw=20, leader_lso=5, leader_epoch=1) == (False, False)  # never
    assert follower.log.log_start_offset == 8


def test_with_a_commit_the_follower_takes_the_leader_log_start_offset_only_once_it_is_flushed(replicas):
    follower = replicas.follower(1)
    commit = LogStartOffsetCommit()

    assert follower.apply_fetched(records=b"", leader_hw=20, leader_lso=8, leader_epoch=1,
                                  lso_commit=commit) == (False, True)

    assert follower.log.log_start_offset == 0  # what the next fetch would report: not durable yet
    assert commit.commit() == [follower.log]
    assert follower.log.log_start_offset == 8


def test_a_follower_never_moves_its_log_start_offset_past_its_own_high_watermark(make_replicas):
    r = make_replicas()
    r.produce(5)
    r.produce(5)
    r.fetch_once(1)  # follower 1 has offsets 0-9 but still knows HW 0
    follower = r.follower(1)
    assert (follower.log.log_end_offset, follower.log.high_watermark) == (10, 0)

    assert follower.apply_fetched(records=b"", leader_hw=6, leader_lso=8, leader_epoch=1) == (False, True)

    assert (follower.log.log_start_offset, follower.log.high_watermark) == (6, 6)


def test_a_leader_log_start_offset_past_the_follower_log_end_truncates_it_fully_and_restarts_there(replicas):
    follower = replicas.follower(2)
    follower.log.truncate_to(5)  # a follower that holds less than the leader deleted
    assert follower.log.log_end_offset == 5

    assert follower.apply_fetched(records=b"", leader_hw=20, leader_lso=15, leader_epoch=1) == (False, True)

    assert (follower.log.log_start_offset, follower.log.high_watermark, follower.log.log_end_offset) == (15, 15, 15)
    assert [s[0] for s in follower.log.describe()["segments"]] == [15]
    with pytest.raises(OffsetOutOfRange):
        follower.log.read(0, max_bytes=1 << 20, max_offset=15)


def test_a_follower_that_restarted_at_the_leader_log_start_offset_catches_up_from_there(make_replicas):
    r = make_replicas(isr=(0, 1))  # follower 2 out of the ISR, so the HW moves without it
    for _ in range(4):
        r.produce(5)
    r.replicate(1)
    r.leader.delete_records_before(15)

    r.replicate(2)  # its first fetch (offset 0) is below the leader's LSO

    follower = r.follower(2)
    assert (follower.log.log_start_offset, follower.log.log_end_offset) == (15, 20)
    assert r.leader.followers[2].log_start_offset == 15


def test_a_leader_ignores_fetched_data_applied_to_it(replicas):
    assert replicas.leader.apply_fetched(records=b"", leader_hw=20, leader_lso=10, leader_epoch=1) == (False, False)
    assert replicas.leader.log.log_start_offset == 0
