"""The front door's binding of the internal topics' runtime (lowtide/frontdoor/internal_topics.py)."""

from __future__ import annotations

import pytest

from lowtide.errors import (
    CoordinatorNotAvailable,
    InvalidConfig,
    LeaderNotAvailable,
    NotEnoughReplicas,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.internal_topics import FRONT_DOOR_APPENDS, FrontDoorRouter, create_with_admin
from lowtide.internal_topics import InternalTopicSpec
from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo

SPEC = InternalTopicSpec(name="__internal", partitions=2, config={"cleanup.policy": "compact"})


class FakeAdmin:
    def __init__(self, error=None) -> None:
        self.requests = []
        self.error = error

    def create_topic(self, request):
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        return TopicInfo(name=request.name, topic_id="x", partitions=request.partitions, replication_factor=3,
                         config=dict(request.config))


def test_the_topic_admin_creates_it_with_its_own_replication_factor_and_the_extra_config():
    admin = FakeAdmin()
    info = create_with_admin(admin, extra_config=lambda: {"min.insync.replicas": "2"})(SPEC)
    (request,) = admin.requests
    assert request.replication_factor == 0 and request.partitions == 2
    assert info.config == {"cleanup.policy": "compact", "min.insync.replicas": "2"}


def test_a_lost_race_is_left_to_the_runtime_and_other_errors_are_coordinator_not_available():
    with pytest.raises(TopicAlreadyExists):
        create_with_admin(FakeAdmin(TopicAlreadyExists("x")))(SPEC)
    with pytest.raises(CoordinatorNotAvailable, match="cannot create __internal: INVALID_CONFIG"):
        create_with_admin(FakeAdmin(InvalidConfig("bad")))(SPEC)


class FakeStore:
    """What ``route_partitions`` reads: one topic, partition 0 led by live broker 1, 1 without a leader."""

    def topic(self, name):
        if name != "__internal":
            raise UnknownTopicOrPartition(name)
        return TopicInfo(name=name, topic_id="x", partitions=2, replication_factor=1)

    def partition_states(self, topic):
        return [PartitionState(topic=topic, partition=0, leader=1, leader_epoch=0, replicas=(1,), isr=(1,)),
                PartitionState(topic=topic, partition=1, leader=-1, leader_epoch=0, replicas=(1,), isr=())]

    def brokers(self):
        return {1: BrokerInfo(id=1, host="h", port=9)}

    def live_broker_ids(self, ids=None):
        return {1}


def test_the_router_finds_live_leaders_and_says_why_there_is_none():
    router = FrontDoorRouter(store=FakeStore(), topic="__internal")
    assert router.find_leader(0, refresh=False) == "h:9" and router.cached_leader(0) is None
    with pytest.raises(LeaderNotAvailable):
        router.find_leader(1, refresh=True)
    assert router.route([0, 1]) == ({"h:9": [0]}, {1: "LEADER_NOT_AVAILABLE: __internal-1 has no leader"})


def test_the_front_door_retries_every_retriable_failure_and_gives_up_unavailable():
    assert FRONT_DOOR_APPENDS.retry_on(NotEnoughReplicas("few")) and not FRONT_DOOR_APPENDS.call_errors_final
    error = FRONT_DOOR_APPENDS.give_up("__internal-0", NotEnoughReplicas("few"))
    assert isinstance(error, CoordinatorNotAvailable)
    assert error.message == "__internal-0 did not take the write: NOT_ENOUGH_REPLICAS: few"
