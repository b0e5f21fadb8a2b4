"""lowtide.frontdoor.admin.admin.manual_assignment: a client's own placement, checked as Kafka checks it."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidReplicaAssignment
from lowtide.frontdoor.admin.admin import manual_assignment


def test_partitions_come_back_in_partition_order_whatever_the_order_given() -> None:
    got = manual_assignment([(1, (2, 3)), (0, (3, 1))], registered={1, 2, 3}, live={1, 2, 3})
    assert got == [[3, 1], [2, 3]]


def test_a_partition_named_twice_is_refused() -> None:
    with pytest.raises(InvalidReplicaAssignment, match="Found multiple manual partition assignments for partition 0"):
        manual_assignment([(0, (1,)), (0, (2,))], registered={1, 2}, live={1, 2})


def test_a_partition_whose_brokers_are_all_down_is_refused_and_one_live_broker_is_enough() -> None:
    assert manual_assignment([(0, (2, 1))], registered={1, 2}, live={1}) == [[2, 1]]
    with pytest.raises(InvalidReplicaAssignment, match="for partition 0 are fenced or in controlled shutdown"):
        manual_assignment([(0, (2,))], registered={1, 2}, live={1})
