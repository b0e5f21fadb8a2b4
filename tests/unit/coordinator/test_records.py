from __future__ import annotations

import struct

import pytest

from lowtide.coordinator.records import (
    CommittedBatch,
    EpochStarted,
    FileCommitted,
    FileDeleted,
    FileHandedOver,
    PartitionCreated,
    RecordsDeleted,
    TopicDeleted,
    decode_entry,
    decode_record,
    encode_record,
)
from lowtide.errors import CorruptMessage

TID = bytes(range(1, 17))
BATCH = CommittedBatch(TID, 3, 2, 100, 200, 10, 14, 1_700_000_000_123, 1_700_000_000_100, 1, 42, 5, 7, 11)
RECORDS = [
    PartitionCreated(TID, "orders", 3),
    TopicDeleted(TID, 1_700_000_000_000),
    FileCommitted("wal/abc", 1, 4096, 2, 1_700_000_000_123, (1, 0, 2), (BATCH, BATCH)),
    FileCommitted("wal/empty", 1, 0, -1, 5, (0,), ()),
    RecordsDeleted(TID, 3, 12, 99),
    FileHandedOver("wal/abc", (1, 0, 2), 1, 77),
    FileDeleted("wal/abc"),
    EpochStarted("coordinator-0-abc", 1_700_000_000_000),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_type_round_trips_through_its_bytes(record):
    assert decode_record(encode_record(record)) == record


def test_partition_created_bytes_are_version_type_epoch_uuid_name_and_index():
    assert encode_record(PartitionCreated(TID, "orders", 3), epoch=7) == (
        b"\x01\x01\x00\x00\x00\x07" + TID + b"\x00\x06orders" + b"\x00\x00\x00\x03")


def test_records_deleted_bytes_are_fixed_width_big_endian():
    assert encode_record(RecordsDeleted(TID, 3, 12, 99)) == (
        b"\x01\x04\x00\x00\x00\x00" + TID + struct.pack(">iqq", 3, 12, 99))


def test_file_committed_bytes_are_the_header_the_owners_and_80_byte_batches():
    data = encode_record(FileCommitted("k", 1, 4096, 2, 5, (1, 0), (BATCH,)))
    header = (b"\x01\x03\x00\x00\x00\x00" + b"\x00\x01k" + struct.pack(">bqiq", 1, 4096, 2, 5)
              + struct.pack(">iii", 2, 1, 0))
    batch = TID + struct.pack(">ibiiqqqqbqhii", 3, 2, 100, 200, 10, 14, 1_700_000_000_123, 1_700_000_000_100, 1,
                              42, 5, 7, 11)
    assert len(batch) == 80
    assert data == header + struct.pack(">i", 1) + batch


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x01\x01", b"\x00\x09", b"\x00\x02" + TID,
                                  encode_record(TopicDeleted(TID, 1)) + b"\x00",
                                  encode_record(FileCommitted("k", 1, 1, 1, 1, (0,), (BATCH,)))[:-1],
                                  b"\x00\x06\x00\x02\xff\xfe"])
def test_truncated_trailing_or_unknown_bytes_are_corrupt_message(data):
    with pytest.raises(CorruptMessage):
        decode_record(data)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_the_coordinator_epoch_round_trips_with_every_record_type(record):
    assert decode_entry(encode_record(record, epoch=123_456)) == (123_456, record)


def test_a_version_0_value_written_before_epochs_reads_as_epoch_0():
    v0 = b"\x00\x06" + b"\x00\x05wal/x"
    assert decode_entry(v0) == (0, FileDeleted("wal/x"))


def test_an_epoch_out_of_range_is_refused_at_encoding_and_a_negative_one_is_corrupt():
    with pytest.raises(ValueError):
        encode_record(FileDeleted("k"), epoch=-1)
    with pytest.raises(CorruptMessage):
        decode_entry(b"\x01\x06\xff\xff\xff\xff\x00\x01k")
