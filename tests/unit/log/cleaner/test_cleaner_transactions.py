"""The cleaner and transactions, named after Kafka's LogCleanerTest: aborted records go, a marker
stays until its transaction has no batch left and its KIP-534 delete horizon passed, and a
producer's last batch stays (empty) to keep its sequence and epoch. Kafka drives these with passes
at t and at t + delete.retention.ms + 1 (``two_passes``)."""

from __future__ import annotations

from lowtide.log.partition_log import PartitionLog
from lowtide.record import encode_batch
from lowtide.record.control import build_marker_batch
from tests.unit.log.cleaner.conftest import NOW, RETENTION_MS, batches_of, by_key, clean, commit, open_log, records_of

LATER = NOW + 10**9  # Kafka's Long.MaxValue: past every horizon


def txn(log: PartitionLog, producer_id: int, keys: list[int], *, epoch: int = 0, sequence: int = 0,
        coordinator: bool = False) -> int:
    """One transactional batch of ``keys`` (value = key) from ``producer_id``; its base offset. A
    client's sequences must follow each other (idempotent produce); ``coordinator``: written as
    Kafka's AppendOrigin.COORDINATOR, whose sequences are not checked."""
    raw = encode_batch([b"%d" % k for k in keys], keys=[b"%d" % k for k in keys], timestamp_ms=NOW - 60_000,
                       producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, is_transactional=True)
    return log.append_as_leader(raw, leader_epoch=1, from_coordinator=coordinator).base_offset


def plain(log: PartitionLog, key: int) -> int:
    raw = encode_batch([b"%d" % key], keys=[b"%d" % key], timestamp_ms=NOW - 60_000)
    return log.append_as_leader(raw, leader_epoch=1).base_offset


def marker(log: PartitionLog, producer_id: int, *, commit_it: bool, epoch: int = 0) -> int:
    raw = build_marker_batch(producer_id=producer_id, producer_epoch=epoch, commit=commit_it, coordinator_epoch=0,
                             timestamp_ms=NOW - 60_000)
    return log.append_as_leader(raw, leader_epoch=1, from_coordinator=True).base_offset


def roll(log: PartitionLog) -> None:
    log.roll()
    commit(log)


def keys_in(log: PartitionLog) -> list[int]:
    """Keys of the data records, in offset order (control records are not data)."""
    return [int(r.key) for h, rs in batches_of(log) if not h.is_control for r in rs]


def offsets_in(log: PartitionLog) -> list[int]:
    """Offsets of every record, markers included (Kafka's offsetsInLog)."""
    return [r.offset for r in records_of(log)]


def last_offsets(log: PartitionLog) -> list[int]:
    """Last offset of every batch, empty ones included (Kafka's lastOffsetsPerBatchInLog)."""
    return [h.last_offset for h, _ in batches_of(log)]


def two_passes(log: PartitionLog, now: int = NOW) -> None:
    clean(log, now)
    clean(log, now + RETENTION_MS + 1)


def test_commit_marker_removal(log):
    txn(log, 1, [1])
    txn(log, 1, [2, 3], sequence=1)
    marker(log, 1, commit_it=True)  # 3
    txn(log, 1, [2], sequence=3)
    marker(log, 1, commit_it=True)  # 5
    roll(log)

    first = clean(log, NOW)  # the first transaction still has records: its marker stays
    assert keys_in(log) == [1, 3, 2]
    assert offsets_in(log) == [0, 2, 3, 4, 5]

    txn(log, 1, [1, 3], sequence=4)
    marker(log, 1, commit_it=True)  # 8
    roll(log)
    second = clean(log, NOW, checkpoint=first.end_offset)  # it read the last batch of that transaction
    assert keys_in(log) == [2, 1, 3]
    assert offsets_in(log) == [3, 4, 5, 6, 7, 8]

    clean(log, NOW, checkpoint=second.end_offset)  # now its marker gets a horizon, and stays until then
    [header] = [h for h, _ in batches_of(log) if h.base_offset == 3]
    assert header.is_control and header.delete_horizon_ms == NOW + RETENTION_MS
    assert offsets_in(log) == [3, 4, 5, 6, 7, 8]

    clean(log, NOW + RETENTION_MS + 1, checkpoint=second.end_offset)
    assert keys_in(log) == [2, 1, 3]
    assert offsets_in(log) == [4, 5, 6, 7, 8]


def test_abort_marker_removal(log):
    txn(log, 1, [1])
    txn(log, 1, [2, 3], sequence=1)
    marker(log, 1, commit_it=False)  # 3: aborts offsets 0..2
    txn(log, 1, [3], sequence=3)
    marker(log, 1, commit_it=True)  # 5
    roll(log)

    first = clean(log, NOW)  # aborted records go, their marker stays
    assert keys_in(log) == [3]
    assert offsets_in(log) == [3, 4, 5]
    assert first.stats.aborted_removed == 3

    two_passes(log)  # the horizon is set, then passed
    assert keys_in(log) == [3]
    assert offsets_in(log) == [4, 5]


def test_commit_marker_retention_with_empty_batch(log):
    txn(log, 1, [2, 3])  # 0, 1
    roll(log)
    txn(log, 2, [2, 3])  # 2, 3
    marker(log, 2, commit_it=True)  # 4
    roll(log)
    plain(log, 2)  # 5
    plain(log, 3)  # 6
    marker(log, 1, commit_it=True)  # 7
    roll(log)

    # Both transactional batches lose their records but stay empty: each is its producer's last.
    first = clean(log, NOW)
    assert keys_in(log) == [2, 3]
    assert offsets_in(log) == [4, 5, 6, 7]
    assert last_offsets(log) == [1, 3, 4, 5, 6, 7]
    assert first.stats.empty_batches_kept == 2

    clean(log, NOW, checkpoint=first.end_offset)  # still the last sequence of each producer
    assert offsets_in(log) == [4, 5, 6, 7]
    assert last_offsets(log) == [1, 3, 4, 5, 6, 7]

    txn(log, 2, [1], sequence=2)  # 8: producer 2's empty batch is no longer its last
    marker(log, 2, commit_it=True)  # 9
    roll(log)
    clean(log, NOW)
    assert keys_in(log) == [2, 3, 1]
    assert offsets_in(log) == [4, 5, 6, 7, 8, 9]
    assert last_offsets(log) == [1, 4, 5, 6, 7, 8, 9]

    two_passes(log)  # producer 2's first commit marker has no batch left: horizon, then gone
    assert keys_in(log) == [2, 3, 1]
    assert offsets_in(log) == [5, 6, 7, 8, 9]
    assert last_offsets(log) == [1, 5, 6, 7, 8, 9]


def test_abort_marker_retention_with_empty_batch(tmp_path):
    log = open_log(tmp_path / "t-0")
    try:
        txn(log, 1, [2, 3])  # 0, 1
        marker(log, 1, commit_it=False)  # 2
        roll(log)
        assert [(a.producer_id, a.first_offset, a.last_offset) for a in log.aborted_transactions(0, 100)] == [
            (1, 0, 2)]

        clean(log, NOW)
        assert keys_in(log) == []
        assert offsets_in(log) == [2]  # the abort marker stays
        assert last_offsets(log) == [1, 2]  # and the emptied batch, the producer's last

        two_passes(log)  # the empty batch is read before the marker: the marker keeps no horizon
        assert offsets_in(log) == [2]
        assert last_offsets(log) == [1, 2]

        txn(log, 1, [1], sequence=2)  # 3
        roll(log)
        clean(log, NOW)
        assert keys_in(log) == [1]
        assert offsets_in(log) == [2, 3]  # the marker still stays: this pass read the empty batch
        assert last_offsets(log) == [2, 3]  # which is no longer kept

        two_passes(log)
        assert keys_in(log) == [1]
        assert offsets_in(log) == [3]
        assert last_offsets(log) == [3]
    finally:
        log.close()
    reopened = open_log(tmp_path / "t-0")
    try:
        assert reopened.aborted_transactions(0, 100) == []  # nothing of it left to index
    finally:
        reopened.close()


def test_empty_batch_removal_with_sequence_reuse(log):
    txn(log, 1, [1])  # 0
    marker(log, 1, commit_it=True)  # 1
    txn(log, 1, [2], coordinator=True)  # 2, the same sequence 0 again (as Kafka's group coordinator writes)
    marker(log, 1, commit_it=True)  # 3
    plain(log, 1)  # 4
    plain(log, 2)  # 5
    roll(log)

    clean(log, NOW)  # both transactional batches emptied; the last one stays (sequence and epoch)
    assert offsets_in(log) == [1, 3, 4, 5]
    assert last_offsets(log) == [1, 2, 3, 4, 5]

    two_passes(log)  # the first marker's transaction has no batch left: horizon, then gone
    assert offsets_in(log) == [3, 4, 5]
    assert last_offsets(log) == [2, 3, 4, 5]


def test_clean_empty_control_batch(log):
    marker(log, 1, commit_it=True)  # 0: a marker of a producer with no data in the log
    plain(log, 2)  # 1
    plain(log, 3)  # 2
    roll(log)

    # The marker gets its horizon, then goes, but an empty batch stays to keep the producer's epoch.
    two_passes(log)
    assert keys_in(log) == [2, 3]
    assert offsets_in(log) == [1, 2]
    assert last_offsets(log) == [0, 1, 2]
    [header] = [h for h, _ in batches_of(log) if h.base_offset == 0]
    assert header.is_control and header.record_count == 0 and header.producer_id == 1

    clean(log, LATER)  # the empty control batch cleans without error and stays
    assert offsets_in(log) == [1, 2]
    assert last_offsets(log) == [0, 1, 2]


def test_deleted_batches_with_no_messages_read(log, small_reads):
    # Kafka's transactional version: every read window holds one batch, some lose everything.
    txn(log, 1, [1])  # 0
    marker(log, 1, commit_it=False)  # 1
    txn(log, 1, [2], sequence=1)  # 2
    txn(log, 1, [2], sequence=2)  # 3
    marker(log, 1, commit_it=True)  # 4
    roll(log)

    clean(log, NOW, cleaner=small_reads)
    assert keys_in(log) == [2]
    assert offsets_in(log) == [1, 3, 4]

    clean(log, NOW, cleaner=small_reads)
    clean(log, NOW + RETENTION_MS + 1, cleaner=small_reads)
    assert keys_in(log) == [2]
    assert offsets_in(log) == [3, 4]


def test_aborted_transaction_records_removed(log):
    txn(log, 1, [7])  # 0: committed k7
    marker(log, 1, commit_it=True)  # 1
    txn(log, 1, [7, 8], epoch=0, sequence=1)  # 2, 3: aborted writes of k7 and k8
    marker(log, 1, commit_it=False)  # 4
    plain(log, 9)  # 5
    roll(log)

    result = clean(log, NOW)

    # The aborted k7 never superseded the committed one: an aborted record is not in the offset map.
    assert by_key(log)[b"7"] == (0, b"7")
    assert b"8" not in {r.key for r in records_of(log)}
    assert result.stats.aborted_removed == 2
    assert offsets_in(log) == [0, 1, 4, 5]


def test_records_of_an_undecided_transaction_are_never_cleaned(log):
    plain(log, 1)  # 0
    txn(log, 1, [1])  # 1: ongoing, no marker yet
    roll(log)
    plain(log, 1)  # 2
    roll(log)
    assert log.last_stable_offset == 1

    clean(log, NOW)

    # The segment holding the ongoing transaction is beyond the last stable offset: left alone.
    assert offsets_in(log) == [0, 1, 2]
