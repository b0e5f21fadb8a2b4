"""``__share_group_state`` records, byte for byte. The expected bytes were written by Kafka 4.4.0's
own generated classes (``ShareSnapshotKey``/``ShareSnapshotValue`` serialized with
``MessageUtil.toVersionPrefixedByteBuffer``), and the partition by Kafka's ``Utils.abs(key.hashCode())
% n`` over ``SharePartitionKey.asCoordinatorKey()``, so lowtide's topic reads as Kafka's."""

from __future__ import annotations

import pytest

from lowtide.errors import CorruptMessage
from lowtide.share.codec import (
    UPDATE_TYPE,
    ShareSnapshot,
    ShareStateKey,
    decode_key,
    decode_snapshot,
    encode_key,
    encode_snapshot,
    partition_for_key,
)
from lowtide.share.state import AVAILABLE, StateBatch

KEY = ShareStateKey(group_id="g", topic_id="00112233445566778899aabbccddeeff", partition=3)
KEY_BYTES = bytes.fromhex(
    "0000"                              # record type 0: ShareSnapshot
    "0001" "67"                         # group id "g"
    "00112233445566778899aabbccddeeff"  # topic id
    "00000003")                         # partition
SNAPSHOT = ShareSnapshot(snapshot_epoch=1, state_epoch=0, leader_epoch=7, start_offset=10, create_timestamp_ms=1000,
                         write_timestamp_ms=2000, batches=(StateBatch(10, 19, AVAILABLE, 2),))
SNAPSHOT_BYTES = bytes.fromhex(
    "0000"                  # version 0
    "00000001"              # snapshot epoch
    "00000000"              # state epoch
    "00000007"              # leader epoch
    "000000000000000a"      # start offset 10
    "00000000000003e8"      # create timestamp 1000
    "00000000000007d0"      # write timestamp 2000
    "02"                    # 1 state batch (compact array: n + 1)
    "000000000000000a"      # first offset 10
    "0000000000000013"      # last offset 19
    "00"                    # delivery state AVAILABLE
    "0002"                  # delivery count 2
    "00"                    # the batch's tagged fields: none
    "00")                   # the value's tagged fields: none


def test_a_snapshot_key_is_drawn_as_kafka_draws_it():
    assert encode_key(KEY) == KEY_BYTES
    assert decode_key(KEY_BYTES) == KEY


def test_a_snapshot_value_is_drawn_as_kafka_draws_it():
    assert encode_snapshot(SNAPSHOT) == SNAPSHOT_BYTES
    assert decode_snapshot(SNAPSHOT_BYTES) == SNAPSHOT


def test_the_delivery_complete_count_is_a_tagged_field():
    value = ShareSnapshot(**{**{f: getattr(SNAPSHOT, f) for f in SNAPSHOT.__slots__}, "delivery_complete_count": 42})
    data = encode_snapshot(value)
    assert data == SNAPSHOT_BYTES[:-1] + bytes.fromhex("01" "00" "04" "0000002a")
    assert decode_snapshot(data) == value


def test_an_update_record_reads_with_its_shorter_head():
    update = ShareSnapshot(snapshot_epoch=4, state_epoch=0, leader_epoch=7, start_offset=12, create_timestamp_ms=0,
                           write_timestamp_ms=0, batches=(StateBatch(12, 12, 2, 1),), is_update=True)
    data = encode_snapshot(update)
    assert data[:18] == bytes.fromhex("0000" "00000004" "00000007" "000000000000000c")
    assert decode_snapshot(data, record_type=UPDATE_TYPE) == update


def test_the_state_partition_is_kafkas_for_the_same_share_partition():
    assert KEY.coordinator_key == "g:ABEiM0RVZneImaq7zN3u_w:3"  # Kafka's Uuid.toString(): URL-safe base64
    assert partition_for_key(KEY, partitions=50) == 30
    assert partition_for_key(KEY, partitions=8) == 0


def test_a_record_of_another_type_is_skipped():
    assert decode_key(bytes.fromhex("0005" "0001" "67") + bytes(20)) is None


@pytest.mark.parametrize("data", [SNAPSHOT_BYTES[:-3], SNAPSHOT_BYTES + b"\x00", b"\x00\x01" + SNAPSHOT_BYTES[2:]])
def test_a_truncated_or_padded_or_unknown_version_value_is_corrupt(data):
    with pytest.raises(CorruptMessage):
        decode_snapshot(data)


def test_a_key_of_the_wrong_length_is_corrupt():
    with pytest.raises(CorruptMessage):
        decode_key(KEY_BYTES[:-1])
