"""Idempotent produce on a real PartitionLog (docs/design/idempotence.md): per producer the epoch
and its last 5 batches decide whether a batch is new, a retry (answered with its original offsets,
nothing appended), out of order or fenced. Named after the cases of Kafka's
ProducerStateManagerTest that apply; the state comes from the batch headers, so it is the same
after a reopen and on a follower that replicated the batches."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber
from lowtide.log.partition_log import AppendInfo, LogConfig, PartitionLog
from lowtide.record import encode_batch, iter_batches
from lowtide.record.control import build_marker_batch

CONFIG = LogConfig(segment_bytes=4096)
INT32_MAX = 2**31 - 1


def open_log(path) -> PartitionLog:
    return PartitionLog.open(path, topic="t", partition=0, config=CONFIG)


@pytest.fixture
def log(tmp_path):
    plog = open_log(tmp_path / "t-0")
    yield plog
    plog.close()


def batch(pid: int, seq: int, n: int = 1, *, epoch: int = 0, ts: int | None = None) -> bytes:
    return encode_batch([b"v%d" % i for i in range(n)], timestamp_ms=ts, producer_id=pid, producer_epoch=epoch,
                        base_sequence=seq)


def produce(log: PartitionLog, pid: int, seq: int, n: int = 1, *, epoch: int = 0) -> AppendInfo:
    return log.append_as_leader(batch(pid, seq, n, epoch=epoch), leader_epoch=0)


def offsets(info: AppendInfo) -> tuple[int, int]:
    return info.base_offset, info.last_offset


def marker(log: PartitionLog, pid: int, *, epoch: int) -> None:
    raw = build_marker_batch(producer_id=pid, producer_epoch=epoch, commit=False, coordinator_epoch=0, timestamp_ms=1)
    log.append_as_leader(raw, leader_epoch=0, from_coordinator=True)


def test_basic_idempotence_a_retry_of_the_last_batch_gets_its_original_offsets_and_nothing_is_appended(log):
    log.append_as_leader(encode_batch([b"x"] * 2), leader_epoch=0)  # 0, 1: someone else's records
    first = produce(log, 7, 0, 3)  # 2..4
    retry = produce(log, 7, 0, 3)
    assert offsets(retry) == offsets(first) == (2, 4)
    assert retry.max_timestamp == first.max_timestamp and retry.num_batches == 0
    assert log.log_end_offset == 5


def test_a_retry_of_any_of_the_last_five_batches_is_answered_but_an_older_one_is_out_of_order(log):
    sent = [offsets(produce(log, 7, seq * 2, 2)) for seq in range(6)]  # sequences 0-1, 2-3, ..., 10-11
    leo = log.log_end_offset
    for seq in range(1, 6):
        assert offsets(produce(log, 7, seq * 2, 2)) == sent[seq]
    with pytest.raises(OutOfOrderSequenceNumber):
        produce(log, 7, 0, 2)  # the sixth newest: no longer retained, and not the next sequence
    assert log.log_end_offset == leo


def test_a_retry_must_match_the_first_and_last_sequence_of_a_batch(log):
    produce(log, 7, 0, 3)  # sequences 0..2
    with pytest.raises(OutOfOrderSequenceNumber):
        produce(log, 7, 0, 2)  # 0..1: overlaps the batch but is not it
    assert log.log_end_offset == 3


def test_a_sequence_gap_is_out_of_order_and_nothing_is_appended(log):
    produce(log, 7, 0, 2)
    with pytest.raises(OutOfOrderSequenceNumber):
        produce(log, 7, 3)  # 2 is missing
    assert log.log_end_offset == 2
    assert offsets(produce(log, 7, 2)) == (2, 2)


def test_producer_sequence_wraps_around_from_int32_max_to_zero(log):
    # Kafka's testProducerSequenceWrapAround
    produce(log, 7, INT32_MAX - 1, 2)  # INT32_MAX - 1, INT32_MAX
    assert offsets(produce(log, 7, 0)) == (2, 2)
    assert offsets(produce(log, 7, INT32_MAX - 1, 2)) == (0, 1)  # its retry is still known


def test_a_batch_of_an_older_epoch_is_an_invalid_producer_epoch(log):
    produce(log, 7, 0, epoch=3)
    with pytest.raises(InvalidProducerEpoch):
        produce(log, 7, 1, epoch=2)
    assert log.log_end_offset == 1


def test_a_new_epoch_of_a_known_producer_starts_at_sequence_zero(log):
    produce(log, 7, 0, 5, epoch=0)
    with pytest.raises(OutOfOrderSequenceNumber):
        produce(log, 7, 5, epoch=1)
    assert offsets(produce(log, 7, 0, epoch=1)) == (5, 5)
    with pytest.raises(InvalidProducerEpoch):
        produce(log, 7, 0, 5, epoch=0)  # the old epoch's batches are no longer retries


def test_out_of_sequence_after_control_record_epoch_bump(log):
    produce(log, 7, 0, 2, epoch=0)
    marker(log, 7, epoch=1)  # the coordinator bumped the epoch (an abort)
    with pytest.raises(OutOfOrderSequenceNumber):
        produce(log, 7, 2, epoch=1)
    assert offsets(produce(log, 7, 0, epoch=1)) == (3, 3)


def test_an_unknown_producer_may_start_at_any_sequence_as_kip_360_has_it(log):
    assert offsets(produce(log, 7, 42, epoch=5)) == (0, 0)
    assert offsets(produce(log, 7, 43, epoch=5)) == (1, 1)


def test_a_coordinators_write_and_a_batch_without_sequence_are_not_checked(log):
    produce(log, 7, 0)
    log.append_as_leader(batch(7, 0), leader_epoch=0, from_coordinator=True)  # Kafka's COORDINATOR origin
    unsequenced = encode_batch([b"c"], producer_id=8, producer_epoch=0)  # base sequence -1
    log.append_as_leader(unsequenced, leader_epoch=0)
    log.append_as_leader(unsequenced, leader_epoch=0)
    assert log.log_end_offset == 4


def test_a_request_mixing_a_retry_with_a_new_batch_is_out_of_order(log):
    produce(log, 7, 0)
    with pytest.raises(OutOfOrderSequenceNumber):
        log.append_as_leader(batch(7, 0) + batch(7, 1), leader_epoch=0)
    assert log.log_end_offset == 1
    both = log.append_as_leader(batch(7, 1) + batch(7, 2), leader_epoch=0)  # in sequence within a request
    assert offsets(log.append_as_leader(batch(7, 1) + batch(7, 2), leader_epoch=0)) == offsets(both) == (1, 2)


def test_the_state_is_rebuilt_from_the_batch_headers_after_a_reopen(tmp_path):
    log = open_log(tmp_path / "t-0")
    sent = [offsets(produce(log, 7, seq, epoch=2)) for seq in range(3)]
    log.roll()
    sent.append(offsets(produce(log, 7, 3, epoch=2)))
    log.close()
    log = open_log(tmp_path / "t-0")
    try:
        assert offsets(produce(log, 7, 1, epoch=2)) == sent[1]
        assert offsets(produce(log, 7, 3, epoch=2)) == sent[3]
        with pytest.raises(OutOfOrderSequenceNumber):
            produce(log, 7, 5, epoch=2)
        with pytest.raises(InvalidProducerEpoch):
            produce(log, 7, 4, epoch=1)
        assert log.log_end_offset == 4
    finally:
        log.close()


def test_a_follower_that_replicated_the_batches_answers_a_retry_as_its_leader_did(tmp_path):
    leader, follower = open_log(tmp_path / "leader"), open_log(tmp_path / "follower")
    try:
        sent = [offsets(produce(leader, 7, seq * 2, 2)) for seq in range(3)]
        data = leader.read(0, max_bytes=1 << 20, max_offset=leader.log_end_offset)
        assert len(list(iter_batches(data))) == 3
        follower.append_as_follower(data)
        assert offsets(produce(follower, 7, 4, 2)) == sent[2]  # it leads now: the retry appends nothing
        with pytest.raises(OutOfOrderSequenceNumber):
            produce(follower, 7, 7)
        assert offsets(produce(follower, 7, 6)) == (6, 6)
    finally:
        leader.close()
        follower.close()


def test_a_truncated_follower_forgets_the_batches_it_no_longer_holds(log):
    produce(log, 7, 0, 2)  # 0, 1
    produce(log, 7, 2, 2)  # 2, 3
    log.truncate_to(2)
    assert offsets(produce(log, 7, 2, 2)) == (2, 3)  # appended again, not answered as a retry
    assert log.log_end_offset == 4


def test_a_follower_takes_a_producers_batches_at_any_sequence_and_then_checks_them_as_leader(tmp_path):
    # Kafka's testAcceptAppendWithoutProducerStateOnReplica: replication is never validated
    follower = open_log(tmp_path / "t-0")
    try:
        replicated = encode_batch([b"a", b"b"], producer_id=7, producer_epoch=3, base_sequence=17)
        follower.append_as_follower(replicated)  # offsets 0, 1; the leader knew the producer, we do not
        assert offsets(produce(follower, 7, 17, 2, epoch=3)) == (0, 1)  # leading now: a retry
        with pytest.raises(OutOfOrderSequenceNumber):
            produce(follower, 7, 20, epoch=3)
        assert offsets(produce(follower, 7, 19, epoch=3)) == (2, 2)
    finally:
        follower.close()


def test_recovery_takes_a_producers_first_batch_at_any_sequence(tmp_path):
    # Kafka's testNoValidationOnFirstEntryWhenLoadingLog: the log's first batch of a producer may
    # follow batches that were deleted, so loading never checks it
    log = open_log(tmp_path / "t-0")
    produce(log, 7, 500, 2, epoch=1)  # unknown producer (KIP-360): any sequence
    log.close()
    for snapshot in tmp_path.joinpath("t-0").glob("*.snapshot"):
        snapshot.unlink()  # read every header
    log = open_log(tmp_path / "t-0")
    try:
        assert log.producer_last_records() == {7: (1, 1)}
        assert offsets(produce(log, 7, 502, epoch=1)) == (2, 2)
    finally:
        log.close()
