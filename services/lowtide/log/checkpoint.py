"""Kafka's text checkpoint files (``log-start-offset-checkpoint``, ``replication-offset-checkpoint``).

Format (UTF-8 text, '\\n' line ends, one space between fields; Kafka's CheckpointFile v0)::

    0                      <- version (only 0 exists)
    2                      <- number of entries that follow
    orders 0 10000         <- topic partition offset
    orders 1 5230

Entries are written sorted by (topic, partition) so the same content always gives the same bytes.
Topic names cannot contain spaces (Kafka's legal characters are [a-zA-Z0-9._-]), so splitting a line
on spaces is unambiguous.

Writes are crash-safe: the text goes to ``<name>.tmp``, which is fsynced, renamed over ``<name>``
(atomic on POSIX), then the directory is fsynced so the rename itself survives a crash. A reader
therefore sees either the old or the new file, never a mix.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from lowtide.errors import KafkaStorageError
from lowtide.log.filenames import tmp_file_name

CHECKPOINT_VERSION = 0


_deferral = threading.local()


def fsync(fd: int) -> None:
    """``os.fsync``, unless this thread is inside ``deferring_fsync``."""
    if not getattr(_deferral, "on", False):
        os.fsync(fd)


@contextmanager
def deferring_fsync() -> Iterator[None]:
    """Skip this thread's fsyncs of log files inside the block. Only for files nobody relies on
    yet, which the caller then makes durable all at once (``sync_filesystem``) before anything
    reads or acknowledges them: a replica creating thousands of new partition directories
    (lowtide/replica/reconcile.py, bulk creation) does one filesystem sync, not seven fsyncs each."""
    before = getattr(_deferral, "on", False)
    _deferral.on = True
    try:
        yield
    finally:
        _deferral.on = before


def _load_syncfs():
    """libc's syncfs(2) (Linux >= 2.6.39; reports write-back errors since 5.8), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


SYNCFS = _load_syncfs()


def syncfs(fd: int) -> None:
    """syncfs(2) on the filesystem of ``fd`` (``SYNCFS`` must not be None). ctypes releases the
    GIL for the call: other threads run while the filesystem flushes."""
    if SYNCFS(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")


def sync_filesystem(path: Path) -> None:
    """Make everything written on ``path``'s filesystem durable: one syncfs, or ``os.sync`` where
    libc has none."""
    if SYNCFS is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs(fd)
    finally:
        os.close(fd)


def fsync_directory(path: Path) -> None:
    """fsync a directory so that creations, renames and unlinks in it are durable."""
    if getattr(_deferral, "on", False):
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` crash-safely (.tmp, fsync, rename, fsync dir)."""
    tmp = path.with_name(tmp_file_name(path.name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def format_checkpoint(entries: Mapping[tuple[str, int], int]) -> str:
    """The checkpoint text for ``entries`` (sorted by topic, partition)."""
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    for (topic, partition), offset in sorted(entries.items()):
        if not topic or any(c.isspace() for c in topic):
            raise ValueError(f"topic name {topic!r} cannot be written to a checkpoint file")
        lines.append(f"{topic} {partition} {offset}")
    return "\n".join(lines) + "\n"


def checkpoint_body(text: str, *, what: str) -> list[str]:
    """The entry lines of a text in Kafka's CheckpointFile v0 layout (version line, count line,
    one line per entry: this module's files and the leader-epoch-checkpoint), once the header
    checks out; else KafkaStorageError starting with ``what`` (the file, by kind and path)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise KafkaStorageError(f"{what} is truncated: expected version and count")
    if lines[0].strip() != str(CHECKPOINT_VERSION):
        raise KafkaStorageError(
            f"{what} has unsupported version {lines[0].strip()!r}, expected {CHECKPOINT_VERSION}")
    try:
        count = int(lines[1])
    except ValueError:
        raise KafkaStorageError(f"{what} has malformed count {lines[1]!r}") from None
    body = lines[2:]
    if len(body) != count:
        raise KafkaStorageError(f"{what} declares {count} entries but has {len(body)}")
    return body


class CheckpointFile:
    """One checkpoint file: map (topic, partition) -> offset.

    Thread-safety: ``write`` calls for the same path must be serialised by the caller (they share the
    .tmp name); ``read`` may run concurrently with ``write`` because the rename is atomic.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def write(self, entries: Mapping[tuple[str, int], int]) -> None:
        """Replace the file with ``entries``, crash-safely."""
        try:
            write_file_atomically(self.path, format_checkpoint(entries).encode("utf-8"))
        except OSError as exc:
            raise KafkaStorageError(f"cannot write checkpoint file {self.path}: {exc}") from exc

    def read(self) -> dict[tuple[str, int], int]:
        """Entries of the file; {} if it does not exist. Raises KafkaStorageError naming the path."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise KafkaStorageError(f"cannot read checkpoint file {self.path}: {exc}") from exc
        entries: dict[tuple[str, int], int] = {}
        for number, line in enumerate(checkpoint_body(text, what=f"checkpoint file {self.path}"), start=3):
            parts = line.split(" ")
            try:
                if len(parts) != 3 or not parts[0]:
                    raise ValueError(line)
                entries[(parts[0], int(parts[1]))] = int(parts[2])
            except ValueError:
                raise KafkaStorageError(
                    f"checkpoint file {self.path} line {number} is malformed: {line!r}"
                ) from None
        return entries
