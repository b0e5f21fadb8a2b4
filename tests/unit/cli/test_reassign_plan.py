"""The planners behind `lowtide reassign plan`, `lowtide drain` and `lowtide rebalance`
(lowtide.cli.reassign_plan): balanced replicas and preferred leaders, as few copies as the balance
allows, the rack rule of assign_replicas, and a drain that empties its broker without changing
any replication factor or refuses when it cannot."""

from __future__ import annotations

from collections import Counter

import pytest

from lowtide.cli.reassign_plan import brokers_load, changed, count_moves, plan_drain, plan_moves
from lowtide.errors import InvalidReplicationFactor
from lowtide.metadata.store import assign_replicas


def layout(topic: str, rows: list[list[int]]) -> dict[tuple[str, int], tuple[int, ...]]:
    return {(topic, p): tuple(r) for p, r in enumerate(rows)}


def spread(assignment, brokers) -> tuple[int, int]:
    """(max - min replicas per broker, max - min preferred leaderships per broker)."""
    load = brokers_load(assignment, brokers)
    replicas = [r for r, _ in load.values()]
    leaders = [lead for _, lead in load.values()]
    return max(replicas) - min(replicas), max(leaders) - min(leaders)


def test_a_fourth_broker_gets_its_share_with_only_the_copies_it_needs():
    current = layout("orders", assign_replicas(broker_ids=[0, 1, 2], partitions=8, replication_factor=3))
    plan = plan_moves(current=current, brokers=[0, 1, 2, 3])
    assert spread(plan, [0, 1, 2, 3]) <= (1, 1) and max(spread(plan, [0, 1, 2, 3])) <= 1
    # 24 replicas over 4 brokers: broker 3 needs 6, and 6 copies is the least that gives it them.
    assert brokers_load(plan, [3])[3][0] == 6
    assert count_moves(current, plan) == 6
    assert all(len(plan[tp]) == 3 and len(set(plan[tp])) == 3 for tp in current)


def test_a_balanced_cluster_is_left_alone():
    current = layout("orders", assign_replicas(broker_ids=[0, 1, 2, 3], partitions=8, replication_factor=3))
    assert changed(current, plan_moves(current=current, brokers=[0, 1, 2, 3])) == {}


def test_piled_up_replicas_and_leaders_are_evened_out():
    current = layout("orders", [[0, 1, 2]] * 6)
    plan = plan_moves(current=current, brokers=[0, 1, 2, 3, 4, 5])
    assert spread(plan, range(6)) == (0, 0)
    assert count_moves(current, plan) == 9  # brokers 3, 4 and 5 need 3 replicas each


def test_brokers_left_out_of_the_list_lose_their_replicas():
    current = layout("orders", [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]])
    plan = plan_moves(current=current, brokers=[1, 2, 3])
    assert all(0 not in r and len(r) == 3 for r in plan.values())
    assert count_moves(current, plan) == 4  # every partition had exactly one replica on 0


def test_replicas_span_the_racks_and_a_rack_spread_layout_is_kept():
    racks = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    current = layout("orders", [[0, 1, 2], [2, 3, 4], [4, 5, 0], [1, 0, 3]])  # 0 and 1 share rack a
    plan = plan_moves(current=current, brokers=range(6), racks=racks)
    for row in plan.values():
        assert sorted(racks[b] for b in row) == ["a", "b", "c"]
    assert spread(plan, range(6))[0] <= 1
    # Partitions 0 and 3 must each lose one of their two rack-a replicas; 2 and 1 may move for balance.
    assert 2 <= count_moves(current, plan) <= 4
    spread_layout = layout("orders", assign_replicas(broker_ids=range(6), partitions=6, replication_factor=3,
                                                     racks=racks))
    assert changed(spread_layout, plan_moves(current=spread_layout, brokers=range(6), racks=racks)) == {}


def test_more_replicas_than_racks_still_span_every_rack():
    racks = {0: "a", 1: "a", 2: "b", 3: "b"}
    plan = plan_moves(current=layout("orders", [[0, 1, 2]] * 4), brokers=range(4), racks=racks)
    for row in plan.values():
        assert Counter(racks[b] for b in row).most_common(1)[0][1] == 2 and len({racks[b] for b in row}) == 2


def test_a_drain_empties_its_broker_keeps_every_replication_factor_and_moves_nothing_else():
    current = {**layout("orders", assign_replicas(broker_ids=[0, 1, 2, 3], partitions=8, replication_factor=3)),
               **layout("audit", [[1, 2], [2, 3]])}
    plan = plan_drain(current=current, broker=1, live=[0, 1, 2, 3])
    after = {**current, **plan}
    assert all(1 not in r for r in after.values())
    assert {tp: len(r) for tp, r in after.items()} == {tp: len(r) for tp, r in current.items()}
    assert all(len(set(r)) == len(r) for r in after.values())
    assert set(plan) == {tp for tp, r in current.items() if 1 in r}
    assert count_moves(current, after) == sum(1 in r for r in current.values())
    assert spread(after, [0, 2, 3])[0] <= 1  # the drained replicas went to the least-loaded brokers


def test_a_drain_keeps_replicas_apart_across_racks():
    racks = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c"}
    current = layout("orders", [[1, 2, 4], [4, 1, 3]])
    plan = plan_drain(current=current, broker=1, live=range(5), racks=racks)
    assert plan == {("orders", 0): (0, 2, 4), ("orders", 1): (4, 0, 3)}  # rack a's other broker takes over


def test_a_drain_that_would_leave_a_topic_under_its_replication_factor_is_refused_with_the_topic():
    current = {**layout("orders", [[0, 1, 2]]), **layout("audit", [[1, 2]])}
    with pytest.raises(InvalidReplicationFactor, match=r"only 2 other live broker.*'orders' \(3\)") as refused:
        plan_drain(current=current, broker=1, live=[0, 1, 2])
    assert "audit" not in refused.value.message
    # A broker that is down is no destination either.
    with pytest.raises(InvalidReplicationFactor):
        plan_drain(current=layout("audit", [[1, 2]]), broker=1, live=[1, 2])


def test_a_plan_with_fewer_brokers_than_replicas_is_refused():
    with pytest.raises(InvalidReplicationFactor, match="orders-0 has 3 replicas but only 2 brokers"):
        plan_moves(current=layout("orders", [[0, 1, 2]]), brokers=[0, 1])


def test_the_rest_of_the_clusters_load_steers_where_replicas_go():
    # Broker 0 already carries other partitions: a new placement avoids it.
    others = layout("busy", [[0], [0], [0]])
    plan = plan_moves(current=layout("orders", [[5]]), brokers=[0, 1], load={**others, **layout("orders", [[5]])})
    assert plan == {("orders", 0): (1,)}


def test_given_partition_sizes_a_rebalance_evens_bytes_per_broker_and_keeps_replica_counts_even():
    from lowtide.cli.reassign_plan import BYTES_TOLERANCE, plan_moves

    # Four brokers with three replicas each, but every big partition sits on brokers 0 and 1.
    current = {("big", 0): (0, 1), ("big", 1): (1, 0), ("big", 2): (0, 1),
               ("small", 0): (2, 3), ("small", 1): (3, 2), ("small", 2): (2, 3)}
    sizes = {("big", p): 900 for p in range(3)} | {("small", p): 100 for p in range(3)}
    plan = plan_moves(current=current, brokers=[0, 1, 2, 3], sizes=sizes)

    def per_broker(assignment, weight):
        out = dict.fromkeys(range(4), 0)
        for tp, row in assignment.items():
            for b in row:
                out[b] += weight(tp)
        return out

    held = per_broker(plan, lambda tp: sizes[tp])
    replicas = per_broker(plan, lambda tp: 1)
    before = per_broker(current, lambda tp: sizes[tp])
    assert max(before.values()) - min(before.values()) == 2400
    mean = sum(held.values()) / 4
    assert max(held.values()) - min(held.values()) <= max(BYTES_TOLERANCE * mean, 800), held
    assert max(replicas.values()) - min(replicas.values()) <= 1
    assert all(len(set(row)) == len(row) == 2 for row in plan.values())


def test_without_sizes_a_rebalance_of_even_counts_moves_nothing():
    from lowtide.cli.reassign_plan import changed, plan_moves

    current = {("big", 0): (0, 1), ("small", 0): (2, 3)}
    assert changed(current, plan_moves(current=current, brokers=[0, 1, 2, 3])) == {}
