"""KIP-848 consumer group records of ``__consumer_offsets`` in Kafka's own format (the group
coordinator's ``ConsumerGroup*Key`` / ``ConsumerGroup*Value`` messages), next to the offset
commits of ``codec.py`` in the same partition of the group. Design:
docs/design/kip-848-consumer-groups.md#records.

A key is a plain (non-flexible) message whose int16 version is the record type; a value is an
int16 version (0) then a *flexible* message: compact strings (uvarint length+1, 0 = null),
compact arrays (uvarint count+1), 16-byte UUIDs, and a tagged-field section (uvarint count, here
always 0 on write; skipped on read) closing every struct. A null value is a tombstone: the member,
its assignment or the group is gone. Integers are big-endian.

Keys (type = the key's version)::

    type 3 ConsumerGroupMetadataKey            | int16 3 | string group |
    type 5 ConsumerGroupMemberMetadataKey      | int16 5 | string group | string member_id |
    type 6 ConsumerGroupTargetAssignmentMetadataKey | int16 6 | string group |
    type 7 ConsumerGroupTargetAssignmentMemberKey   | int16 7 | string group | string member_id |
    type 8 ConsumerGroupCurrentMemberAssignmentKey  | int16 8 | string group | string member_id |
    (type 4, ConsumerGroupPartitionMetadata, is not written: the subscribed topics' partition
     counts are read from the cluster metadata when the group loads; a type-4 record is skipped)

Values (after int16 version = 0; "cstr" compact string, "cstr?" nullable, "[]" compact array,
"tags" = uvarint 0)::

    3 ConsumerGroupMetadataValue:   int32 epoch | tags
    5 ConsumerGroupMemberMetadataValue:
          cstr? instance_id | cstr? rack_id | cstr client_id | cstr client_host
          | [] cstr subscribed_topic_names | cstr? subscribed_topic_regex
          | int32 rebalance_timeout_ms | cstr? server_assignor | tags
          tag 0 (only for a member using the classic protocol inside a consumer group, KIP-848's
          online upgrade): int8 1 (present) | int32 session_timeout_ms
          | [] { cstr name | cbytes metadata | tags } supported protocols | tags
    6 ConsumerGroupTargetAssignmentMetadataValue: int32 assignment_epoch | tags
    7 ConsumerGroupTargetAssignmentMemberValue:
          [] { uuid topic_id | [] int32 partition | tags } | tags
    8 ConsumerGroupCurrentMemberAssignmentValue:
          int32 member_epoch | int32 previous_member_epoch | int8 state
          | [] { uuid topic_id | [] int32 partition | tags }      assigned partitions
          | [] { uuid topic_id | [] int32 partition | tags }      partitions pending revocation
          | tags

    e.g. type 3, epoch 5:  key 00 03 00 01 67 ("g")   value 00 00 | 00 00 00 05 | 00

Assignments are keyed by topic id (uuid) on disk and by name in memory: the loader resolves ids
with the cluster metadata and drops partitions of topics that no longer exist.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field, replace

from lowtide.errors import CorruptMessage

GROUP_METADATA, PARTITION_METADATA, MEMBER_METADATA = 3, 4, 5
TARGET_METADATA, TARGET_MEMBER, CURRENT_MEMBER = 6, 7, 8
CONSUMER_RECORD_TYPES = frozenset({GROUP_METADATA, PARTITION_METADATA, MEMBER_METADATA, TARGET_METADATA,
                                   TARGET_MEMBER, CURRENT_MEMBER})
_WITH_MEMBER = frozenset({MEMBER_METADATA, TARGET_MEMBER, CURRENT_MEMBER})
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")

# topic id (32 hex digits, as lowtide's metadata keeps it) -> partitions, sorted
TopicIdPartitions = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class ConsumerKey:
    """A consumer group record's key: its type, the group, and the member for per-member types."""

    type: int
    group: str
    member_id: str = ""


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    epoch: int


@dataclass(frozen=True, slots=True)
class ClassicProtocol:
    """One protocol a classic-protocol member named in its JoinGroup (name and its metadata)."""

    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class ClassicMemberMetadata:
    """Kafka's ClassicMemberMetadata: what a member using the classic protocol inside a consumer
    group joined with (tagged field 0 of the member's metadata value; absent for the others)."""

    session_timeout_ms: int
    supported_protocols: tuple[ClassicProtocol, ...]


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic: ClassicMemberMetadata | None = None


@dataclass(frozen=True, slots=True)
class TargetMetadata:
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class TargetMember:
    partitions: TopicIdPartitions = ()


@dataclass(frozen=True, slots=True)
class CurrentMember:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: TopicIdPartitions = ()
    pending_revocation: TopicIdPartitions = field(default=())


ConsumerValue = GroupMetadata | MemberMetadata | TargetMetadata | TargetMember | CurrentMember
_VALUE_TYPE = {GroupMetadata: GROUP_METADATA, MemberMetadata: MEMBER_METADATA, TargetMetadata: TARGET_METADATA,
               TargetMember: TARGET_MEMBER, CurrentMember: CURRENT_MEMBER}


# -- writing ----------------------------------------------------------------------------------
def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _INT16.pack(len(raw)) + raw


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _cstr(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode("utf-8")
    return _uvarint(len(raw) + 1) + raw


def _classic(meta: ClassicMemberMetadata) -> bytes:
    """Tag 0's data: a nullable struct, so a presence byte (1) first, as Kafka's generated code."""
    out = [b"\x01", _INT32.pack(meta.session_timeout_ms), _uvarint(len(meta.supported_protocols) + 1)]
    for protocol in meta.supported_protocols:
        out.extend((_cstr(protocol.name), _uvarint(len(protocol.metadata) + 1), protocol.metadata, b"\x00"))
    out.append(b"\x00")
    return b"".join(out)


def _topic_partitions(items: TopicIdPartitions) -> bytes:
    out = [_uvarint(len(items) + 1)]
    for topic_id, partitions in items:
        out.append(uuid.UUID(hex=topic_id).bytes)
        out.append(_uvarint(len(partitions) + 1))
        out.extend(_INT32.pack(p) for p in partitions)
        out.append(b"\x00")
    return b"".join(out)


def encode_consumer_key(key: ConsumerKey) -> bytes:
    if key.type not in CONSUMER_RECORD_TYPES:
        raise ValueError(f"not a consumer group record type: {key.type}")
    out = _INT16.pack(key.type) + _string(key.group)
    return out + _string(key.member_id) if key.type in _WITH_MEMBER else out


def encode_consumer_value(value: ConsumerValue) -> bytes:
    head = _INT16.pack(0)
    if isinstance(value, GroupMetadata):
        body = _INT32.pack(value.epoch)
    elif isinstance(value, TargetMetadata):
        body = _INT32.pack(value.assignment_epoch)
    elif isinstance(value, MemberMetadata):
        body = (_cstr(value.instance_id) + _cstr(value.rack_id) + _cstr(value.client_id) + _cstr(value.client_host)
                + _uvarint(len(value.subscribed_topic_names) + 1)
                + b"".join(_cstr(t) for t in value.subscribed_topic_names)
                + _cstr(value.subscribed_topic_regex) + _INT32.pack(value.rebalance_timeout_ms)
                + _cstr(value.server_assignor))
        if value.classic is not None:  # the tagged field section carries it: count 1, tag 0, size
            classic = _classic(value.classic)
            return head + body + b"\x01\x00" + _uvarint(len(classic)) + classic
    elif isinstance(value, TargetMember):
        body = _topic_partitions(value.partitions)
    else:
        body = (_INT32.pack(value.member_epoch) + _INT32.pack(value.previous_member_epoch)
                + struct.pack(">b", value.state) + _topic_partitions(value.assigned)
                + _topic_partitions(value.pending_revocation))
    return head + body + b"\x00"


def record_type_of(value: ConsumerValue) -> int:
    return _VALUE_TYPE[type(value)]


# -- reading ----------------------------------------------------------------------------------
class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise CorruptMessage(f"{self.what} is truncated: {len(self.data)} bytes, needs {end}")
        chunk, self.pos = self.data[self.pos:end], end
        return chunk

    def int8(self) -> int:
        return struct.unpack(">b", self.take(1))[0]

    def int16(self) -> int:
        return _INT16.unpack(self.take(2))[0]

    def int32(self) -> int:
        return _INT32.unpack(self.take(4))[0]

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 35:
                raise CorruptMessage(f"{self.what} has an overlong varint")

    def _text(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptMessage(f"{self.what} has a string that is not UTF-8: {exc}") from None

    def string(self) -> str:
        length = self.int16()
        if length < 0:
            raise CorruptMessage(f"{self.what} has a null string where one is required")
        return self._text(self.take(length))

    def cstr(self, *, nullable: bool = False) -> str | None:
        n = self.uvarint()
        if n == 0:
            if not nullable:
                raise CorruptMessage(f"{self.what} has a null string where one is required")
            return None
        return self._text(self.take(n - 1))

    def count(self) -> int:
        n = self.uvarint()
        if n == 0:
            raise CorruptMessage(f"{self.what} has a null array where one is required")
        return n - 1

    def skip_tags(self) -> None:
        self.tags()

    def tags(self) -> dict[int, bytes]:
        """The tagged fields (tag -> its bytes)."""
        out = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = self.take(self.uvarint())
        return out

    def cbytes(self) -> bytes:
        n = self.uvarint()
        if n == 0:
            raise CorruptMessage(f"{self.what} has null bytes where they are required")
        return self.take(n - 1)

    def topic_partitions(self) -> TopicIdPartitions:
        out = []
        for _ in range(self.count()):
            topic_id = uuid.UUID(bytes=self.take(16)).hex
            partitions = tuple(self.int32() for _ in range(self.count()))
            self.skip_tags()
            out.append((topic_id, partitions))
        return tuple(out)


def _read_classic(reader: _Reader) -> ClassicMemberMetadata | None:
    if reader.int8() < 0:
        return None
    session_timeout_ms = reader.int32()
    protocols = []
    for _ in range(reader.count()):
        name = reader.cstr() or ""
        protocols.append(ClassicProtocol(name=name, metadata=reader.cbytes()))
        reader.skip_tags()
    reader.skip_tags()
    return ClassicMemberMetadata(session_timeout_ms=session_timeout_ms, supported_protocols=tuple(protocols))


def decode_consumer_key(data: bytes) -> ConsumerKey | None:
    """The key of a consumer group record; None when ``data`` is another kind of key."""
    reader = _Reader(bytes(data), "consumer group record key")
    kind = reader.int16()
    if kind not in CONSUMER_RECORD_TYPES:
        return None
    group = reader.string()
    return ConsumerKey(type=kind, group=group, member_id=reader.string() if kind in _WITH_MEMBER else "")


def decode_consumer_value(kind: int, data: bytes) -> ConsumerValue | None:
    """The value of a record of type ``kind`` (None for type 4, which lowtide does not use).
    Raises CORRUPT_MESSAGE for bytes that are not one, or a version other than 0."""
    reader = _Reader(bytes(data), f"consumer group record value (type {kind})")
    version = reader.int16()
    if version != 0:
        raise CorruptMessage(f"unknown version {version} of consumer group record type {kind}")
    value: ConsumerValue | None
    if kind == GROUP_METADATA:
        value = GroupMetadata(epoch=reader.int32())
    elif kind == TARGET_METADATA:
        value = TargetMetadata(assignment_epoch=reader.int32())
    elif kind == MEMBER_METADATA:
        instance, rack = reader.cstr(nullable=True), reader.cstr(nullable=True)
        client_id, client_host = reader.cstr() or "", reader.cstr() or ""
        topics = tuple(reader.cstr() or "" for _ in range(reader.count()))
        value = MemberMetadata(instance_id=instance, rack_id=rack, client_id=client_id, client_host=client_host,
                               subscribed_topic_names=topics, subscribed_topic_regex=reader.cstr(nullable=True),
                               rebalance_timeout_ms=reader.int32(), server_assignor=reader.cstr(nullable=True))
        tagged = reader.tags().get(0)
        if tagged is not None:
            value = replace(value, classic=_read_classic(_Reader(tagged, reader.what)))
        return value
    elif kind == TARGET_MEMBER:
        value = TargetMember(partitions=reader.topic_partitions())
    elif kind == CURRENT_MEMBER:
        value = CurrentMember(member_epoch=reader.int32(), previous_member_epoch=reader.int32(), state=reader.int8(),
                              assigned=reader.topic_partitions(), pending_revocation=reader.topic_partitions())
    else:
        return None
    reader.skip_tags()
    return value
