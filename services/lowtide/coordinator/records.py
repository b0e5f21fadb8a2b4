"""The diskless coordinator's metadata records: values of the records of ``__diskless_metadata-k``.

Binary, big-endian (Kafka's byte order); every record is one record value (the key is null)::

    version 1 (written):
    +---------+------+-------------------+----------------+
    | version | type | coordinator_epoch | body ...       |   version int8 = 1; type int8 (below);
    +---------+------+-------------------+----------------+   coordinator_epoch int32 >= 0
    version 0 (read only, before epochs): version int8 = 0 | type int8 | body; its epoch reads as 0
    string = int16 N | N bytes UTF-8          uuid = 16 bytes (Kafka's Uuid: high long, low long)

    type 1 PartitionCreated  topic_id uuid | name string | partition_index int32
    type 2 TopicDeleted      topic_id uuid | deleted_at_ms int64
    type 3 FileCommitted     object_key string | object_format int8 | file_size int64
                             | uploader_broker_id int32 | committed_at_ms int64
                             | owner_count int32 | owner_id int32 * owner_count
                             | batch_count int32 | batch * batch_count
           batch, 80 bytes:  topic_id uuid(16) | partition_index int32 | magic int8 | byte_offset int32
                             | byte_size int32 | base_offset int64 | last_offset int64
                             | log_append_timestamp int64 | batch_max_timestamp int64
                             | timestamp_type int8 | producer_id int64 | producer_epoch int16
                             | base_sequence int32 | last_sequence int32
    type 4 RecordsDeleted    topic_id uuid | partition_index int32 | new_log_start_offset int64
                             | deleted_at_ms int64
    type 5 FileHandedOver    object_key string | owner_count int32 | owner_id int32 * owner_count
                             | to_owner_index int32 | at_ms int64
    type 6 FileDeleted       object_key string
    type 7 EpochStarted      owner string | at_ms int64   (the first record of every leadership)
    type 8 FileCommitted with transactions: type 3's body, then
                             | kind_count int32 (= batch_count) | kind int8 * kind_count
           kind, per batch in batch order: 0 not transactional, 1 transactional data,
                             2 COMMIT marker, 3 ABORT marker (messages.coordinator TXN_*)

``coordinator_epoch``: the epoch of the shard leadership that wrote the record
(docs/design/diskless.md#fencing-by-epoch): one more than any before, taken in the metadata store
with the lease (``leadership.take_epoch``), and opened in the log by an EpochStarted record before
the leader answers anything. Every applier keeps the highest epoch it has applied and skips a record with a
lower one (a zombie's append that landed after its successor's EpochStarted): the state stays a
function of the log. The batches carrying the records are fenced at the replica too, by Kafka's
producer-epoch rule (``metadata_log`` and the shard's writer id).

Differences from KIP-1164's records, and why:

* Batches are one flat fixed-size list (each names its topic and partition) instead of KIP's
  topics -> partitions -> batches nesting: decoded with one ``struct.iter_unpack``, no per-level
  Python loop; the KIP itself marks the record "TODO: optimize for storing fewer bytes".
* Every record that changes a time-dependent column carries the time (``committed_at_ms``,
  ``deleted_at_ms``, ``at_ms``): the SQLite state must be a pure function of the records, so a
  state rebuilt from the log equals, row for row, the one built while serving.
* Type 7 and the epoch are not in the KIP either: they are how a deposed (paused) shard is fenced
  without a time assumption, as KRaft's LeaderChangeMessage opens a term.
* Type 8 is not in the KIP (which has no transactions yet): a file holding a transactional batch
  or a marker says which, so every applier derives the same ongoing and aborted transactions
  (coordinator/transactions.py). A file without any is still written as type 3, byte for byte as
  before, so the common record costs nothing more and an older build reads it.
* Types 5 and 6 are not in the KIP. The KIP changes a file's owner in local state only, but the
  receiving owner must still know it owns the file after a restart, and the row of a deleted file
  must go away on every replica of the shard: both are therefore records of the receiving shard.

A value that is truncated, has trailing bytes, or names an unknown version or type is
CORRUPT_MESSAGE.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import partial
from itertools import starmap
from typing import ClassVar, NamedTuple

from lowtide.errors import CorruptMessage

FORMAT_VERSION = 1
FILE_COMMITTED_TXN = 8  # the record type of a FileCommitted whose txn_kinds is not empty
MAX_EPOCH = 0x7FFFFFFF

_HEAD = struct.Struct(">bb")
_HEAD_V1 = struct.Struct(">bbi")
_EPOCH_TAIL = struct.Struct(">q")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_PARTITION = struct.Struct(">16si")
_TOPIC_DELETED = struct.Struct(">16sq")
_FILE_HEAD = struct.Struct(">bqiq")
_RECORDS_DELETED = struct.Struct(">16siqq")
_HANDOVER_TAIL = struct.Struct(">iq")
BATCH = struct.Struct(">16sibiiqqqqbqhii")
assert BATCH.size == 80


class CommittedBatch(NamedTuple):
    """One accepted batch of a FileCommitted record, with the offsets the coordinator assigned.

    Fields in the order of the 80-byte ``BATCH`` layout above, so a batch is packed with
    ``BATCH.pack(*batch)`` and unpacked with ``CommittedBatch._make``; a NamedTuple because a file
    carries one per batch and a tuple is built several times faster than a dataclass."""

    topic_id: bytes
    partition_index: int
    magic: int
    byte_offset: int
    byte_size: int
    base_offset: int
    last_offset: int
    log_append_timestamp: int
    batch_max_timestamp: int
    timestamp_type: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_sequence: int


@dataclass(frozen=True, slots=True)
class PartitionCreated:
    TYPE: ClassVar[int] = 1
    topic_id: bytes
    name: str
    partition_index: int


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    TYPE: ClassVar[int] = 2
    topic_id: bytes
    deleted_at_ms: int


@dataclass(frozen=True, slots=True)
class FileCommitted:
    TYPE: ClassVar[int] = 3
    object_key: str
    object_format: int
    file_size: int
    uploader_broker_id: int
    committed_at_ms: int
    owner_ids: tuple[int, ...]
    batches: tuple[CommittedBatch, ...]
    # One TXN_* byte per batch (empty: none transactional): written as type 8 when not empty.
    txn_kinds: bytes = b""


@dataclass(frozen=True, slots=True)
class RecordsDeleted:
    TYPE: ClassVar[int] = 4
    topic_id: bytes
    partition_index: int
    new_log_start_offset: int
    deleted_at_ms: int


@dataclass(frozen=True, slots=True)
class FileHandedOver:
    TYPE: ClassVar[int] = 5
    object_key: str
    owner_ids: tuple[int, ...]
    to_owner_index: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class FileDeleted:
    TYPE: ClassVar[int] = 6
    object_key: str


@dataclass(frozen=True, slots=True)
class EpochStarted:
    """The first record of a leadership: its ``coordinator_epoch`` (in the header) fences every
    lower one. ``owner`` (the process) and ``at_ms`` are for people reading the log; no table
    keeps them."""

    TYPE: ClassVar[int] = 7
    owner: str
    at_ms: int


# ``CommittedBatch._make`` minus its Python frame: one per batch of every file decoded.
_new_batch = partial(tuple.__new__, CommittedBatch)

MetadataRecord = (PartitionCreated | TopicDeleted | FileCommitted | RecordsDeleted | FileHandedOver | FileDeleted
                  | EpochStarted)


def _string(value: str) -> bytes:
    data = value.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes does not fit an int16 length")
    return _I16.pack(len(data)) + data


def _owners(owner_ids: tuple[int, ...]) -> bytes:
    return _I32.pack(len(owner_ids)) + struct.pack(f">{len(owner_ids)}i", *owner_ids)


def _uuid(value: bytes) -> bytes:
    if len(value) != 16:
        raise ValueError(f"topic id must be 16 bytes, got {len(value)}")
    return value


def encode_record(record: MetadataRecord, *, epoch: int = 0) -> bytes:
    """The record value bytes of ``record`` written in coordinator ``epoch`` (layout in the module
    docstring)."""
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"coordinator epoch {epoch} out of range")
    head = _HEAD_V1.pack(FORMAT_VERSION, record.TYPE, epoch)
    if isinstance(record, FileCommitted):
        kinds = record.txn_kinds
        if kinds:
            if len(kinds) != len(record.batches):
                raise ValueError(f"{len(kinds)} transaction kinds for {len(record.batches)} batches")
            head = _HEAD_V1.pack(FORMAT_VERSION, FILE_COMMITTED_TXN, epoch)
        parts = [head, _string(record.object_key),
                 _FILE_HEAD.pack(record.object_format, record.file_size, record.uploader_broker_id,
                                 record.committed_at_ms),
                 _owners(record.owner_ids), _I32.pack(len(record.batches))]
        for b in record.batches:
            if len(b[0]) != 16:  # struct's "16s" would pad or cut it silently
                _uuid(b[0])
        parts.extend(starmap(BATCH.pack, record.batches))
        if kinds:
            parts += [_I32.pack(len(kinds)), bytes(kinds)]
        return b"".join(parts)
    if isinstance(record, PartitionCreated):
        return (head + _uuid(record.topic_id) + _string(record.name) + _I32.pack(record.partition_index))
    if isinstance(record, TopicDeleted):
        return head + _TOPIC_DELETED.pack(_uuid(record.topic_id), record.deleted_at_ms)
    if isinstance(record, RecordsDeleted):
        return head + _RECORDS_DELETED.pack(_uuid(record.topic_id), record.partition_index,
                                            record.new_log_start_offset, record.deleted_at_ms)
    if isinstance(record, FileHandedOver):
        return (head + _string(record.object_key) + _owners(record.owner_ids)
                + _HANDOVER_TAIL.pack(record.to_owner_index, record.at_ms))
    if isinstance(record, FileDeleted):
        return head + _string(record.object_key)
    if isinstance(record, EpochStarted):
        return head + _string(record.owner) + _EPOCH_TAIL.pack(record.at_ms)
    raise TypeError(f"not a metadata record: {record!r}")


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise CorruptMessage(f"metadata record truncated at byte {self.pos} (wanted {n} more)")
        view = self.data[self.pos:self.pos + n]
        self.pos += n
        return view

    def unpack(self, fmt: struct.Struct) -> tuple:
        return fmt.unpack(self.take(fmt.size))

    def string(self) -> str:
        (n,) = self.unpack(_I16)
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptMessage("metadata record string is not UTF-8") from exc

    def owners(self) -> tuple[int, ...]:
        (n,) = self.unpack(_I32)
        if n < 0 or n > 0xFFFF:
            raise CorruptMessage(f"metadata record owner count {n}")
        return struct.unpack(f">{n}i", self.take(4 * n))


def decode_record(data: bytes) -> MetadataRecord:
    """The record a value holds; CORRUPT_MESSAGE if it is not one this module writes."""
    return decode_entry(data)[1]


def decode_entry(data: bytes) -> tuple[int, MetadataRecord]:
    """(coordinator epoch, record) of a value; CORRUPT_MESSAGE if it is not one this module
    writes. A version 0 value (written before epochs) has epoch 0."""
    r = _Reader(data)
    version, kind = r.unpack(_HEAD)
    if version == FORMAT_VERSION:
        r.pos = 0
        _version, _kind, epoch = r.unpack(_HEAD_V1)
        if epoch < 0:
            raise CorruptMessage(f"metadata record coordinator epoch {epoch}")
    elif version == 0:
        epoch = 0
    else:
        raise CorruptMessage(f"metadata record format version {version} (this build reads 0 and {FORMAT_VERSION})")
    record: MetadataRecord
    if kind == FileCommitted.TYPE or kind == FILE_COMMITTED_TXN:
        key = r.string()
        fmt, size, uploader, at_ms = r.unpack(_FILE_HEAD)
        owners = r.owners()
        (count,) = r.unpack(_I32)
        if count < 0:
            raise CorruptMessage(f"metadata record batch count {count}")
        raw = r.take(BATCH.size * count)
        batches = tuple(map(_new_batch, BATCH.iter_unpack(raw)))
        kinds = b""
        if kind == FILE_COMMITTED_TXN:
            (n,) = r.unpack(_I32)
            if n != count:
                raise CorruptMessage(f"metadata record has {n} transaction kinds for {count} batches")
            kinds = bytes(r.take(n))
            if not kinds or max(kinds) > 3:
                raise CorruptMessage("metadata record transaction kind out of range")
        record = FileCommitted(key, fmt, size, uploader, at_ms, owners, batches, kinds)
    elif kind == PartitionCreated.TYPE:
        topic_id = bytes(r.take(16))
        name = r.string()
        (index,) = r.unpack(_I32)
        record = PartitionCreated(topic_id, name, index)
    elif kind == TopicDeleted.TYPE:
        topic_id, at_ms = r.unpack(_TOPIC_DELETED)
        record = TopicDeleted(bytes(topic_id), at_ms)
    elif kind == RecordsDeleted.TYPE:
        topic_id, index, lso, at_ms = r.unpack(_RECORDS_DELETED)
        record = RecordsDeleted(bytes(topic_id), index, lso, at_ms)
    elif kind == FileHandedOver.TYPE:
        key = r.string()
        owners = r.owners()
        to_index, at_ms = r.unpack(_HANDOVER_TAIL)
        record = FileHandedOver(key, owners, to_index, at_ms)
    elif kind == FileDeleted.TYPE:
        record = FileDeleted(r.string())
    elif kind == EpochStarted.TYPE:
        owner = r.string()
        (at_ms,) = r.unpack(_EPOCH_TAIL)
        record = EpochStarted(owner, at_ms)
    else:
        raise CorruptMessage(f"unknown metadata record type {kind}")
    if r.pos != len(r.data):
        raise CorruptMessage(f"{len(r.data) - r.pos} trailing bytes after a metadata record of type {kind}")
    return epoch, record
