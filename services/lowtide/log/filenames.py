"""The one module that knows the names of the files in a replica data directory.

Layout::

    <data dir>/
      meta.properties                      cluster id and node id (lowtide.metadata.identity)
      log-start-offset-checkpoint          KIP-107 LSO per partition (checkpoint.py format)
      replication-offset-checkpoint        HW per partition
      .lowtide-clean-shutdown              present only between a clean shutdown and the next
                                           start: logs open without a scan (clean_shutdown.py)
      <topic>-<partition>/                 one directory per partition replica, e.g. orders-3
        partition.metadata                 the topic id whose log this is (partition_metadata.py)
        log-start-offset                   the durable LSO, two 512-byte slots (start_offset_file.py)
        leader-epoch-checkpoint            leader epoch -> start offset (leader_epoch.py, KIP-101)
        00000000000000000000.log           segment data: concatenated RecordBatch v2 batches
        00000000000000000000.index         sparse offset index of that segment (index.py)
        00000000000000000000.timeindex     sparse time index of that segment (index.py)
        00000000000000004096.log           next segment: the name is its base offset, 20 digits
        00000000000000004096.snapshot      producer state of the batches below that offset
                                           (producer_snapshot.py; at each roll and clean shutdown)
        ....deleted                        a segment file waiting for its delayed deletion
        ....tmp                            a file being written crash-safely (removed on open)
      <topic>-<partition>.<32 hex>-delete/ a partition directory being deleted (renamed first, as
                                           Kafka does, so a crash mid-delete never leaves a half
                                           log under the partition's name; swept at start-up)
      <topic>-<partition>.<32 hex>-stray/  a partition the metadata no longer names, set aside and
                                           kept until the operator removes it

Base offsets are zero-padded to 20 digits (the width of 2**63 - 1) so that names sort like offsets.
Topic names may contain '-', so the partition number is whatever follows the LAST '-'.
"""

from __future__ import annotations

LOG_SUFFIX = ".log"
OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
TMP_SUFFIX = ".tmp"
SNAPSHOT_SUFFIX = ".snapshot"

LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".lowtide-clean-shutdown"
# Where a replica builds new partition directories in bulk before renaming them into place
# (lowtide/replica/reconcile.py); whatever a crash leaves there is removed.
CREATING_DIR = ".lowtide-creating"
LOG_START_OFFSET_FILE = "log-start-offset"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

_OFFSET_DIGITS = 20


def format_base_offset(base_offset: int) -> str:
    """20-digit zero-padded decimal, the stem of every segment file."""
    if base_offset < 0:
        raise ValueError(f"base offset must be >= 0, got {base_offset}")
    return f"{base_offset:0{_OFFSET_DIGITS}d}"


def log_file_name(base_offset: int) -> str:
    return format_base_offset(base_offset) + LOG_SUFFIX


def offset_index_file_name(base_offset: int) -> str:
    return format_base_offset(base_offset) + OFFSET_INDEX_SUFFIX


def time_index_file_name(base_offset: int) -> str:
    return format_base_offset(base_offset) + TIME_INDEX_SUFFIX


def segment_file_names(base_offset: int) -> tuple[str, str, str]:
    """(log, offset index, time index) names of the segment starting at ``base_offset``."""
    stem = format_base_offset(base_offset)
    return stem + LOG_SUFFIX, stem + OFFSET_INDEX_SUFFIX, stem + TIME_INDEX_SUFFIX


def snapshot_file_name(offset: int) -> str:
    """Name of the producer-state snapshot of the batches below ``offset`` (Kafka's ``<offset>.snapshot``)."""
    return format_base_offset(offset) + SNAPSHOT_SUFFIX


def parse_snapshot_offset(filename: str) -> int | None:
    """The offset of a producer-state snapshot file name, None for any other name."""
    stem, dot, suffix = filename.partition(".")
    if "." + suffix != SNAPSHOT_SUFFIX or len(stem) != _OFFSET_DIGITS or not stem.isdigit():
        return None
    return int(stem)


def deleted_file_name(name: str) -> str:
    """Name a segment file gets while it waits for delayed deletion."""
    return name + DELETED_SUFFIX


def tmp_file_name(name: str) -> str:
    """Name of the temporary file a crash-safe write goes through."""
    return name + TMP_SUFFIX


def is_leftover_file_name(name: str) -> bool:
    """True for files an interrupted delete or write left behind (safe to remove on open)."""
    return name.endswith(DELETED_SUFFIX) or name.endswith(TMP_SUFFIX)


def parse_base_offset(filename: str) -> int:
    """Base offset encoded in a segment file name such as ``00000000000000000042.log``."""
    stem, dot, suffix = filename.partition(".")
    if not dot or "." + suffix not in (LOG_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        raise ValueError(f"not a segment file name: {filename!r}")
    if len(stem) != _OFFSET_DIGITS or not stem.isdigit():
        raise ValueError(f"segment file name {filename!r} does not start with a 20-digit offset")
    return int(stem)


def partition_dir_name(topic: str, partition: int) -> str:
    """Directory name of a partition replica: ``<topic>-<partition>``."""
    if not topic:
        raise ValueError("topic name must not be empty")
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")
    return f"{topic}-{partition}"


DELETE_DIR_SUFFIX = "-delete"


def deleted_partition_dir_name(partition_dir: str, unique: str) -> str:
    """``orders-3`` -> ``orders-3.<unique>-delete``: what a partition directory is renamed to
    before its files are removed. Not a partition directory name (it ends in ``-delete``)."""
    return f"{partition_dir}.{unique}{DELETE_DIR_SUFFIX}"


def is_deleted_partition_dir(name: str) -> bool:
    base, dot, rest = name.rpartition(".")
    return bool(base) and bool(dot) and rest.endswith(DELETE_DIR_SUFFIX) and \
        len(rest) == 32 + len(DELETE_DIR_SUFFIX) and all(c in "0123456789abcdef" for c in rest[:32])


STRAY_DIR_SUFFIX = "-stray"
# In every partition directory: the id of the topic whose log it holds (partition_metadata.py).
PARTITION_METADATA_FILE = "partition.metadata"


def stray_partition_dir_name(partition_dir: str, unique: str) -> str:
    """``orders-3`` -> ``orders-3.<unique>-stray``: where a partition the metadata no longer names
    is set aside, kept until the operator removes it (Kafka names its stray logs alike). Not a
    partition directory name (it ends in ``-stray``), so it is never opened as a log."""
    return f"{partition_dir}.{unique}{STRAY_DIR_SUFFIX}"


def is_stray_partition_dir(name: str) -> bool:
    base, dot, rest = name.rpartition(".")
    return bool(base) and bool(dot) and rest.endswith(STRAY_DIR_SUFFIX)


def parse_partition_dir(name: str) -> tuple[str, int]:
    """(topic, partition) of a partition directory name; splits on the last '-'."""
    topic, dash, number = name.rpartition("-")
    if not dash or not topic or not number.isdigit():
        raise ValueError(f"not a partition directory name: {name!r}")
    return topic, int(number)
