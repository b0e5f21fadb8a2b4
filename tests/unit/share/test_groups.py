"""The share group coordinator (lowtide.share.groups): joins, leaves, fencing, expiry and describe,
as Kafka answers ShareGroupHeartbeat v1 and ShareGroupDescribe."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lowtide.auth.acl import Authorizer
from lowtide.errors import FencedMemberEpoch, GroupIdNotFound, InvalidRequest, NonEmptyGroup, UnknownMemberId
from lowtide.messages.consumer_groups import ConsumerHeartbeat
from lowtide.share.groups import ShareGroupConfig, ShareGroups

ORDERS_ID = "0" * 31 + "1"


@dataclass(frozen=True)
class Info:
    topic_id: str
    partitions: int


class Topics:
    """The cluster's topics as the coordinator reads them (the metadata store's ``topics()``)."""

    def __init__(self) -> None:
        self.infos = {"orders": Info(ORDERS_ID, 3)}

    def topics(self):
        return dict(self.infos)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup():
    clock, topics = Clock(), Topics()
    groups = ShareGroups(topics=topics, authorizer=Authorizer(store=None, enabled=False),  # type: ignore[arg-type]
                         config=ShareGroupConfig(session_timeout_ms=1000), clock=clock,
                         other_group=lambda g: g == "classic")
    return groups, clock, topics


def beat(groups: ShareGroups, member: str, epoch: int, topics=("orders",), group: str = "g"):
    return groups.heartbeat(principal="User:ANONYMOUS", request=ConsumerHeartbeat(
        group_id=group, member_id=member, member_epoch=epoch,
        subscribed_topic_names=tuple(topics) if topics is not None else None))


def partitions(result) -> set[int]:
    return {p for t in result.assignment or () for p in t.partitions}


def test_a_member_joins_with_epoch_zero_and_gets_every_partition(setup):
    groups, _, _ = setup
    answer = beat(groups, "a", 0)
    assert answer.member_epoch == 1 and partitions(answer) == {0, 1, 2}
    assert beat(groups, "a", 1, topics=None).assignment is None  # unchanged: not repeated


def test_members_that_join_later_share_the_partitions(setup):
    groups, _, _ = setup
    beat(groups, "a", 0)
    b = beat(groups, "b", 0)
    assert b.member_epoch == 2 and len(partitions(b)) == 1
    [described] = groups.describe(principal="User:ANONYMOUS", group_ids=["g"])
    assert described.state == "Stable" and described.assignor_name == "simple" and len(described.members) == 2


def test_a_heartbeat_with_a_stale_epoch_is_fenced(setup):
    groups, _, _ = setup
    beat(groups, "a", 0)
    beat(groups, "b", 0)
    with pytest.raises(FencedMemberEpoch):
        beat(groups, "a", 5, topics=None)


def test_an_unknown_member_with_an_epoch_is_unknown(setup):
    groups, _, _ = setup
    with pytest.raises(UnknownMemberId):
        beat(groups, "ghost", 3, topics=None)


def test_leaving_with_epoch_minus_one_gives_the_partitions_to_the_others(setup):
    groups, _, _ = setup
    beat(groups, "a", 0)
    epoch = beat(groups, "b", 0).member_epoch
    assert beat(groups, "a", -1, topics=None).member_epoch == -1
    answer = beat(groups, "b", epoch, topics=None)
    assert partitions(answer) == {0, 1, 2}


def test_a_silent_member_expires_after_its_session(setup):
    groups, clock, _ = setup
    beat(groups, "a", 0)
    epoch = beat(groups, "b", 0).member_epoch
    clock.now += 0.9
    beat(groups, "b", epoch, topics=None)
    clock.now += 0.2  # a: 1.1 s silent; b: 0.2 s
    groups.tick()
    [described] = groups.describe(principal="User:ANONYMOUS", group_ids=["g"])
    assert [m.member_id for m in described.members] == ["b"]


def test_a_topic_that_grows_is_assigned_again(setup):
    groups, _, topics = setup
    epoch = beat(groups, "a", 0).member_epoch
    topics.infos["orders"] = Info(ORDERS_ID, 4)
    answer = beat(groups, "a", epoch, topics=None)
    assert answer.member_epoch == epoch + 1 and partitions(answer) == {0, 1, 2, 3}


@pytest.mark.parametrize("member, epoch, topics", [("", 0, ("orders",)), ("a", 0, None), ("a", -2, None)])
def test_a_malformed_heartbeat_is_an_invalid_request(setup, member, epoch, topics):
    groups, _, _ = setup
    with pytest.raises(InvalidRequest):
        beat(groups, member, epoch, topics=topics)


def test_a_group_id_of_another_group_type_is_not_a_share_group(setup):
    groups, _, _ = setup
    with pytest.raises(GroupIdNotFound):
        beat(groups, "a", 0, group="classic")


def test_describing_an_unknown_group_answers_group_id_not_found(setup):
    groups, _, _ = setup
    [described] = groups.describe(principal="User:ANONYMOUS", group_ids=["nope"])
    assert isinstance(described.error, GroupIdNotFound)


def test_deleting_a_share_group_needs_it_empty_and_deletes_its_state_first(setup):
    groups, _, _ = setup
    forgotten: list[str] = []
    groups.forget_state = forgotten.append
    epoch = beat(groups, "a", 0).member_epoch
    with pytest.raises(NonEmptyGroup):
        groups.delete_if_empty("g")
    beat(groups, "a", -1, topics=None)
    assert epoch == 1 and groups.delete_if_empty("g") is True
    assert forgotten == ["g"] and groups.listings() == []
    assert groups.delete_if_empty("g") is False  # no such share group (any more)
