"""The clean-shutdown marker (log/clean_shutdown.py) and what it changes when a log opens: after a
clean shutdown the last segment is not scanned (so a flipped byte inside a batch goes unseen, as in
Kafka), without one it is scanned whole and the log cut at the first batch that fails its CRC."""

from __future__ import annotations

import struct
from pathlib import Path

from lowtide.log import filenames
from lowtide.log.clean_shutdown import mark_clean_shutdown, take_clean_shutdown_marker
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.record.batch import encode_batch


def test_a_marked_directory_is_found_clean_once_and_the_marker_is_gone_after(tmp_path):
    mark_clean_shutdown(tmp_path)
    assert (tmp_path / filenames.CLEAN_SHUTDOWN_FILE).read_bytes() == b"version 0\n"
    assert take_clean_shutdown_marker(tmp_path) is True
    assert not (tmp_path / filenames.CLEAN_SHUTDOWN_FILE).exists()
    assert take_clean_shutdown_marker(tmp_path) is False


def test_a_marker_with_other_content_counts_as_none_and_is_removed(tmp_path):
    (tmp_path / filenames.CLEAN_SHUTDOWN_FILE).write_bytes(b"version 7\n")
    assert take_clean_shutdown_marker(tmp_path) is False
    assert not (tmp_path / filenames.CLEAN_SHUTDOWN_FILE).exists()


def _log_with_a_corrupt_first_batch(dir: Path) -> None:
    log = PartitionLog.open(dir, topic="t", partition=0, config=LogConfig())
    for i in range(3):
        log.append_as_leader(encode_batch([b"value-%d" % i] * 3, timestamp_ms=5), leader_epoch=1)
    log.close()
    segment = dir / filenames.log_file_name(0)
    data = bytearray(segment.read_bytes())
    (batch_length,) = struct.unpack_from(">i", data, 8)
    data[12 + batch_length - 1] ^= 0xFF  # the last byte of the first batch's records: its CRC fails
    segment.write_bytes(bytes(data))


def test_a_log_opened_after_a_clean_shutdown_is_not_scanned(tmp_path):
    _log_with_a_corrupt_first_batch(tmp_path / "t-0")
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=LogConfig(), recover=False)
    try:
        assert log.log_end_offset == 9
    finally:
        log.close()


def test_a_log_opened_after_a_crash_is_scanned_and_cut_at_the_first_bad_batch(tmp_path):
    _log_with_a_corrupt_first_batch(tmp_path / "t-0")
    log = PartitionLog.open(tmp_path / "t-0", topic="t", partition=0, config=LogConfig())
    try:
        assert log.log_end_offset == 0
    finally:
        log.close()
