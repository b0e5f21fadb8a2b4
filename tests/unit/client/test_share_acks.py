"""The share consumer's bookkeeping of held records (``client/share_acks``): what it sends as
acknowledgement batches for implicit, bulk and per-record acknowledgements, gaps included."""

from __future__ import annotations

import pytest

from lowtide.client.share_acks import HeldRecords, merge_ranges, to_batches
from lowtide.errors import InvalidRequest
from lowtide.messages.share import ACCEPT, GAP, REJECT, RELEASE, AcquiredRange, ShareAckBatch

TP = ("t", 0)


def test_adjacent_acquired_ranges_merge_into_one_span_keeping_their_delivery_counts():
    merged = merge_ranges([AcquiredRange(10, 19, 2), AcquiredRange(0, 9, 1), AcquiredRange(30, 39, 1)])
    assert [(f, last) for f, last, _ in merged] == [(0, 19), (30, 39)]
    assert merged[0][2] == (AcquiredRange(0, 9, 1), AcquiredRange(10, 19, 2))


def test_accepting_a_span_without_gaps_is_one_batch_of_one_type_whatever_its_size():
    held = HeldRecords()
    held.add(TP, 0, 99_999, None, (AcquiredRange(0, 99_999, 1),))
    held.acknowledge_all(ACCEPT)
    assert held.take() == {TP: [ShareAckBatch(0, 99_999, (ACCEPT,))]}
    assert held.take() == {} and held.count() == 0


def test_offsets_without_a_record_are_acknowledged_as_gaps_with_the_spans_records():
    held = HeldRecords()
    held.add(TP, 0, 4, (0, 1, 3), (AcquiredRange(0, 4, 1),))  # 2 and 4: a control batch, a compacted record
    held.acknowledge_all(RELEASE)
    assert held.take() == {TP: [ShareAckBatch(0, 4, (RELEASE, RELEASE, GAP, RELEASE, GAP))]}


def test_a_span_of_gaps_only_is_acknowledged_at_once():
    held = HeldRecords()
    held.add(TP, 7, 7, (), (AcquiredRange(7, 7, 1),))
    assert held.count() == 0
    assert held.take() == {TP: [ShareAckBatch(7, 7, (GAP,))]}


def test_records_typed_one_by_one_go_as_they_are_typed_and_the_gaps_go_with_the_last():
    held = HeldRecords()
    held.add(TP, 0, 5, (0, 1, 2, 4, 5), (AcquiredRange(0, 5, 1),))
    held.acknowledge(TP, 0, ACCEPT)
    held.acknowledge(TP, 1, REJECT)
    assert held.take() == {TP: [ShareAckBatch(0, 1, (ACCEPT, REJECT))]}
    assert held.count() == 3
    held.acknowledge(TP, 5, ACCEPT)
    held.acknowledge(TP, 4, ACCEPT)
    assert held.take() == {TP: [ShareAckBatch(4, 5, (ACCEPT,))]}
    held.acknowledge(TP, 2, RELEASE)
    assert held.take() == {TP: [ShareAckBatch(2, 3, (RELEASE, GAP))]}
    assert held.partitions() == []


def test_a_record_not_held_or_acknowledged_twice_is_refused():
    held = HeldRecords()
    held.add(TP, 0, 1, None, (AcquiredRange(0, 1, 3),))
    assert held.find(TP, 1).delivery_count(1) == 3
    held.acknowledge(TP, 0, ACCEPT)
    with pytest.raises(InvalidRequest):
        held.acknowledge(TP, 0, ACCEPT)
    with pytest.raises(InvalidRequest):
        held.acknowledge(TP, 2, ACCEPT)
    with pytest.raises(InvalidRequest):
        held.acknowledge(("t", 1), 0, ACCEPT)
    with pytest.raises(InvalidRequest):
        held.acknowledge(TP, 1, GAP)


def test_bulk_acknowledgement_covers_only_records_without_a_type():
    held = HeldRecords()
    held.add(TP, 0, 3, None, (AcquiredRange(0, 3, 1),))
    held.acknowledge(TP, 2, REJECT)
    held.acknowledge_all(ACCEPT)
    assert held.take() == {TP: [ShareAckBatch(0, 3, (ACCEPT, ACCEPT, REJECT, ACCEPT))]}


def test_runs_of_offsets_become_separate_batches():
    assert to_batches([(1, ACCEPT), (2, ACCEPT), (5, RELEASE)]) == [ShareAckBatch(1, 2, (ACCEPT,)),
                                                                     ShareAckBatch(5, 5, (RELEASE,))]
