"""The per-batch filter as bytes: the KIP-534 horizon rewrite, byte for byte; what is kept, copied
or re-encoded; and the produce path's key check."""

from __future__ import annotations

import struct

import pytest

from lowtide.errors import InvalidRecord
from lowtide.log.cleaner.batch_filter import BatchFilter, ChunkRows, OffsetMap, rewrite_batch
from lowtide.log.compacted_keys import require_keys
from lowtide.record import (
    DELETE_HORIZON_MASK,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchBuilder,
    Compression,
    crc32c,
    decode_batch,
    decode_varint,
    encode_batch,
    iter_batches,
    read_header,
)
from lowtide.record.control import COMMIT, build_marker_batch, read_marker_type

HORIZON = 1_700_000_086_400_000
TS = [1_700_000_000_000, 1_700_000_000_007, 1_699_999_999_990]  # not monotonic, as producers may send


def original(*, compression=Compression.NONE, timestamp_type=0) -> bytes:
    """Three records (a value, a tombstone, a value) of one producer batch at offset 100."""
    builder = BatchBuilder(compression=compression, base_offset=100, producer_id=42, producer_epoch=3,
                           base_sequence=17, partition_leader_epoch=5, is_transactional=False,
                           timestamp_type=timestamp_type)
    builder.append(timestamp_ms=TS[0], key=b"a", value=b"one")
    builder.append(timestamp_ms=TS[1], key=b"b", value=None, headers=[("h", b"x")])
    builder.append(timestamp_ms=TS[2], key=b"c", value=b"three")
    return builder.build()


def expected(keep: list[bool], *, horizon: int | None, compression=Compression.NONE) -> bytes:
    """What BatchBuilder (the reference encoder) builds from the kept records with their offsets."""
    builder = BatchBuilder(compression=compression, base_offset=100, producer_id=42, producer_epoch=3,
                           base_sequence=17, partition_leader_epoch=5, delete_horizon_ms=horizon,
                           last_offset_delta=2)
    records = [(b"a", b"one", ()), (b"b", None, [("h", b"x")]), (b"c", b"three", ())]
    for i, (key, value, headers) in enumerate(records):
        if keep[i]:
            builder.append(timestamp_ms=TS[i], key=key, value=value, headers=headers, offset_delta=i)
    return builder.build()


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_setting_the_delete_horizon_is_byte_for_byte_what_the_reference_encoder_builds(compression):
    rewritten = rewrite_batch(original(compression=compression), [True, True, True], delete_horizon_ms=HORIZON)
    assert rewritten == expected([True, True, True], horizon=HORIZON, compression=compression)


def test_the_horizon_rewrite_sets_base_timestamp_bit_6_and_deltas_so_every_record_keeps_its_timestamp():
    raw = original()
    rewritten = rewrite_batch(raw, [True, True, True], delete_horizon_ms=HORIZON)
    header, records = decode_batch(rewritten)  # checks the CRC

    assert header.base_timestamp == HORIZON and header.delete_horizon_ms == HORIZON
    assert header.attributes == read_header(raw).attributes | DELETE_HORIZON_MASK == 0x40
    assert header.max_timestamp == max(TS)
    assert [r.timestamp for r in records] == TS
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == [
        (100, b"a", b"one", ()), (101, b"b", None, (("h", b"x"),)), (102, b"c", b"three", ())]
    # The deltas on the wire: record timestamp - horizon, zig-zag varints (negative here).
    body = rewritten[61:]
    deltas, position = [], 0
    for _ in range(3):
        length, after = decode_varint(body, position)
        deltas.append(decode_varint(body, after + 1)[0])
        position = after + length
    assert deltas == [t - HORIZON for t in TS]
    assert struct.unpack_from(">I", rewritten, 17)[0] == crc32c(rewritten[21:])


def test_a_rewrite_keeps_base_offset_offset_range_leader_epoch_and_producer_fields():
    rewritten = rewrite_batch(original(), [False, True, False], delete_horizon_ms=HORIZON)
    before, after = read_header(original()), read_header(rewritten)
    assert after.base_offset == 100 and after.last_offset_delta == before.last_offset_delta == 2
    assert (after.partition_leader_epoch, after.producer_id, after.producer_epoch, after.base_sequence) == (
        5, 42, 3, 17)
    assert after.record_count == 1
    assert rewritten == expected([False, True, False], horizon=HORIZON)


def test_dropping_records_without_a_horizon_keeps_the_base_timestamp_and_copies_records_verbatim():
    raw = original()
    rewritten = rewrite_batch(raw, [True, False, True], delete_horizon_ms=None)
    header, records = decode_batch(rewritten)
    assert header.base_timestamp == TS[0] and not header.has_delete_horizon
    assert [(r.offset, r.timestamp) for r in records] == [(100, TS[0]), (102, TS[2])]
    assert rewritten == expected([True, False, True], horizon=None)
    assert header.max_timestamp == max(TS[0], TS[2])


def test_a_batch_that_already_has_a_horizon_keeps_it_when_it_loses_records():
    with_horizon = rewrite_batch(original(), [True, True, True], delete_horizon_ms=HORIZON)
    again = rewrite_batch(with_horizon, [True, False, True], delete_horizon_ms=None)
    header, records = decode_batch(again)
    assert header.delete_horizon_ms == HORIZON
    assert [r.timestamp for r in records] == [TS[0], TS[2]]


def test_a_batch_losing_every_record_is_gone():
    assert rewrite_batch(original(), [False, False, False], delete_horizon_ms=HORIZON) is None


def test_a_log_append_time_batch_keeps_its_max_timestamp_as_every_records_timestamp():
    raw = original(timestamp_type=TIMESTAMP_LOG_APPEND_TIME)
    append_time = read_header(raw).max_timestamp
    header, records = decode_batch(rewrite_batch(raw, [True, True, False], delete_horizon_ms=HORIZON))
    assert header.max_timestamp == append_time and header.timestamp_type == 1
    assert {r.timestamp for r in records} == {append_time}


def filter_one(raw: bytes, offset_map: OffsetMap, *, now_ms: int = 1000, retention: int = 500):
    view = memoryview(raw)
    return BatchFilter(offset_map, now_ms=now_ms, delete_retention_ms=retention).filter(
        view, list(iter_batches(view)), ChunkRows.of(view))


def test_a_batch_whose_records_are_all_kept_is_the_very_same_bytes():
    raw = encode_batch([b"1", b"2"], keys=[b"a", b"b"], timestamp_ms=5)
    out = filter_one(raw, OffsetMap(max_bytes=1 << 20))
    assert not out.changed and out.stats.batches_copied == 1
    assert bytes(out.pieces[0]) == raw


def test_superseded_records_go_and_the_latest_of_each_key_stays():
    raw = encode_batch([b"old-a", b"b", b"new-a"], keys=[b"a", b"b", b"a"], timestamp_ms=5)
    offset_map = OffsetMap(max_bytes=1 << 20)
    offset_map.add(ChunkRows.of(raw), start=0, end=3)
    out = filter_one(raw, offset_map)
    _, records = decode_batch(b"".join(out.pieces))
    assert [(r.offset, r.value) for r in records] == [(1, b"b"), (2, b"new-a")]
    assert out.stats.records_removed == 1 and out.stats.batches_rewritten == 1


def test_a_tombstone_without_a_horizon_gets_now_plus_delete_retention_and_one_that_passed_goes():
    raw = encode_batch([None, b"v"], keys=[b"gone", b"stays"], timestamp_ms=5)
    first = filter_one(raw, OffsetMap(max_bytes=1 << 20), now_ms=1000, retention=500)
    assert first.earliest_horizon == 1500 and first.stats.horizons_set == 1
    kept = b"".join(first.pieces)
    assert read_header(kept).delete_horizon_ms == 1500

    before = filter_one(kept, OffsetMap(max_bytes=1 << 20), now_ms=1499)
    assert not before.changed and before.earliest_horizon == 1500
    after = filter_one(kept, OffsetMap(max_bytes=1 << 20), now_ms=1500)
    _, records = decode_batch(b"".join(after.pieces))
    assert [r.key for r in records] == [b"stays"] and after.stats.tombstones_removed == 1
    assert after.earliest_horizon is None


def test_records_without_a_key_are_removed_and_counted():
    raw = encode_batch([b"x", b"y"], keys=[None, b"k"], timestamp_ms=5)
    out = filter_one(raw, OffsetMap(max_bytes=1 << 20))
    _, records = decode_batch(b"".join(out.pieces))
    assert [r.key for r in records] == [b"k"] and out.stats.keyless_removed == 1


def test_a_marker_whose_transaction_still_has_a_batch_in_the_pass_is_copied_untouched():
    data = encode_batch([b"v"], keys=[b"k"], timestamp_ms=5, producer_id=9, producer_epoch=0, base_sequence=0,
                        is_transactional=True)
    marker = build_marker_batch(producer_id=9, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=6)
    marker = struct.pack(">q", 1) + marker[8:]  # the marker follows the data batch at offset 1
    out = filter_one(data + marker, OffsetMap(max_bytes=1 << 20), now_ms=10**13)
    assert b"".join(bytes(p) for p in out.pieces) == data + marker and not out.changed


def test_a_marker_whose_transaction_has_no_batch_left_gets_the_delete_horizon_with_its_bytes_otherwise_kept():
    marker = build_marker_batch(producer_id=9, producer_epoch=0, commit=True, coordinator_epoch=3, timestamp_ms=5)
    out = filter_one(marker, OffsetMap(max_bytes=1 << 20), now_ms=1000, retention=500)
    [header] = out.headers
    assert out.changed and header.delete_horizon_ms == 1500 and header.is_control
    assert read_marker_type(bytes(out.pieces[0])) == COMMIT
    assert decode_batch(bytes(out.pieces[0]))[1][0].timestamp == 5
    assert out.earliest_horizon == 1500


def test_the_produce_path_check_refuses_a_keyless_record_as_invalid_record():
    require_keys(encode_batch([b"v"], keys=[b"k"]), topic_partition="t-0")
    with pytest.raises(InvalidRecord) as raised:
        require_keys(encode_batch([b"v", b"w"], keys=[b"k", None]), topic_partition="t-0")
    assert raised.value.code == 87 and "without key" in raised.value.message
