"""``MetadataStore.update_isr`` (the leader's AlterPartition) and the partition compare-and-set
under it, on a real etcd (``metadata_store``: a root of its own per test)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from lowtide.errors import FencedLeaderEpoch, InvalidUpdateVersion, UnknownTopicOrPartition
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.model import IsrChange
from lowtide.metadata.store import MetadataStore
from tests.waiting import wait_until


@pytest.fixture
def store(metadata_store):
    return metadata_store


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


def test_of_two_processes_changing_a_partition_from_the_same_state_exactly_one_wins(store):
    store.create_topic(name="orders", partitions=1, replication_factor=3, config={}, assignment=[[0, 1, 2]])
    other = MetadataStore(client=EtcdClient(store.client.endpoints), root=store.root)
    try:
        cur = other.partition_state("orders", 0)
        assert store.partition_state("orders", 0) == cur
        start = threading.Barrier(2)
        results: dict[int, bool] = {}

        def elect(s: MetadataStore, leader: int) -> None:
            start.wait()
            results[leader] = s.compare_and_set_partition(
                cur, dataclasses.replace(cur, leader=leader, leader_epoch=cur.leader_epoch + 1, isr=(leader,)))

        threads = [threading.Thread(target=elect, args=(s, leader)) for s, leader in ((store, 1), (other, 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results.values()) == [False, True]
        [winner] = [leader for leader, won in results.items() if won]
        for s in (store, other):
            # sync() gives up after 2 s (False) when the suite's load delays the watch: look again.
            wait_until(lambda s=s: s.sync() and s.partition_state("orders", 0).partition_epoch > cur.partition_epoch,
                       timeout_s=15, what="the store caught up")
            stored = s.partition_state("orders", 0)
            assert (stored.leader, stored.isr, stored.partition_epoch) == (winner, (winner,), cur.partition_epoch + 1)
    finally:
        other.close()


def test_an_isr_change_after_another_writer_moved_the_partition_lands_on_the_current_state(store):
    store.create_topic(name="orders", partitions=1, replication_factor=3, config={}, assignment=[[0, 1, 2]])
    cur = store.partition_state("orders", 0)
    # Another writer moves the partition epoch on (a reassignment step) behind this store's back,
    # straight in etcd: whether or not the image has it yet, the change is compared against the
    # stored revision and retried on what is stored.
    moved = dataclasses.replace(cur, partition_epoch=cur.partition_epoch + 1, adding_replicas=(), removing_replicas=())
    store.client.put(store._k("partitions", "orders", 0), moved.to_json().encode())
    new = store.update_isr(topic="orders", partition=0, leader=cur.leader, leader_epoch=cur.leader_epoch, isr=[0, 1])
    assert new.isr == (0, 1) and new.partition_epoch == cur.partition_epoch + 2
    assert store.partition_state("orders", 0) == new


def test_changing_a_partition_of_a_topic_that_does_not_exist_is_unknown(store):
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    cur = store.partition_state("orders", 0)
    store.delete_topic("orders")
    with pytest.raises(UnknownTopicOrPartition):
        store.update_isr(topic="orders", partition=0, leader=0, leader_epoch=cur.leader_epoch, isr=[0])
    with pytest.raises(UnknownTopicOrPartition):
        store.compare_and_set_partition(cur, dataclasses.replace(cur, isr=()))


def test_isr_changes_of_many_partitions_land_in_one_etcd_write_per_hundred(store):
    store.create_topic(name="orders", partitions=250, replication_factor=3, config={},
                       assignment=[[0, 1, 2]] * 250)
    before = store.client.revision()
    answers = store.update_isrs([IsrChange(topic="orders", partition=p, leader=0, leader_epoch=0, isr=(0, 1),
                                           expected_partition_epoch=0) for p in range(250)])
    assert [a.isr for a in answers] == [(0, 1)] * 250
    assert [a.partition_epoch for a in answers] == [1] * 250
    assert store.client.revision() - before == 3  # 100 + 100 + 50
    assert all(s.isr == (0, 1) and s.partition_epoch == 1 for s in store.partition_states("orders"))


def test_in_a_batch_of_isr_changes_only_the_fenced_and_the_stale_are_refused(store):
    store.create_topic(name="orders", partitions=4, replication_factor=3, config={}, assignment=[[0, 1, 2]] * 4)
    elected = dataclasses.replace(store.partition_state("orders", 1), leader=1, leader_epoch=1)
    assert store.compare_and_set_partition(store.partition_state("orders", 1), elected)
    answers = store.update_isrs([
        IsrChange(topic="orders", partition=0, leader=0, leader_epoch=0, isr=(0,), expected_partition_epoch=0),
        IsrChange(topic="orders", partition=1, leader=0, leader_epoch=0, isr=(0,)),  # deposed
        IsrChange(topic="orders", partition=2, leader=0, leader_epoch=0, isr=(0,), expected_partition_epoch=7),
        IsrChange(topic="orders", partition=9, leader=0, leader_epoch=0, isr=(0,)),  # no such partition
        IsrChange(topic="orders", partition=3, leader=0, leader_epoch=0, isr=(0, 2)),
    ])
    assert [type(a).__name__ for a in answers] == ["PartitionState", "FencedLeaderEpoch", "InvalidUpdateVersion",
                                                   "UnknownTopicOrPartition", "PartitionState"]
    assert [s.isr for s in store.partition_states("orders")] == [(0,), (0, 1, 2), (0, 1, 2), (0, 2)]


def test_a_batched_compare_and_set_writes_only_the_partitions_still_at_their_expected_epoch(store):
    store.create_topic(name="orders", partitions=3, replication_factor=3, config={}, assignment=[[0, 1, 2]] * 3)
    states = store.partition_states("orders")
    moved = dataclasses.replace(states[1], isr=(0, 1))
    assert store.compare_and_set_partition(states[1], moved)  # partition 1 moves on under the batch
    batch = [(s, dataclasses.replace(s, leader=2, leader_epoch=1)) for s in states]
    assert store.compare_and_set_partitions(batch) == [True, False, True]
    assert [(s.leader, s.partition_epoch) for s in store.partition_states("orders")] == [(2, 1), (0, 1), (2, 1)]
