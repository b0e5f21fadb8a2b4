"""The low watermark: min LSO over the leader, every replica on a live broker (as Kafka counts) and
every ISR member (election picks from the ISR, so a replica leaves it before it stops counting)."""

from __future__ import annotations

from lowtide.clock import now_ms

ALL_LIVE = frozenset({0, 1, 2})


def test_the_low_watermark_is_the_minimum_log_start_offset_over_leader_and_live_followers(replicas):
    replicas.leader.delete_records_before(15)
    replicas.replicate(1)  # follower 1 adopts 15 and reports it; follower 2 has not fetched since

    assert replicas.follower(1).log.log_start_offset == 15
    assert replicas.leader.followers[2].log_start_offset == 0
    assert replicas.leader.low_watermark(ALL_LIVE) == 0

    replicas.replicate(2)
    assert replicas.leader.low_watermark(ALL_LIVE) == 15


def test_a_follower_neither_live_nor_in_the_isr_does_not_hold_the_low_watermark_back(replicas):
    replicas.leader.delete_records_before(15)
    replicas.replicate(1)
    replicas.shrink_isr((0, 1))

    assert replicas.leader.low_watermark(frozenset({0, 1})) == 15
    assert replicas.leader.low_watermark(frozenset({0})) == 15


def test_an_isr_member_whose_session_lapsed_holds_the_low_watermark_back_until_it_leaves_the_isr(replicas):
    replicas.leader.delete_records_before(15)
    replicas.replicate(1)

    assert replicas.leader.low_watermark(frozenset({0, 1})) == 0
    assert replicas.leader.isr_shrink_candidate(lag_time_max_ms=10**9, live_brokers=frozenset({0, 1})) == {0, 1}
    replicas.shrink_isr((0, 1))
    assert replicas.leader.low_watermark(frozenset({0, 1})) == 15


def test_a_follower_whose_log_start_offset_lags_the_leaders_does_not_rejoin_the_isr(replicas):
    replicas.shrink_isr((0, 1))
    replicas.leader.delete_records_before(15)
    replicas.replicate(1)
    # follower 2 is caught up on data but has not learnt the new LSO yet
    replicas.leader.update_follower(2, fetch_offset=20, log_start_offset=0)
    assert replicas.leader.isr_expansion_candidate(2) is None
    replicas.replicate(2)
    assert replicas.leader.isr_expansion_candidate(2) == {0, 1, 2}


def test_a_live_follower_not_heard_from_since_the_leadership_began_makes_it_minus_one(make_replicas):
    r = make_replicas(isr=(0, 1))
    r.elect(0, leader_epoch=2)  # a new leadership resets what the leader knows of its followers

    assert r.leader.low_watermark(ALL_LIVE) == -1
    r.fetch_once(1)
    assert r.leader.low_watermark(ALL_LIVE) == -1  # follower 2 is live and silent
    assert r.leader.low_watermark(frozenset({0, 1})) == 0
    r.fetch_once(2)
    assert r.leader.low_watermark(ALL_LIVE) == 0


def test_a_replica_that_is_not_the_leader_reports_no_low_watermark(replicas):
    assert replicas.follower(1).low_watermark(ALL_LIVE) == -1


def test_a_caught_up_follower_seen_in_a_recent_session_round_stays_in_the_isr_and_a_behind_one_leaves(replicas):
    leader = replicas.leader
    for f in leader.followers.values():
        f.last_caught_up_ms = 1  # long ago: no fetch listed these partitions since
    recent = {1: now_ms(), 2: now_ms()}
    seen = lambda replica, key: recent[replica] if key == (replicas.topic.name, 0) else 0  # noqa: E731
    assert leader.isr_shrink_candidate(lag_time_max_ms=1000, seen_ms=seen) is None
    replicas.produce(5)  # the leader moves on; follower 2's last told position is behind it now
    replicas.replicate(1)
    for f in leader.followers.values():
        f.last_caught_up_ms = 1
    assert leader.isr_shrink_candidate(lag_time_max_ms=1000, seen_ms=seen) == {0, 1}
    for f in leader.followers.values():
        f.last_caught_up_ms = 1
    assert leader.isr_shrink_candidate(lag_time_max_ms=1000) == {0}, "without sessions both lag"
