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
