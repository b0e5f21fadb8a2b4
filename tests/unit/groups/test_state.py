"""The fold of __consumer_offsets records: latest record of a key wins, a tombstone deletes it."""

from __future__ import annotations

import pytest

from lowtide.errors import CorruptMessage
from lowtide.groups import (
    OffsetKey,
    OffsetRecord,
    OffsetValue,
    PartitionOffsets,
    TopicCommit,
    commits_by_topic,
    decode_offset_records,
    encode_offset_key,
    encode_offset_value,
)
from lowtide.record import assign_offsets, encode_batch, validate_batches
from lowtide.record.control import build_marker_batch


def batch_at(base_offset: int, items: list[tuple[OffsetKey, OffsetValue | None]]) -> bytes:
    raw = bytearray(encode_batch([None if v is None else encode_offset_value(v) for _, v in items],
                                 keys=[encode_offset_key(k) for k, _ in items], timestamp_ms=1000))
    assign_offsets(raw, validate_batches(raw), base_offset=base_offset, leader_epoch=0)
    return bytes(raw)


K0 = OffsetKey("etl", "orders", 0)
K1 = OffsetKey("etl", "orders", 1)


def value(offset: int, ts: int = 1) -> OffsetValue:
    return OffsetValue(offset=offset, metadata="", commit_timestamp=ts)


def test_the_latest_record_of_a_key_wins():
    records = decode_offset_records(batch_at(0, [(K0, value(5)), (K1, value(7)), (K0, value(9))]))
    part = PartitionOffsets(partition=0)
    part.apply_all(records)
    assert {e.key: e.value.offset for e in part.entries()} == {K0: 9, K1: 7}
    assert part.get(K0).log_offset == 2


def test_a_tombstone_deletes_its_key():
    part = PartitionOffsets(partition=0)
    part.apply_all(decode_offset_records(batch_at(0, [(K0, value(5)), (K1, value(7))]) +
                                         batch_at(2, [(K0, None)])))
    assert [e.key for e in part.entries()] == [K1]


def test_an_older_record_arriving_after_a_newer_one_changes_nothing():
    # A front door applies its own acknowledged write at once; the tail reads older records later.
    part = PartitionOffsets(partition=0)
    assert part.apply(OffsetRecord(K0, value(50), log_offset=10))
    assert not part.apply(OffsetRecord(K0, value(5), log_offset=3))
    assert part.get(K0).value.offset == 50
    assert part.apply(OffsetRecord(K0, None, log_offset=11))
    assert not part.apply(OffsetRecord(K0, value(5), log_offset=4))
    assert part.get(K0) is None


def test_tombstones_are_forgotten_once_the_tail_passed_them():
    part = PartitionOffsets(partition=0)
    part.apply(OffsetRecord(K0, None, log_offset=4))
    part.advance(5)
    assert part.apply(OffsetRecord(K0, value(1), log_offset=6))


def test_records_below_the_fetch_position_are_skipped():
    records = decode_offset_records(batch_at(0, [(K0, value(5)), (K1, value(7))]), from_offset=1)
    assert [(r.key, r.log_offset) for r in records] == [(K1, 1)]


def test_a_reset_forgets_the_partition_and_restarts_at_the_given_position():
    part = PartitionOffsets(partition=0)
    part.apply(OffsetRecord(K0, value(5), log_offset=0))
    part.advance(1)
    part.reset(40)
    assert len(part) == 0 and part.position == 40


def test_commits_are_grouped_by_topic_group_and_partition():
    a, b = PartitionOffsets(partition=0), PartitionOffsets(partition=1)
    a.apply(OffsetRecord(K0, value(5, ts=11), log_offset=0))
    b.apply(OffsetRecord(OffsetKey("audit", "orders", 1), value(3, ts=12), log_offset=0))
    b.apply(OffsetRecord(OffsetKey("audit", "other", 1), value(3), log_offset=1))
    assert commits_by_topic([a, b], "orders") == {"etl": {0: TopicCommit(5, 11)}, "audit": {1: TopicCommit(3, 12)}}


def test_a_corrupt_record_fails_the_whole_decode():
    raw = bytearray(encode_batch([encode_offset_value(value(1)), b"\x00"], keys=[encode_offset_key(K0),
                                                                                 encode_offset_key(K1)]))
    with pytest.raises(CorruptMessage):
        decode_offset_records(bytes(raw))


# -- offsets committed inside a transaction (TxnOffsetCommit, KIP-447) ---------------------------
def txn_batch_at(base_offset: int, producer_id: int, items: list[tuple[OffsetKey, OffsetValue]]) -> bytes:
    raw = bytearray(encode_batch([encode_offset_value(v) for _, v in items],
                                 keys=[encode_offset_key(k) for k, _ in items], timestamp_ms=1000,
                                 producer_id=producer_id, producer_epoch=0, is_transactional=True))
    assign_offsets(raw, validate_batches(raw), base_offset=base_offset, leader_epoch=0)
    return bytes(raw)


def marker_at(base_offset: int, producer_id: int, *, commit: bool) -> bytes:
    raw = bytearray(build_marker_batch(producer_id=producer_id, producer_epoch=0, commit=commit, coordinator_epoch=0,
                                       timestamp_ms=1000))
    assign_offsets(raw, validate_batches(raw), base_offset=base_offset, leader_epoch=0)
    return bytes(raw)


def committed(part: PartitionOffsets) -> dict[OffsetKey, int]:
    return {e.key: e.value.offset for e in part.entries()}


def test_offsets_of_a_transaction_are_pending_until_its_commit_marker():
    part = PartitionOffsets(partition=0)
    part.apply_all(decode_offset_records(batch_at(0, [(K0, value(5))]) + txn_batch_at(1, 7, [(K0, value(9))])))
    assert committed(part) == {K0: 5}
    assert part.pending_keys() == {K0}
    part.apply_all(decode_offset_records(marker_at(2, 7, commit=True)))
    assert committed(part) == {K0: 9}
    assert part.pending_keys() == set()


def test_offsets_of_an_aborted_transaction_never_show():
    part = PartitionOffsets(partition=0)
    part.apply_all(decode_offset_records(batch_at(0, [(K0, value(5))]) + txn_batch_at(1, 7, [(K0, value(9))]) +
                                         marker_at(2, 7, commit=False)))
    assert committed(part) == {K0: 5}
    assert part.pending_keys() == set()


def test_a_marker_decides_only_its_own_producers_offsets():
    part = PartitionOffsets(partition=0)
    part.apply_all(decode_offset_records(txn_batch_at(0, 7, [(K0, value(9))]) + txn_batch_at(1, 8, [(K1, value(4))]) +
                                         marker_at(2, 8, commit=True)))
    assert committed(part) == {K1: 4}
    assert part.pending_keys() == {K0}


def test_a_committed_transaction_does_not_undo_a_later_plain_commit_of_the_same_key():
    # Kafka's completePendingTxnOffsetCommit keeps whichever record has the higher log offset.
    part = PartitionOffsets(partition=0)
    part.apply_all(decode_offset_records(txn_batch_at(0, 7, [(K0, value(9))]) + batch_at(1, [(K0, value(12))]) +
                                         marker_at(2, 7, commit=True)))
    assert committed(part) == {K0: 12}


def test_pending_records_handed_in_twice_count_once():
    part = PartitionOffsets(partition=0)
    part.apply(OffsetRecord(K0, value(9), log_offset=1, producer_id=7))
    part.apply_all(decode_offset_records(txn_batch_at(1, 7, [(K0, value(9))]) + marker_at(2, 7, commit=True)))
    assert committed(part) == {K0: 9}
    assert part.pending_keys() == set()


def test_starting_a_partition_over_forgets_its_pending_offsets():
    part = PartitionOffsets(partition=0)
    part.apply_all(decode_offset_records(txn_batch_at(0, 7, [(K0, value(9))])))
    part.reset(0)
    assert part.pending_keys() == set()


def test_a_marker_leaves_pending_the_records_of_its_producers_next_transaction():
    # Records of the next transaction handed in before the marker of the previous one (out of log order).
    part = PartitionOffsets(partition=0)
    part.apply(OffsetRecord(K0, value(5), log_offset=0, producer_id=7))
    part.apply(OffsetRecord(K0, value(50), log_offset=2, producer_id=7))
    part.apply_all(decode_offset_records(txn_batch_at(0, 7, [(K0, value(5))]) + marker_at(1, 7, commit=True)))
    assert committed(part) == {K0: 5}
    assert part.pending_keys() == {K0}
    part.apply_all(decode_offset_records(txn_batch_at(2, 7, [(K0, value(50))]) + marker_at(3, 7, commit=False)))
    assert committed(part) == {K0: 5}
    assert part.pending_keys() == set()
