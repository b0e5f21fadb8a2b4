"""One KIP-848 consumer group's state machine (``frontdoor/groups/consumer_group.py``), driven as
the coordinator drives it: heartbeats with epochs and owned partitions, and time passing."""

from __future__ import annotations

import pytest

from lowtide.errors import FencedMemberEpoch, GroupMaxSizeReached, UnknownMemberId, UnreleasedInstanceId
from lowtide.frontdoor.groups.consumer_group import (
    MEMBER_STABLE,
    RECONCILING,
    STABLE,
    STATIC_LEAVE_EPOCH,
    UNRELEASED_PARTITIONS,
    UNREVOKED_PARTITIONS,
    ConsumerGroup,
    JoinSpec,
)

TOPICS = {"orders": 4}
SESSION_S = 10.0


def hb(group: ConsumerGroup, member_id: str, epoch: int, *, owned=None, now: float = 0.0, topics=("orders",),
       instance: str | None = None, max_size: int = 100, rebalance_ms: int = 5000, assignor: str | None = None):
    """One heartbeat; returns the member. ``owned``: {topic: set} the member says it owns."""
    spec = JoinSpec(member_id=member_id, member_epoch=epoch, instance_id=instance,
                    subscribed_topics=tuple(topics) if epoch == 0 else None, rebalance_timeout_ms=rebalance_ms,
                    server_assignor=assignor,
                    owned=None if owned is None else {t: frozenset(ps) for t, ps in owned.items()})
    member, _ = group.join_or_heartbeat(spec, now=now, session_timeout_s=SESSION_S, max_size=max_size,
                                        topics=TOPICS)
    check_owned_once(group)
    return member


def check_owned_once(group: ConsumerGroup) -> None:
    seen: dict[tuple[str, int], str] = {}
    for m in group.members.values():
        for t, ps in m.owns().items():
            for p in ps:
                assert (t, p) not in seen, f"{t}-{p} owned by {seen[(t, p)]} and {m.member_id}"
                seen[(t, p)] = m.member_id


def parts(member) -> set[int]:
    return set(member.assigned.get("orders", ()))


def test_first_member_gets_every_partition():
    group = ConsumerGroup(group_id="g")
    m1 = hb(group, "m1", 0)
    assert (m1.member_epoch, parts(m1), m1.state) == (1, {0, 1, 2, 3}, MEMBER_STABLE)
    assert (group.group_epoch, group.assignment_epoch, group.state()) == (1, 1, STABLE)


def test_partitions_move_only_after_their_owner_revoked_them():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0)
    m2 = hb(group, "m2", 0)
    # m2 is at the new epoch but gets nothing yet: m1 still owns everything.
    assert (m2.member_epoch, parts(m2), m2.state) == (2, set(), UNRELEASED_PARTITIONS)
    assert group.state() == RECONCILING
    m1 = hb(group, "m1", 1, owned={"orders": {0, 1, 2, 3}})
    revoked = set(m1.pending_revocation["orders"])
    assert m1.state == UNREVOKED_PARTITIONS and m1.member_epoch == 1 and len(revoked) == 2
    assert parts(hb(group, "m2", 2)) == set()  # still held by m1 while it revokes
    m1 = hb(group, "m1", 1, owned={"orders": {0, 1, 2, 3}})  # not revoked yet: same answer
    assert m1.state == UNREVOKED_PARTITIONS
    m1 = hb(group, "m1", 1, owned={"orders": parts(m1)})  # revoked
    assert (m1.member_epoch, m1.state) == (2, MEMBER_STABLE)
    m2 = hb(group, "m2", 2)
    assert parts(m2) == revoked and m2.state == MEMBER_STABLE
    assert group.state() == STABLE


def test_fencing():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0)
    with pytest.raises(FencedMemberEpoch):
        hb(group, "m1", 7)
    with pytest.raises(UnknownMemberId):
        hb(group, "nobody", 1)
    hb(group, "m2", 0)
    m1 = hb(group, "m1", 1, owned={"orders": {0, 1, 2, 3}})
    m1 = hb(group, "m1", 1, owned={"orders": parts(m1)})
    assert m1.member_epoch == 2
    # The answer that moved m1 to epoch 2 was lost: epoch 1 with partitions it still has is accepted.
    assert hb(group, "m1", 1, owned={"orders": parts(m1)}).member_epoch == 2
    with pytest.raises(FencedMemberEpoch):  # but not while claiming partitions it does not have
        hb(group, "m1", 1, owned={"orders": {0, 1, 2, 3}})


def test_rejoin_after_fencing_owns_nothing():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0)
    m2 = hb(group, "m2", 0)
    m1 = hb(group, "m1", 0)  # fenced client rejoins with epoch 0: it gave up its partitions
    assert not m1.pending_revocation
    m2 = hb(group, "m2", 2)
    m1 = hb(group, "m1", m1.member_epoch)
    assert parts(m1) | parts(m2) == {0, 1, 2, 3} and not parts(m1) & parts(m2)


def test_leave_gives_the_partitions_to_the_others():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0)
    hb(group, "m2", 0)
    m1 = hb(group, "m1", 1, owned={"orders": {0, 1, 2, 3}})
    hb(group, "m1", 1, owned={"orders": parts(m1)})
    hb(group, "m2", 2)
    assert group.leave("m2", epoch=-1, instance_id=None) == -1
    assert "m2" not in group.members and group.group_epoch == 3
    m1 = hb(group, "m1", 2)
    assert (m1.member_epoch, parts(m1)) == (3, {0, 1, 2, 3})


def test_static_member_rejoin_keeps_its_assignment():
    group = ConsumerGroup(group_id="g")
    hb(group, "a1", 0, instance="a")
    hb(group, "b1", 0, instance="b")
    a = hb(group, "a1", 1, owned={"orders": {0, 1, 2, 3}}, instance="a")
    a = hb(group, "a1", 1, owned={"orders": parts(a)}, instance="a")
    b = hb(group, "b1", 2, instance="b")
    kept, epoch = parts(b), b.member_epoch
    assert group.leave("b1", epoch=STATIC_LEAVE_EPOCH, instance_id="b") == STATIC_LEAVE_EPOCH
    assert group.group_epoch == 2  # a temporary leave changes no assignment
    assert parts(hb(group, "a1", 2, instance="a")) == parts(a)  # b's partitions are not handed out
    with pytest.raises(UnreleasedInstanceId):
        hb(group, "a2", 0, instance="a")  # a1 has not left
    b = hb(group, "b2", 0, instance="b")
    assert (b.member_id, parts(b), b.member_epoch) == ("b2", kept, epoch)
    assert "b1" not in group.members and group.group_epoch == 2


def test_session_expiry_removes_the_member_and_rebalances():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0, now=0)
    hb(group, "m2", 0, now=0)
    m1 = hb(group, "m1", 1, owned={"orders": {0, 1, 2, 3}}, now=5)
    hb(group, "m1", 1, owned={"orders": parts(m1)}, now=5)
    assert group.expire(now=SESSION_S + 1) == ["m2"]
    assert group.group_epoch == 3 and group.target == {"m1": {"orders": frozenset({0, 1, 2, 3})}}
    assert parts(hb(group, "m1", 2, now=SESSION_S + 1)) == {0, 1, 2, 3}


def test_a_member_that_does_not_revoke_in_time_is_removed():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0, rebalance_ms=2000)
    hb(group, "m2", 0)
    m1 = hb(group, "m1", 1, owned={"orders": {0, 1, 2, 3}}, now=1, rebalance_ms=2000)
    assert m1.state == UNREVOKED_PARTITIONS
    hb(group, "m2", 2, now=2.5)
    assert group.expire(now=3.1) == ["m1"]
    assert parts(hb(group, "m2", 2, now=3.2)) == {0, 1, 2, 3}


def test_group_max_size_and_records_marked():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0, max_size=1)
    with pytest.raises(GroupMaxSizeReached):
        hb(group, "m2", 0, max_size=1)
    assert {kind for kind, _ in group.dirty} == {3, 5, 6, 7, 8}


def test_range_assignor_when_members_ask_for_it():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0, assignor="range")
    hb(group, "m2", 0, assignor="range")
    assert group.assignor() == "range"
    assert group.target == {"m1": {"orders": frozenset({0, 1})}, "m2": {"orders": frozenset({2, 3})}}


def test_a_commit_racing_its_epoch_bump_counts_for_partitions_held_since():
    group = ConsumerGroup(group_id="g")
    hb(group, "m1", 0)
    hb(group, "m2", 0)
    m1 = hb(group, "m1", 1, owned={"orders": {0, 1, 2, 3}})
    m1 = hb(group, "m1", 1, owned={"orders": parts(m1)})
    m2 = hb(group, "m2", 2)
    kept, moved = sorted(parts(m1)), sorted(parts(m2))
    assert m1.member_epoch == 2
    # m1's commit sent with epoch 1 before it read the answer that moved it to 2 (KIP-1251).
    assert group.commit_epoch_ok(m1, 1, [("orders", kept[0])])
    assert not group.commit_epoch_ok(m1, 1, [("orders", moved[0])])  # no longer its partition
    assert not group.commit_epoch_ok(m2, 1, [("orders", moved[0])])  # m2 got it at epoch 2
    assert group.commit_epoch_ok(m2, 2, [("orders", moved[0])])
    assert not group.commit_epoch_ok(m1, 3, [("orders", kept[0])])


def test_regex_subscriptions_follow_the_topics():
    group = ConsumerGroup(group_id="g")
    spec = JoinSpec(member_id="m1", member_epoch=0, subscribed_topics=(), subscribed_regex="ord.*",
                    rebalance_timeout_ms=5000)
    m1, _ = group.join_or_heartbeat(spec, now=0, session_timeout_s=SESSION_S, max_size=10,
                                    topics={"orders": 2, "audit": 1, "__consumer_offsets": 8})
    assert (m1.member_epoch, m1.assigned) == (1, {"orders": frozenset({0, 1})})
    # A matching topic created later is a new epoch and joins the assignment.
    m1, _ = group.join_or_heartbeat(JoinSpec(member_id="m1", member_epoch=1), now=1, session_timeout_s=SESSION_S,
                                    max_size=10, topics={"orders": 2, "orders-eu": 1, "audit": 1})
    assert (m1.member_epoch, m1.assigned) == (2, {"orders": frozenset({0, 1}), "orders-eu": frozenset({0})})
