"""Records of ``__consumer_offsets`` in Kafka's own format, and the group -> partition mapping.

Kafka's group coordinator writes one record per committed (group, topic, partition); the key says
what it is about, the value what was committed, and a null value (a tombstone) deletes it, so the
topic can be compacted (KIP-534 then drops the tombstones after ``delete.retention.ms``). lowtide
writes exactly Kafka's bytes so the Kafka-wire-protocol front end can serve them unchanged.

All integers are big-endian. A Kafka ``string`` is an int16 length then that many UTF-8 bytes
(length -1 = null, not allowed in these records).

OffsetCommitKey, version 1 (the record key)::

    +---------+----------------------+----------------------+-----------+
    | version | group                | topic                | partition |
    | int16=1 | int16 len | utf-8    | int16 len | utf-8    | int32     |
    +---------+----------------------+----------------------+-----------+
      00 01     00 03  65 74 6c        00 06  6f 72 64 ...     00 00 00 02     ("etl", "orders", 2)

    Version 0 has the same layout and is read too; version 2 is a GroupMetadataKey (int16 2,
    string group), about a classic group's members, which lowtide neither writes nor needs:
    skipped. Versions 3 to 8 are KIP-848 consumer group records (``consumer_codec.py`` draws them).

OffsetCommitValue, version 3 (the record value; null = tombstone)::

    +---------+--------+--------------+----------------------+------------------+
    | version | offset | leader_epoch | metadata             | commit_timestamp |
    | int16=3 | int64  | int32        | int16 len | utf-8    | int64 (ms)       |
    +---------+--------+--------------+----------------------+------------------+

    Older versions, read for data written by other producers of the format:
      v0: int64 offset, string metadata, int64 timestamp
      v1: int64 offset, string metadata, int64 commit_timestamp, int64 expire_timestamp
      v2: int64 offset, string metadata, int64 commit_timestamp
    Bytes after the fields of a known version are ignored, as Kafka's readers do (later
    versions only append fields).

Partition of a group (Kafka's ``GroupCoordinator.partitionFor``)::

    partition = Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions

where ``hashCode`` is Java's ``String.hashCode`` over UTF-16 code units (s[0]*31^(n-1) + ... +
s[n-1], 32-bit wrap-around) and ``Utils.abs(Integer.MIN_VALUE)`` is 0.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from lowtide.errors import CorruptMessage, InvalidRequest

OFFSETS_TOPIC = "__consumer_offsets"
KEY_VERSION = 1
VALUE_VERSION = 3
GROUP_METADATA_KEY_VERSION = 2
NO_LEADER_EPOCH = -1
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_INT16_MAX = 0x7FFF


@dataclass(frozen=True, slots=True)
class OffsetKey:
    """What one record of ``__consumer_offsets`` is about."""

    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class OffsetValue:
    """What was committed; ``leader_epoch`` is the client's ``committed_leader_epoch`` (KIP-320),
    -1 when it sent none (lowtide's own clients, OffsetCommit before v6)."""

    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = NO_LEADER_EPOCH


def _encode_string(text: str, what: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > _INT16_MAX:
        raise InvalidRequest(f"{what} is {len(raw)} bytes of UTF-8; Kafka's string holds at most {_INT16_MAX}")
    return _INT16.pack(len(raw)) + raw


def encode_offset_key(key: OffsetKey) -> bytes:
    """OffsetCommitKey v1 bytes of ``key`` (module doc)."""
    return (_INT16.pack(KEY_VERSION) + _encode_string(key.group, "group id")
            + _encode_string(key.topic, "topic") + _INT32.pack(key.partition))


def encode_offset_value(value: OffsetValue) -> bytes:
    """OffsetCommitValue v3 bytes of ``value`` (module doc)."""
    return (_INT16.pack(VALUE_VERSION) + _INT64.pack(value.offset) + _INT32.pack(value.leader_epoch)
            + _encode_string(value.metadata, "offset metadata") + _INT64.pack(value.commit_timestamp))


class _Reader:
    """Sequential big-endian reads that raise CORRUPT_MESSAGE instead of running off the end."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def _take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise CorruptMessage(f"{self.what} is truncated: {len(self.data)} bytes, needs {end}")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def int16(self) -> int:
        return _INT16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _INT32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _INT64.unpack(self._take(8))[0]

    def string(self) -> str:
        length = self.int16()
        if length < 0:
            raise CorruptMessage(f"{self.what} has a null string where one is required")
        try:
            return self._take(length).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptMessage(f"{self.what} has a string that is not UTF-8: {exc}") from None


def decode_offset_key(data: bytes) -> OffsetKey | None:
    """The key of an offset commit record; None for a GroupMetadataKey (not an offset commit).

    Raises CORRUPT_MESSAGE for truncated bytes or an unknown key version."""
    reader = _Reader(bytes(data), "offset commit key")
    version = reader.int16()
    if version == GROUP_METADATA_KEY_VERSION:
        return None
    if version not in (0, 1):
        raise CorruptMessage(f"unknown __consumer_offsets key version {version}")
    return OffsetKey(group=reader.string(), topic=reader.string(), partition=reader.int32())


def decode_offset_value(data: bytes) -> OffsetValue:
    """An OffsetCommitValue of version 0 to 3 (module doc). Raises CORRUPT_MESSAGE otherwise."""
    reader = _Reader(bytes(data), "offset commit value")
    version = reader.int16()
    if version in (0, 1, 2):
        offset = reader.int64()
        metadata = reader.string()
        timestamp = reader.int64()
        return OffsetValue(offset=offset, metadata=metadata, commit_timestamp=timestamp)
    if version == 3:
        offset = reader.int64()
        leader_epoch = reader.int32()
        metadata = reader.string()
        return OffsetValue(offset=offset, metadata=metadata, commit_timestamp=reader.int64(),
                           leader_epoch=leader_epoch)
    raise CorruptMessage(f"unknown __consumer_offsets value version {version}")


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, as a signed 32-bit int."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for_group(group: str, *, partitions: int) -> int:
    """The ``__consumer_offsets`` partition holding ``group``'s commits (Kafka's rule, module doc)."""
    if partitions < 1:
        raise InvalidRequest(f"__consumer_offsets must have at least 1 partition, got {partitions}")
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
