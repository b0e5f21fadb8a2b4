from __future__ import annotations

import pytest

from lowtide.errors import KafkaStorageError
from lowtide.log.start_offset_file import FILE_SIZE, SLOT_SIZE, LogStartOffsetFile, decode_slot, encode_slot


def test_a_slot_is_encoded_byte_for_byte_as_the_module_draws_it():
    slot = encode_slot(sequence=3, log_start_offset=10000)
    assert len(slot) == SLOT_SIZE
    assert slot[:28] == bytes.fromhex(
        "4c54534f"                      # magic "LTSO"
        "00" "000000"                   # version 0, reserved
        "0000000000000003"              # sequence 3
        "0000000000002710"              # log start offset 10000
        "448ba843"                      # CRC-32C of the 24 bytes before it (bitwise reference)
    )
    assert slot[28:] == bytes(SLOT_SIZE - 28)
    assert decode_slot(slot) == (3, 10000)


@pytest.mark.parametrize("position", [0, 4, 8, 16, 24])
def test_a_slot_with_any_flipped_byte_does_not_decode(position):
    slot = bytearray(encode_slot(sequence=1, log_start_offset=42))
    slot[position] ^= 0x01
    assert decode_slot(bytes(slot)) is None


def test_an_empty_slot_does_not_decode():
    assert decode_slot(bytes(SLOT_SIZE)) is None


def test_a_missing_file_reads_as_none(tmp_path):
    assert LogStartOffsetFile(tmp_path).read() is None


def test_the_last_write_wins_and_writes_alternate_between_the_two_slots(tmp_path):
    f = LogStartOffsetFile(tmp_path)
    f.create(0)
    f.write(5)
    f.write(9)
    data = f.path.read_bytes()
    assert len(data) == FILE_SIZE
    assert decode_slot(data[:SLOT_SIZE]) == (2, 5)
    assert decode_slot(data[SLOT_SIZE:]) == (3, 9)
    assert LogStartOffsetFile(tmp_path).read() == 9


def test_a_torn_latest_slot_falls_back_to_the_previous_value(tmp_path):
    f = LogStartOffsetFile(tmp_path)
    f.create(7)
    f.write(11)  # sequence 2, slot 0
    data = bytearray(f.path.read_bytes())
    data[20] ^= 0xFF  # tear the newest slot
    f.path.write_bytes(bytes(data))
    again = LogStartOffsetFile(tmp_path)
    assert again.read() == 7
    again.write(13)  # the next write reuses the torn slot, leaving 7 intact until it lands
    assert LogStartOffsetFile(tmp_path).read() == 13


def test_a_file_with_no_valid_slot_is_a_storage_error_naming_the_path(tmp_path):
    f = LogStartOffsetFile(tmp_path)
    f.create(7)
    f.path.write_bytes(bytes(FILE_SIZE))
    with pytest.raises(KafkaStorageError, match=str(f.path)):
        LogStartOffsetFile(tmp_path).read()


def test_a_file_of_the_wrong_size_is_a_storage_error_naming_the_path(tmp_path):
    f = LogStartOffsetFile(tmp_path)
    f.create(7)
    f.path.write_bytes(f.path.read_bytes()[:SLOT_SIZE])
    with pytest.raises(KafkaStorageError, match=f"{f.path}.*512 bytes"):
        LogStartOffsetFile(tmp_path).read()
