"""Kafka's __consumer_offsets record format, byte for byte, and Kafka's group -> partition rule."""

from __future__ import annotations

import pytest

from lowtide.errors import CorruptMessage, InvalidRequest
from lowtide.groups import (
    OffsetKey,
    OffsetValue,
    decode_offset_key,
    decode_offset_value,
    encode_offset_key,
    encode_offset_value,
    java_string_hash,
    partition_for_group,
)


def test_offset_commit_key_v1_is_version_then_group_topic_and_partition():
    raw = encode_offset_key(OffsetKey(group="etl", topic="orders", partition=2))
    assert raw == bytes.fromhex("0001" "0003" "65746c" "0006" "6f7264657273" "00000002")
    assert decode_offset_key(raw) == OffsetKey(group="etl", topic="orders", partition=2)


def test_offset_commit_value_v3_is_version_offset_epoch_metadata_and_commit_time():
    raw = encode_offset_value(OffsetValue(offset=10000, metadata="m", commit_timestamp=1732201500123))
    assert raw == bytes.fromhex("0003" "0000000000002710" "ffffffff" "0001" "6d" "000001934f414ddb")
    assert decode_offset_value(raw) == OffsetValue(offset=10000, metadata="m", commit_timestamp=1732201500123,
                                                   leader_epoch=-1)


def test_strings_are_utf8_with_an_int16_byte_length():
    raw = encode_offset_key(OffsetKey(group="é", topic="t", partition=0))
    assert raw[2:6] == bytes.fromhex("0002c3a9")
    assert decode_offset_key(raw).group == "é"


def test_older_value_versions_written_by_kafka_are_read():
    v0 = bytes.fromhex("0000" "0000000000000005" "0000" "0000000000000007")
    v1 = bytes.fromhex("0001" "0000000000000005" "0002" "6869" "0000000000000007" "0000000000000009")
    v2 = bytes.fromhex("0002" "0000000000000005" "0000" "0000000000000007")
    assert decode_offset_value(v0) == OffsetValue(offset=5, metadata="", commit_timestamp=7)
    assert decode_offset_value(v1) == OffsetValue(offset=5, metadata="hi", commit_timestamp=7)
    assert decode_offset_value(v2) == OffsetValue(offset=5, metadata="", commit_timestamp=7)


def test_a_group_metadata_key_is_not_an_offset_commit():
    assert decode_offset_key(bytes.fromhex("0002" "0003" "65746c")) is None


@pytest.mark.parametrize("raw", [b"", bytes.fromhex("0001" "0003" "6574"), bytes.fromhex("0009" "0000"),
                                 bytes.fromhex("0001" "ffff" "0000" "00000000"),
                                 bytes.fromhex("0001" "0001" "ff" "0000" "00000000")])
def test_malformed_keys_are_corrupt_messages(raw):
    with pytest.raises(CorruptMessage):
        decode_offset_key(raw)


@pytest.mark.parametrize("raw", [bytes.fromhex("0003" "00000000"), bytes.fromhex("0004" + "00" * 30)])
def test_malformed_values_are_corrupt_messages(raw):
    with pytest.raises(CorruptMessage):
        decode_offset_value(raw)


def test_a_string_longer_than_kafka_allows_is_refused():
    with pytest.raises(InvalidRequest):
        encode_offset_value(OffsetValue(offset=1, metadata="x" * 40000, commit_timestamp=0))


def test_java_string_hash_matches_java_including_surrogate_pairs():
    # Values printed by jshell (Java 17): "etl".hashCode() etc.
    assert java_string_hash("etl") == 100765
    assert java_string_hash("slow") == 3533313
    assert java_string_hash("fast") == 3135580
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("h\u00e9llo\U0001F600") == 291564465


def test_group_partition_is_kafkas_abs_hash_modulo_the_partition_count():
    # Java: Math.abs("etl".hashCode()) % 50 == 15, Math.abs("console-consumer-12345".hashCode()) % 50 == 6
    assert partition_for_group("etl", partitions=50) == 15
    assert partition_for_group("console-consumer-12345", partitions=50) == 6
    # Kafka's Utils.abs(Integer.MIN_VALUE) is 0, not Integer.MIN_VALUE
    assert partition_for_group("polygenelubricants", partitions=7) == 0


def test_a_topic_without_partitions_has_no_group_partition():
    with pytest.raises(InvalidRequest):
        partition_for_group("etl", partitions=0)
