"""Partition reassignment (KIP-455): the steps as pure functions, and the front door's Alter/List
with the controller finishing moves, on a real Redis."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.errors import (
    ClusterAuthorizationFailed,
    EligibleLeadersNotAvailable,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    NoReassignmentInProgress,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.controller.controller import Controller
from lowtide.frontdoor.controller.reassignments import (
    PartitionReassigner,
    cancel_reassignment,
    complete_reassignment,
    start_reassignment,
    validate_target,
)
from lowtide.messages import TopicPartition
from lowtide.metadata.model import PartitionState
from tests.unit.frontdoor.harness import kill_broker, register_broker

ALL = {0, 1, 2, 3, 4}


def state(leader: int = 0, replicas=(0, 1, 2), isr=(0, 1, 2), **moving) -> PartitionState:
    return PartitionState(topic="orders", partition=0, leader=leader, leader_epoch=3, replicas=replicas, isr=isr,
                          partition_epoch=7, **moving)


def test_a_move_starts_with_the_target_first_and_the_removed_replicas_after_it():
    new = start_reassignment(state(), (1, 2, 3), ALL)
    assert (new.replicas, new.adding_replicas, new.removing_replicas) == ((1, 2, 3, 0), (3,), (0,))
    assert (new.leader, new.leader_epoch, new.isr) == (0, 3, (0, 1, 2))  # leadership is not touched yet


def test_a_move_to_where_the_partition_already_is_writes_nothing():
    assert start_reassignment(state(), (0, 1, 2), ALL) is None
    moving = start_reassignment(state(), (1, 2, 3), ALL)
    assert start_reassignment(moving, (1, 2, 3), ALL) is None


def test_a_move_finishes_only_once_every_adding_replica_is_in_the_isr():
    moving = start_reassignment(state(), (1, 2, 3), ALL)
    assert complete_reassignment(moving, ALL) is None
    done = complete_reassignment(replace(moving, isr=(0, 1, 2, 3)), ALL)
    assert (done.replicas, done.isr, done.adding_replicas, done.removing_replicas) == ((1, 2, 3), (1, 2, 3), (), ())
    assert (done.leader, done.leader_epoch) == (1, 4)  # the removed leader hands over in the same write


def test_a_finished_move_keeps_a_leader_that_stays_and_its_epoch():
    moving = start_reassignment(state(leader=1), (1, 2, 3), ALL)
    done = complete_reassignment(replace(moving, isr=(0, 1, 2, 3)), ALL)
    assert (done.leader, done.leader_epoch) == (1, 3)


def test_a_move_waits_while_no_live_isr_member_of_the_target_can_lead():
    moving = replace(start_reassignment(state(), (3, 4), ALL), isr=(0, 3, 4))
    assert complete_reassignment(moving, live={0}) is None
    assert complete_reassignment(moving, live={0, 4}).leader == 4


def test_a_move_can_change_the_replication_factor():
    grown = start_reassignment(state(), (0, 1, 2, 3), ALL)
    assert (grown.replicas, grown.adding_replicas, grown.removing_replicas) == ((0, 1, 2, 3), (3,), ())
    shrunk = start_reassignment(state(), (0, 1), ALL)
    assert (shrunk.replicas, shrunk.adding_replicas, shrunk.removing_replicas) == ((0, 1, 2), (), (2,))
    assert complete_reassignment(shrunk, ALL).replicas == (0, 1)


def test_a_new_target_mid_move_is_computed_from_the_original_set():
    moving = replace(start_reassignment(state(), (1, 2, 3), ALL), isr=(0, 1, 2, 3))
    redirected = start_reassignment(moving, (2, 4, 0), ALL)
    assert (redirected.replicas, redirected.adding_replicas, redirected.removing_replicas) == ((2, 4, 0, 1), (4,), (1,))
    assert redirected.isr == (0, 1, 2)  # 3 was adding for the old target only: out with it


def test_cancel_restores_the_original_set_and_drops_the_adding_replicas_from_the_isr():
    moving = replace(start_reassignment(state(), (1, 2, 3), ALL), isr=(0, 1, 2, 3))
    back = cancel_reassignment(moving, ALL)
    assert (back.replicas, back.isr, back.adding_replicas, back.removing_replicas) == ((1, 2, 0), (0, 1, 2), (), ())
    assert back.leader_epoch == moving.leader_epoch


def test_cancel_moves_leadership_off_an_adding_replica_and_refuses_when_nobody_original_can_lead():
    moving = replace(start_reassignment(state(), (3, 4), ALL), isr=(0, 3, 4), leader=3)
    back = cancel_reassignment(moving, ALL)
    assert (back.leader, back.leader_epoch, back.isr) == (0, 4, (0,))
    with pytest.raises(EligibleLeadersNotAvailable):
        cancel_reassignment(moving, live={3, 4})


def test_cancel_without_a_move_is_no_reassignment_in_progress():
    with pytest.raises(NoReassignmentInProgress):
        cancel_reassignment(state(), ALL)


@pytest.mark.parametrize("target, error", [
    ((), InvalidReplicaAssignment),
    ((1, 1, 2), InvalidReplicaAssignment),
    ((1, 2, 9), InvalidReplicaAssignment),
])
def test_a_bad_target_is_refused_with_kafkas_error(target, error):
    with pytest.raises(error):
        validate_target(state(), target, registered=ALL)


def test_a_replication_factor_change_is_refused_when_the_caller_disallows_it():
    with pytest.raises(InvalidReplicationFactor):
        validate_target(state(), (1, 2), registered=ALL, allow_replication_factor_change=False)
    assert validate_target(state(), (1, 2, 3), registered=ALL, allow_replication_factor_change=False) == (1, 2, 3)


# -- on a real Redis -------------------------------------------------------------------------------
def reassigner(store, *, enabled=False) -> PartitionReassigner:
    return PartitionReassigner(store=store, authorizer=Authorizer(store=AclStore(metadata=store), enabled=enabled))


@pytest.fixture
def cluster(store):
    for b in range(4):
        register_broker(store, b)
    store.create_topic(name="orders", partitions=2, replication_factor=3, config={},
                       assignment=[[0, 1, 2], [1, 2, 0]])
    return store


def test_an_alter_is_listed_until_the_controller_finishes_it(cluster):
    front = reassigner(cluster)
    outcomes = front.alter(principal="User:admin", targets={TopicPartition("orders", 0): (1, 2, 3)})
    assert [o.error for o in outcomes] == [None]
    listed = front.list(principal="User:admin")
    assert [(s.partition, s.replicas, s.adding_replicas, s.removing_replicas) for s in listed] == [
        (0, (1, 2, 3, 0), (3,), (0,))]
    controller = Controller(store=cluster)
    assert controller.run_once() == []  # broker 3 is not in the ISR yet
    cur = cluster.partition_state("orders", 0)
    cluster.update_isr(topic="orders", partition=0, leader=0, leader_epoch=cur.leader_epoch, isr=[0, 1, 2, 3])
    written = controller.run_once()
    assert [(s.replicas, s.isr, s.leader) for s in written] == [((1, 2, 3), (1, 2, 3), 1)]
    assert cluster.partition_state("orders", 0) == written[0]
    assert front.list(principal="User:admin") == []


def test_a_cancelled_alter_leaves_the_partition_as_it_was(cluster):
    front = reassigner(cluster)
    before = cluster.partition_state("orders", 1)
    front.alter(principal="User:admin", targets={TopicPartition("orders", 1): (3, 2, 0)})
    outcomes = front.alter(principal="User:admin", targets={TopicPartition("orders", 1): None})
    assert [o.error for o in outcomes] == [None]
    after = cluster.partition_state("orders", 1)
    assert (after.replicas, after.isr, after.leader, after.leader_epoch) == (
        (2, 0, 1), before.isr, before.leader, before.leader_epoch)
    again = front.alter(principal="User:admin", targets={TopicPartition("orders", 1): None})
    assert isinstance(again[0].error, NoReassignmentInProgress)


def test_each_partition_gets_its_own_answer(cluster):
    kill_broker(cluster, 3)  # registered but not live: the move is accepted and waits (Kafka too)
    outcomes = reassigner(cluster).alter(principal="User:admin", targets={
        TopicPartition("orders", 0): (1, 2, 3), TopicPartition("orders", 7): (1, 2, 3),
        TopicPartition("nope", 0): (1, 2, 3), TopicPartition("orders", 1): (1, 2, 9)})
    assert [type(o.error) for o in outcomes] == [
        type(None), UnknownTopicOrPartition, UnknownTopicOrPartition, InvalidReplicaAssignment]
    assert cluster.partition_state("orders", 1).replicas == (1, 2, 0)


def test_a_diskless_topic_has_no_replicas_to_move(cluster):
    cluster.create_topic(name="lake", partitions=1, replication_factor=1, config={}, assignment=[],
                         diskless=True, diskless_shards=[0])
    outcomes = reassigner(cluster).alter(principal="User:admin", targets={TopicPartition("lake", 0): (1,)})
    assert isinstance(outcomes[0].error, InvalidReplicaAssignment)


def test_reassigning_needs_alter_and_listing_describe_on_the_cluster(cluster):
    front = reassigner(cluster, enabled=True)
    with pytest.raises(ClusterAuthorizationFailed):
        front.alter(principal="User:alice", targets={TopicPartition("orders", 0): (1, 2, 3)})
    with pytest.raises(ClusterAuthorizationFailed):
        front.list(principal="User:alice")
    assert cluster.partition_state("orders", 0).replicas == (0, 1, 2)
