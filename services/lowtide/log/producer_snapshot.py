"""Producer-state snapshots (Kafka's ``<offset>.snapshot`` files): the state of
``producer_state.py`` for the batches of a log below an offset, so that opening the log reads the
snapshot and the batch headers after it instead of every header, and keeps the producers whose
batches retention or DeleteRecords removed.

Format, version 100 (lowtide's own; integers big-endian, like every lowtide file)::

    offset  size  field
    0       2     version                   int16   100
    2       4     crc                       uint32  CRC-32C of every byte from offset 6 to the end
    6       4     producer count            int32
    10      ...   producer entries, by producer id (below)
    ...     4     aborted count             int32
    ...     24*n  aborted transactions, in marker order (below)

    producer entry, 47 + 32 * batch count bytes:
    +0      8     producer_id               int64
    +8      2     producer_epoch            int16
    +10     4     last_sequence             int32   -1: none
    +14     8     last_offset               int64   its last data offset, -1: none
    +22     4     offset_delta              int32   last retained batch's last - first offset, 0: none
    +26     8     timestamp                 int64   largest timestamp of its batches (expiry)
    +34     4     coordinator_epoch         int32   always -1 (lowtide does not track it)
    +38     8     current_txn_first_offset  int64   -1: no ongoing transaction
    +46     1     batch count               int8    0..5
    +47     32*n  retained batches, oldest first:
                    first_sequence int32, last_sequence int32,
                    first_offset int64, last_offset int64, max_timestamp int64

    aborted transaction, 24 bytes:
    +0      8     producer_id               int64
    +8      8     first_offset              int64
    +16     8     last_offset               int64   its ABORT marker's offset

Why not Kafka's version 1 byte for byte: Kafka's entry is the first 46 bytes of ours (same fields,
same order), but it keeps only a producer's last batch, so after a restart Kafka answers a retry
of any of the 4 batches before it OUT_OF_ORDER_SEQUENCE_NUMBER; lowtide keeps all 5
(``NUM_BATCHES_TO_RETAIN``) so a state read from a snapshot is the state a full rebuild gives.
And Kafka keeps the aborted transactions in per-segment ``.txnindex`` files, which lowtide does
not have: they come with the snapshot (24 bytes per aborted transaction the log still holds, in
every snapshot), because a read_committed fetch below the snapshot needs them and the point of
the snapshot is not to read the headers below it. 100 is far from Kafka's 1 so that neither is
ever read as the other.

Files: ``<20-digit offset>.snapshot`` (``filenames.py``), the state of the batches below that offset.
Written at each segment roll (the new segment's base offset) and on clean shutdown (the log end
offset): ``.tmp``, fsync, rename, directory fsync. A snapshot is used only for the log it was
written from: when the log loses its tail (a follower truncation, a torn tail cut after a crash),
the snapshots above its new end are deleted before anything else is written, and a snapshot below
the first segment is never used (the batches between it and the first segment are gone, so its
sequences could be stale: a producer whose last batches were there would be refused its next one).
A file whose version, crc or counts are wrong is ignored with a warning and deleted; the state is
then read from an older snapshot, or rebuilt from every header. An aborted transaction of a
snapshot is kept only while the log still holds its ABORT marker (one 61-byte read each at open):
the cleaner removes markers past their delete horizon (KIP-534).
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from pathlib import Path

from lowtide.errors import KafkaStorageError
from lowtide.log import filenames
from lowtide.log.checkpoint import fsync_directory, write_file_atomically
from lowtide.log.producer_state import BATCHES_TO_RETAIN, AbortedTxn, BatchMetadata, ProducerEntry, ProducerStateManager
from lowtide.log.segment import LogSegment
from lowtide.record import BATCH_HEADER_SIZE, crc32c, read_header

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 100
_HEADER = struct.Struct(">hI")  # version, crc
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiqb")  # 47 bytes: Kafka's 46-byte entry, then the batch count
_BATCH = struct.Struct(">iiqqq")  # 32 bytes
_ABORTED = struct.Struct(">qqq")  # 24 bytes
_CRC_START = _HEADER.size  # 6
_NO_COORDINATOR_EPOCH = -1


class CorruptSnapshot(KafkaStorageError):
    """A snapshot file that cannot be read back (its message names the file)."""


def encode_snapshot(state: ProducerStateManager) -> bytes:
    """The bytes of a snapshot of ``state`` (module docstring)."""
    producers = state.entries()
    body = bytearray(_COUNT.pack(len(producers)))
    for pid, entry in producers:
        batches = list(entry.batches)
        delta = batches[-1].last_offset - batches[-1].first_offset if batches else 0
        body += _ENTRY.pack(pid, entry.epoch, entry.last_sequence, entry.last_data_offset, delta,
                            entry.last_timestamp, _NO_COORDINATOR_EPOCH, entry.txn_first_offset, len(batches))
        for b in batches:
            body += _BATCH.pack(b.first_sequence, b.last_sequence, b.first_offset, b.last_offset, b.max_timestamp)
    aborted = state.all_aborted()
    body += _COUNT.pack(len(aborted))
    for txn in aborted:
        body += _ABORTED.pack(txn.producer_id, txn.first_offset, txn.last_offset)
    return _HEADER.pack(SNAPSHOT_VERSION, crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes, *, path: Path | str = "<bytes>") -> ProducerStateManager:
    """The state a snapshot's bytes hold; CorruptSnapshot naming ``path`` if the version, crc or
    counts are wrong (a torn or foreign file)."""
    if len(data) < _HEADER.size + 2 * _COUNT.size:
        raise CorruptSnapshot(f"producer snapshot {path} is truncated: {len(data)} bytes")
    version, crc = _HEADER.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshot(f"producer snapshot {path} has version {version}, expected {SNAPSHOT_VERSION}")
    actual = crc32c(memoryview(data)[_CRC_START:])
    if actual != crc:
        raise CorruptSnapshot(f"producer snapshot {path} has crc {crc:#010x} but its bytes give {actual:#010x}")
    try:
        return _decode_body(data, path)
    except struct.error as exc:  # a count pointing past the end: only a bug writes that (the crc matched)
        raise CorruptSnapshot(f"producer snapshot {path} is truncated: {exc}") from None


def _decode_body(data: bytes, path: Path | str) -> ProducerStateManager:
    pos = _CRC_START
    (count,) = _COUNT.unpack_from(data, pos)
    pos += _COUNT.size
    if count < 0:
        raise CorruptSnapshot(f"producer snapshot {path} has a producer count of {count}")
    producers: list[tuple[int, ProducerEntry]] = []
    for _ in range(count):
        pid, epoch, last_seq, last_offset, _delta, timestamp, _coord, txn_first, n = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        if not 0 <= n <= BATCHES_TO_RETAIN:
            raise CorruptSnapshot(f"producer snapshot {path} keeps {n} batches of producer {pid}, "
                                  f"at most {BATCHES_TO_RETAIN} are retained")
        end = pos + n * _BATCH.size
        batches = deque(itertools.starmap(BatchMetadata, _BATCH.iter_unpack(data[pos:end])), BATCHES_TO_RETAIN)
        pos = end
        producers.append((pid, ProducerEntry(epoch=epoch, last_data_offset=last_offset, last_sequence=last_seq,
                                             txn_first_offset=txn_first, last_timestamp=timestamp,
                                             batches=batches)))
    (aborted_count,) = _COUNT.unpack_from(data, pos)
    pos += _COUNT.size
    end = pos + aborted_count * _ABORTED.size
    if aborted_count < 0 or end != len(data):
        raise CorruptSnapshot(f"producer snapshot {path} holds {len(data)} bytes, but its counts "
                              f"({count} producers, {aborted_count} aborted transactions) describe {end}")
    aborted = [AbortedTxn(*_ABORTED.unpack_from(data, p)) for p in range(pos, end, _ABORTED.size)]
    return ProducerStateManager.restore(producers=producers, aborted=aborted)


class ProducerSnapshots:
    """The snapshot files of one partition directory, by offset.

    Contract: ``offsets`` lists the files present (read once from the directory, then kept in
    step with every write and removal made here); ``write`` replaces or adds one crash-safely;
    removals unlink at once except ``take_below``, which hands the paths to the caller (the log
    deletes them with the segments they went with).

    Not thread-safe: the owning PartitionLog calls it with its lock held.
    """

    def __init__(self, dir: Path) -> None:
        self._dir = dir
        try:
            names = os.listdir(dir)
        except OSError as exc:
            raise KafkaStorageError(f"cannot list producer snapshots of {dir}: {exc}") from exc
        found = (filenames.parse_snapshot_offset(name) for name in names)
        self._offsets = sorted(offset for offset in found if offset is not None)

    def path(self, offset: int) -> Path:
        return self._dir / filenames.snapshot_file_name(offset)

    def offsets(self) -> list[int]:
        return list(self._offsets)

    def latest(self) -> int | None:
        return self._offsets[-1] if self._offsets else None

    def write(self, state: ProducerStateManager, *, offset: int) -> None:
        """Write the snapshot of ``state`` as that of the batches below ``offset``."""
        write_file_atomically(self.path(offset), encode_snapshot(state))
        if offset not in self._offsets:
            self._offsets.append(offset)
            self._offsets.sort()

    def read(self, offset: int) -> ProducerStateManager:
        path = self.path(offset)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CorruptSnapshot(f"cannot read producer snapshot {path}: {exc}") from exc
        return decode_snapshot(data, path=path)

    def remove(self, offsets: Iterable[int]) -> bool:
        """Unlink the snapshots at ``offsets`` now; whether any file went."""
        gone = set(offsets)
        for offset in gone:
            self.path(offset).unlink(missing_ok=True)
        before = len(self._offsets)
        self._offsets = [o for o in self._offsets if o not in gone]
        return len(self._offsets) != before

    def remove_above(self, offset: int) -> bool:
        """Unlink the snapshots of offsets above ``offset`` (the log no longer holds that history)."""
        return self.remove([o for o in self._offsets if o > offset])

    def take_below(self, offset: int) -> list[Path]:
        """Forget the snapshots below ``offset`` and return their paths for the caller to unlink."""
        below = [o for o in self._offsets if o < offset]
        self._offsets = self._offsets[len(below):]
        return [self.path(o) for o in below]


def load_producer_state(*, segments: list[LogSegment], snapshots: ProducerSnapshots) -> ProducerStateManager:
    """The producer state of a log just opened (``segments`` in order, the last one recovered): the
    newest valid snapshot at or below its end plus the headers after it, or every header.

    First drops the snapshots that describe another history (above the log end: a tail cut off by
    recovery or lost in a crash) and those below the first segment (module docstring), durably,
    before anything new can be written under those names."""
    first, end = segments[0].base_offset, segments[-1].next_offset
    stale = snapshots.take_below(first)
    for path in stale:
        path.unlink(missing_ok=True)
    if snapshots.remove_above(end) or stale:
        fsync_directory(snapshots.path(0).parent)
    for offset in reversed(snapshots.offsets()):
        try:
            state = snapshots.read(offset)
        except CorruptSnapshot as exc:
            log.warning("%s: ignored, the producer state is read from the log instead", exc)
            snapshots.remove([offset])
            continue
        state.retain_aborted(lambda txn: _marker_present(segments, txn))
        state.replay(segments, from_offset=offset)
        return state
    return ProducerStateManager.rebuild(segments)


def _marker_present(segments: list[LogSegment], txn: AbortedTxn) -> bool:
    """Whether the log still holds ``txn``'s ABORT marker: one 61-byte read. The cleaner removes
    markers past their delete horizon (KIP-534) without telling the snapshots that index them;
    Kafka's cleaner rewrites the .txnindex of the segments it cleans instead."""
    i = bisect_right([s.base_offset for s in segments], txn.last_offset) - 1
    if i < 0:
        return False
    segment = segments[i]
    position = segment.translate_offset(txn.last_offset)
    if position is None:
        return False
    header = read_header(segment.read(position, BATCH_HEADER_SIZE), 0)
    return (header.is_control and header.base_offset == txn.last_offset and header.record_count > 0
            and header.producer_id == txn.producer_id)
