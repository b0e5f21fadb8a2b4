"""The clean-shutdown marker of a replica data directory (Kafka's ``.kafka_cleanshutdown``).

File ``<data dir>/.lowtide-clean-shutdown`` (name: filenames.CLEAN_SHUTDOWN_FILE)::

    version 0\\n          one line; any other content counts as no marker

A replica writes it (crash-safely: ``.tmp``, fsync, rename) as the last step of a clean shutdown,
after every log was flushed and closed and the checkpoints were written. At start, before it opens
any log, it takes the marker away (unlink, fsync of the directory): present, every log was closed
cleanly, so opening skips the scan of each last segment (``PartitionLog.open(recover=False)``);
absent (kill -9, a power cut, a shutdown that failed half-way), every last segment is scanned and a
torn tail cut. Taking it away before serving means a crash from then on finds no marker.
"""

from __future__ import annotations

import os
from pathlib import Path

from lowtide.errors import KafkaStorageError
from lowtide.log.checkpoint import fsync_directory, write_file_atomically
from lowtide.log.filenames import CLEAN_SHUTDOWN_FILE

_CONTENT = b"version 0\n"


def mark_clean_shutdown(data_dir: Path) -> None:
    """Record that every log under ``data_dir`` was closed cleanly (the last step of a shutdown)."""
    write_file_atomically(Path(data_dir) / CLEAN_SHUTDOWN_FILE, _CONTENT)


def take_clean_shutdown_marker(data_dir: Path) -> bool:
    """Whether the last shutdown of ``data_dir`` was clean; the marker is gone (durably) after."""
    path = Path(data_dir) / CLEAN_SHUTDOWN_FILE
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise KafkaStorageError(f"cannot read the clean-shutdown marker {path}: {exc}") from exc
    try:
        os.unlink(path)
        fsync_directory(path.parent)
    except OSError as exc:
        raise KafkaStorageError(f"cannot remove the clean-shutdown marker {path}: {exc}") from exc
    return content == _CONTENT
