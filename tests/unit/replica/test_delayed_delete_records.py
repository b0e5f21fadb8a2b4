"""DelayedDeleteRecords: completes when the low watermark reaches the offset, times out at its
deadline, fails when leadership moves. Driven directly (no purgatory, no Redis, no sleeps)."""

from __future__ import annotations

from lowtide.clock import now_ms
from lowtide.errors import NotLeaderOrFollower, RequestTimedOut
from lowtide.replica.delete_records import DelayedDeleteRecords
from lowtide.replica.registry import PartitionRegistry
from tests.unit.replica.conftest import TOPIC

TP = (TOPIC, 0)


def delete_and_wait(registry, offset: int) -> DelayedDeleteRecords:
    """What the leader does for DeleteRecords(offset): raise the LSO, then build the waiting op."""
    leader = registry.get(*TP)
    target, _ = leader.delete_records_before(offset)
    return DelayedDeleteRecords(registry=registry, required={TP: (target, leader.leader_epoch)},
                                deadline_ms=now_ms() + 60_000)


def test_it_completes_with_the_low_watermark_once_every_live_replica_reached_the_offset(replicas, registry):
    op = delete_and_wait(registry, 15)

    assert op.run_try_complete() is False
    replicas.replicate(1)
    assert op.run_try_complete() is False  # follower 2 still reports LSO 0
    replicas.replicate(2)
    assert op.run_try_complete() is True

    assert op.is_completed and not op.expired
    assert op.results == {TP: 15}
    assert op.wait(0)


def test_an_offset_at_or_below_the_log_start_offset_completes_at_once_with_the_current_low_watermark(
        replicas, registry):
    registry.get(*TP).delete_records_before(12)
    replicas.replicate()

    op = delete_and_wait(registry, 5)

    assert op.run_try_complete() is True
    assert op.results == {TP: 12}


def test_it_completes_when_the_lagging_follower_leaves_the_live_set_and_then_the_isr(replicas, registry):
    op = delete_and_wait(registry, 15)
    replicas.replicate(1)
    assert op.run_try_complete() is False

    registry.update_live_brokers({0, 1})
    assert op.run_try_complete() is False  # still in the ISR: it could be elected with LSO 0

    replicas.shrink_isr((0, 1))
    assert op.run_try_complete() is True
    assert op.results == {TP: 15}


def test_it_times_out_with_request_timed_out_and_the_leader_log_start_offset_stays_advanced(replicas, registry):
    op = delete_and_wait(registry, 15)
    replicas.replicate(1)
    assert op.run_try_complete() is False

    assert op.expire() is True

    assert op.expired
    assert isinstance(op.results[TP], RequestTimedOut)
    assert op.results[TP].code == 7
    assert replicas.leader.log.log_start_offset == 15
    assert op.run_try_complete() is False  # completed once, for good
    assert op.force_complete() is False


def test_a_partition_that_reached_its_offset_keeps_its_low_watermark_when_the_rest_times_out(make_replicas):
    fast, slow = make_replicas(topic="fast"), make_replicas(topic="slow")
    for r in (fast, slow):
        r.produce(5)
        r.replicate()
    registry = PartitionRegistry(broker_id=0)
    leaders = {fast.leader.key: fast.leader, slow.leader.key: slow.leader}
    registry.apply_assignment({fast.leader.key: fast.state, slow.leader.key: slow.state},
                              open_partition=leaders.__getitem__)
    registry.update_live_brokers({0, 1, 2})
    fast.leader.delete_records_before(4)
    slow.leader.delete_records_before(3)
    op = DelayedDeleteRecords(registry=registry, required={("fast", 0): (4, 1), ("slow", 0): (3, 1)},
                              deadline_ms=now_ms() + 60_000)
    fast.replicate()  # the slow set's followers never fetch

    assert op.run_try_complete() is False
    op.expire()

    assert op.results[("fast", 0)] == 4
    assert isinstance(op.results[("slow", 0)], RequestTimedOut)


def test_it_fails_with_not_leader_or_follower_when_another_broker_becomes_leader(replicas, registry):
    op = delete_and_wait(registry, 15)
    assert op.run_try_complete() is False

    replicas.elect(1, leader_epoch=2)

    assert op.run_try_complete() is True
    assert isinstance(op.results[TP], NotLeaderOrFollower)
    assert op.results[TP].code == 6


def test_it_fails_with_not_leader_or_follower_when_the_leader_epoch_changes_even_if_it_stays_leader(
        replicas, registry):
    op = delete_and_wait(registry, 15)

    replicas.elect(0, leader_epoch=2)
    replicas.replicate()  # the LW reaches 15 under the new epoch: still not this request's leadership

    assert replicas.leader.low_watermark(registry.live_brokers) == 15
    assert op.run_try_complete() is True
    assert isinstance(op.results[TP], NotLeaderOrFollower)


def test_it_fails_with_not_leader_or_follower_when_the_partition_is_no_longer_hosted(replicas, registry):
    op = delete_and_wait(registry, 15)

    changes = registry.apply_assignment({}, open_partition=lambda tp: replicas.leader)

    assert [p.key for p in changes.removed] == [TP]
    assert op.run_try_complete() is True
    assert isinstance(op.results[TP], NotLeaderOrFollower)
