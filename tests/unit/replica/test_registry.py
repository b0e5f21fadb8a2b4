"""PartitionRegistry: the hosted partitions, the live brokers, and the wake-ups of parked requests."""

from __future__ import annotations

import threading

import pytest

from lowtide.errors import UnknownTopicOrPartition
from lowtide.metadata.model import PartitionState
from lowtide.replica.partition import FOLLOWER, LEADER
from lowtide.replica.registry import OffsetWaiters, PartitionRegistry


def test_get_raises_unknown_topic_or_partition_for_a_partition_not_hosted(registry):
    with pytest.raises(UnknownTopicOrPartition) as raised:
        registry.get("orders", 7)
    assert raised.value.code == 3
    assert registry.find("orders", 7) is None
    assert registry.get("orders", 0) is registry.find("orders", 0)


def test_an_assignment_opens_a_partition_only_the_first_time_it_is_assigned(make_replicas):
    r = make_replicas()
    opened = []

    def open_partition(tp):
        opened.append(tp)
        return r.follower(1)

    registry = PartitionRegistry(broker_id=1)
    registry.apply_assignment({("orders", 0): r.state}, open_partition=open_partition)
    registry.apply_assignment({("orders", 0): r.state}, open_partition=open_partition)

    assert opened == [("orders", 0)]
    assert registry.following(0) == [r.follower(1)]
    assert registry.leading() == []


def test_an_assignment_reports_the_new_role_of_a_partition_whose_leadership_changed(make_replicas):
    r = make_replicas()
    registry = PartitionRegistry(broker_id=0)
    registry.apply_assignment({("orders", 0): r.state}, open_partition=lambda tp: r.leader)
    new_state = PartitionState(topic="orders", partition=0, leader=2, leader_epoch=2, replicas=(0, 1, 2),
                               isr=(0, 1, 2))

    changes = registry.apply_assignment({("orders", 0): new_state}, open_partition=lambda tp: r.leader)

    assert [(p.key, role) for p, role in changes.became] == [(("orders", 0), FOLLOWER)]
    assert registry.following(2) == [r.leader]
    assert registry.leading() == []


def test_a_partition_left_out_of_the_assignment_is_removed_and_returned(replicas, registry):
    assert [p.role for p in registry.all()] == [LEADER]

    changes = registry.apply_assignment({}, open_partition=lambda tp: replicas.leader)

    assert changes.removed == [replicas.leader]
    assert registry.all() == []
    with pytest.raises(UnknownTopicOrPartition):
        registry.get("orders", 0)


def test_update_live_brokers_says_whether_the_set_changed():
    registry = PartitionRegistry(broker_id=0)
    assert registry.update_live_brokers([0, 1]) is True
    assert registry.update_live_brokers({1, 0}) is False
    assert registry.live_brokers == frozenset({0, 1})
    assert registry.update_live_brokers([0]) is True
    assert registry.live_brokers == frozenset({0})


def test_notify_wakes_only_the_waiters_of_the_partitions_that_changed():
    registry = PartitionRegistry(broker_id=0)
    with registry.waiting([("a", 0)]) as on_a, registry.waiting([("b", 0), ("c", 0)]) as on_b_or_c:
        registry.notify([("c", 0)])
        assert (on_a.is_set(), on_b_or_c.is_set()) == (False, True)
        on_b_or_c.clear()
        registry.notify()
        assert (on_a.is_set(), on_b_or_c.is_set()) == (True, True)


def test_an_hw_move_wakes_only_the_offset_waiters_it_passed_and_none_after_their_block():
    waiters = OffsetWaiters()
    first, second, other = threading.Event(), threading.Event(), threading.Event()
    with waiters.waiting([(("t", 0), 9)], first), waiters.waiting([(("t", 0), 19)], second), \
            waiters.waiting([(("t", 1), 0)], other):
        waiters.passed(("t", 0), 10)  # offset 9 is below the HW now; 19 is not
        assert first.is_set() and not second.is_set() and not other.is_set()
        waiters.passed(("t", 0), 19)  # the HW must pass the offset, not reach it
        assert not second.is_set()
        waiters.passed(("t", 0), 20)
        assert second.is_set() and not other.is_set()
    late = threading.Event()
    with waiters.waiting([(("t", 0), 30)], late):
        pass
    waiters.passed(("t", 0), 100)
    assert not late.is_set(), "a waiter was woken after its block ended"
