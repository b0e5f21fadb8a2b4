"""The ``partition.metadata`` file of a partition directory: which topic (by id) the log belongs to.

Format (Kafka's ``PartitionMetadataFile``, text)::

    version: 0
    topic_id: 195f1d79dd814c07845b15b22c060489

Why: a topic deleted and created again under the same name has a new id. A replica that finds a
directory whose id is neither the current topic's nor one the metadata says was deleted sets it
aside (``-stray``) rather than deleting it or serving its records as the new topic's
(docs/design/metadata.md#stray-partitions).

Written crash-safely (``.tmp``, fsync, rename); read with a version check, naming the path in errors.
"""

from __future__ import annotations

import os
from pathlib import Path

from lowtide.errors import KafkaStorageError
from lowtide.log.checkpoint import fsync, fsync_directory
from lowtide.log.filenames import PARTITION_METADATA_FILE, tmp_file_name

VERSION = 0


def write_partition_metadata(dir: Path, *, topic_id: str) -> None:
    path = dir / PARTITION_METADATA_FILE
    tmp = dir / tmp_file_name(PARTITION_METADATA_FILE)
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(f"version: {VERSION}\ntopic_id: {topic_id}\n")
        fh.flush()
        fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_directory(dir)


def read_partition_metadata(dir: Path) -> str | None:
    """The topic id recorded in ``dir``; None when the file is absent (a directory written before
    the file existed)."""
    path = dir / PARTITION_METADATA_FILE
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        return None
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    if fields.get("version") != str(VERSION) or not fields.get("topic_id"):
        raise KafkaStorageError(f"{path}: unreadable partition metadata (version {fields.get('version')!r}, "
                                f"expected {VERSION}, and a topic_id)")
    return fields["topic_id"]
