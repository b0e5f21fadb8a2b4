"""Varints of the record format, byte for byte (lowtide/record/varint.py draws them)."""

from __future__ import annotations

import pytest

from lowtide.errors import CorruptMessage
from lowtide.record.varint import decode_varint, encode_uvarint, encode_varint

ZIGZAG = [(0, "00"), (-1, "01"), (1, "02"), (63, "7e"), (-64, "7f"), (64, "8001"), (300, "d804"),
          (8191, "fe7f"), (8192, "808001"), (-(2**63), "ffffffffffffffffff01"), (2**63 - 1, "feffffffffffffffff01")]


@pytest.mark.parametrize(("value", "encoded"), ZIGZAG)
def test_a_signed_value_is_zigzag_encoded_seven_bits_a_byte_low_group_first(value, encoded):
    assert encode_varint(value).hex() == encoded
    assert decode_varint(b"\xaa" + bytes.fromhex(encoded) + b"\xbb", 1) == (value, 1 + len(encoded) // 2)


def test_an_unsigned_varint_skips_the_zigzag_step():
    assert [encode_uvarint(v).hex() for v in (0, 1, 127, 128, 300, 16384)] == ["00", "01", "7f", "8001", "ac02",
                                                                                 "808001"]


def test_a_truncated_or_overlong_varint_is_corrupt_message():
    with pytest.raises(CorruptMessage, match="ends inside a varint"):
        decode_varint(bytes.fromhex("8080"), 0)
    with pytest.raises(CorruptMessage, match="longer than 10 bytes"):
        decode_varint(bytes.fromhex("ff" * 11), 0)
