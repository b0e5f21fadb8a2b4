"""``__share_group_state`` records in Kafka's share coordinator format (KIP-932): ShareSnapshotKey
and ShareSnapshotValue (record type 0), byte for byte as Kafka 4's share coordinator writes them, so
that Kafka's tools (``kafka-dump-log --share-group-state-decoder``) read lowtide's topic.

Key (not a flexible version)::

    int16   record type = 0 (ShareSnapshot)
    int16   group id length, then its UTF-8 bytes
    16 B    topic id (UUID, most significant half first)
    int32   partition

Value (flexible version 0)::

    int16   version = 0
    int32   snapshot epoch      (+1 each write of this share-partition)
    int32   state epoch
    int32   leader epoch        (of the partition leader that wrote it)
    int64   start offset        (SPSO)
    int64   create timestamp    (ms)
    int64   write timestamp     (ms)
    uvarint state batch count + 1, then per batch:
        int64 first offset, int64 last offset, int8 delivery state, int16 delivery count,
        uvarint 0 (the batch's tagged fields: none)
    uvarint tagged field count (0, or 1 with tag 0 = DeliveryCompleteCount: uvarint 0, uvarint 4, int32)

A tombstone (no value) deletes the share-partition's state. ShareUpdate records (type 1, Kafka's
deltas between snapshots) are read too, applied over the latest snapshot as Kafka's coordinator
does; lowtide writes only snapshots.
"""

from __future__ import annotations

import base64
import struct
import uuid
from dataclasses import dataclass

from lowtide.errors import CorruptMessage
from lowtide.groups.codec import java_string_hash
from lowtide.record import encode_uvarint
from lowtide.share.state import StateBatch

SHARE_STATE_TOPIC = "__share_group_state"
SNAPSHOT_TYPE, UPDATE_TYPE = 0, 1
_BATCH = struct.Struct(">qqbh")
_SNAPSHOT_HEAD = struct.Struct(">hiiiqqq")  # version, snapshot/state/leader epochs, start, create, write
_UPDATE_HEAD = struct.Struct(">hiiq")  # version, snapshot epoch, leader epoch, start offset


@dataclass(frozen=True, slots=True)
class ShareStateKey:
    """Which share-partition a record is about (``topic_id``: the 32-hex-digit id)."""

    group_id: str
    topic_id: str
    partition: int
    record_type: int = SNAPSHOT_TYPE

    @property
    def coordinator_key(self) -> str:
        """Kafka's ``SharePartitionKey.asCoordinatorKey()``: what picks the topic partition (the topic
        id as Kafka's ``Uuid.toString()`` writes it: URL-safe base64, no padding)."""
        topic = base64.urlsafe_b64encode(uuid.UUID(hex=self.topic_id).bytes).rstrip(b"=").decode()
        return f"{self.group_id}:{topic}:{self.partition}"


@dataclass(frozen=True, slots=True)
class ShareSnapshot:
    """A ShareSnapshotValue (or, with ``is_update``, a ShareUpdateValue: no state epoch or timestamps)."""

    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    create_timestamp_ms: int
    write_timestamp_ms: int
    batches: tuple[StateBatch, ...]
    delivery_complete_count: int = -1
    is_update: bool = False


def encode_key(key: ShareStateKey) -> bytes:
    group = key.group_id.encode()
    if len(group) > 0x7FFF:
        raise CorruptMessage(f"group id of {len(group)} bytes is too long")
    return b"".join((struct.pack(">hh", key.record_type, len(group)), group, uuid.UUID(hex=key.topic_id).bytes,
                     struct.pack(">i", key.partition)))


def decode_key(data: bytes) -> ShareStateKey | None:
    """The key, or None for a record type this topic does not hold (skipped, as Kafka's loader does)."""
    try:
        record_type, length = struct.unpack_from(">hh", data, 0)
        if record_type not in (SNAPSHOT_TYPE, UPDATE_TYPE):
            return None
        end = 4 + length
        if length < 0 or len(data) != end + 20:
            raise CorruptMessage(f"share state key of {len(data)} bytes")
        group = data[4:end].decode()
        topic_id = uuid.UUID(bytes=bytes(data[end:end + 16])).hex
        (partition,) = struct.unpack_from(">i", data, end + 16)
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptMessage(f"share state key: {exc}") from exc
    return ShareStateKey(group_id=group, topic_id=topic_id, partition=partition, record_type=record_type)


def _encode_batches(batches: tuple[StateBatch, ...]) -> list[bytes]:
    parts = [encode_uvarint(len(batches) + 1)]
    for b in batches:
        parts.append(_BATCH.pack(b.first, b.last, b.state, b.delivery_count))
        parts.append(b"\x00")
    return parts


def _encode_tags(delivery_complete_count: int) -> bytes:
    if delivery_complete_count == -1:
        return b"\x00"
    return b"\x01\x00\x04" + struct.pack(">i", delivery_complete_count)


def encode_snapshot(value: ShareSnapshot) -> bytes:
    if value.is_update:
        head = _UPDATE_HEAD.pack(0, value.snapshot_epoch, value.leader_epoch, value.start_offset)
    else:
        head = _SNAPSHOT_HEAD.pack(0, value.snapshot_epoch, value.state_epoch, value.leader_epoch,
                                   value.start_offset, value.create_timestamp_ms, value.write_timestamp_ms)
    return b"".join([head, *_encode_batches(value.batches), _encode_tags(value.delivery_complete_count)])


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise CorruptMessage("share state value: bad unsigned varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _skip_tags(data: bytes, pos: int) -> tuple[int, int]:
    """Skip a tagged-field section; returns (DeliveryCompleteCount or -1, position after)."""
    complete = -1
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        tag, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        if tag == 0 and size == 4:
            (complete,) = struct.unpack_from(">i", data, pos)
        pos += size
    if pos > len(data):
        raise CorruptMessage("share state value: tagged fields run past the record")
    return complete, pos


def decode_snapshot(data: bytes, *, record_type: int = SNAPSHOT_TYPE) -> ShareSnapshot:
    try:
        if record_type == UPDATE_TYPE:
            version, snapshot_epoch, leader_epoch, start = _UPDATE_HEAD.unpack_from(data, 0)
            state_epoch = create = write = 0
            pos = _UPDATE_HEAD.size
        else:
            version, snapshot_epoch, state_epoch, leader_epoch, start, create, write = \
                _SNAPSHOT_HEAD.unpack_from(data, 0)
            pos = _SNAPSHOT_HEAD.size
        if version != 0:
            raise CorruptMessage(f"share state value version {version}")
        n, pos = _uvarint(data, pos)
        batches = []
        for _ in range(max(0, n - 1)):
            first, last, state, count = _BATCH.unpack_from(data, pos)
            pos += _BATCH.size
            _, pos = _skip_tags(data, pos)
            batches.append(StateBatch(first, last, state, count))
        complete, pos = _skip_tags(data, pos)
    except struct.error as exc:
        raise CorruptMessage(f"share state value: {exc}") from exc
    if pos != len(data):
        raise CorruptMessage(f"share state value: {len(data) - pos} bytes after the end")
    return ShareSnapshot(snapshot_epoch=snapshot_epoch, state_epoch=state_epoch, leader_epoch=leader_epoch,
                         start_offset=start, create_timestamp_ms=create, write_timestamp_ms=write,
                         batches=tuple(batches), delivery_complete_count=complete,
                         is_update=record_type == UPDATE_TYPE)


def partition_for_key(key: ShareStateKey, *, partitions: int) -> int:
    """The ``__share_group_state`` partition of a share-partition: Kafka's
    ``abs(hashCode(coordinator key)) % partitions``."""
    h = java_string_hash(key.coordinator_key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def reset_snapshot(current: ShareSnapshot | None, start_offset: int, now_ms: int) -> ShareSnapshot:
    """An admin's reset of a share-partition whose state is ``current`` (AlterShareGroupOffsets):
    a new state at ``start_offset`` with nothing in flight, under the next state epoch, so that a
    leader holding the old state in memory reloads it and a write of the old state epoch is fenced
    when read."""
    return ShareSnapshot(
        snapshot_epoch=current.snapshot_epoch + 1 if current else 0,
        state_epoch=current.state_epoch + 1 if current else 1,
        leader_epoch=current.leader_epoch if current else 0, start_offset=start_offset,
        create_timestamp_ms=current.create_timestamp_ms if current else now_ms, write_timestamp_ms=now_ms,
        batches=())
