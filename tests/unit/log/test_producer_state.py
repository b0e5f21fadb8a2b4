"""Producer state of a real PartitionLog: ongoing transactions hold the last stable offset back,
markers release it, aborts are indexed, fenced epochs append nothing, and all of it is rebuilt from
the batch headers after a restart, a follower truncation or a raised log start offset."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidProducerEpoch, InvalidRecord, InvalidTxnState
from lowtide.log.cleaner.batch_filter import empty_batch
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.log.producer_state import ProducerStateManager
from lowtide.record import encode_batch, read_header
from lowtide.record.control import build_marker_batch

CONFIG = LogConfig(segment_bytes=4096)


def open_log(path) -> PartitionLog:
    return PartitionLog.open(path, topic="t", partition=0, config=CONFIG)


def txn(log: PartitionLog, pid: int, n: int = 2, *, epoch: int = 0) -> int:
    raw = encode_batch([b"v"] * n, keys=[b"k"] * n, producer_id=pid, producer_epoch=epoch, base_sequence=0,
                       is_transactional=True)
    return log.append_as_leader(raw, leader_epoch=0).base_offset


def plain(log: PartitionLog, n: int = 1) -> int:
    return log.append_as_leader(encode_batch([b"p"] * n), leader_epoch=0).base_offset


def end(log: PartitionLog, pid: int, *, commit: bool, epoch: int = 0) -> int:
    raw = build_marker_batch(producer_id=pid, producer_epoch=epoch, commit=commit, coordinator_epoch=0, timestamp_ms=1)
    return log.append_as_leader(raw, leader_epoch=0, from_coordinator=True).base_offset


def caught_up(log: PartitionLog) -> PartitionLog:
    log.set_high_watermark(log.log_end_offset)
    return log


@pytest.fixture
def log(tmp_path):
    plog = open_log(tmp_path / "t-0")
    yield plog
    plog.close()


def test_an_ongoing_transaction_holds_the_last_stable_offset_at_its_first_offset_until_its_marker(log):
    plain(log)
    first = txn(log, 1)
    plain(log, 3)
    caught_up(log)
    assert log.last_stable_offset == first == 1 and log.high_watermark == 6
    end(log, 1, commit=True)
    caught_up(log)
    assert log.last_stable_offset == log.high_watermark == 7
    assert log.aborted_transactions(0, 100) == []


def test_an_abort_is_indexed_from_the_first_offset_to_its_marker_and_found_by_range(log):
    txn(log, 1)  # 0, 1
    txn(log, 2)  # 2, 3
    end(log, 1, commit=False)  # 4
    end(log, 2, commit=True)  # 5
    caught_up(log)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in log.aborted_transactions(0, 6)] == [(1, 0, 4)]
    assert log.aborted_transactions(5, 6) == []  # the marker is before the range
    assert log.aborted_transactions(0, 0) == []  # the transaction starts at the range's end


def test_a_fenced_producer_epoch_is_refused_and_nothing_is_appended(log):
    txn(log, 1, epoch=0)
    end(log, 1, commit=False, epoch=1)  # the coordinator bumped the epoch when it aborted
    leo = log.log_end_offset
    with pytest.raises(InvalidProducerEpoch):
        txn(log, 1, epoch=0)
    with pytest.raises(InvalidProducerEpoch):
        end(log, 1, commit=True, epoch=0)
    assert log.log_end_offset == leo
    txn(log, 1, epoch=1)  # the new epoch writes


def test_a_control_batch_from_a_client_is_an_invalid_record(log):
    raw = build_marker_batch(producer_id=1, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=1)
    with pytest.raises(InvalidRecord):
        log.append_as_leader(raw, leader_epoch=0)
    assert log.log_end_offset == 0


def test_a_plain_batch_inside_the_producers_own_transaction_is_an_invalid_txn_state(log):
    txn(log, 1)
    raw = encode_batch([b"v"], keys=[b"k"], producer_id=1, producer_epoch=0, base_sequence=2)
    with pytest.raises(InvalidTxnState):
        log.append_as_leader(raw, leader_epoch=0)


def test_the_state_is_rebuilt_from_the_batch_headers_after_a_restart(tmp_path):
    log = open_log(tmp_path / "t-0")
    txn(log, 1)  # 0, 1
    end(log, 1, commit=False)  # 2
    plain(log)  # 3
    log.roll()
    txn(log, 2)  # 4, 5: still ongoing
    caught_up(log)
    log.close()
    reopened = caught_up(open_log(tmp_path / "t-0"))
    try:
        assert reopened.ongoing_transactions() == {2: 4}
        assert reopened.last_stable_offset == 4
        assert [(a.producer_id, a.first_offset, a.last_offset) for a in reopened.aborted_transactions(0, 9)] == [
            (1, 0, 2)]
        end(reopened, 2, commit=False, epoch=1)  # the epochs survived too: the old one is now fenced
        with pytest.raises(InvalidProducerEpoch):
            txn(reopened, 2, epoch=0)
    finally:
        reopened.close()


def test_a_follower_truncation_below_a_marker_reopens_the_transaction(log):
    txn(log, 1)  # 0, 1
    marker = end(log, 1, commit=True)  # 2
    assert log.ongoing_transactions() == {}
    log.truncate_to(marker)
    assert log.ongoing_transactions() == {1: 0}


def test_a_raised_log_start_offset_forgets_the_aborts_wholly_below_it(log):
    txn(log, 1)
    end(log, 1, commit=False)  # aborted [0, 2]
    plain(log, 2)  # 3, 4
    caught_up(log)
    log.increment_log_start_offset(3)
    assert log.aborted_transactions(0, 10) == []


def test_an_empty_batch_the_cleaner_kept_starts_no_transaction():
    raw = encode_batch([b"v"], keys=[b"k"], producer_id=4, producer_epoch=2, base_sequence=9, is_transactional=True)
    state = ProducerStateManager()
    state.apply(read_header(empty_batch(raw)))
    assert state.ongoing() == {}
    assert state.last_records() == {4: (0, 2)}


def test_a_version_2_marker_of_the_bumped_epoch_ends_the_transaction_and_the_next_one_starts_at_sequence_0(log):
    # KIP-890: EndTxn v5 writes the marker with the epoch bumped; the producer's next transaction
    # runs in that epoch from sequence 0, and a late batch of the old epoch is fenced.
    txn(log, 9, epoch=3)
    assert log.in_transaction(9, 3) and not log.in_transaction(9, 4) and not log.in_transaction(8, 3)
    end(log, 9, commit=True, epoch=4)
    assert not log.in_transaction(9, 3) and not log.in_transaction(9, 4)
    txn(log, 9, epoch=4)
    assert log.in_transaction(9, 4)
    with pytest.raises(InvalidProducerEpoch):
        txn(log, 9, epoch=3)
