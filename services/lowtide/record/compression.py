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

from lowtide.errors import CorruptMessage, UnsupportedForMessageFormat


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


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    """Decompress a batch's record bytes; CORRUPT_MESSAGE when they do not decompress."""
    if codec == Compression.GZIP:
        try:
            return zlib.decompress(data, _AUTO_WBITS)
        except zlib.error as exc:
            raise CorruptMessage(f"gzip record data does not decompress: {exc}") from None
    raise UnsupportedForMessageFormat(describe_unsupported(codec))


def describe_unsupported(codec: int) -> str:
    try:
        name = Compression(codec).name
    except ValueError:
        return f"unknown compression codec {codec} (attributes bits 0-2)"
    return f"compression {name} is not supported by lowtide; use NONE or GZIP"
