"""Varints of the record format (KIP-98's records v2, as Kafka's ``ByteUtils``).

Layout: 7 bits per byte, least significant group first; the high bit of a byte says another
follows. A signed value (``varint``/``varlong``: record lengths, offset and timestamp deltas) is
zig-zag encoded first, so small negative values stay short::

    value    zig-zag   bytes
        0          0   00
       -1          1   01
        1          2   02
       63        126   7e
      -64        127   7f
       64        128   80 01
      300        600   d8 04

An unsigned varint (``encode_uvarint``) skips the zig-zag step (protobuf's lengths, rpc/wire.py).
Encodings of small values are precomputed: the producer encodes a length and two deltas per
record, and almost all of them are below 2**14.
"""

from __future__ import annotations

from lowtide.errors import CorruptMessage

_VARINT_TABLE_SIZE = 1 << 14


def encode_uvarint(value: int) -> bytes:
    """Unsigned varint (protobuf's and Kafka's unsigned varint): 7 bits a byte, low first."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_UVARINT_TABLE: tuple[bytes, ...] = tuple(encode_uvarint(v) for v in range(_VARINT_TABLE_SIZE))


def encode_varint(value: int) -> bytes:
    """Zig-zag varint (varlong) encoding of a signed integer."""
    z = (value << 1) ^ (value >> 63)
    if z < _VARINT_TABLE_SIZE:
        return _UVARINT_TABLE[z]
    return encode_uvarint(z)


def append_nullable_bytes(out: bytearray, value: bytes | None) -> None:
    """Append a nullable bytes field of a record (key, value, header value): its varint length
    and the bytes, or the length -1 (the one byte 01) for null."""
    if value is None:
        out += b"\x01"
    else:
        out += encode_varint(len(value))
        out += value


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varint at ``pos``; return (value, position after it)."""
    try:
        b = buf[pos]
        if b < 0x80:  # fast path: one byte
            return (b >> 1) ^ -(b & 1), pos + 1
        result = b & 0x7F
        shift = 7
        pos += 1
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                raise CorruptMessage("varint is longer than 10 bytes")
    except IndexError:
        raise CorruptMessage("record data ends inside a varint") from None
    return (result >> 1) ^ -(result & 1), pos
