"""Leader elections on request (KIP-460) and the controller's leader balance, on a real Redis."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.errors import (
    ClusterAuthorizationFailed,
    ElectionNotNeeded,
    EligibleLeadersNotAvailable,
    PreferredLeaderNotAvailable,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.controller.controller import Controller
from lowtide.frontdoor.controller.elections import (
    BalanceConfig,
    ElectionType,
    LeaderBalancer,
    LeaderElections,
    imbalanced_brokers,
    preferred_election,
    unclean_election,
)
from lowtide.messages import TopicPartition
from lowtide.metadata.model import PartitionState
from tests.unit.frontdoor.harness import kill_broker, register_broker


def state(leader: int, replicas=(0, 1, 2), isr=(0, 1, 2), partition: int = 0) -> PartitionState:
    return PartitionState(topic="orders", partition=partition, leader=leader, leader_epoch=3, replicas=replicas,
                          isr=isr, partition_epoch=7)


def test_a_preferred_election_moves_leadership_to_the_first_replica_with_a_new_epoch():
    new = preferred_election(state(leader=1), live={0, 1, 2})
    assert (new.leader, new.leader_epoch, new.isr, new.replicas) == (0, 4, (0, 1, 2), (0, 1, 2))


def test_a_preferred_election_is_not_needed_when_the_preferred_replica_leads():
    with pytest.raises(ElectionNotNeeded):
        preferred_election(state(leader=0), live={0, 1, 2})


@pytest.mark.parametrize("live, isr, why", [({1, 2}, (0, 1, 2), "is not live"), ({0, 1, 2}, (1, 2), "not in the ISR")])
def test_a_preferred_replica_that_is_down_or_behind_never_leads(live, isr, why):
    with pytest.raises(PreferredLeaderNotAvailable, match=why):
        preferred_election(state(leader=1, isr=isr), live=live)


def test_an_unclean_election_stays_clean():
    with pytest.raises(ElectionNotNeeded):
        unclean_election(state(leader=1), live={0, 1, 2})
    assert unclean_election(state(leader=1, isr=(1, 2)), live={0, 2}).leader == 2  # a live ISR member
    with pytest.raises(EligibleLeadersNotAvailable, match="unclean election .* is disabled"):
        unclean_election(state(leader=1, isr=(1,)), live={0, 2})  # only out-of-sync replicas are live


def test_imbalance_is_the_share_of_a_brokers_preferred_partitions_it_does_not_lead():
    states = [state(leader=1, replicas=(0, 1, 2), partition=p) for p in range(1)] + \
             [state(leader=0, replicas=(0, 1, 2), partition=p) for p in range(1, 10)] + \
             [state(leader=2, replicas=(1, 2, 0), partition=10)]
    # broker 0: 1 of 10 not led = 10 %, not above the threshold; broker 1: 1 of 1 = 100 %
    assert {b: [s.partition for s in ps] for b, ps in imbalanced_brokers(states, percentage=10).items()} == {1: [10]}
    assert set(imbalanced_brokers(states, percentage=9)) == {0, 1}


@pytest.fixture
def orders(store):
    for b in (0, 1, 2):
        register_broker(store, b)
    store.create_topic(name="orders", partitions=3, replication_factor=3, config={},
                       assignment=[[0, 1, 2], [1, 2, 0], [2, 0, 1]])
    # broker 0 restarted: partition 0 is led by broker 1 (epoch 1), as after a failover
    current = store.partition_state("orders", 0)
    assert store.compare_and_set_partition(current, replace(current, leader=1, leader_epoch=1))
    return store


def elections(store, *, enabled=False) -> LeaderElections:
    return LeaderElections(store=store, authorizer=Authorizer(store=AclStore(metadata=store), enabled=enabled))


def test_electing_every_partition_answers_only_where_an_election_was_due(orders):
    outcomes = elections(orders).elect(principal="User:ops", election_type=ElectionType.PREFERRED, partitions=None)
    assert [(o.partition, o.error) for o in outcomes] == [(TopicPartition("orders", 0), None)]
    assert [s.leader for s in orders.partition_states("orders")] == [0, 1, 2]
    assert orders.partition_state("orders", 0).leader_epoch == 2


def test_electing_named_partitions_answers_each_one(orders):
    kill_broker(orders, 0)
    outcomes = elections(orders).elect(principal="User:ops", election_type=ElectionType.PREFERRED, partitions=[
        TopicPartition("orders", 0), TopicPartition("orders", 1), TopicPartition("orders", 9)])
    assert [type(o.error).__name__ for o in outcomes] == [
        "PreferredLeaderNotAvailable", "ElectionNotNeeded", "UnknownTopicOrPartition"]
    assert orders.partition_state("orders", 0).leader == 1  # nothing changed


def test_elections_need_alter_on_the_cluster(orders):
    with pytest.raises(ClusterAuthorizationFailed):
        elections(orders, enabled=True).elect(principal="User:mallory", election_type=ElectionType.PREFERRED,
                                              partitions=None)
    assert orders.partition_state("orders", 0).leader == 1


def test_the_controller_moves_leaders_back_to_preferred_replicas_once_per_check_interval(orders):
    now = [0.0]
    balancer = LeaderBalancer(store=orders, config=BalanceConfig(check_interval_s=30))
    controller = Controller(store=orders, balancer=balancer, clock=lambda: now[0])
    assert controller.run_once() == []  # the first check is one interval after start
    assert orders.partition_state("orders", 0).leader == 1
    now[0] = 30.0
    [moved] = controller.run_once()
    assert (moved.topic, moved.partition, moved.leader, moved.leader_epoch) == ("orders", 0, 0, 2)
    assert orders.partition_state("orders", 0).leader == 0


def test_a_disabled_balancer_leaves_leaders_where_they_are(orders):
    now = [100.0]
    controller = Controller(store=orders, clock=lambda: now[0], balancer=LeaderBalancer(
        store=orders, config=BalanceConfig(enabled=False, check_interval_s=1)))
    now[0] = 200.0
    assert controller.run_once() == [] and orders.partition_state("orders", 0).leader == 1


def test_unknown_partitions_are_refused_without_touching_others(orders):
    [outcome] = elections(orders).elect(principal="User:ops", election_type=ElectionType.UNCLEAN,
                                        partitions=[TopicPartition("nope", 0)])
    assert isinstance(outcome.error, UnknownTopicOrPartition)
