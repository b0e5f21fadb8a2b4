"""Protobuf wire format, read just far enough to lift one large ``bytes`` field out of a message
without copying it.

A 1 MiB Produce request or follower Fetch answer is mostly one field: the record batches. Parsed
the usual way (``Message.FromString`` then ``.records``), those bytes are copied twice more after
gRPC hands the message over: into the upb arena, then into a new ``bytes`` on attribute access.
On this machine memory copies were the largest single item of replica CPU under produce load
(perf: ``memmove`` ~25 % of a replica, beside the kernel's page-cache copy). So the hot methods
register a deserializer that walks the wire format, keeps each ``records`` field as a
``memoryview`` of the received buffer, and lets upb parse only the rest (a few dozen bytes).

Wire format (https://protobuf.dev/programming-guides/encoding/), the part read here::

    message := field*
    field   := key value
    key     := varint                        (field_number << 3) | wire_type
    value   := varint                        wire_type 0 (int32/int64/enum/bool; negative int32
                                             is a 10-byte varint)
             | 8 bytes                       wire_type 1 (fixed64, double)
             | varint length, length bytes   wire_type 2 (string, bytes, sub-message, packed)
             | 4 bytes                       wire_type 5 (fixed32, float)
    varint  := 1 to 10 bytes, 7 bits each, little-endian groups, high bit = more follows

``split_bytes_field(raw, repeated_field=R, bytes_field=B)`` returns the message with field ``B``
removed from every element of the repeated sub-message field ``R`` (the element lengths
re-encoded), and, in element order, a view of each element's ``B`` (the last occurrence wins, as
in protobuf; an element without one gets an empty view). Groups (wire types 3 and 4) and anything
truncated raise ``WireFormatError``: the same request upb would refuse is refused.

Thread-safety: pure functions.
"""

from __future__ import annotations

from lowtide.record import encode_uvarint

_EMPTY = memoryview(b"")


class WireFormatError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint at ``pos`` (not past ``end``): (value, position after it)."""
    result = shift = 0
    while True:
        if pos >= end:
            raise WireFormatError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireFormatError("varint longer than 10 bytes")


def _skip(buf: memoryview, pos: int, end: int, wire_type: int) -> int:
    """Position after a value of ``wire_type`` starting at ``pos``."""
    if wire_type == 0:
        return read_uvarint(buf, pos, end)[1]
    if wire_type == 2:
        length, pos = read_uvarint(buf, pos, end)
        after = pos + length
    elif wire_type == 1:
        after = pos + 8
    elif wire_type == 5:
        after = pos + 4
    else:
        raise WireFormatError(f"unsupported wire type {wire_type}")
    if after > end:
        raise WireFormatError("field runs past the end of its message")
    return after


def _strip(buf: memoryview, start: int, end: int, field_number: int) -> tuple[bytes, memoryview]:
    """The sub-message in ``buf[start:end]`` without ``field_number``, and that field's bytes."""
    kept: list[memoryview] = []
    found = _EMPTY
    run = pos = start  # run: the first byte of the fields kept since the last cut
    while pos < end:
        field_start = pos
        key, pos = read_uvarint(buf, pos, end)
        wire_type = key & 7
        if key >> 3 == field_number and wire_type == 2:
            length, body = read_uvarint(buf, pos, end)
            pos = body + length
            if pos > end:
                raise WireFormatError("field runs past the end of its message")
            kept.append(buf[run:field_start])
            found = buf[body:pos]
            run = pos
        else:
            pos = _skip(buf, pos, end, wire_type)
    kept.append(buf[run:end])
    return b"".join(kept), found


def split_bytes_field(raw: bytes | memoryview, *, repeated_field: int,
                      bytes_field: int) -> tuple[bytes, list[memoryview]]:
    """``raw`` without ``bytes_field`` in the elements of ``repeated_field``, and those fields'
    views (see the module doc). The views share ``raw``'s memory."""
    buf = memoryview(raw)
    end = len(buf)
    pieces: list[bytes | memoryview] = []
    views: list[memoryview] = []
    run = pos = 0
    while pos < end:
        key, pos = read_uvarint(buf, pos, end)
        wire_type = key & 7
        if key >> 3 == repeated_field and wire_type == 2:
            key_end = pos
            length, body = read_uvarint(buf, pos, end)
            pos = body + length
            if pos > end:
                raise WireFormatError("field runs past the end of its message")
            element, found = _strip(buf, body, pos, bytes_field)
            pieces += (buf[run:key_end], encode_uvarint(len(element)), element)
            views.append(found)
            run = pos
        else:
            pos = _skip(buf, pos, end, wire_type)
    pieces.append(buf[run:end])
    return b"".join(pieces), views
