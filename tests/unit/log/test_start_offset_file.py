from __future__ import annotations

import os

import pytest

from lowtide.errors import KafkaStorageError
from lowtide.log import checkpoint, start_offset_file
from lowtide.log.start_offset_file import (
    FILE_SIZE,
    SLOT_SIZE,
    LogStartOffsetFile,
    StartOffsetSyncGroup,
    decode_slot,
    encode_slot,
)


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


def created(tmp_path, count: int, value: int = 7) -> list[LogStartOffsetFile]:
    """``count`` partition directories, each with a log start offset file holding ``value``."""
    files = []
    for i in range(count):
        (tmp_path / f"p-{i}").mkdir()
        f = LogStartOffsetFile(tmp_path / f"p-{i}")
        f.create(value)
        files.append(f)
    return files


def slots_of(f: LogStartOffsetFile) -> list[tuple[int, int] | None]:
    data = f.path.read_bytes()
    return [decode_slot(data[:SLOT_SIZE]), decode_slot(data[SLOT_SIZE:])]


@pytest.fixture
def flushes(monkeypatch) -> list[str]:
    """Records every fdatasync and syncfs (which then do nothing) in order."""
    calls: list[str] = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append("fdatasync"))
    fake = lambda fd: calls.append("syncfs") or 0  # noqa: E731
    monkeypatch.setattr(start_offset_file, "_SYNCFS", fake)  # which flush a group chooses
    monkeypatch.setattr(checkpoint, "SYNCFS", fake)  # the call itself
    return calls


def test_a_group_write_takes_the_next_slot_but_is_durable_only_once_its_group_flushed(tmp_path):
    (f,) = created(tmp_path, 1)
    group = StartOffsetSyncGroup()

    f.write(11, group=group)

    assert (f.sequence, f.durable_value) == (2, 7)
    assert slots_of(f) == [(2, 11), (1, 7)]  # the layout of any write
    group.flush()
    f.mark_flushed(2)
    assert f.durable_value == 11


def test_a_write_after_an_unflushed_one_flushes_it_first_so_the_other_slot_stays_durable(tmp_path, monkeypatch):
    (f,) = created(tmp_path, 1)
    f.write(11, group=StartOffsetSyncGroup())  # its group never flushes
    seen_at_flush = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: seen_at_flush.append(slots_of(f)))

    f.write(13)

    # Slot 1 (value 7) was only overwritten once 11, in slot 0, had been flushed.
    assert seen_at_flush == [[(2, 11), (1, 7)]]
    assert slots_of(f) == [(2, 11), (3, 13)]
    assert f.durable_value == 13


def test_a_small_group_flushes_file_by_file_and_a_big_one_syncs_the_filesystem_once(tmp_path, flushes):
    files = created(tmp_path, 20)

    small = StartOffsetSyncGroup(per_file_max=16)
    for f in files[:3]:
        f.write(8, group=small)
    small.flush()
    assert flushes == ["fdatasync"] * 3

    for f in files[:3]:
        f.mark_flushed(f.sequence)
    flushes.clear()
    big = StartOffsetSyncGroup(per_file_max=16)
    for f in files:
        f.write(9, group=big)
    big.flush()
    assert flushes == ["syncfs"]


def test_a_mark_for_an_older_write_does_not_count_a_newer_unflushed_one_as_durable(tmp_path):
    (f,) = created(tmp_path, 1)
    first, second = StartOffsetSyncGroup(), StartOffsetSyncGroup()
    f.write(11, group=first)
    first.flush()
    f.write(13, group=second)  # 11 is flushed again first (not marked yet), then 13 goes unflushed

    f.mark_flushed(2)

    assert f.durable_value == 11
    second.flush()
    f.mark_flushed(3)
    assert f.durable_value == 13


def test_a_failed_group_flush_is_a_storage_error_and_nothing_counts_as_durable(tmp_path, monkeypatch):
    (f,) = created(tmp_path, 1)
    group = StartOffsetSyncGroup()
    f.write(11, group=group)

    def fail(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", fail)
    with pytest.raises(KafkaStorageError, match="Input/output error"):
        group.flush()
    assert f.durable_value == 7


def test_a_real_big_group_flush_makes_every_value_readable_back(tmp_path):
    files = created(tmp_path, 20)
    group = StartOffsetSyncGroup(per_file_max=4)
    for i, f in enumerate(files):
        f.write(100 + i, group=group)
    group.flush()
    assert [LogStartOffsetFile(f.path.parent).read() for f in files] == [100 + i for i in range(20)]


def test_the_first_read_in_a_process_syncs_the_filesystem_and_later_ones_do_not(tmp_path, flushes, monkeypatch):
    monkeypatch.setattr(start_offset_file, "_synced_devices", set())
    created(tmp_path, 2, value=3)

    assert LogStartOffsetFile(tmp_path / "p-0").read() == 3
    assert LogStartOffsetFile(tmp_path / "p-1").read() == 3

    assert flushes == ["syncfs"]  # what a crashed predecessor left unflushed is durable before use
