"""The leader's DeleteRecords handler end to end in one process: a real purgatory on a real
redis-server, real partition logs, no replica server."""

from __future__ import annotations

from lowtide.errors import KafkaStorageError
from lowtide.log.start_offset_file import StartOffsetSyncGroup
from lowtide.messages.replica import DeleteRecordsResult
from lowtide.replica.delete_records import DeleteRecordsHandler
from lowtide.replica.registry import PartitionRegistry
from tests.unit.replica.conftest import TOPIC, leader_registry


def handler_for(replicas, purgatory) -> DeleteRecordsHandler:
    registry = leader_registry(replicas)
    return DeleteRecordsHandler(registry=registry, purgatory=purgatory)


def test_a_low_watermark_of_zero_is_a_success_not_an_unknown_server_error(replicas, purgatory):
    # Finding 4 of issue 9: the result 0 was falsy and fell through to UNKNOWN_SERVER_ERROR.
    handler = handler_for(replicas, purgatory)

    assert handler.delete_records([(TOPIC, 0, 0)], timeout_ms=1000) == [DeleteRecordsResult(TOPIC, 0, low_watermark=0)]


def test_offset_minus_one_on_an_empty_partition_succeeds_with_low_watermark_zero(make_replicas, purgatory):
    empty = make_replicas()
    empty.replicate()  # the followers have fetched once, so they count toward the low watermark
    handler = handler_for(empty, purgatory)

    assert handler.delete_records([(TOPIC, 0, -1)], timeout_ms=1000) == [DeleteRecordsResult(TOPIC, 0, low_watermark=0)]


def test_results_come_back_in_request_order_with_errors_in_place(replicas, purgatory):
    handler = handler_for(replicas, purgatory)
    replicas.replicate()

    results = handler.delete_records([(TOPIC, 7, 1), (TOPIC, 0, 0)], timeout_ms=1000)

    assert [(r.topic, r.partition) for r in results] == [(TOPIC, 7), (TOPIC, 0)]
    assert results[0].error.name == "UNKNOWN_TOPIC_OR_PARTITION" and results[0].low_watermark == -1
    assert results[1] == DeleteRecordsResult(TOPIC, 0, low_watermark=0)


def leaders_alone(make_replicas, count: int) -> tuple[list, PartitionRegistry]:
    """``count`` single-partition topics led by broker 0, the only live broker and ISR member, so
    each low watermark is the leader's LSO; and broker 0's registry hosting them."""
    sets = [make_replicas(topic=f"t{i}", isr=(0,)) for i in range(count)]
    for r in sets:
        r.produce(10)
    registry = PartitionRegistry(broker_id=0)
    leaders = {r.leader.key: r.leader for r in sets}
    registry.apply_assignment({r.leader.key: r.state for r in sets}, open_partition=leaders.__getitem__)
    registry.update_live_brokers({0})
    return sets, registry


def test_one_request_over_many_partitions_makes_their_log_start_offsets_durable_with_one_flush(
        make_replicas, purgatory, monkeypatch):
    sets, registry = leaders_alone(make_replicas, 3)
    flushes = []
    real_flush = StartOffsetSyncGroup.flush
    monkeypatch.setattr(StartOffsetSyncGroup, "flush", lambda self: (flushes.append(len(self)), real_flush(self)))
    handler = DeleteRecordsHandler(registry=registry, purgatory=purgatory)

    results = handler.delete_records([("t0", 0, 7), ("t1", 0, 7), ("t2", 0, 7)], timeout_ms=1000)

    assert results == [DeleteRecordsResult(t, 0, low_watermark=7) for t in ("t0", "t1", "t2")]
    assert flushes == [3]
    assert [r.leader.log.log_start_offset for r in sets] == [7, 7, 7]


def test_when_the_flush_fails_the_raised_partitions_fail_and_keep_their_log_start_offset(
        make_replicas, purgatory, monkeypatch):
    sets, registry = leaders_alone(make_replicas, 2)

    def fail(self) -> None:
        raise KafkaStorageError("cannot flush the log start offset files of 2 partitions: Input/output error")

    monkeypatch.setattr(StartOffsetSyncGroup, "flush", fail)
    handler = DeleteRecordsHandler(registry=registry, purgatory=purgatory)

    results = handler.delete_records([("t0", 0, 7), ("t1", 0, 0)], timeout_ms=1000)

    assert results[0].error.name == "KAFKA_STORAGE_ERROR"
    assert results[1] == DeleteRecordsResult("t1", 0, low_watermark=0)  # not part of the failed flush
    assert [r.leader.log.log_start_offset for r in sets] == [0, 0]
