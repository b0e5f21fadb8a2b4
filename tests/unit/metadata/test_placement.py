"""Replica placement: round-robin leaders, and rack-aware spreading when every broker has a rack."""

from __future__ import annotations

from collections import Counter

import pytest

from lowtide.errors import InvalidPartitions, InvalidReplicationFactor
from lowtide.metadata.store import assign_replicas

RACKS = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}


def test_without_racks_partition_p_starts_at_broker_start_plus_p():
    assert assign_replicas(broker_ids=[2, 0, 1], partitions=4, replication_factor=2, start=1) == [
        [1, 2], [2, 0], [0, 1], [1, 2]]


@pytest.mark.parametrize("rf", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("start", [0, 1, 5])
def test_with_racks_each_partition_spans_as_many_racks_as_it_can(rf, start):
    assignment = assign_replicas(broker_ids=RACKS, partitions=12, replication_factor=rf, start=start, racks=RACKS)
    for replicas in assignment:
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert len({RACKS[b] for b in replicas}) == min(rf, 3), replicas


def test_with_racks_leaders_and_replicas_spread_evenly_over_brokers():
    assignment = assign_replicas(broker_ids=RACKS, partitions=12, replication_factor=3, start=0, racks=RACKS)
    assert Counter(r[0] for r in assignment) == {b: 2 for b in RACKS}
    assert Counter(b for r in assignment for b in r) == {b: 6 for b in RACKS}


def test_uneven_racks_still_put_a_partitions_replicas_on_distinct_racks_first():
    racks = {0: "a", 1: "a", 2: "a", 3: "b"}
    for replicas in assign_replicas(broker_ids=racks, partitions=8, replication_factor=2, racks=racks):
        assert {racks[b] for b in replicas} == {"a", "b"}, replicas


def test_a_broker_without_a_rack_makes_placement_rack_unaware():
    racks = {0: "a", 1: "b", 2: ""}
    assert assign_replicas(broker_ids=[0, 1, 2], partitions=3, replication_factor=2, racks=racks) == \
        assign_replicas(broker_ids=[0, 1, 2], partitions=3, replication_factor=2)


def test_impossible_shapes_are_refused():
    with pytest.raises(InvalidReplicationFactor):
        assign_replicas(broker_ids=[0, 1], partitions=1, replication_factor=3, racks={0: "a", 1: "b"})
    with pytest.raises(InvalidPartitions):
        assign_replicas(broker_ids=[0, 1], partitions=0, replication_factor=1)

