"""__transaction_state records in Kafka's bytes (TransactionLogKey, TransactionLogValue v0 and v1)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lowtide.errors import CorruptMessage
from lowtide.frontdoor.transactions.txn_records import (
    TxnLogValue,
    decode_txn_key,
    decode_txn_value,
    encode_txn_key,
    encode_txn_value,
    partition_for_transactional_id,
)

VALUE = TxnLogValue(producer_id=100, producer_epoch=50, timeout_ms=500, state="Ongoing",
                    partitions=frozenset({("b", 1), ("a", 2), ("a", 0)}), last_update_ms=1000, start_ms=750)


def test_the_key_is_type_0_then_the_transactional_id_as_a_kafka_string():
    assert encode_txn_key("tx-1") == bytes.fromhex("0000" "0004") + b"tx-1"
    assert decode_txn_key(encode_txn_key("tx-1")) == "tx-1"


def test_a_key_of_another_record_type_is_not_a_transactional_ids():
    assert decode_txn_key(bytes.fromhex("0001" "0004") + b"tx-1") is None


def test_the_value_is_kafkas_version_0_layout_byte_for_byte():
    expected = bytes.fromhex(
        "0000"                      # version 0
        "0000000000000064"          # producer id 100
        "0032"                      # epoch 50
        "000001f4"                  # timeout 500 ms
        "01"                        # status Ongoing
        "00000002"                  # two topics, in name order
        "0001" "61" "00000002" "00000000" "00000002"   # "a": [0, 2]
        "0001" "62" "00000001" "00000001"              # "b": [1]
        "00000000000003e8"          # last update 1000
        "00000000000002ee")         # start 750
    assert encode_txn_value(VALUE) == expected
    assert decode_txn_value(expected) == VALUE


def test_a_flexible_version_1_value_is_read_with_its_tagged_fields_skipped():
    v1 = bytes.fromhex(
        "0001" "0000000000000064" "0032" "000001f4" "04"   # CompleteCommit
        "02"                                             # compact array: 1 topic
        "02" "61" "02" "00000003" "00"                   # "a": [3], no tags
        "00000000000003e8" "00000000000002ee"
        "01" "02" "02" "0001")                           # tag 2 (client transaction version) = 1
    got = decode_txn_value(v1)
    assert (got.state, got.partitions, got.start_ms) == ("CompleteCommit", frozenset({("a", 3)}), 750)


V2_VALUE = replace(VALUE, producer_epoch=51, state="PrepareCommit", transaction_version=2, next_producer_id=200)


def test_a_transactions_version_2_state_is_kafkas_flexible_version_1_layout_byte_for_byte():
    expected = bytes.fromhex(
        "0001"                      # version 1 (flexible)
        "0000000000000064"          # producer id 100
        "0033"                      # epoch 51 (bumped by the EndTxn that prepared it)
        "000001f4"                  # timeout 500 ms
        "02"                        # status PrepareCommit
        "03"                        # compact array: two topics, in name order
        "0261" "03" "00000000" "00000002" "00"   # "a": [0, 2], no tagged fields
        "0262" "02" "00000001" "00"              # "b": [1]
        "00000000000003e8"          # last update 1000
        "00000000000002ee"          # start 750
        "02"                        # two tagged fields (previous producer id -1 is left out)
        "01" "08" "00000000000000c8"             # tag 1: next producer id 200 (the epoch ran out)
        "02" "02" "0002")                        # tag 2: client transaction version 2
    assert encode_txn_value(V2_VALUE) == expected
    assert decode_txn_value(expected) == V2_VALUE


def test_a_rotated_producer_id_is_tag_0_and_a_version_1_state_stays_version_0():
    rotated = replace(VALUE, state="CompleteCommit", partitions=frozenset(), producer_id=200, producer_epoch=0,
                      previous_producer_id=100, transaction_version=2)
    raw = encode_txn_value(rotated)
    assert raw[:2] == bytes.fromhex("0001")
    assert raw.endswith(bytes.fromhex("01" "00000000000003e8" "00000000000002ee"
                                      "02" "00" "08" "0000000000000064" "02" "02" "0002"))
    assert decode_txn_value(raw) == rotated
    assert encode_txn_value(VALUE)[:2] == bytes.fromhex("0000") and not VALUE.flexible


@pytest.mark.parametrize("raw", [b"", bytes.fromhex("0007") + bytes(30), encode_txn_value(VALUE)[:-3],
                                 encode_txn_value(V2_VALUE)[:-1]])
def test_a_cut_short_or_unknown_version_value_is_corrupt(raw):
    with pytest.raises(CorruptMessage):
        decode_txn_value(raw)


def test_the_partition_is_kafkas_abs_hash_code_modulo_the_partition_count():
    # Java: "tx-1".hashCode() == 3572520 (t*31^3 + x*31^2 + -*31 + 1), so partition 3572520 % 50 == 20.
    assert partition_for_transactional_id("tx-1", partitions=50) == 20
