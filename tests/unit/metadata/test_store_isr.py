"""``MetadataStore.update_isr`` (the leader's AlterPartition) on a real Redis."""

from __future__ import annotations

import dataclasses

import pytest

from lowtide.errors import FencedLeaderEpoch, InvalidUpdateVersion


def make_moving_partition(store):
    store.create_topic(name="orders", partitions=1, replication_factor=3, config={}, assignment=[[0, 1, 2]])
    cur = store.partition_state("orders", 0)
    moving = dataclasses.replace(cur, replicas=(1, 2, 3, 0), adding_replicas=(3,), removing_replicas=(0,))
    assert store.compare_and_set_partition(cur, moving)
    return store.partition_state("orders", 0)


def test_an_isr_change_keeps_a_move_in_progress(store):
    cur = make_moving_partition(store)
    new = store.update_isr(topic="orders", partition=0, leader=cur.leader, leader_epoch=cur.leader_epoch,
                           isr=[0, 1, 2, 3], expected_partition_epoch=cur.partition_epoch)
    stored = store.partition_state("orders", 0)
    assert stored == new
    assert (stored.isr, stored.adding_replicas, stored.removing_replicas) == ((0, 1, 2, 3), (3,), (0,))
    assert stored.partition_epoch == cur.partition_epoch + 1


def test_an_isr_naming_a_broker_outside_the_replicas_is_cut_to_the_replicas(store):
    store.create_topic(name="orders", partitions=1, replication_factor=2, config={}, assignment=[[0, 1]])
    cur = store.partition_state("orders", 0)
    new = store.update_isr(topic="orders", partition=0, leader=0, leader_epoch=cur.leader_epoch, isr=[0, 1, 7])
    assert new.isr == (0, 1)


def test_a_leader_acting_on_a_stale_partition_epoch_changes_nothing(store):
    cur = make_moving_partition(store)
    with pytest.raises(InvalidUpdateVersion):
        store.update_isr(topic="orders", partition=0, leader=cur.leader, leader_epoch=cur.leader_epoch,
                         isr=[0, 1, 2], expected_partition_epoch=cur.partition_epoch - 1)
    assert store.partition_state("orders", 0) == cur


def test_a_deposed_leader_is_fenced(store):
    cur = make_moving_partition(store)
    with pytest.raises(FencedLeaderEpoch):
        store.update_isr(topic="orders", partition=0, leader=cur.leader, leader_epoch=cur.leader_epoch - 1,
                         isr=[0, 1])
    assert store.partition_state("orders", 0) == cur
