"""Producer-state snapshots (producer_snapshot.py): the bytes of the format, what a log writes at
roll and close, opening from a snapshot plus the tail (the same state a full rebuild gives), and
the snapshots that truncation, DeleteRecords and retention remove. Cases named after Kafka's
ProducerStateManagerTest say so in a comment."""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path

import pytest

from lowtide.clock import now_ms
from lowtide.log import filenames
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.log.producer_snapshot import CorruptSnapshot, decode_snapshot, encode_snapshot
from lowtide.log.producer_state import AbortedTxn, BatchMetadata, ProducerEntry, ProducerStateManager
from lowtide.record import crc32c, encode_batch
from lowtide.record.control import build_marker_batch
from tests.waiting import wait_until

CONFIG = LogConfig(segment_bytes=1 << 20)

# A producer with two retained batches and an ongoing transaction, and one aborted transaction.
ENTRY = ProducerEntry(epoch=2, last_data_offset=11, last_sequence=5, txn_first_offset=12, last_timestamp=1700000000000,
                      batches=deque([BatchMetadata(0, 2, 5, 7, 1699999999000),
                                     BatchMetadata(3, 5, 9, 11, 1700000000000)], 5))
ABORTED = AbortedTxn(producer_id=9, first_offset=1, last_offset=4)
ENCODED = bytes.fromhex(
    "0064"                  # version 100
    "9e1accb0"              # crc32c of everything below
    "00000001"              # 1 producer
    "0000000000000007"      # producer id 7
    "0002"                  # epoch 2
    "00000005"              # last sequence 5
    "000000000000000b"      # last offset 11
    "00000002"              # offset delta 2 (last batch 9..11)
    "0000018bcfe56800"      # timestamp 1700000000000
    "ffffffff"              # coordinator epoch -1
    "000000000000000c"      # current transaction's first offset 12
    "02"                    # 2 batches, oldest first:
    "00000000" "00000002" "0000000000000005" "0000000000000007" "0000018bcfe56418"  # seq 0..2, offsets 5..7
    "00000003" "00000005" "0000000000000009" "000000000000000b" "0000018bcfe56800"  # seq 3..5, offsets 9..11
    "00000001"              # 1 aborted transaction:
    "0000000000000009" "0000000000000001" "0000000000000004"  # producer 9, offsets 1..4 (its marker)
)


def sample_state() -> ProducerStateManager:
    return ProducerStateManager.restore(producers=[(7, ENTRY)], aborted=[ABORTED])


def open_log(path: Path, config: LogConfig = CONFIG) -> PartitionLog:
    return PartitionLog.open(path, topic="t", partition=0, config=config)


def snapshot_offsets(path: Path) -> list[int]:
    found = (filenames.parse_snapshot_offset(p.name) for p in path.iterdir())
    return sorted(offset for offset in found if offset is not None)


def produce(log: PartitionLog, pid: int, seq: int, n: int = 1, *, epoch: int = 0, txn: bool = False,
            ts: int | None = None) -> int:
    raw = encode_batch([b"v"] * n, timestamp_ms=ts, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                       is_transactional=txn)
    return log.append_as_leader(raw, leader_epoch=0).base_offset


def end_txn(log: PartitionLog, pid: int, *, commit: bool, epoch: int = 0) -> int:
    raw = build_marker_batch(producer_id=pid, producer_epoch=epoch, commit=commit, coordinator_epoch=0,
                             timestamp_ms=now_ms())
    return log.append_as_leader(raw, leader_epoch=0, from_coordinator=True).base_offset


def mixed_history(log: PartitionLog) -> None:
    """Idempotent and transactional producers over four segments: committed, aborted, one still
    open, a new epoch, plain batches in between."""
    log.append_as_leader(encode_batch([b"plain"] * 3), leader_epoch=0)
    for seq in range(0, 12, 2):
        produce(log, 1, seq, 2)  # more than the 5 retained batches
    produce(log, 2, 0, 3, txn=True)
    log.roll()
    produce(log, 3, 0, 2, txn=True)
    end_txn(log, 2, commit=True)
    produce(log, 1, 12)
    end_txn(log, 3, commit=False)  # aborted: indexed
    log.roll()
    produce(log, 4, 0, 1, txn=True)
    end_txn(log, 4, commit=False, epoch=1)  # the coordinator bumped the epoch on abort
    produce(log, 3, 0, 1, epoch=1, txn=True)
    log.roll()
    produce(log, 5, 0, 2, txn=True)  # left open
    produce(log, 1, 13, 3)


def rebuilt(log: PartitionLog) -> ProducerStateManager:
    with log.segments_locked() as segments:
        state = ProducerStateManager.rebuild(segments)
    state.truncate_head(log.log_start_offset)
    return state


# -- the format ---------------------------------------------------------------------------------

def test_the_crc_is_crc32c():
    assert crc32c(b"123456789") == 0xE3069283  # the Castagnoli check value: the same CRC as Kafka's


def test_a_snapshot_is_encoded_byte_for_byte_as_the_module_draws_it():
    assert encode_snapshot(sample_state()) == ENCODED
    assert crc32c(ENCODED[6:]) == 0x9E1ACCB0


def test_the_snapshot_of_an_empty_state_is_version_crc_and_two_zero_counts():
    assert encode_snapshot(ProducerStateManager()) == bytes.fromhex("0064" "8c28b28a" "00000000" "00000000")


def test_a_snapshot_decodes_to_the_state_it_was_encoded_from():
    state = decode_snapshot(ENCODED)
    assert state == sample_state()
    assert state.producer(7) == ENTRY
    assert state.ongoing() == {7: 12}  # follows from the producer's open transaction
    assert state.aborted_transactions(0, 100) == [ABORTED]


@pytest.mark.parametrize(("data", "message"), [
    (ENCODED[:-1], "has crc"),  # a torn write
    (ENCODED[:5], "is truncated"),
    (b"\x00\x01" + ENCODED[2:], "has version 1, expected 100"),
    (ENCODED[:20] + bytes([ENCODED[20] ^ 1]) + ENCODED[21:], "has crc"),
])
def test_a_truncated_wrong_version_or_corrupt_snapshot_is_refused_naming_the_file(data, message):
    with pytest.raises(CorruptSnapshot, match=message) as raised:
        decode_snapshot(data, path="/data/t-0/00000000000000000042.snapshot")
    assert "/data/t-0/00000000000000000042.snapshot" in str(raised.value)


def test_counts_that_do_not_match_the_bytes_are_refused_even_with_a_right_crc():
    body = bytearray(ENCODED[6:])
    body[-28:-24] = (2).to_bytes(4, "big")  # claims 2 aborted transactions
    data = ENCODED[:2] + crc32c(bytes(body)).to_bytes(4, "big") + bytes(body)
    with pytest.raises(CorruptSnapshot, match="2 aborted transactions"):
        decode_snapshot(data)


# -- written by the log -------------------------------------------------------------------------

def test_a_snapshot_is_taken_at_each_roll_and_on_clean_shutdown(tmp_path):
    # Kafka's testTakeSnapshot
    log = open_log(tmp_path / "t-0")
    produce(log, 1, 0, 2)
    log.roll()
    produce(log, 1, 2)
    assert snapshot_offsets(tmp_path / "t-0") == [2]
    log.close()
    assert snapshot_offsets(tmp_path / "t-0") == [2, 3]


def test_no_snapshot_is_written_when_the_log_end_has_one_already(tmp_path):
    # Kafka's testSkipSnapshotIfOffsetUnchanged
    log = open_log(tmp_path / "t-0")
    produce(log, 1, 0, 2)
    log.roll()
    before = (tmp_path / "t-0" / filenames.snapshot_file_name(2)).stat().st_mtime_ns
    log.close()
    assert snapshot_offsets(tmp_path / "t-0") == [2]
    assert (tmp_path / "t-0" / filenames.snapshot_file_name(2)).stat().st_mtime_ns == before


def test_a_snapshot_at_a_roll_inside_one_append_holds_exactly_the_batches_below_it(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=200))
    raw = b"".join(encode_batch([b"x" * 60], producer_id=1, producer_epoch=0, base_sequence=seq) for seq in range(3))
    log.append_as_leader(raw, leader_epoch=0)  # three batches, one segment each
    assert snapshot_offsets(tmp_path / "t-0") == [1, 2]
    state = decode_snapshot((tmp_path / "t-0" / filenames.snapshot_file_name(2)).read_bytes())
    assert state.producer(1).last_sequence == 1
    log.close()


# -- opening from a snapshot --------------------------------------------------------------------

def test_opening_from_a_snapshot_gives_exactly_the_state_a_full_rebuild_gives(tmp_path):
    # Kafka's testRecoverFromSnapshotUnfinishedTransaction and testRecoverFromSnapshotFinishedTransaction
    log = open_log(tmp_path / "t-0")
    mixed_history(log)
    log.close()
    reopened = open_log(tmp_path / "t-0")
    try:
        full = rebuilt(reopened)
        assert reopened._producers == full
        assert reopened.ongoing_transactions() == full.ongoing() and sorted(full.ongoing()) == [3, 5]
        reopened.set_high_watermark(reopened.log_end_offset)
        assert reopened.last_stable_offset == min(full.ongoing().values())
        assert [a.producer_id for a in reopened.aborted_transactions(0, 100)] == [3, 4]
    finally:
        reopened.close()


def test_an_older_snapshot_and_the_batch_headers_after_it_give_the_same_state(tmp_path):
    # Kafka's testRecoverFromSnapshot: the tail after the snapshot is replayed
    log = open_log(tmp_path / "t-0")
    mixed_history(log)
    log.close()
    offsets = snapshot_offsets(tmp_path / "t-0")
    for offset in offsets[1:]:  # leave only the first roll's snapshot
        (tmp_path / "t-0" / filenames.snapshot_file_name(offset)).unlink()
    reopened = open_log(tmp_path / "t-0")
    try:
        assert reopened._producers == rebuilt(reopened)
        assert produce(reopened, 1, 13, 3) < reopened.log_end_offset  # a retry: answered, not appended
    finally:
        reopened.close()


def test_a_corrupt_snapshot_is_ignored_with_a_warning_deleted_and_the_state_read_from_the_log(tmp_path, caplog):
    # Kafka's testLoadFromCorruptSnapshotFile
    log = open_log(tmp_path / "t-0")
    mixed_history(log)
    log.close()
    newest = tmp_path / "t-0" / filenames.snapshot_file_name(snapshot_offsets(tmp_path / "t-0")[-1])
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="lowtide.log.producer_snapshot"):
        reopened = open_log(tmp_path / "t-0")
    try:
        assert str(newest) in caplog.text and "has crc" in caplog.text
        assert not newest.exists()
        assert reopened._producers == rebuilt(reopened)
    finally:
        reopened.close()


def test_a_snapshot_above_the_recovered_log_end_is_deleted_on_open(tmp_path):
    # Kafka's removeStraySnapshots: a torn tail cut off by recovery took the batches it described
    log = open_log(tmp_path / "t-0")
    produce(log, 1, 0, 2)
    log.roll()
    produce(log, 1, 2, 2)
    log.close()
    assert snapshot_offsets(tmp_path / "t-0") == [2, 4]
    segment = tmp_path / "t-0" / filenames.log_file_name(2)
    with open(segment, "r+b") as f:
        f.truncate(segment.stat().st_size - 1)  # the last batch is torn
    reopened = open_log(tmp_path / "t-0")
    try:
        assert reopened.log_end_offset == 2
        assert snapshot_offsets(tmp_path / "t-0") == [2]
        assert produce(reopened, 1, 2, 2) == 2  # appended again, not answered as a retry
    finally:
        reopened.close()


def test_a_snapshot_keeps_the_producers_whose_batches_delete_records_removed(tmp_path):
    log = open_log(tmp_path / "t-0")
    produce(log, 1, 0, 3)
    log.roll()
    produce(log, 2, 0)
    log.set_high_watermark(log.log_end_offset)
    log.increment_log_start_offset(3)
    log.close()
    reopened = open_log(tmp_path / "t-0")
    try:
        assert reopened.log_start_offset == 3
        assert reopened._producers.producer(1).last_sequence == 2  # a full rebuild would have forgotten it
        assert produce(reopened, 1, 3) == 4
    finally:
        reopened.close()


# -- removed with the log -----------------------------------------------------------------------

def test_truncation_deletes_the_snapshots_above_it_and_reloads_the_state(tmp_path):
    # Kafka's testTruncateAndReloadRemovesOutOfRangeSnapshots
    log = open_log(tmp_path / "t-0")
    try:
        for seq in range(4):
            produce(log, 1, seq * 2, 2)
            log.roll()
        assert snapshot_offsets(tmp_path / "t-0") == [2, 4, 6, 8]
        log.truncate_to(4)
        assert snapshot_offsets(tmp_path / "t-0") == [2, 4]
        assert log._producers == rebuilt(log)
        assert log._producers.producer(1).last_sequence == 3
        assert produce(log, 1, 4, 2) == 4  # appended again, not a retry
    finally:
        log.close()


def test_a_full_truncation_deletes_every_snapshot(tmp_path):
    # Kafka's testTruncateFullyAndStartAt
    log = open_log(tmp_path / "t-0")
    try:
        produce(log, 1, 0, 2)
        log.roll()
        log.truncate_fully_and_start_at(10)
        assert snapshot_offsets(tmp_path / "t-0") == []
        assert log._producers.producer(1) is None
    finally:
        log.close()


def test_delete_records_deletes_the_snapshots_below_the_first_segment_left(tmp_path):
    # Kafka's testDeleteSnapshotsBefore
    log = open_log(tmp_path / "t-0")
    for seq in range(4):
        produce(log, 1, seq * 2, 2)
        log.roll()
    log.set_high_watermark(log.log_end_offset)
    log.increment_log_start_offset(5)  # inside the segment [4, 6): the one at 4 stays, for its tail
    log.close()  # finishes the deleter's work
    assert snapshot_offsets(tmp_path / "t-0") == [4, 6, 8]
    reopened = open_log(tmp_path / "t-0")
    try:
        assert reopened._producers.producer(1).last_sequence == 7
    finally:
        reopened.close()


def test_retention_deletes_the_snapshots_of_the_segments_it_deletes(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20, retention_bytes=0))
    for seq in range(3):
        produce(log, 1, seq, 1)
        log.roll()
    log.set_high_watermark(log.log_end_offset)
    log.delete_retention_segments(now_ms=now_ms())
    log.close()
    assert snapshot_offsets(tmp_path / "t-0") == [3]


def test_a_log_deleted_whole_keeps_its_producers_in_a_new_snapshot(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20, retention_bytes=0))
    produce(log, 1, 0, 2)  # only in the active segment: no roll wrote a snapshot
    log.set_high_watermark(2)
    log.increment_log_start_offset(2)
    # The file deleter's thread empties the active segment, then writes the snapshot.
    wait_until(lambda: snapshot_offsets(tmp_path / "t-0") == [2], timeout_s=10)
    assert log.describe()["segments"] == [(2, 2, 0)]
    log.close()
    reopened = open_log(tmp_path / "t-0")
    try:
        assert reopened._producers.producer(1).last_sequence == 1
    finally:
        reopened.close()


def test_a_truncation_inside_a_batch_deletes_the_snapshot_at_that_batchs_end(tmp_path):
    log = open_log(tmp_path / "t-0")
    try:
        produce(log, 1, 0, 4)  # offsets 0..3
        log.roll()
        assert snapshot_offsets(tmp_path / "t-0") == [4]
        log.truncate_to(2)  # inside the batch: it goes whole, and the snapshot that held it
        assert log.log_end_offset == 0 and snapshot_offsets(tmp_path / "t-0") == []
        assert log._producers.producer(1) is None
    finally:
        log.close()
