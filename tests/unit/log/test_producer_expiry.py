"""Producer-id expiry (KIP-854 ``producer.id.expiration.ms``): a producer with no batch for that
long and no open transaction is forgotten, by the periodic pass and when a log is opened; a
produce from it afterwards is an unknown producer's (KIP-360: any sequence). Timestamps are the
batches' own. Cases named after Kafka's ProducerStateManagerTest say so in a comment."""

from __future__ import annotations

import pytest

from lowtide.clock import now_ms
from lowtide.errors import InvalidConfig, OutOfOrderSequenceNumber
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.record import encode_batch

HOUR_MS = 60 * 60 * 1000
CONFIG = LogConfig(producer_id_expiration_ms=HOUR_MS)


def open_log(path, config: LogConfig = CONFIG) -> PartitionLog:
    return PartitionLog.open(path, topic="t", partition=0, config=config)


@pytest.fixture
def log(tmp_path):
    plog = open_log(tmp_path / "t-0")
    yield plog
    plog.close()


def produce(log: PartitionLog, pid: int, seq: int, *, ts: int, txn: bool = False) -> int:
    raw = encode_batch([b"v"], timestamp_ms=ts, producer_id=pid, producer_epoch=0, base_sequence=seq,
                       is_transactional=txn)
    return log.append_as_leader(raw, leader_epoch=0).base_offset


def test_the_expiration_time_is_a_log_config_key_with_kafkas_default_of_one_day():
    assert LogConfig().producer_id_expiration_ms == 24 * HOUR_MS
    assert LogConfig.from_topic_config({"producer.id.expiration.ms": "5000"}).producer_id_expiration_ms == 5000
    with pytest.raises(InvalidConfig, match="producer.id.expiration.ms"):
        LogConfig.from_topic_config({"producer.id.expiration.ms": "0"})


def test_a_producer_idle_for_the_expiration_time_is_forgotten_and_may_then_start_at_any_sequence(log):
    # Kafka's testPidExpirationTimeout
    now = now_ms()
    produce(log, 1, 0, ts=now - 2 * HOUR_MS)
    with pytest.raises(OutOfOrderSequenceNumber):
        produce(log, 1, 5, ts=now)  # known: sequence 5 does not follow 0
    assert log.remove_expired_producers(now_ms=now) == [1]
    assert produce(log, 1, 5, ts=now) == 1  # unknown now: KIP-360 accepts it
    assert log.remove_expired_producers(now_ms=now) == []


def test_a_producer_that_wrote_within_the_expiration_time_is_kept(log):
    now = now_ms()
    produce(log, 1, 0, ts=now - 2 * HOUR_MS)
    produce(log, 1, 1, ts=now - HOUR_MS // 2)  # the newest batch counts
    assert log.remove_expired_producers(now_ms=now) == []
    assert log.remove_expired_producers(now_ms=now + HOUR_MS) == [1]


def test_a_producer_with_an_open_transaction_never_expires(log):
    # Kafka's testProducersWithOngoingTransactionsDontExpire
    now = now_ms()
    first = produce(log, 1, 0, ts=now - 48 * HOUR_MS, txn=True)
    produce(log, 2, 0, ts=now - 48 * HOUR_MS)
    assert log.remove_expired_producers(now_ms=now) == [2]
    assert log.ongoing_transactions() == {1: first}
    log.set_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == first  # still held back by the open transaction


def test_expired_producers_are_dropped_when_a_log_is_reopened(tmp_path):
    # Kafka's testRemoveExpiredPidsOnReload and testLoadFromSnapshotRetainsNonExpiredProducers
    log = open_log(tmp_path / "t-0")
    now = now_ms()
    produce(log, 1, 0, ts=now - 2 * HOUR_MS)
    produce(log, 2, 0, ts=now)
    log.roll()  # a snapshot holding both
    log.close()
    reopened = open_log(tmp_path / "t-0")
    try:
        assert reopened._producers.producer(1) is None
        assert reopened._producers.producer(2) is not None
        assert produce(reopened, 1, 9, ts=now) == 2  # any sequence
        with pytest.raises(OutOfOrderSequenceNumber):
            produce(reopened, 2, 9, ts=now)
    finally:
        reopened.close()
