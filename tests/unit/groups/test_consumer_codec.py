"""KIP-848 consumer group records of ``__consumer_offsets`` (``groups/consumer_codec.py``): Kafka's
bytes, written by hand from its message schemas, and their fold beside the offset commits."""

from __future__ import annotations

import pytest

from lowtide.errors import CorruptMessage
from lowtide.groups import ConsumerRecord, OffsetKey, OffsetValue, encode_offset_key, encode_offset_value
from lowtide.groups.consumer_codec import (
    CURRENT_MEMBER,
    GROUP_METADATA,
    MEMBER_METADATA,
    TARGET_MEMBER,
    TARGET_METADATA,
    ClassicMemberMetadata,
    ClassicProtocol,
    ConsumerKey,
    CurrentMember,
    GroupMetadata,
    MemberMetadata,
    TargetMember,
    TargetMetadata,
    decode_consumer_key,
    decode_consumer_value,
    encode_consumer_key,
    encode_consumer_value,
)
from lowtide.groups.state import PartitionOffsets, decode_offset_records
from lowtide.record import encode_batch

TOPIC_ID = "0123456789abcdef0123456789abcdef"
TOPIC_ID_BYTES = bytes.fromhex(TOPIC_ID)


def test_group_metadata_bytes():
    assert encode_consumer_key(ConsumerKey(GROUP_METADATA, "g")) == bytes.fromhex("0003 0001 67")
    assert encode_consumer_value(GroupMetadata(epoch=5)) == bytes.fromhex("0000 00000005 00")
    assert encode_consumer_value(TargetMetadata(assignment_epoch=7)) == bytes.fromhex("0000 00000007 00")
    assert encode_consumer_key(ConsumerKey(TARGET_METADATA, "g")) == bytes.fromhex("0006 0001 67")


def test_member_keys_carry_the_member_id():
    for kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_MEMBER):
        key = ConsumerKey(kind, "g", "m1")
        assert encode_consumer_key(key) == kind.to_bytes(2, "big") + bytes.fromhex("0001 67 0002 6d31")
        assert decode_consumer_key(encode_consumer_key(key)) == key


def test_member_metadata_bytes():
    value = MemberMetadata(instance_id=None, rack_id=None, client_id="c", client_host="/h",
                           subscribed_topic_names=("t",), subscribed_topic_regex=None, rebalance_timeout_ms=300000,
                           server_assignor="uniform")
    expected = (bytes.fromhex("0000")            # version 0
                + b"\x00" + b"\x00"               # instance id, rack id: null compact strings
                + b"\x02c" + b"\x03/h"            # client id, client host: length + 1
                + b"\x02" + b"\x02t"              # one subscribed topic name
                + b"\x00"                         # no regex
                + (300000).to_bytes(4, "big")
                + b"\x08uniform"
                + b"\x00")                        # no tagged fields
    assert encode_consumer_value(value) == expected
    assert decode_consumer_value(MEMBER_METADATA, expected) == value


def test_a_classic_members_metadata_is_tagged_field_zero_of_its_member_metadata():
    value = MemberMetadata(instance_id=None, rack_id=None, client_id="c", client_host="/h",
                           subscribed_topic_names=("t",), subscribed_topic_regex=None, rebalance_timeout_ms=300000,
                           server_assignor=None, classic=ClassicMemberMetadata(
                               session_timeout_ms=45000, supported_protocols=(ClassicProtocol("range", b"\x00\x01"),)))
    classic = (b"\x01"                            # a nullable struct: present
               + (45000).to_bytes(4, "big")
               + b"\x02" + b"\x06range" + b"\x03\x00\x01" + b"\x00"  # one protocol: name, metadata, no tags
               + b"\x00")                          # the struct's own tagged fields: none
    expected = (bytes.fromhex("0000") + b"\x00\x00" + b"\x02c" + b"\x03/h" + b"\x02\x02t" + b"\x00"
                + (300000).to_bytes(4, "big") + b"\x00"
                + b"\x01" + b"\x00" + bytes([len(classic)]) + classic)  # one tagged field: tag 0, its size
    assert encode_consumer_value(value) == expected
    assert decode_consumer_value(MEMBER_METADATA, expected) == value


def test_assignment_bytes():
    target = TargetMember(partitions=((TOPIC_ID, (0, 2)),))
    expected = (bytes.fromhex("0000") + b"\x02" + TOPIC_ID_BYTES + b"\x03" + bytes.fromhex("00000000 00000002")
                + b"\x00" + b"\x00")
    assert encode_consumer_value(target) == expected
    assert decode_consumer_value(TARGET_MEMBER, expected) == target
    current = CurrentMember(member_epoch=4, previous_member_epoch=3, state=1, assigned=((TOPIC_ID, (1,)),),
                            pending_revocation=((TOPIC_ID, (2,)),))
    expected = (bytes.fromhex("0000 00000004 00000003 01")
                + b"\x02" + TOPIC_ID_BYTES + b"\x02" + bytes.fromhex("00000001") + b"\x00"
                + b"\x02" + TOPIC_ID_BYTES + b"\x02" + bytes.fromhex("00000002") + b"\x00"
                + b"\x00")
    assert encode_consumer_value(current) == expected
    assert decode_consumer_value(CURRENT_MEMBER, expected) == current


def test_tagged_fields_written_by_newer_kafka_are_skipped():
    # Kafka 4.1 writes MetadataHash as tag 0 (int64) in ConsumerGroupMetadataValue.
    raw = bytes.fromhex("0000 00000009") + b"\x01" + b"\x00" + b"\x08" + bytes(8)
    assert decode_consumer_value(GROUP_METADATA, raw) == GroupMetadata(epoch=9)


def test_corrupt_values_are_refused():
    with pytest.raises(CorruptMessage):
        decode_consumer_value(GROUP_METADATA, bytes.fromhex("0000 0000"))
    with pytest.raises(CorruptMessage):
        decode_consumer_value(GROUP_METADATA, bytes.fromhex("0001 00000001 00"))
    assert decode_consumer_key(encode_offset_key(OffsetKey("g", "t", 0))) is None


def test_fold_keeps_the_latest_consumer_record_and_drops_tombstoned_ones():
    offsets_key = encode_offset_key(OffsetKey("g", "t", 0))
    epoch_key = encode_consumer_key(ConsumerKey(GROUP_METADATA, "g"))
    member_key = encode_consumer_key(ConsumerKey(CURRENT_MEMBER, "g", "m1"))
    batch = encode_batch([encode_offset_value(OffsetValue(offset=5, metadata="", commit_timestamp=1)),
                          encode_consumer_value(GroupMetadata(epoch=1)),
                          encode_consumer_value(CurrentMember(member_epoch=1, previous_member_epoch=0, state=0)),
                          encode_consumer_value(GroupMetadata(epoch=2)),
                          None],
                         keys=[offsets_key, epoch_key, member_key, epoch_key, member_key], timestamp_ms=1)
    records = decode_offset_records(batch)
    assert [type(r).__name__ for r in records] == ["OffsetRecord"] + ["ConsumerRecord"] * 4
    fold = PartitionOffsets(partition=0)
    fold.apply_all(records)
    live = fold.consumer_records("g")
    assert [(r.key, r.log_offset) for r in live] == [(ConsumerKey(GROUP_METADATA, "g"), 3)]
    assert decode_consumer_value(GROUP_METADATA, live[0].value) == GroupMetadata(epoch=2)
    # An older record read after the tombstone does not bring the member back.
    fold.apply(ConsumerRecord(key=ConsumerKey(CURRENT_MEMBER, "g", "m1"), value=b"x", log_offset=2))
    assert len(fold.consumer_records("g")) == 1
    assert len(fold) == 1  # the offset commit is still there
