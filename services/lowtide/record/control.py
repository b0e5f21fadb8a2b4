"""Kafka's transaction control records (KIP-98): the COMMIT / ABORT markers a transaction
coordinator has the partition leaders append, and the batches that carry them.

A marker is a control batch (attributes: control bit 5 + transactional bit 4, never compressed)
holding exactly one record, with the transaction's producer id and epoch in the batch header
(layout of the batch and of a record: ``batch.py``)::

    Control record key   (4 bytes)                 Control record value  (6 bytes)
      Version => Int16  (= 0)                        Version          => Int16 (= 0)
      Type    => Int16  (0 = ABORT, 1 = COMMIT)      CoordinatorEpoch => Int32

    e.g. COMMIT, coordinator epoch 5:  key 00 00 00 01   value 00 00 00 00 00 05

    Marker batch: BaseSequence -1, RecordCount 1, LastOffsetDelta 0, the record's TimestampDelta 0,
    KeyLength 4, ValueLength 6, no headers; one record = 17 bytes, the whole batch 78 bytes.

Readers never see markers as records: consumers skip control batches (``columns.columnize``), a
read_committed consumer uses them to end an aborted transaction's range, the producer state of a
log (``log/producer_state.py``) to end the producer's ongoing transaction.
"""

from __future__ import annotations

import struct

from lowtide.errors import CorruptMessage
from lowtide.record.batch import (
    BATCH_HEADER_SIZE,
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    encode_varint,
    read_header,
    seal_batch,
)
from lowtide.record.validate import record_fields

ABORT = 0
COMMIT = 1
CONTROL_KEY_VERSION = 0
CONTROL_VALUE_VERSION = 0
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


def encode_control_key(*, marker_type: int) -> bytes:
    """The 4-byte key of a control record (version 0, ``marker_type`` ABORT or COMMIT)."""
    if marker_type not in (ABORT, COMMIT):
        raise ValueError(f"control record type must be ABORT (0) or COMMIT (1), got {marker_type}")
    return _KEY.pack(CONTROL_KEY_VERSION, marker_type)


def encode_marker_value(*, coordinator_epoch: int) -> bytes:
    """The 6-byte value of an end-transaction marker (version 0, the coordinator's epoch)."""
    return _VALUE.pack(CONTROL_VALUE_VERSION, coordinator_epoch)


def decode_control_key(key: bytes) -> int:
    """The type of a control record key (ABORT / COMMIT); CorruptMessage if it is not 4+ bytes."""
    if len(key) < _KEY.size:
        raise CorruptMessage(f"control record key of {len(key)} bytes; expected at least {_KEY.size}")
    version, marker_type = _KEY.unpack_from(key)
    if version < 0:
        raise CorruptMessage(f"control record key has version {version}")
    return marker_type


def build_marker_batch(*, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                       timestamp_ms: int, partition_leader_epoch: int = -1) -> bytes:
    """One control batch holding one COMMIT (``commit``) or ABORT marker (base offset 0: the leader
    assigns it)."""
    key = encode_control_key(marker_type=COMMIT if commit else ABORT)
    value = encode_marker_value(coordinator_epoch=coordinator_epoch)
    fields = b"\x00" + encode_varint(0) + encode_varint(0)  # attributes, timestamp delta, offset delta
    fields += encode_varint(len(key)) + key + encode_varint(len(value)) + value + encode_varint(0)
    body = encode_varint(len(fields)) + fields
    return seal_batch(body, record_count=1, base_timestamp=timestamp_ms, max_timestamp=timestamp_ms,
                      producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1,
                      partition_leader_epoch=partition_leader_epoch, is_transactional=True, is_control=True)


def is_marker_header(header: BatchHeader) -> bool:
    """Whether a batch header is a transaction control batch (control + transactional bits)."""
    return header.attributes & (CONTROL_MASK | TRANSACTIONAL_MASK) == (CONTROL_MASK | TRANSACTIONAL_MASK)


def read_marker_type(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """ABORT / COMMIT of the control batch at ``pos``, None when it holds no record (a control batch
    the cleaner emptied): the first record's key (control batches are never compressed)."""
    header = read_header(buf, pos)
    if not header.is_control:
        raise CorruptMessage(f"batch at offset {header.base_offset} is not a control batch")
    if header.record_count <= 0:
        return None
    if header.compression:
        raise CorruptMessage(f"control batch at offset {header.base_offset} is compressed")
    end = pos + header.size_in_bytes
    data = bytes(memoryview(buf)[pos + BATCH_HEADER_SIZE:end])
    try:
        fields = record_fields(data, header.record_count)  # the one record walker, in C
    except ValueError as exc:  # (code, message) of the walk
        raise CorruptMessage(f"control batch at offset {header.base_offset}: {exc.args[-1]}") from None
    key, key_length = fields[0][6:8]
    if key_length < 0:
        raise CorruptMessage(f"control batch at offset {header.base_offset} has a null key")
    return decode_control_key(data[key:key + key_length])
