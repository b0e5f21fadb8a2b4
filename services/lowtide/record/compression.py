"""Record-batch compression codecs (RecordBatch v2 attributes bits 0-2).

    codec  attributes & 0x07   lowtide
    NONE   0                   yes
    GZIP   1                   yes (gzip container, as Kafka's GZIP codec writes; zlib accepted on read)
    SNAPPY 2                   refused: UNSUPPORTED_FOR_MESSAGE_FORMAT
    LZ4    3                   refused
    ZSTD   4                   refused

The other codecs are recognised but refused, so a caller gets a clear error instead of garbage.
"""

from __future__ import annotations

import zlib
from enum import IntEnum

from lowtide.errors import CorruptMessage, MessageTooLarge, UnsupportedForMessageFormat


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_GZIP_WBITS = 31  # zlib: 16 + 15 = gzip container, which is what Kafka's GZIP codec writes
_AUTO_WBITS = 47  # zlib: 32 + 15 = accept gzip or zlib container


def compress(codec: int, data: bytes | bytearray) -> bytes:
    """Compress a batch's record bytes with ``codec`` (GZIP only)."""
    if codec == Compression.GZIP:
        comp = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
        return comp.compress(data) + comp.flush()
    raise UnsupportedForMessageFormat(describe_unsupported(codec))


def decompress(codec: int, data: bytes | memoryview, *, max_size: int | None = None) -> bytes:
    """Decompress a batch's record bytes; CORRUPT_MESSAGE when they do not decompress.

    With ``max_size`` (the leader validating a produced batch) the data must be whole gzip
    members, one after another as Java's GZIPInputStream reads them, with nothing after the last,
    and inflate to at most ``max_size`` bytes (MESSAGE_TOO_LARGE otherwise): a few KiB of gzip can
    claim gigabytes, and the limit stops inflating at the limit instead of after allocating them.
    """
    if codec == Compression.GZIP:
        if max_size is None:
            try:
                return zlib.decompress(data, _AUTO_WBITS)
            except zlib.error as exc:
                raise CorruptMessage(f"gzip record data does not decompress: {exc}") from None
        return _gunzip_bounded(data, max_size)
    raise UnsupportedForMessageFormat(describe_unsupported(codec))


def _gunzip_bounded(data: bytes | memoryview, max_size: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest: bytes | memoryview = data
    while True:
        inflater = zlib.decompressobj(_AUTO_WBITS)
        try:
            # max_length = room + 1: getting more than the room means the limit is exceeded.
            part = inflater.decompress(rest, max_size - total + 1)
        except zlib.error as exc:
            raise CorruptMessage(f"gzip record data does not decompress: {exc}") from None
        total += len(part)
        if total > max_size:
            raise MessageTooLarge(f"gzip record data inflates to more than {max_size} bytes")
        if not inflater.eof:
            raise CorruptMessage("gzip record data is truncated: the gzip stream does not end")
        parts.append(part)
        rest = inflater.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)


def describe_unsupported(codec: int) -> str:
    try:
        name = Compression(codec).name
    except ValueError:
        return f"unknown compression codec {codec} (attributes bits 0-2)"
    return f"compression {name} is not supported by lowtide; use NONE or GZIP"
