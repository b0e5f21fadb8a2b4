"""Leader election by the controller on a real Redis, with liveness keys set by the test."""

from __future__ import annotations

import time

from lowtide.frontdoor.controller.controller import Controller, ControllerConfig, elect_leader
from lowtide.metadata.model import PartitionState
from tests.unit.frontdoor.harness import kill_broker, register_broker


def make_topic(store, replicas=(0, 1, 2)):
    store.create_topic(name="orders", partitions=1, replication_factor=len(replicas), config={},
                       assignment=[list(replicas)])


def test_dead_leader_is_replaced_by_the_next_live_isr_member_with_a_bumped_epoch(store):
    for b in (0, 1, 2):
        register_broker(store, b)
    make_topic(store)
    kill_broker(store, 0)
    written = Controller(store=store).run_once()
    state = store.partition_state("orders", 0)
    assert (state.leader, state.leader_epoch, state.isr) == (1, 1, (1, 2))
    assert written == [state]


def test_live_leader_is_left_alone(store):
    for b in (0, 1, 2):
        register_broker(store, b)
    make_topic(store)
    kill_broker(store, 2)  # a dead follower is the leader's business (ISR shrink), not an election
    assert Controller(store=store).run_once() == []
    assert store.partition_state("orders", 0).leader_epoch == 0


def test_no_live_isr_member_leaves_the_partition_leaderless_until_one_returns(store):
    for b in (0, 1):
        register_broker(store, b)
    make_topic(store, replicas=(0, 1))
    state = store.partition_state("orders", 0)
    store.update_isr(topic="orders", partition=0, leader=0, leader_epoch=0, isr=[0])  # 1 fell behind
    kill_broker(store, 0)
    controller = Controller(store=store)
    controller.run_once()
    state = store.partition_state("orders", 0)
    assert (state.leader, state.leader_epoch, state.isr) == (-1, 1, (0,))  # 1 is live but not in sync
    assert controller.run_once() == []  # nothing to do while no ISR member is live
    register_broker(store, 0)
    controller.run_once()
    state = store.partition_state("orders", 0)
    assert (state.leader, state.leader_epoch, state.isr) == (0, 2, (0,))


def test_a_leader_that_restarted_within_its_session_is_moved_off_under_a_new_epoch(store):
    for b in (0, 1, 2):
        register_broker(store, b)
    make_topic(store)
    controller = Controller(store=store)
    assert controller.run_once() == []  # broker 0 leads, seen under its first incarnation
    register_broker(store, 0)  # a new process: its session reopened before the old one expired
    [written] = controller.run_once()
    assert (written.leader, written.leader_epoch, written.isr) == (1, 1, (1, 2))
    assert controller.run_once() == []  # the restart is handled once


def test_a_restarted_sole_isr_member_leads_again_only_under_a_new_epoch(store):
    for b in (0, 1):
        register_broker(store, b)
    make_topic(store, replicas=(0, 1))
    store.update_isr(topic="orders", partition=0, leader=0, leader_epoch=0, isr=[0])
    controller = Controller(store=store)
    controller.run_once()
    register_broker(store, 0)
    controller.run_once()
    assert store.partition_state("orders", 0).leader == -1  # no other ISR member: leaderless
    controller.run_once()
    state = store.partition_state("orders", 0)
    assert (state.leader, state.leader_epoch) == (0, 2)


def test_only_the_lease_holder_elects(store):
    for b in (0, 1):
        register_broker(store, b)
    make_topic(store, replicas=(0, 1))
    first = Controller(store=store, config=ControllerConfig(lease_ms=5000))
    second = Controller(store=store, config=ControllerConfig(lease_ms=5000))
    assert first.run_once() == []
    kill_broker(store, 0)
    assert second.run_once() == []
    assert store.partition_state("orders", 0).leader == 0
    assert first.run_once()[0].leader == 1


def test_background_loop_elects_within_a_few_rounds(store):
    for b in (0, 1):
        register_broker(store, b)
    make_topic(store, replicas=(0, 1))
    controller = Controller(store=store, config=ControllerConfig(interval_s=0.05))
    controller.start()
    try:
        kill_broker(store, 0)
        deadline = time.monotonic() + 5
        while store.partition_state("orders", 0).leader != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.partition_state("orders", 0).leader == 1
    finally:
        controller.stop()


def test_election_prefers_assignment_order_among_live_isr_members():
    state = PartitionState(topic="t", partition=0, leader=3, leader_epoch=4, replicas=(3, 2, 1), isr=(1, 2, 3))
    new = elect_leader(state, live={1, 2})
    assert (new.leader, new.leader_epoch, new.isr) == (2, 5, (1, 2))
