"""KIP-107 on the leader's partition: which offsets DeleteRecords accepts and what each one does."""

from __future__ import annotations

import pytest

from lowtide.errors import NotLeaderOrFollower, OffsetOutOfRange, PolicyViolation


def offsets(p) -> tuple[int, int, int]:
    """(LSO, HW, LEO) of a partition's log."""
    return p.log.log_start_offset, p.log.high_watermark, p.log.log_end_offset


def test_offset_minus_one_deletes_up_to_the_high_watermark_not_the_log_end(replicas):
    replicas.produce(5)  # on the leader only: LEO 25, HW stays 20
    assert offsets(replicas.leader) == (0, 20, 25)

    assert replicas.leader.delete_records_before(-1) == (20, True)

    assert offsets(replicas.leader) == (20, 20, 25)


def test_an_offset_at_the_high_watermark_is_accepted(replicas):
    assert replicas.leader.delete_records_before(20) == (20, True)
    assert replicas.leader.log.log_start_offset == 20


@pytest.mark.parametrize("offset", [21, 25, 1_000_000])
def test_an_offset_past_the_high_watermark_is_out_of_range_and_changes_nothing(replicas, offset):
    replicas.produce(5)  # LEO 25 > HW 20: even offsets the leader holds are refused past the HW
    segments = replicas.leader.log.describe()["segments"]

    with pytest.raises(OffsetOutOfRange) as raised:
        replicas.leader.delete_records_before(offset)

    assert raised.value.code == 1
    assert offsets(replicas.leader) == (0, 20, 25)
    assert replicas.leader.log.describe()["segments"] == segments


@pytest.mark.parametrize("offset", [-2, -3, -100])
def test_an_offset_below_minus_one_is_out_of_range_and_changes_nothing(replicas, offset):
    with pytest.raises(OffsetOutOfRange):
        replicas.leader.delete_records_before(offset)
    assert offsets(replicas.leader) == (0, 20, 20)


def test_an_offset_at_or_below_the_log_start_offset_is_a_no_op(replicas):
    assert replicas.leader.delete_records_before(12) == (12, True)

    assert replicas.leader.delete_records_before(12) == (12, False)
    assert replicas.leader.delete_records_before(3) == (3, False)
    assert replicas.leader.delete_records_before(0) == (0, False)

    assert offsets(replicas.leader) == (12, 20, 20)


def test_deleting_records_deletes_the_segments_entirely_below_the_new_log_start_offset(replicas):
    assert [s[0] for s in replicas.leader.log.describe()["segments"]] == [0, 15]

    replicas.leader.delete_records_before(14)
    assert [s[0] for s in replicas.leader.log.describe()["segments"]] == [0, 15]  # offset 14 is still in it

    replicas.leader.delete_records_before(15)
    assert [s[0] for s in replicas.leader.log.describe()["segments"]] == [15]


def test_records_below_the_log_start_offset_are_never_served_again(replicas):
    replicas.leader.delete_records_before(15)

    with pytest.raises(OffsetOutOfRange):
        replicas.leader.log.read(10, max_bytes=1 << 20, max_offset=20)
    assert replicas.leader.log.read(15, max_bytes=1 << 20, max_offset=20) != b""


def test_a_compact_only_topic_refuses_with_policy_violation(make_replicas):
    r = make_replicas(topic_config={"cleanup.policy": "compact"})
    r.produce(5)
    r.replicate()

    with pytest.raises(PolicyViolation) as raised:
        r.leader.delete_records_before(3)

    assert raised.value.code == 44
    assert offsets(r.leader) == (0, 5, 5)


def test_a_compact_and_delete_topic_accepts_deletion(make_replicas):
    r = make_replicas(topic_config={"cleanup.policy": "compact,delete"})
    r.produce(5)
    r.replicate()

    assert r.leader.delete_records_before(3) == (3, True)


def test_a_follower_refuses_with_not_leader_or_follower(replicas):
    follower = replicas.follower(1)

    with pytest.raises(NotLeaderOrFollower) as raised:
        follower.delete_records_before(5)

    assert raised.value.code == 6
    assert offsets(follower) == (0, 20, 20)


def test_a_deposed_leader_refuses_with_not_leader_or_follower(replicas):
    replicas.elect(1, leader_epoch=2)

    with pytest.raises(NotLeaderOrFollower):
        replicas.by_broker[0].delete_records_before(5)
    assert replicas.by_broker[0].log.log_start_offset == 0
