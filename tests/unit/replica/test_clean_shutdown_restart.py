"""A real replica process (``replica_set``) marks its data directory clean as the last step of a
graceful stop (SIGTERM) and opens its logs without scanning them on the next start; after kill -9
there is no marker and every last segment is scanned again (log/clean_shutdown.py). A byte flipped
inside the first batch while the replica is down shows which happened: unseen after a clean stop,
the log cut before it after a crash."""

from __future__ import annotations

import signal
import struct
from pathlib import Path

import pytest

from lowtide.log import filenames

NAME = "replica-0"


@pytest.fixture
def redis_url(replica_set):
    return replica_set.clean()


def corrupt_first_batch(partition_dir: Path) -> None:
    segment = partition_dir / filenames.log_file_name(0)
    data = bytearray(segment.read_bytes())
    (batch_length,) = struct.unpack_from(">i", data, 8)
    data[12 + batch_length - 1] ^= 0xFF
    segment.write_bytes(bytes(data))


def log_end_offset(replica_set) -> int:
    return replica_set.describe(0, "marked", 0).log_end_offset


def test_a_graceful_stop_marks_the_data_dir_clean_and_a_kill_does_not(replica_set, store):
    cluster = replica_set.cluster
    data_dir = Path(cluster.service(NAME).data_dir)
    marker = data_dir / filenames.CLEAN_SHUTDOWN_FILE
    store.create_topic(name="marked", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    replica_set.wait_for_leaders("marked")
    for i in range(3):
        replica_set.produce("marked", 0, [b"v%d" % i] * 3)
    assert log_end_offset(replica_set) == 9
    try:
        cluster.stop_service(NAME)
        assert marker.read_bytes() == b"version 0\n"
        corrupt_first_batch(data_dir / "marked-0")
        cluster.start_service(NAME)
        assert not marker.exists()  # taken away before serving: a crash from now on finds none
        assert log_end_offset(replica_set) == 9  # not scanned: the bad batch went unseen

        cluster.kill(NAME, signal.SIGKILL)
        assert not marker.exists()
        cluster.start_service(NAME)
        assert log_end_offset(replica_set) == 0  # scanned: cut before the batch that fails its CRC
    finally:
        if not cluster.is_running(NAME):
            cluster.start_service(NAME)
    assert '"after_clean_shutdown": true' in Path(cluster.service(NAME).log).read_text()
