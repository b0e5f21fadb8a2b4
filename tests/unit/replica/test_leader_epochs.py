"""Leader epochs on the replica (KIP-101, KIP-279): followers truncate to where the leader says
their latest epoch ends, never to their own high watermark; stale and future epochs are fenced."""

from __future__ import annotations

import pytest

from lowtide.errors import FencedLeaderEpoch, NotLeaderOrFollower, OffsetNotAvailable, UnknownLeaderEpoch
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.record import encode_batch
from lowtide.replica.partition import Partition


def restart(replicas, broker: int, *, checkpointed_hw: int) -> Partition:
    """kill -9 and restart ``broker``'s replica: reopen its directory with a (lagging) HW checkpoint."""
    old = replicas.by_broker[broker]
    old.log.close()
    plog = PartitionLog.open(old.log.dir, topic=old.topic, partition=0,
                             config=LogConfig.from_topic_config(replicas.topic.config),
                             high_watermark=checkpointed_hw)
    p = Partition(topic=replicas.topic, partition=0, log=plog, broker_id=broker)
    p.apply_state(replicas.state)
    replicas.by_broker[broker] = p
    return p


def test_a_restarted_follower_elected_before_it_could_ask_keeps_every_acknowledged_record(replicas):
    # Finding 1 of issue 9: the HW a follower checkpointed lags the leader's. The leader hangs,
    # the follower restarts and is elected before it can ask the leader anything.
    f = restart(replicas, 1, checkpointed_hw=10)
    assert f.truncation_pending
    assert (f.log.high_watermark, f.log.log_end_offset) == (10, 20)

    replicas.elect(1, leader_epoch=2)

    assert replicas.leader is f
    assert f.log.log_end_offset == 20  # the old code truncated to its HW: 10 acknowledged records lost
    assert f.log.leader_epochs()[-1] == (2, 20)


def test_a_restarted_follower_truncates_to_the_end_of_its_epoch_on_the_leader_not_to_its_hw(replicas):
    f = restart(replicas, 1, checkpointed_hw=5)
    replicas.fetch_once(1)
    assert not f.truncation_pending
    assert f.log.log_end_offset == 20


def test_a_deposed_leader_drops_only_what_the_new_leader_does_not_have(replicas):
    old = replicas.leader
    old.append_as_leader(encode_batch([b"unreplicated"] * 3), acks=1, min_insync_replicas=1)  # offsets 20..22
    replicas.elect(1, leader_epoch=2)
    new = replicas.leader
    new.append_as_leader(encode_batch([b"new-epoch"] * 2), acks=1, min_insync_replicas=1)  # offsets 20..21

    replicas.replicate(0, 2)

    assert old.log.log_end_offset == new.log.log_end_offset == 22
    assert old.log.read(20, max_bytes=1 << 20, max_offset=22) == new.log.read(20, max_bytes=1 << 20, max_offset=22)
    assert old.log.leader_epochs() == new.log.leader_epochs() == [(1, 0), (2, 20)]


def test_a_follower_asking_about_an_epoch_the_leader_skipped_truncates_to_where_the_leader_moved_on(replicas):
    # Broker 2 led epoch 2 alone (its records never replicated); broker 1 then led epoch 3.
    replicas.elect(2, leader_epoch=2)
    replicas.leader.append_as_leader(encode_batch([b"lost"] * 4), acks=1, min_insync_replicas=1)
    replicas.elect(1, leader_epoch=3)
    replicas.leader.append_as_leader(encode_batch([b"kept"] * 1), acks=1, min_insync_replicas=1)

    replicas.replicate(2)

    assert replicas.leader.end_offset_for_epoch(2) == (1, 20)
    assert replicas.follower(2).log.log_end_offset == 21
    assert replicas.follower(2).log.leader_epochs() == [(1, 0), (3, 20)]


def test_produce_with_a_stale_leader_epoch_is_fenced_and_with_a_future_one_is_unknown(replicas):
    with pytest.raises(FencedLeaderEpoch):
        replicas.leader.append_as_leader(encode_batch([b"x"]), acks=1, min_insync_replicas=1, current_leader_epoch=0)
    with pytest.raises(UnknownLeaderEpoch):
        replicas.leader.append_as_leader(encode_batch([b"x"]), acks=1, min_insync_replicas=1, current_leader_epoch=2)
    assert replicas.leader.log.log_end_offset == 20
    info = replicas.leader.append_as_leader(encode_batch([b"x"]), acks=1, min_insync_replicas=1,
                                            current_leader_epoch=1)
    assert info.base_offset == 20


def test_a_fetch_answer_from_another_leader_epoch_is_dropped(replicas):
    f = replicas.follower(1)
    batch = encode_batch([b"stale"], base_offset=20, partition_leader_epoch=1)
    assert f.apply_fetched(records=batch, leader_hw=21, leader_lso=0, leader_epoch=0) == (False, False)
    assert f.log.log_end_offset == 20


def test_a_follower_does_not_apply_fetched_data_before_its_truncation_is_settled(replicas):
    f = restart(replicas, 1, checkpointed_hw=20)
    batch = encode_batch([b"early"], base_offset=20, partition_leader_epoch=1)
    assert f.apply_fetched(records=batch, leader_hw=21, leader_lso=0, leader_epoch=1) == (False, False)
    assert f.log.log_end_offset == 20


def test_a_leader_restarted_under_the_same_epoch_has_no_high_watermark_to_answer_until_its_followers_fetch(replicas):
    # kill -9 of the leader and a restart before the controller moved the leadership: it leads
    # epoch 1 again from an HW checkpoint that lags the 20 records it had acknowledged. A front
    # door loading __consumer_offsets to that HW served a consumer group without its latest
    # records (GROUP_ID_NOT_FOUND to ConsumerGroupDescribe, in the franz-go KIP-848 test).
    leader = restart(replicas, 0, checkpointed_hw=10)
    assert replicas.leader is leader and leader.leader_epoch == 1
    assert (leader.log.high_watermark, leader.log.log_end_offset) == (10, 20)
    with pytest.raises(OffsetNotAvailable):
        leader.check_high_watermark_settled()

    replicas.replicate()

    assert leader.log.high_watermark == 20
    leader.check_high_watermark_settled()


def test_a_leader_just_elected_has_no_high_watermark_to_answer_until_it_reaches_the_start_of_its_epoch(replicas):
    replicas.produce(5)
    replicas.fetch_once(1)
    replicas.fetch_once(2)  # the followers hold offsets 20..24 but learnt HW 20
    replicas.elect(1, leader_epoch=2)
    new = replicas.leader
    assert (new.log.high_watermark, new.log.log_end_offset) == (20, 25)
    with pytest.raises(OffsetNotAvailable):
        new.check_high_watermark_settled()

    replicas.replicate()

    assert new.log.high_watermark == 25
    new.check_high_watermark_settled()


def test_a_follower_has_no_high_watermark_to_answer_as_a_leader(replicas):
    with pytest.raises(NotLeaderOrFollower):
        replicas.follower(1).check_high_watermark_settled()
