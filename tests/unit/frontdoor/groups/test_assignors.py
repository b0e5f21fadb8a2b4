"""The KIP-848 server assignors (``frontdoor/groups/assignors.py``) as pure functions."""

from __future__ import annotations

from lowtide.frontdoor.groups.assignors import MemberSpec, range_assign, uniform_assign


def spec(*topics: str, current=None) -> MemberSpec:
    return MemberSpec(subscribed_topics=frozenset(topics), current=current or {})


def owned(result) -> list[tuple[str, int]]:
    return sorted((t, p) for a in result.values() for t, ps in a.items() for p in ps)


def sizes(result) -> list[int]:
    return sorted(sum(len(ps) for ps in a.values()) for a in result.values())


def test_uniform_gives_every_partition_once_and_balances():
    result = uniform_assign(members={m: spec("a", "b") for m in ("m1", "m2", "m3")}, partitions={"a": 5, "b": 3})
    assert owned(result) == [("a", p) for p in range(5)] + [("b", p) for p in range(3)]
    assert sizes(result) == [2, 3, 3]


def test_uniform_is_sticky_when_a_member_joins():
    before = uniform_assign(members={"m1": spec("a"), "m2": spec("a")}, partitions={"a": 6})
    after = uniform_assign(members={"m1": spec("a", current=before["m1"]), "m2": spec("a", current=before["m2"]),
                                    "m3": spec("a")}, partitions={"a": 6})
    assert sizes(after) == [2, 2, 2]
    # m1 and m2 each keep two of the three they had; m3 gets the two they gave up.
    assert after["m1"]["a"] <= before["m1"]["a"] and after["m2"]["a"] <= before["m2"]["a"]
    assert owned(after) == [("a", p) for p in range(6)]


def test_uniform_keeps_a_balanced_assignment_unchanged():
    current = {"m1": {"a": frozenset({0, 3})}, "m2": {"a": frozenset({1, 4})}, "m3": {"a": frozenset({2, 5})}}
    result = uniform_assign(members={m: spec("a", current=c) for m, c in current.items()}, partitions={"a": 6})
    assert result == current


def test_uniform_member_leaving_only_moves_its_partitions():
    current = {"m1": {"a": frozenset({0, 3})}, "m2": {"a": frozenset({1, 4})}, "m3": {"a": frozenset({2, 5})}}
    result = uniform_assign(members={m: spec("a", current=current[m]) for m in ("m1", "m2")}, partitions={"a": 6})
    assert current["m1"]["a"] <= result["m1"]["a"] and current["m2"]["a"] <= result["m2"]["a"]
    assert sizes(result) == [3, 3]


def test_uniform_heterogeneous_subscriptions():
    result = uniform_assign(members={"m1": spec("a"), "m2": spec("a", "b"), "m3": spec("b")},
                            partitions={"a": 4, "b": 2})
    assert owned(result) == [("a", p) for p in range(4)] + [("b", p) for p in range(2)]
    assert "b" not in result["m1"] and "a" not in result["m3"]
    assert sizes(result) == [2, 2, 2]


def test_uniform_drops_partitions_of_unsubscribed_or_missing_topics():
    members = {"m1": spec("a", "gone", current={"b": frozenset({0})})}
    result = uniform_assign(members=members, partitions={"a": 2, "b": 1})
    assert result == {"m1": {"a": frozenset({0, 1})}}


def test_range_co_partitions_topics_with_the_same_subscribers():
    members = {m: spec("clicks", "views") for m in ("m2", "m1", "m3")}
    result = range_assign(members=members, partitions={"clicks": 7, "views": 7})
    for m in members:
        assert result[m]["clicks"] == result[m]["views"]
    assert result["m1"]["clicks"] == frozenset({0, 1, 2}) and result["m3"]["clicks"] == frozenset({5, 6})


def test_range_per_topic_subscribers():
    result = range_assign(members={"m1": spec("a"), "m2": spec("a", "b")}, partitions={"a": 3, "b": 2})
    assert result == {"m1": {"a": frozenset({0, 1})}, "m2": {"a": frozenset({2}), "b": frozenset({0, 1})}}


def test_more_members_than_partitions():
    result = uniform_assign(members={m: spec("a") for m in ("m1", "m2", "m3")}, partitions={"a": 2})
    assert sizes(result) == [0, 1, 1]
    assert sizes(range_assign(members={m: spec("a") for m in ("m1", "m2", "m3")}, partitions={"a": 2})) == [0, 1, 1]
