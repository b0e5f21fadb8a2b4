"""Record-batch compression codecs (RecordBatch v2 attributes bits 0-2), byte-compatible with Kafka.

    codec   id  lowtide  writes (what Kafka's Java producer writes)         reads
    NONE    0   yes      -                                                 -
    GZIP    1   yes      one gzip member, deflate level 6                  gzip members back to back, or zlib
    SNAPPY  2   refused  UNSUPPORTED_FOR_MESSAGE_FORMAT: Kafka's snappy is snappy-java's xerial framing,
                         not implemented here
    LZ4     3   yes      one LZ4 frame as Lz4BlockOutputStream writes it   one LZ4 frame: block checksums on
                         (FLG 0x60: version 01, independent blocks, no     or off, content size and content
                         checksums, no content size; BD 0x40: 64 KiB       checksum optional, any block size;
                         blocks; HC 0x82), each 64 KiB block compressed    linked blocks refused (Kafka
                         alone by the fast compressor (lz4-java's          refuses them); nothing after
                         fastCompressor) or stored raw when that does      the frame
                         not shrink it (size's high bit), end mark 0
    ZSTD    4   yes      one zstd frame at level 3 as zstd-jni's           zstd frames back to back (and
                         streaming compressor writes it: no content        skippable frames), with or without
                         size, no checksum, window 2 MiB                   content size or checksum; nothing
                                                                           after them

Magic 2 only: the broken LZ4 header checksum of Kafka 0.8-0.10 (HC over the magic too) belongs to
message format v0, so a RecordBatch v2 LZ4 body is a standard LZ4 frame that any LZ4 reader takes.

Libraries: ``zlib`` (standard library); ``lz4`` (liblz4: ``lz4.block`` compresses the blocks of the
frame written here, ``lz4.frame`` reads frames); ``zstandard`` (libzstd). ``lz4`` and ``zstandard``
are imported on first use, so code that never meets those codecs does not load them; when one is
missing its codec is UNSUPPORTED_FOR_MESSAGE_FORMAT, naming the package.

``decompress(..., max_size=N)`` (the leader validating a produced batch) bounds what the data may
inflate to and never allocates much more than that: a few KiB of any codec can claim gigabytes.
"""

from __future__ import annotations

import importlib
import struct
import threading
import zlib
from enum import IntEnum
from types import ModuleType

from lowtide.errors import CorruptMessage, MessageTooLarge, UnsupportedForMessageFormat


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


# The codecs lowtide reads and writes.
SUPPORTED = frozenset({Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD})
# Kafka's compression.type names (producer config) of the supported codecs.
BY_NAME: dict[str, Compression] = {"none": Compression.NONE, "gzip": Compression.GZIP,
                                   "lz4": Compression.LZ4, "zstd": Compression.ZSTD}

_GZIP_WBITS = 31  # zlib: 16 + 15 = gzip container, which is what Kafka's GZIP codec writes
_AUTO_WBITS = 47  # zlib: 32 + 15 = accept gzip or zlib container

ZSTD_LEVEL = 3  # Kafka's default compression.zstd.level (zstd's own default)
_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK, _ZSTD_SKIPPABLE = 0xFFFFFFF0, 0x184D2A50
_ZSTD_BLOCK_MAX = 128 << 10  # a compressed zstd block never regenerates more
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
# Magic, FLG 0x60 (version 01, independent blocks, no checksums, no content size), BD 0x40 (64 KiB
# blocks), HC 0x82 = (XXH32 of FLG BD >> 8) & 0xFF: a constant, since Kafka's FLG and BD are.
_LZ4_KAFKA_HEADER = _LZ4_MAGIC + b"\x60\x40\x82"
_LZ4_BLOCK_SIZE = 64 << 10
_LZ4_UNCOMPRESSED = 0x80000000
_LZ4_END_MARK = b"\x00\x00\x00\x00"
_UINT32_LE = struct.Struct("<I")


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress a batch's record bytes with ``codec`` (GZIP, LZ4 or ZSTD), as Kafka's producer does."""
    if codec == Compression.GZIP:
        comp = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
        return comp.compress(data) + comp.flush()
    if codec == Compression.LZ4:
        return _lz4_kafka_frame(data)
    if codec == Compression.ZSTD:
        # The streaming API, as zstd-jni's ZstdOutputStream in Kafka: the source size is not known
        # up front, so the frame carries no content size and keeps level 3's window.
        cobj = _zstd_compressor().compressobj()
        return cobj.compress(data) + cobj.flush()
    raise UnsupportedForMessageFormat(describe_unsupported(codec))


def decompress(codec: int, data: bytes | memoryview, *, max_size: int | None = None) -> bytes:
    """Decompress a batch's record bytes; CORRUPT_MESSAGE when they do not decompress.

    LZ4 and ZSTD data must be whole (one LZ4 frame; zstd frames) with nothing after it; GZIP data is
    held to the same (gzip members one after another, as Java's GZIPInputStream reads them) with
    ``max_size``. ``max_size`` (the leader validating a produced batch) is the most the data may
    inflate to (MESSAGE_TOO_LARGE otherwise): inflating stops at the limit instead of after
    allocating everything the data claims.
    """
    if codec == Compression.GZIP:
        if max_size is None:
            try:
                return zlib.decompress(data, _AUTO_WBITS)
            except zlib.error as exc:
                raise CorruptMessage(f"gzip record data does not decompress: {exc}") from None
        return _gunzip_bounded(data, max_size)
    if codec == Compression.LZ4:
        return _unlz4(data, max_size)
    if codec == Compression.ZSTD:
        return _unzstd(data, max_size)
    raise UnsupportedForMessageFormat(describe_unsupported(codec))


def readable(codec: int) -> bool:
    """Whether this process can decompress ``codec``: NONE and GZIP always, LZ4 and ZSTD when
    their library is installed."""
    if codec in (Compression.NONE, Compression.GZIP):
        return True
    loader = {Compression.LZ4: _lz4, Compression.ZSTD: _zstandard}.get(codec)
    if loader is None:
        return False
    try:
        loader()
    except UnsupportedForMessageFormat:
        return False
    return True


def describe_unsupported(codec: int) -> str:
    try:
        name = Compression(codec).name
    except ValueError:
        return f"unknown compression codec {codec} (attributes bits 0-2)"
    return f"compression {name} is not supported by lowtide; use NONE, GZIP, LZ4 or ZSTD"


# ---------------------------------------------------------------------------------------------------
# gzip


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


# ---------------------------------------------------------------------------------------------------
# LZ4 (frame format)


def _lz4_kafka_frame(data: bytes | bytearray | memoryview) -> bytes:
    """One LZ4 frame as Kafka's Lz4BlockOutputStream writes it (module doc). Each 64 KiB block is
    compressed on its own by liblz4's one-shot fast compressor, as lz4-java's fastCompressor does:
    LZ4F's own framer reuses its context between blocks and limits the output, and its blocks come
    out a few bytes different."""
    compress_block = _lz4_block().compress
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    parts = [_LZ4_KAFKA_HEADER]
    for start in range(0, len(view), _LZ4_BLOCK_SIZE):
        chunk = view[start:start + _LZ4_BLOCK_SIZE]
        packed = compress_block(chunk, mode="default", store_size=False)
        if len(packed) >= len(chunk):  # incompressible: stored raw, flagged in the size's high bit
            parts += (_UINT32_LE.pack(len(chunk) | _LZ4_UNCOMPRESSED), chunk)
        else:
            parts += (_UINT32_LE.pack(len(packed)), packed)
    parts.append(_LZ4_END_MARK)
    return b"".join(parts)


def _unlz4(data: bytes | memoryview, max_size: int | None) -> bytes:
    lz4_frame = _lz4()
    bound = lz4_frame_bound(data)
    limit = bound if max_size is None else min(bound, max_size)
    inflater = lz4_frame.LZ4FrameDecompressor()
    try:
        # One output buffer of limit + 1 bytes: never what a lying header or block claims.
        out = inflater.decompress(data, max_length=limit + 1)
    except RuntimeError as exc:  # python-lz4 reports every LZ4F error this way
        raise CorruptMessage(f"lz4 record data does not decompress: {exc}") from None
    if max_size is not None and len(out) > max_size:
        raise MessageTooLarge(f"lz4 record data inflates to more than {max_size} bytes")
    if not inflater.eof:  # (the walk saw the whole frame: only a block that lied gets here)
        raise CorruptMessage("lz4 record data is truncated: the LZ4 frame does not end")
    return out


def lz4_frame_bound(data: bytes | memoryview) -> int:
    """Walk the LZ4 frame of ``data`` by its descriptor and block sizes (no decompression) and return
    an upper bound of what it inflates to: a raw block its size, a compressed one the frame's
    maximum block size.

    CORRUPT_MESSAGE unless ``data`` is exactly one whole frame with independent blocks (Kafka's
    Lz4BlockInputStream reads one frame and refuses linked blocks; liblz4 alone would take both,
    and would return what a truncated frame holds).
    """
    n = len(data)
    if n < 7 or bytes(data[:4]) != _LZ4_MAGIC:
        raise CorruptMessage("lz4 record data is not an LZ4 frame (magic 04 22 4d 18 expected)")
    flg, bd = data[4], data[5]
    if not flg & 0x20:
        raise CorruptMessage(f"lz4 record data uses dependent blocks (FLG {flg:#04x}), which Kafka does not read")
    block_size_id = (bd >> 4) & 7
    if block_size_id < 4:
        raise CorruptMessage(f"lz4 record data does not decompress: invalid block size in BD {bd:#04x}")
    block_max = 1 << (2 * block_size_id + 8)
    block_checksum = 4 if flg & 0x10 else 0
    pos = 7 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)  # content size, dictionary id
    bound = 0
    truncated = "lz4 record data is truncated: the LZ4 frame does not end"
    while True:
        if n - pos < 4:
            raise CorruptMessage(truncated)
        size = int.from_bytes(data[pos:pos + 4], "little")
        pos += 4
        if size == 0:  # end mark
            break
        stored = size & _LZ4_UNCOMPRESSED
        size &= ~_LZ4_UNCOMPRESSED
        pos += size + block_checksum
        if pos > n:
            raise CorruptMessage(truncated)
        bound += size if stored else block_max
    if flg & 0x04:  # content checksum
        pos += 4
        if pos > n:
            raise CorruptMessage(truncated)
    if pos != n:
        raise CorruptMessage(f"lz4 record data does not decompress: {n - pos} bytes after the end of the LZ4 frame")
    return bound


# ---------------------------------------------------------------------------------------------------
# ZSTD


def _unzstd(data: bytes | memoryview, max_size: int | None) -> bytes:
    zstandard = _zstandard()
    bound = zstd_frames_bound(data)
    if bound == 0:
        return b""
    limit = bound if max_size is None else min(bound, max_size)
    try:
        # A reader over the whole input: decompresses into one buffer of limit + 1 bytes, never more.
        with _zstd_decompressor().stream_reader(data, read_across_frames=True) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        raise CorruptMessage(f"zstd record data does not decompress: {exc}") from None
    if max_size is not None and len(out) > max_size:
        raise MessageTooLarge(f"zstd record data inflates to more than {max_size} bytes")
    return out


def zstd_frames_bound(data: bytes | memoryview) -> int:
    """Walk the zstd frames of ``data`` by their headers and block headers (no decompression) and
    return an upper bound of what they inflate to.

    CORRUPT_MESSAGE unless ``data`` is whole frames back to back (zstd or skippable) and nothing else:
    the decompressor alone would return what a truncated frame holds without a word. One step per
    block of at most 128 KiB, so the walk costs nothing next to the decompression.
    """
    n = len(data)
    if n == 0:
        raise CorruptMessage("zstd record data is empty: at least one zstd frame is required")
    pos = 0
    bound = 0
    truncated = "zstd record data is truncated: the frame at byte {} does not end"
    while pos < n:
        start = pos
        if n - pos < 4:
            raise CorruptMessage(truncated.format(start))
        magic = int.from_bytes(data[pos:pos + 4], "little")
        if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE:
            if n - pos < 8:
                raise CorruptMessage(truncated.format(start))
            pos += 8 + int.from_bytes(data[pos + 4:pos + 8], "little")
            if pos > n:
                raise CorruptMessage(truncated.format(start))
            continue
        if magic != _ZSTD_MAGIC:
            raise CorruptMessage(f"zstd record data does not decompress: no zstd frame at byte {pos} "
                                 f"(magic {magic:#010x})")
        pos += 4
        if pos >= n:
            raise CorruptMessage(truncated.format(start))
        descriptor = data[pos]
        pos += 1
        if descriptor & 0x08:
            raise CorruptMessage(f"zstd record data does not decompress: reserved bit set in the frame at byte {start}")
        single_segment = bool(descriptor & 0x20)
        content_size_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
        pos += (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3] + content_size_bytes
        while True:
            if n - pos < 3:
                raise CorruptMessage(truncated.format(start))
            block = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            pos += 3
            kind, size = (block >> 1) & 3, block >> 3
            if kind == 0:  # raw
                pos += size
                bound += size
            elif kind == 1:  # RLE: one byte, repeated size times
                pos += 1
                bound += size
            elif kind == 2:  # compressed
                pos += size
                bound += _ZSTD_BLOCK_MAX
            else:
                raise CorruptMessage(f"zstd record data does not decompress: reserved block type at byte {pos - 3}")
            if pos > n:
                raise CorruptMessage(truncated.format(start))
            if block & 1:  # last block
                break
        if descriptor & 0x04:  # content checksum
            pos += 4
            if pos > n:
                raise CorruptMessage(truncated.format(start))
    return bound


# ---------------------------------------------------------------------------------------------------
# Libraries, loaded on first use; zstd contexts are per thread (they are not thread-safe).

_modules: dict[str, ModuleType] = {}
_local = threading.local()


def _load(module: str, package: str, codec: str) -> ModuleType:
    loaded = _modules.get(module)
    if loaded is None:
        try:
            loaded = _modules[module] = importlib.import_module(module)
        except ImportError:
            raise UnsupportedForMessageFormat(
                f"compression {codec} needs the Python package {package}, which is not installed "
                f"(pip install -e . or make setup installs it)") from None
    return loaded


def _lz4() -> ModuleType:
    return _load("lz4.frame", "lz4", "LZ4")


def _lz4_block() -> ModuleType:
    return _load("lz4.block", "lz4", "LZ4")


def _zstandard() -> ModuleType:
    return _load("zstandard", "zstandard", "ZSTD")


def _zstd_compressor():
    cctx = getattr(_local, "zstd_compressor", None)
    if cctx is None:
        cctx = _local.zstd_compressor = _zstandard().ZstdCompressor(
            level=ZSTD_LEVEL, write_content_size=False, write_checksum=False)
    return cctx


def _zstd_decompressor():
    dctx = getattr(_local, "zstd_decompressor", None)
    if dctx is None:
        dctx = _local.zstd_decompressor = _zstandard().ZstdDecompressor()
    return dctx
