"""Records of ``__transaction_state`` in Kafka's own format (the transaction coordinator's log), and
the transactional id -> partition mapping.

One record per state change of a transactional id: the key names the id, the value is its whole
state after the change, and a null value (a tombstone) forgets the id (transactional.id.expiration.ms),
so the topic is compacted down to each id's latest state. The bytes are Kafka's
(``TransactionLogKey`` / ``TransactionLogValue`` v0), so Kafka's own readers of the topic read them.

All integers are big-endian; a ``string`` is an int16 length then UTF-8 bytes.

TransactionLogKey (the record key; the leading int16 is the record type, 0)::

    +---------+-------------------------+
    | type    | transactional_id        |
    | int16=0 | int16 len | utf-8       |
    +---------+-------------------------+
      00 00     00 04  74 78 2d 31          ("tx-1")

TransactionLogValue, version 0 (the record value; null = tombstone)::

    +---------+-------------+----------------+------------+--------+
    | version | producer_id | producer_epoch | timeout_ms | status |
    | int16=0 | int64       | int16          | int32      | int8   |
    +---------+-------------+----------------+------------+--------+
    | partitions: int32 count (-1 = null), then per topic:         |
    |   topic: int16 len | utf-8;  partition_ids: int32 count, int32 each |
    +---------------------------+----------------------------------+
    | last_update_timestamp_ms  | start_timestamp_ms               |
    | int64                     | int64 (-1: no transaction)       |
    +---------------------------+----------------------------------+

    status: 0 Empty, 1 Ongoing, 2 PrepareCommit, 3 PrepareAbort, 4 CompleteCommit,
            5 CompleteAbort, 6 Dead, 7 PrepareEpochFence (Kafka's TransactionState ids).

TransactionLogValue, version 1 (flexible): the same fields in the same order, with compact
strings and arrays (uvarint length + 1) and tagged fields after each partition entry and at the
end. lowtide writes it for a transaction of transactions version 2 (KIP-890) and version 0 for
every other, so a version-1 client's records are what they were::

    +---------+-------------+----------------+------------+--------+
    | version | producer_id | producer_epoch | timeout_ms | status |
    | int16=1 | int64       | int16          | int32      | int8   |
    +---------+-------------+----------------+------------+--------+
    | partitions: uvarint count + 1 (0 = null), then per topic:            |
    |   topic: uvarint len + 1 | utf-8;  partition_ids: uvarint count + 1, |
    |   int32 each;  tagged fields: uvarint 0                              |
    +---------------------------+------------------------------------------+
    | last_update_timestamp_ms  | start_timestamp_ms                       |
    | int64                     | int64                                    |
    +---------------------------+------------------------------------------+
    | tagged fields: uvarint count, then per field (by tag, ascending, only |
    | those not at their default): uvarint tag | uvarint size | value       |
    |   tag 0  previous_producer_id        int64 (default -1)               |
    |   tag 1  next_producer_id            int64 (default -1)               |
    |   tag 2  client_transaction_version  int16 (default 0)                |
    +-----------------------------------------------------------------------+
      ... 00000000000003e8 00000000000002ee  01 02 02 0002
      (last update 1000, start 750; one tagged field: tag 2, 2 bytes, transaction version 2)

Partition of a transactional id (Kafka's ``TransactionStateManager.partitionFor``)::

    partition = Utils.abs(transactionalId.hashCode()) % transaction.state.log.num.partitions
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from lowtide.errors import CorruptMessage
from lowtide.groups.codec import java_string_hash
from lowtide.record.varint import encode_uvarint

TXN_STATE_TOPIC = "__transaction_state"
KEY_TYPE = 0
STATUS_IDS = {"Empty": 0, "Ongoing": 1, "PrepareCommit": 2, "PrepareAbort": 3, "CompleteCommit": 4,
              "CompleteAbort": 5, "Dead": 6, "PrepareEpochFence": 7}
STATUS_NAMES = {v: k for k, v in STATUS_IDS.items()}
_HEAD = struct.Struct(">hqhib")  # version, producer id, epoch, timeout, status
_TAIL = struct.Struct(">qq")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class TxnLogValue:
    """One transactional id's state as the log holds it."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str
    partitions: frozenset[tuple[str, int]]
    last_update_ms: int
    start_ms: int
    # KIP-890's tagged fields (version 1 only; their defaults mean "absent").
    transaction_version: int = 0
    previous_producer_id: int = -1
    next_producer_id: int = -1

    @property
    def flexible(self) -> bool:
        """Whether it is written as version 1: a transactions-version-2 state, or one carrying a
        producer id change (only such states have them)."""
        return self.transaction_version >= 2 or self.previous_producer_id >= 0 or self.next_producer_id >= 0


def partition_for_transactional_id(transactional_id: str, *, partitions: int) -> int:
    h = java_string_hash(transactional_id)
    return (0 if h == -(2**31) else abs(h)) % partitions


def _string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0x7FFF:
        raise CorruptMessage(f"string of {len(raw)} bytes does not fit a Kafka string")
    return _INT16.pack(len(raw)) + raw


def encode_txn_key(transactional_id: str) -> bytes:
    return _INT16.pack(KEY_TYPE) + _string(transactional_id)


def decode_txn_key(data: bytes) -> str | None:
    """The transactional id of a key; None for a record type this coordinator does not write."""
    if len(data) < 4:
        raise CorruptMessage(f"__transaction_state key of {len(data)} bytes")
    (kind,) = _INT16.unpack_from(data, 0)
    if kind != KEY_TYPE:
        return None
    (size,) = _INT16.unpack_from(data, 2)
    if size < 0 or 4 + size > len(data):
        raise CorruptMessage(f"__transaction_state key: string of {size} bytes in {len(data)}")
    return data[4:4 + size].decode()


def encode_txn_value(value: TxnLogValue) -> bytes:
    """Version 1 when ``value.flexible``, else version 0 (module docstring)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(value.partitions):
        by_topic.setdefault(topic, []).append(partition)
    flexible = value.flexible
    out = [_HEAD.pack(1 if flexible else 0, value.producer_id, value.producer_epoch, value.timeout_ms,
                      STATUS_IDS[value.state])]
    if not flexible:
        out.append(_INT32.pack(len(by_topic)))
        for topic, ids in by_topic.items():
            out += [_string(topic), _INT32.pack(len(ids)), struct.pack(f">{len(ids)}i", *ids)]
        out.append(_TAIL.pack(value.last_update_ms, value.start_ms))
        return b"".join(out)
    out.append(encode_uvarint(len(by_topic) + 1))
    for topic, ids in by_topic.items():
        raw = topic.encode()
        out += [encode_uvarint(len(raw) + 1), raw, encode_uvarint(len(ids) + 1),
                struct.pack(f">{len(ids)}i", *ids), b"\0"]
    out.append(_TAIL.pack(value.last_update_ms, value.start_ms))
    tags = [(tag, data) for tag, data, present in (
        (0, _INT64.pack(value.previous_producer_id), value.previous_producer_id != -1),
        (1, _INT64.pack(value.next_producer_id), value.next_producer_id != -1),
        (2, _INT16.pack(value.transaction_version), value.transaction_version != 0)) if present]
    out.append(encode_uvarint(len(tags)))
    for tag, data in tags:
        out += [encode_uvarint(tag), encode_uvarint(len(data)), data]
    return b"".join(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: struct.Struct) -> tuple:
        if self.pos + fmt.size > len(self.data):
            raise CorruptMessage(f"__transaction_state value ends at byte {len(self.data)}, "
                                 f"inside a field at {self.pos}")
        out = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return out

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            if self.pos >= len(self.data):
                raise CorruptMessage("__transaction_state value ends inside a varint")
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def string(self, *, compact: bool) -> str:
        size = self.uvarint() - 1 if compact else self.take(_INT16)[0]
        if size < 0 or self.pos + size > len(self.data):
            raise CorruptMessage(f"__transaction_state value: string of {size} bytes at {self.pos}")
        text = self.data[self.pos:self.pos + size].decode()
        self.pos += size
        return text

    def count(self, *, compact: bool) -> int:
        return self.uvarint() - 1 if compact else self.take(_INT32)[0]

    def skip_tags(self) -> None:
        self.tags()

    def tags(self) -> dict[int, bytes]:
        """A tagged-field section: tag -> its value's bytes."""
        out = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            size = self.uvarint()
            if self.pos + size > len(self.data):
                raise CorruptMessage(f"__transaction_state value: tagged field {tag} of {size} bytes at {self.pos}")
            out[tag] = self.data[self.pos:self.pos + size]
            self.pos += size
        return out


def decode_txn_value(data: bytes) -> TxnLogValue:
    """A value of version 0 or 1; CORRUPT_MESSAGE when it is neither or is cut short."""
    r = _Reader(data)
    (version,) = r.take(_INT16)
    if version not in (0, 1):
        raise CorruptMessage(f"__transaction_state value of version {version}; known: 0, 1")
    compact = version == 1
    producer_id, = r.take(struct.Struct(">q"))
    epoch, timeout_ms, status = r.take(struct.Struct(">hib"))
    partitions: list[tuple[str, int]] = []
    for _ in range(max(0, r.count(compact=compact))):
        topic = r.string(compact=compact)
        for _ in range(max(0, r.count(compact=compact))):
            partitions.append((topic, r.take(_INT32)[0]))
        if compact:
            r.skip_tags()
    last_update_ms, start_ms = r.take(_TAIL)
    tags = r.tags() if compact else {}
    if status not in STATUS_NAMES:
        raise CorruptMessage(f"__transaction_state value with unknown status {status}")
    return TxnLogValue(producer_id=producer_id, producer_epoch=epoch, timeout_ms=timeout_ms,
                       state=STATUS_NAMES[status], partitions=frozenset(partitions),
                       last_update_ms=last_update_ms, start_ms=start_ms,
                       previous_producer_id=_tag_int(tags, 0, _INT64, -1),
                       next_producer_id=_tag_int(tags, 1, _INT64, -1),
                       transaction_version=_tag_int(tags, 2, _INT16, 0))


def _tag_int(tags: dict[int, bytes], tag: int, fmt: struct.Struct, default: int) -> int:
    data = tags.get(tag)
    if data is None:
        return default
    if len(data) != fmt.size:
        raise CorruptMessage(f"__transaction_state value: tagged field {tag} of {len(data)} bytes, not {fmt.size}")
    return fmt.unpack(data)[0]
