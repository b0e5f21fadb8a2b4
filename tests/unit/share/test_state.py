"""The share-partition state machine (lowtide.share.state): acquisition by whole batches, locks,
delivery counts, acknowledgements all or nothing, and the start offset moving over what is done."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidRecordState, InvalidRequest
from lowtide.messages.share import ShareAckBatch
from lowtide.share.state import (
    ACCEPT,
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    AVAILABLE,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    Acquired,
    SharePartitionConfig,
    SharePartitionState,
    StateBatch,
)

LOCK = 1000
CONFIG = SharePartitionConfig(lock_duration_ms=LOCK, delivery_count_limit=3)
# Three batches of the log: offsets 0-9, 10-19, 20-24.
BATCHES = [(0, 9), (10, 19), (20, 24)]


def fresh(start: int = 0) -> SharePartitionState:
    return SharePartitionState(start_offset=start, config=CONFIG)


def ack(state: SharePartitionState, member: str, first: int, last: int, *types: int, now: int = 0) -> None:
    state.acknowledge(member=member, batches=[ShareAckBatch(first, last, tuple(types))], now_ms=now)


def shape(state: SharePartitionState) -> list[tuple[int, int, int, int, str]]:
    return [(r.first, r.last, r.state, r.delivery_count, r.member) for r in state.ranges]


def test_a_fetch_acquires_whole_batches_until_it_has_max_records():
    state = fresh()
    got = state.acquire(member="a", batches=BATCHES, max_records=12, now_ms=0)
    assert got == [Acquired(0, 9, 1), Acquired(10, 19, 1)]  # batch-aligned: 20 records for 12 asked
    assert state.end_offset == 20 and state.start_offset == 0
    assert shape(state) == [(0, 9, ACQUIRED, 1, "a"), (10, 19, ACQUIRED, 1, "a")]


def test_a_second_member_gets_the_records_after_the_first_ones():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    got = state.acquire(member="b", batches=BATCHES, max_records=100, now_ms=0)
    assert got == [Acquired(10, 19, 1), Acquired(20, 24, 1)]


def test_accepting_everything_moves_the_start_offset_past_it():
    state = fresh()
    state.acquire(member="a", batches=BATCHES, max_records=100, now_ms=0)
    ack(state, "a", 0, 24, ACCEPT)
    assert state.start_offset == 25 and state.ranges == []


def test_an_acknowledgement_with_one_type_per_offset_splits_the_range():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    ack(state, "a", 0, 4, ACCEPT, ACCEPT, RELEASE, REJECT, GAP)
    assert state.start_offset == 2
    assert shape(state) == [(2, 2, AVAILABLE, 1, ""), (3, 4, ARCHIVED, 1, ""), (5, 9, ACQUIRED, 1, "a")]


def test_released_records_are_delivered_again_with_their_count_raised():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    ack(state, "a", 3, 5, RELEASE)
    got = state.acquire(member="b", batches=BATCHES[:1], max_records=100, now_ms=0)
    assert got == [Acquired(3, 5, 2)]  # nothing new in that window: only the released ones


def test_a_record_past_its_delivery_limit_is_archived_not_delivered_again():
    state = fresh()
    for delivery in range(1, CONFIG.delivery_count_limit + 1):
        got = state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
        assert got == [Acquired(0, 9, delivery)]
        ack(state, "a", 0, 9, RELEASE)
    assert state.ranges == [] and state.start_offset == 10  # archived, so the start offset passed it
    assert state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0) == []


def test_records_whose_lock_timed_out_go_to_the_next_member_that_fetches():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    assert state.expire_locks(LOCK - 1) is False
    assert state.expire_locks(LOCK) is True
    got = state.acquire(member="b", batches=BATCHES[:1], max_records=10, now_ms=LOCK)
    assert got == [Acquired(0, 9, 2)]


def test_a_member_cannot_acknowledge_records_it_does_not_hold_and_nothing_changes():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    state.acquire(member="b", batches=BATCHES[1:2], max_records=10, now_ms=0)
    before = shape(state)
    with pytest.raises(InvalidRecordState):
        # the first batch is a's: the whole call is refused, even its part on b's own records
        state.acknowledge(member="b", batches=[ShareAckBatch(10, 19, (ACCEPT,)), ShareAckBatch(0, 9, (ACCEPT,))],
                          now_ms=0)
    assert shape(state) == before


def test_acknowledging_after_the_lock_timed_out_is_refused():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    with pytest.raises(InvalidRecordState):
        ack(state, "a", 0, 9, ACCEPT, now=LOCK)


def test_acknowledging_offsets_never_delivered_is_refused():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    with pytest.raises(InvalidRecordState):
        ack(state, "a", 5, 12, ACCEPT)


def test_an_acknowledgement_with_the_wrong_number_of_types_is_an_invalid_request():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    with pytest.raises(InvalidRequest):
        ack(state, "a", 0, 9, ACCEPT, ACCEPT)
    with pytest.raises(InvalidRequest):
        ack(state, "a", 0, 9, 7)


def test_renewing_extends_the_lock_and_keeps_the_records_acquired():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    ack(state, "a", 0, 9, RENEW, now=LOCK - 1)
    assert state.expire_locks(LOCK) is False
    ack(state, "a", 0, 9, ACCEPT, now=LOCK + 10)
    assert state.start_offset == 10


def test_a_closed_session_gives_back_what_its_member_held():
    state = fresh()
    state.acquire(member="a", batches=BATCHES[:1], max_records=10, now_ms=0)
    state.acquire(member="b", batches=BATCHES[1:2], max_records=10, now_ms=0)
    assert state.release_member("a") is True
    assert shape(state) == [(0, 9, AVAILABLE, 1, ""), (10, 19, ACQUIRED, 1, "b")]


def test_the_start_offset_follows_the_log_start_offset():
    state = fresh()
    state.acquire(member="a", batches=BATCHES, max_records=100, now_ms=0)
    state.advance_to(15)
    assert state.start_offset == 15 and shape(state)[0] == (15, 19, ACQUIRED, 1, "a")


def test_a_redelivery_is_limited_to_the_batches_the_read_returned():
    state = fresh()
    state.acquire(member="a", batches=BATCHES, max_records=100, now_ms=0)
    ack(state, "a", 0, 24, RELEASE)
    got = state.acquire(member="b", batches=[(0, 9), (10, 19)], max_records=100, now_ms=0)
    assert got == [Acquired(0, 9, 2), Acquired(10, 19, 2)]
    assert shape(state)[-1] == (20, 24, AVAILABLE, 1, "")


def test_the_persisted_state_writes_acquired_records_as_available():
    state = fresh()
    state.acquire(member="a", batches=BATCHES, max_records=100, now_ms=0)
    ack(state, "a", 10, 14, ACCEPT)
    assert state.to_state_batches() == [StateBatch(0, 9, AVAILABLE, 1), StateBatch(10, 14, ACKNOWLEDGED, 1),
                                     StateBatch(15, 24, AVAILABLE, 1)]


def test_a_state_rebuilt_from_its_batches_continues_where_it_was():
    state = SharePartitionState(start_offset=5, config=CONFIG, batches=[
        StateBatch(5, 9, AVAILABLE, 2), StateBatch(10, 14, ACKNOWLEDGED, 1), StateBatch(15, 19, ACQUIRED, 1)])
    assert state.start_offset == 5 and state.end_offset == 20
    got = state.acquire(member="a", batches=BATCHES, max_records=100, now_ms=0)
    assert got == [Acquired(5, 9, 3), Acquired(15, 19, 2), Acquired(20, 24, 1)]
    ack(state, "a", 5, 9, ACCEPT)
    assert state.start_offset == 15  # 10-14 were acknowledged before the restart


def test_a_state_rebuilt_from_batches_that_are_all_done_starts_after_them():
    state = SharePartitionState(start_offset=0, config=CONFIG, batches=[StateBatch(0, 9, ARCHIVED, 3)])
    assert state.start_offset == 10 and state.end_offset == 10 and state.ranges == []
