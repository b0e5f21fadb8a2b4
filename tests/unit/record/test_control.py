"""The transaction marker codec, byte for byte against the layout drawn in record/control.py."""

from __future__ import annotations

import struct

import pytest

from lowtide.errors import CorruptMessage
from lowtide.record import crc32c, decode_batch, encode_batch, read_header, validate_batches
from lowtide.record.control import (
    ABORT,
    COMMIT,
    build_marker_batch,
    decode_control_key,
    encode_control_key,
    encode_marker_value,
    read_marker_type,
)


def test_the_control_key_and_value_are_kafkas_bytes():
    assert encode_control_key(marker_type=COMMIT) == b"\x00\x00\x00\x01"
    assert encode_control_key(marker_type=ABORT) == b"\x00\x00\x00\x00"
    assert encode_marker_value(coordinator_epoch=5) == b"\x00\x00\x00\x00\x00\x05"
    assert decode_control_key(b"\x00\x00\x00\x01") == COMMIT


def test_a_marker_batch_is_78_bytes_laid_out_as_drawn():
    raw = build_marker_batch(producer_id=7, producer_epoch=3, commit=True, coordinator_epoch=5,
                             timestamp_ms=1_700_000_000_000)
    record = bytes([16 << 1, 0, 0, 0, 4 << 1]) + b"\x00\x00\x00\x01" + bytes([6 << 1]) + b"\x00" * 5 + b"\x05\x00"
    header = struct.pack(">qiibIhiqqqhii", 0, 78 - 12, -1, 2, 0, 0x30, 0, 1_700_000_000_000, 1_700_000_000_000,
                         7, 3, -1, 1)
    expected = bytearray(header + record)
    struct.pack_into(">I", expected, 17, crc32c(bytes(expected[21:])))
    assert raw == bytes(expected) and len(raw) == 78
    assert read_marker_type(raw) == COMMIT
    h = read_header(raw)
    assert h.is_control and h.is_transactional and (h.producer_id, h.producer_epoch) == (7, 3)
    [(_, [r])] = [decode_batch(raw)]
    assert (r.key, r.value) == (b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05")
    validate_batches(raw)  # a well-formed batch: the leader's own validation accepts it


def test_an_abort_marker_reads_back_as_abort_and_a_data_batch_is_not_a_marker():
    raw = build_marker_batch(producer_id=1, producer_epoch=0, commit=False, coordinator_epoch=0, timestamp_ms=1)
    assert read_marker_type(raw) == ABORT
    with pytest.raises(CorruptMessage):
        read_marker_type(encode_batch([b"v"], keys=[b"k"]))


def test_a_control_key_that_is_too_short_is_corrupt():
    with pytest.raises(CorruptMessage):
        decode_control_key(b"\x00")
