"""KIP-932's ``simple`` assignor (lowtide.share.assignor): every subscribed partition has a member,
members may share one, and nobody loses what it had when another joins."""

from __future__ import annotations

from lowtide.share.assignor import assign_simple

COUNTS = {"orders": 3, "audit": 2}


def every(result) -> set[tuple[str, int]]:
    return {tp for tps in result.values() for tp in tps}


def test_three_members_of_a_three_partition_topic_cover_every_partition():
    members = ["m-a", "m-b", "m-c"]
    result = assign_simple(members=members, subscriptions={m: frozenset({"orders"}) for m in members},
                           partition_counts=COUNTS, current={})
    assert every(result) == {("orders", p) for p in range(3)}
    assert all(result[m] for m in members)  # each member hashed to one partition at least


def test_a_lone_member_gets_every_partition_of_its_topics():
    result = assign_simple(members=["solo"], subscriptions={"solo": frozenset({"orders", "audit"})},
                           partition_counts=COUNTS, current={})
    assert result["solo"] == {("orders", 0), ("orders", 1), ("orders", 2), ("audit", 0), ("audit", 1)}


def test_a_member_joining_takes_nothing_away_from_the_others():
    first = assign_simple(members=["a"], subscriptions={"a": frozenset({"orders"})}, partition_counts=COUNTS,
                          current={})
    second = assign_simple(members=["a", "b"], subscriptions={m: frozenset({"orders"}) for m in "ab"},
                           partition_counts=COUNTS, current=first)
    assert second["a"] == first["a"]
    assert len(second["b"]) == 1 and second["b"] <= first["a"]  # b shares the partition it hashed to


def test_a_departed_members_partitions_go_to_those_left():
    members = ["a", "b", "c"]
    subs = {m: frozenset({"orders"}) for m in members}
    before = assign_simple(members=members, subscriptions=subs, partition_counts=COUNTS, current={})
    after = assign_simple(members=["b", "c"], subscriptions=subs, partition_counts=COUNTS,
                          current={m: before[m] for m in ("b", "c")})
    assert every(after) == {("orders", p) for p in range(3)}


def test_members_with_different_subscriptions_get_only_their_topics():
    result = assign_simple(members=["a", "b"], subscriptions={"a": frozenset({"orders"}), "b": frozenset({"audit"})},
                           partition_counts=COUNTS, current={})
    assert {t for t, _ in result["a"]} == {"orders"} and {t for t, _ in result["b"]} == {"audit"}
    assert every(result) == {("orders", p) for p in range(3)} | {("audit", p) for p in range(2)}


def test_a_topic_that_does_not_exist_assigns_nothing():
    result = assign_simple(members=["a"], subscriptions={"a": frozenset({"missing"})}, partition_counts=COUNTS,
                           current={})
    assert result == {"a": frozenset()}
