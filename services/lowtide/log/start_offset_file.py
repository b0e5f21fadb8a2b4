"""The per-partition log start offset file: the LSO made durable in one small in-place write.

Why it exists: an acknowledged low watermark must survive a crash (docs/design/invariants.md, rule
2: after a restart the LSO never goes back below an acknowledged LW), so every LSO change is durable before it is
acknowledged (leader) or reported (follower). Replacing the replica-wide checkpoint file for that
costs a file create, an fsync, a rename and a directory fsync: two or three journal commits,
0.5 ms at p50 and 8 ms at p99 on the benchmark machine. Overwriting 512 preallocated bytes with
O_DSYNC is a data-only flush (the file's size and blocks never change, so no journal commit):
0.07 ms at p50, 0.25 ms at p99. The Kafka-format ``log-start-offset-checkpoint`` is still written
periodically and on clean shutdown (docs/design/kip-107-delete-records.md#durability-of-the-lso);
on open this file, when present, is the newer truth.

File ``<partition dir>/log-start-offset`` (name from filenames.py), exactly 1024 bytes: two
512-byte slots. Write number ``n`` (1, 2, 3, ...) goes to slot ``n % 2``, so a torn write can only
damage the slot being written and the other one still holds the previous value::

    slot (512 bytes, big-endian; bytes 28..511 are zero)
    +0   magic            4 bytes   b"LTSO"
    +4   version          int8      0
    +5   reserved         3 bytes   zero
    +8   sequence         uint64    write number n, grows by one per write
    +16  log start offset int64
    +24  crc32c           uint32    CRC-32C of bytes +0..+23

Reading takes the valid slot (magic, version, CRC) with the highest sequence. The file is created
crash-safely (.tmp, fsync, rename, directory fsync) with the first value in slot 1 and slot 0
zeroed, so it is complete before the first in-place write relies on it.

Group commit. A DeleteRecords over 1,000 partitions (and the follower fetch answer that brings
those LSOs) paid one O_DSYNC flush per partition: ~0.3 ms each on a shared disk, 60% of a
replica's busy time in that benchmark. ``write(..., group=g)`` writes the slot without a flush
and ``g.flush()`` then makes every write of the group durable at once: ``syncfs`` (one flush of
the filesystem: it writes back every dirty page of it, ours among them, then flushes the device
cache) when the group holds more than ``PER_FILE_FLUSH_MAX`` files, else one ``fdatasync`` per file
(a syncfs also writes back unrelated dirty data, segments being produced, which one or two small
files should not wait for). A single fsync of one file or directory would not do: it says nothing
about the other files' data.

What keeps the two slots safe with writes that are not yet durable: **a write is issued only once
the previous write of the same file is durable** (``write`` fdatasyncs a still-unflushed previous
write first; in practice the group flushed it long before). So the slot not being written always
holds a durable value and a crash, torn write included, can only fall back to it, as with
O_DSYNC. Syncs report write-back errors through the descriptors they flush, so the descriptors a
group flushes are opened before its writes. What a crashed predecessor wrote and never flushed
may still be in the page cache, readable but not durable: the first ``read`` in a process syncs
that file's filesystem once, so nothing read back is used (reported, acknowledged) before it is
durable.
"""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

from crc32c import crc32c

from lowtide.errors import KafkaStorageError
from lowtide.log import filenames
from lowtide.log.checkpoint import SYNCFS, syncfs, write_file_atomically

MAGIC = b"LTSO"
VERSION = 0
SLOT_SIZE = 512
SLOTS = 2
FILE_SIZE = SLOT_SIZE * SLOTS
_BODY = struct.Struct(">4sb3xQq")  # magic, version, reserved, sequence, log start offset
_CRC = struct.Struct(">I")
_PAD = bytes(SLOT_SIZE - _BODY.size - _CRC.size)
# Up to this many files a group flushes each with fdatasync; above it one syncfs. Measured on the
# benchmark machine: an fdatasync of one slot 0.07-0.5 ms, a syncfs 2 ms plus the write-back of
# whatever else is dirty on the filesystem; 1,000 files: 20-55 ms by syncfs, 0.3-1.3 s file by file.
PER_FILE_FLUSH_MAX = 16


_SYNCFS = SYNCFS
# Filesystems (st_dev) this process has synced before using a value read back (module doc).
_synced_devices: set[int] = set()
_synced_lock = threading.Lock()


def _fdatasync_path(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _make_read_value_durable(fd: int, device: int) -> None:
    """Flush the file open at ``fd`` (its whole filesystem, once per process) before a value read
    from it is used."""
    if _SYNCFS is None:
        os.fdatasync(fd)
        return
    if device in _synced_devices:
        return
    with _synced_lock:  # readers on this filesystem wait until it is synced
        if device not in _synced_devices:
            syncfs(fd)
            _synced_devices.add(device)


def encode_slot(*, sequence: int, log_start_offset: int) -> bytes:
    """The 512 bytes of one slot."""
    body = _BODY.pack(MAGIC, VERSION, sequence, log_start_offset)
    return body + _CRC.pack(crc32c(body)) + _PAD


def decode_slot(data: bytes) -> tuple[int, int] | None:
    """(sequence, log start offset) of a slot, or None when it is empty, torn or foreign."""
    if len(data) < _BODY.size + _CRC.size:
        return None
    body = data[:_BODY.size]
    magic, version, sequence, log_start_offset = _BODY.unpack(body)
    if magic != MAGIC or version != VERSION:
        return None
    (crc,) = _CRC.unpack_from(data, _BODY.size)
    if crc != crc32c(body):
        return None
    return sequence, log_start_offset


class LogStartOffsetFile:
    """The durable LSO of one partition replica.

    Contract: ``write`` without a group returns only once the value is on stable storage; with a
    group the value is durable once that group's ``flush`` returned (``mark_flushed`` then
    records it). ``durable_value`` is the latest value known durable. ``read`` returns the last
    value written (or None if the file does not exist), durable by then, and raises
    KafkaStorageError, naming the path, when the file exists but holds no valid slot.

    Thread-safety: none. The owning PartitionLog calls it with its lock held, which also keeps
    the sequence numbers in order.
    """

    def __init__(self, partition_dir: Path) -> None:
        self.path = Path(partition_dir) / filenames.LOG_START_OFFSET_FILE
        self._sequence = 0
        self._value: int | None = None  # last value written
        self._durable: int | None = None  # last value known durable
        self._device: int | None = None

    @property
    def sequence(self) -> int:
        """The number of the last write (0: none yet)."""
        return self._sequence

    @property
    def durable_value(self) -> int | None:
        """The latest value known to be on stable storage (None before the first read or write)."""
        return self._durable

    def device_of(self, fd: int) -> int:
        """st_dev of the file's filesystem (what a group's syncfs must cover), given it open at ``fd``."""
        if self._device is None:
            self._device = os.fstat(fd).st_dev
        return self._device

    def read(self) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KafkaStorageError(f"cannot read log start offset file {self.path}: {exc}") from exc
        try:
            data = os.pread(fd, FILE_SIZE + 1, 0)
            if len(data) != FILE_SIZE:
                raise KafkaStorageError(
                    f"log start offset file {self.path} has {os.fstat(fd).st_size} bytes, expected {FILE_SIZE}")
            slots = [s for s in (decode_slot(data[i * SLOT_SIZE:(i + 1) * SLOT_SIZE]) for i in range(SLOTS)) if s]
            if not slots:
                raise KafkaStorageError(f"log start offset file {self.path} has no valid slot (both torn or corrupt)")
            _make_read_value_durable(fd, self.device_of(fd))
        except OSError as exc:
            raise KafkaStorageError(f"cannot read log start offset file {self.path}: {exc}") from exc
        finally:
            os.close(fd)
        sequence, log_start_offset = max(slots)
        self._sequence = sequence
        self._value = self._durable = log_start_offset
        return log_start_offset

    def create(self, log_start_offset: int) -> None:
        """Replace the file with one holding ``log_start_offset`` (crash-safe, durable)."""
        data = bytearray(FILE_SIZE)
        data[SLOT_SIZE:] = encode_slot(sequence=1, log_start_offset=log_start_offset)
        try:
            write_file_atomically(self.path, bytes(data))
        except OSError as exc:
            raise KafkaStorageError(f"cannot create log start offset file {self.path}: {exc}") from exc
        self._sequence = 1
        self._value = self._durable = log_start_offset

    def write(self, log_start_offset: int, *, group: StartOffsetSyncGroup | None = None) -> None:
        """Record ``log_start_offset`` in the slot the previous write did not use: durably now,
        or, with ``group``, without a flush (durable once the group flushed)."""
        if self._sequence == 0:
            self.create(log_start_offset)
            return
        if self._value != self._durable:
            # The previous write is not known durable yet: the slot about to be written must not
            # be the only one holding a durable value (module doc). Normally its group flushed it.
            self.flush()
        sequence = self._sequence + 1
        slot = encode_slot(sequence=sequence, log_start_offset=log_start_offset)
        try:
            if group is None:
                fd = os.open(self.path, os.O_WRONLY | os.O_DSYNC)
                try:
                    written = os.pwrite(fd, slot, (sequence % SLOTS) * SLOT_SIZE)
                finally:
                    os.close(fd)
            else:
                written = group.pwrite(self, slot, (sequence % SLOTS) * SLOT_SIZE)
        except OSError as exc:
            raise KafkaStorageError(f"cannot write log start offset file {self.path}: {exc}") from exc
        if written != SLOT_SIZE:
            raise KafkaStorageError(f"short write ({written} of {SLOT_SIZE} bytes) to {self.path}")
        self._sequence = sequence
        self._value = log_start_offset
        if group is None:
            self._durable = log_start_offset
        else:
            group.written(self, sequence)

    def flush(self) -> None:
        """Make the last write durable now (fdatasync)."""
        if self._value == self._durable:
            return
        try:
            _fdatasync_path(self.path)
        except OSError as exc:
            raise KafkaStorageError(f"cannot flush log start offset file {self.path}: {exc}") from exc
        self._durable = self._value

    def mark_flushed(self, sequence: int) -> None:
        """A group flush covering write ``sequence`` succeeded. A later write made it durable
        before overwriting anything, so only the last write needs recording."""
        if sequence == self._sequence:
            self._durable = self._value


class StartOffsetSyncGroup:
    """Writes of many log start offset files made durable by one flush (module doc: group commit).

    Contract: pass it to ``LogStartOffsetFile.write(..., group=...)``; ``flush()`` returns once
    every write made through it is on stable storage, or raises KafkaStorageError (then none of
    them counts as durable); the caller then calls each file's ``mark_flushed`` under the lock it
    writes that file with. One flush per group; ``close()`` releases the descriptors without one.

    Thread-safety: none; one thread writes through a group and flushes it. The files written stay
    owned by their logs meanwhile.
    """

    def __init__(self, *, per_file_max: int = PER_FILE_FLUSH_MAX) -> None:
        self._per_file_max = per_file_max
        self._written: list[tuple[LogStartOffsetFile, int]] = []
        self._file_fds: list[int] = []  # one per write while the group is small (fdatasync each)
        self._fs_fds: dict[int, int] = {}  # st_dev -> a directory on it, for syncfs
        self._closed = False

    def __len__(self) -> int:
        return len(self._written)

    def pwrite(self, file: LogStartOffsetFile, data: bytes, offset: int) -> int:
        """Write without a flush; for LogStartOffsetFile.write."""
        if self._closed:
            raise KafkaStorageError("log start offset sync group already flushed")
        fd = os.open(file.path, os.O_WRONLY)
        keep = len(self._written) < self._per_file_max  # the group is still small: fdatasync it
        try:
            # Descriptors are opened before the write they flush, so write-back errors of that
            # write are reported to them (errseq: an error is reported to descriptors opened before it).
            device = file.device_of(fd)
            if _SYNCFS is not None and device not in self._fs_fds:
                self._fs_fds[device] = os.open(file.path.parent, os.O_RDONLY)
            return os.pwrite(fd, data, offset)
        finally:
            if keep:
                self._file_fds.append(fd)
            else:
                os.close(fd)

    def written(self, file: LogStartOffsetFile, sequence: int) -> None:
        """For LogStartOffsetFile.write: write ``sequence`` of ``file`` went through ``pwrite``."""
        self._written.append((file, sequence))
        if len(self._written) > self._per_file_max and self._file_fds:
            # Flushed by syncfs now: the per-file descriptors are no longer needed.
            for fd in self._file_fds:
                os.close(fd)
            self._file_fds = []

    def flush(self) -> None:
        """One flush for every write of the group (fdatasync each while small, else syncfs)."""
        try:
            if not self._written:
                return
            if len(self._written) <= self._per_file_max:
                for fd in self._file_fds:
                    os.fdatasync(fd)
            elif _SYNCFS is not None:
                for fd in self._fs_fds.values():
                    syncfs(fd)
            else:  # no syncfs here (not Linux): file by file
                for file, _ in self._written:
                    _fdatasync_path(file.path)
        except OSError as exc:
            raise KafkaStorageError(
                f"cannot flush the log start offset files of {len(self._written)} partitions "
                f"(first {self._written[0][0].path}): {exc}") from exc
        finally:
            self.close()

    def close(self) -> None:
        """Release the descriptors (idempotent)."""
        self._closed = True
        fds = self._file_fds + list(self._fs_fds.values())
        self._file_fds, self._fs_fds = [], {}
        for fd in fds:
            os.close(fd)
