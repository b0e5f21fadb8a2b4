"""__transaction_state records in Kafka's bytes (TransactionLogKey, TransactionLogValue v0 and v1)."""

from __future__ import annotations

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


@pytest.mark.parametrize("raw", [b"", bytes.fromhex("0007") + bytes(30), encode_txn_value(VALUE)[:-3]])
def test_a_cut_short_or_unknown_version_value_is_corrupt(raw):
    with pytest.raises(CorruptMessage):
        decode_txn_value(raw)


def test_the_partition_is_kafkas_abs_hash_code_modulo_the_partition_count():
    # Java: "tx-1".hashCode() == 3572520 (t*31^3 + x*31^2 + -*31 + 1), so partition 3572520 % 50 == 20.
    assert partition_for_transactional_id("tx-1", partitions=50) == 20
