"""The history checker against hand-made histories: a clean one passes, each violation is found."""

from __future__ import annotations

import itertools

from tests.chaos.checker import (
    FinalRead,
    History,
    ReadObs,
    Summary,
    check,
    decode_id,
    encode_value,
)

T = "t"


def make_history() -> History:
    ticks = itertools.count()
    return History(clock=lambda: float(next(ticks)))


def clean(h: History) -> None:
    """Offsets 0..9 acknowledged, a delete before 4 acknowledged with LW 4, reads that respect it,
    a final read from the LSO 4 holding every acknowledged record."""
    h.produce_acked(T, 0, 0, [f"a{i}" for i in range(5)], started=1, acked=2)
    h.produce_acked(T, 0, 5, [f"b{i}" for i in range(5)], started=3, acked=4)
    h.read(ReadObs(T, 0, started=5, ended=6, fetch_offset=0, records=tuple((i, f"a{i}") for i in range(5)),
                   log_start_offset=0, high_watermark=10))
    start = h.delete_started(T, 0, 4, started=7)
    h.delete_acked(T, 0, 4, 4, started=start, acked=8)
    h.read(ReadObs(T, 0, started=9, ended=10, fetch_offset=4, records=((4, "a4"), (5, "b0")),
                   log_start_offset=4, high_watermark=10))
    # a fetch below the LW that got OFFSET_OUT_OF_RANGE carries the LSO and no records
    h.read(ReadObs(T, 0, started=11, ended=12, fetch_offset=1, log_start_offset=4, high_watermark=10))
    final = [(4, "a4")] + [(5 + i, f"b{i}") for i in range(5)]
    h.final(FinalRead(T, 0, log_start_offset=4, high_watermark=10, records=tuple(final), at=20))


def kinds(h: History) -> list[str]:
    return sorted({v.kind for v in check(h)})


def test_a_clean_history_passes():
    h = make_history()
    clean(h)
    assert check(h) == []
    s = Summary.of(h, [])
    assert (s.records_acked, s.deletes_acked, s.reads, s.final_records) == (10, 1, 3, 6)


def test_payload_ids_round_trip_through_record_values():
    assert decode_id(encode_value("p1-42", pad=100)) == "p1-42"
    assert decode_id(b"not ours") is None
    assert decode_id(None) is None


def test_an_acknowledged_record_missing_from_the_final_read_is_lost():
    h = make_history()
    clean(h)
    h.final(FinalRead(T, 0, log_start_offset=4, high_watermark=10,
                      records=((4, "a4"), (5, "b0"), (8, "b3"), (9, "b4")), at=20))
    [v] = check(h)
    assert (v.kind, v.first_offset, v.last_offset) == ("lost_record", 6, 7)


def test_an_acknowledged_record_above_the_final_high_watermark_is_lost():
    # the old follower-restart bug: the new leader truncated to a stale HW
    h = make_history()
    clean(h)
    h.final(FinalRead(T, 0, log_start_offset=4, high_watermark=6, records=((4, "a4"), (5, "b0")), at=20))
    [v] = check(h)
    assert (v.kind, v.first_offset, v.last_offset) == ("lost_record", 6, 9)


def test_records_below_the_final_lso_are_lost_unless_a_delete_asked_for_them():
    h = make_history()
    clean(h)
    h.final(FinalRead(T, 0, log_start_offset=7, high_watermark=10, records=((7, "b2"), (8, "b3"), (9, "b4")), at=20))
    [v] = [v for v in check(h) if v.kind == "lost_record"]
    assert (v.first_offset, v.last_offset) == (4, 6)  # 0..3 were deleted on request
    # a DeleteRecords that was sent but never acknowledged may still have moved the LSO
    h2 = make_history()
    clean(h2)
    h2.delete_started(T, 0, 7, started=15)
    h2.final(FinalRead(T, 0, log_start_offset=7, high_watermark=10, records=((7, "b2"), (8, "b3"), (9, "b4")), at=20))
    assert check(h2) == []


def test_a_different_payload_at_an_acknowledged_offset_is_wrong_payload():
    h = make_history()
    clean(h)
    h.final(FinalRead(T, 0, log_start_offset=4, high_watermark=10,
                      records=((4, "a4"), (5, "b0"), (6, "zz"), (7, "b2"), (8, "b3"), (9, "b4")), at=20))
    [v] = check(h)
    assert (v.kind, v.first_offset) == ("wrong_payload", 6)


def test_one_offset_acknowledged_for_two_payloads_is_a_duplicate_offset():
    h = make_history()
    clean(h)
    h.produce_acked(T, 0, 9, ["c0", "c1"], started=13, acked=14)  # offset 9 again (and 10)
    h.final(FinalRead(T, 0, log_start_offset=4, high_watermark=11,
                      records=((4, "a4"), *((5 + i, f"b{i}") for i in range(5)), (10, "c1")), at=20))
    found = kinds(h)
    assert "duplicate_offset" in found
    [dup] = [v for v in check(h) if v.kind == "duplicate_offset"]
    assert dup.first_offset == 9 and "'b4'" in dup.detail and "'c0'" in dup.detail


def test_a_run_of_reassigned_offsets_is_one_violation_per_range():
    h = make_history()
    clean(h)
    h.produce_acked(T, 0, 6, ["c0", "c1", "c2"], started=13, acked=14)  # 6..8 handed out again
    [dup] = [v for v in check(h) if v.kind == "duplicate_offset"]
    assert (dup.first_offset, dup.last_offset) == (6, 8)


def test_a_record_served_below_an_acknowledged_low_watermark_is_detected():
    h = make_history()
    clean(h)
    h.read(ReadObs(T, 0, started=13, ended=14, fetch_offset=1, records=((1, "a1"), (2, "a2")),
                   log_start_offset=4, high_watermark=10))
    [v] = check(h)
    assert (v.kind, v.first_offset, v.last_offset) == ("served_below_lw", 1, 2)


def test_a_read_that_started_before_the_delete_was_acknowledged_may_see_old_records():
    h = make_history()
    clean(h)
    h.read(ReadObs(T, 0, started=7.5, ended=13, fetch_offset=1, records=((1, "a1"),), log_start_offset=0,
                   high_watermark=10))
    assert check(h) == []


def test_a_log_start_offset_below_an_acknowledged_low_watermark_is_a_regression():
    h = make_history()
    clean(h)
    # a new leader that was left out of the low watermark answers ListOffsets earliest = 0
    h.read(ReadObs(T, 0, started=13, ended=14, log_start_offset=0, source="list_offsets"))
    [v] = check(h)
    assert (v.kind, v.first_offset) == ("lso_regressed", 0)
    h2 = make_history()
    clean(h2)
    h2.final(FinalRead(T, 0, log_start_offset=0, high_watermark=10,
                       records=tuple((i, f"a{i}") for i in range(5)) + tuple((5 + i, f"b{i}") for i in range(5)),
                       at=20))
    assert kinds(h2) == ["lso_regressed"]


def test_a_later_delete_answering_a_lower_low_watermark_is_a_regression():
    h = make_history()
    clean(h)
    start = h.delete_started(T, 0, 6, started=13)
    h.delete_acked(T, 0, 6, 2, started=start, acked=14)
    assert kinds(h) == ["lw_regressed"]
    # concurrent deletes (the second started before the first was acknowledged) are not ordered
    h2 = make_history()
    clean(h2)
    h2.delete_acked(T, 0, 2, 2, started=7.5, acked=9)
    assert check(h2) == []


def test_a_read_serving_another_payload_than_the_acknowledged_one_is_a_conflict():
    h = make_history()
    clean(h)
    h.read(ReadObs(T, 0, started=13, ended=14, fetch_offset=5, records=((5, "other"),), log_start_offset=4,
                   high_watermark=10))
    [v] = check(h)
    assert (v.kind, v.first_offset) == ("read_conflict", 5)


def test_acknowledged_records_of_a_partition_never_read_at_the_end_are_reported():
    h = make_history()
    h.produce_acked(T, 1, 0, ["x"], started=1, acked=2)
    [v] = check(h)
    assert v.kind == "lost_record" and "no final read" in v.detail


def test_partitions_are_checked_independently():
    h = make_history()
    clean(h)
    # LW 4 on partition 0 says nothing about partition 1
    h.produce_acked(T, 1, 0, ["p0", "p1"], started=1, acked=2)
    h.read(ReadObs(T, 1, started=13, ended=14, fetch_offset=0, records=((0, "p0"),), log_start_offset=0,
                   high_watermark=2))
    h.final(FinalRead(T, 1, log_start_offset=0, high_watermark=2, records=((0, "p0"), (1, "p1")), at=20))
    assert check(h) == []
