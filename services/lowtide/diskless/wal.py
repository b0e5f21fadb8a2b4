"""WAL files of diskless topics (KIP-1164): one object per flush of a broker's produce buffer.

Object key ``wal/<32 hex digits>`` (a random Uuid: two brokers never pick the same key, and a
retried upload of the same buffer reuses its key). Object format 1 (WRITE_AHEAD_MULTI_SEGMENT)::

    offset 0                                                        file_size
    +---------------------+---------------------+-----+---------------------+
    | RecordBatch v2 #0   | RecordBatch v2 #1   | ... | RecordBatch v2 #n-1 |
    +---------------------+---------------------+-----+---------------------+
      any partition, any producer, back to back, no header, no padding, no footer

    each batch exactly as the producer sent it (validated first):
      BaseOffset int64          the producer's (normally 0); NOT the assigned offset
      BatchLength int32 | PartitionLeaderEpoch int32 | Magic int8 (= 2) | CRC uint32 | ...
      (lowtide.record.batch draws the whole 61-byte header)

Where each batch sits (byte offset, size), which partition it belongs to and which offsets the
coordinator assigned live only in the coordinators' metadata (CommitFile / FindBatches), never in
the file: a file is written once, whole, before any offset is known. A reader rewrites BaseOffset
to the assigned offset after a ranged read; BaseOffset precedes the CRC-covered bytes, so the CRC
stays valid. Crash safety: ``ObjectStore.put`` is atomic (a reader sees all of the file or none),
and a file is referenced only by a commit made after its upload completed; a file uploaded and
never committed is an orphan the orphan scanner removes.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable

WAL_PREFIX = "wal/"
_BASE_OFFSET = struct.Struct(">q")


def new_object_key() -> str:
    return f"{WAL_PREFIX}{uuid.uuid4().hex}"


class WalFileBuilder:
    """Lays out the batches of one WAL file. Not thread-safe: the produce buffer's lock guards it."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.size = 0

    def add(self, batch: bytes | memoryview) -> int:
        """Append one batch (or several back to back); returns its byte offset in the file."""
        offset = self.size
        self._parts.append(bytes(batch))
        self.size += len(batch)
        return offset

    def build(self) -> bytes:
        return b"".join(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


def rewrite_base_offsets(data: bytearray, placements: Iterable[tuple[int, int]]) -> None:
    """Set BaseOffset of the batch starting at each ``position`` of ``data`` to ``base_offset``
    (one 8-byte write per batch; the CRC does not cover it)."""
    pack = _BASE_OFFSET.pack_into
    for position, base_offset in placements:
        pack(data, position, base_offset)
