"""DescribeProducers on a replica (KIP-664, what ``kafka-transactions describe-producers``,
``find-hanging`` and ``abort --start-offset`` read): every replica answers its own log's producer
state, leader or follower as in Kafka (``Partition.activeProducerState``), so a follower answers
what it has replicated; a partition not hosted answers UNKNOWN_TOPIC_OR_PARTITION. Real partition
logs, no server."""

from __future__ import annotations

from lowtide.errors import UnknownTopicOrPartition
from lowtide.log.producer_state import ProducerDescription
from lowtide.record import encode_batch
from lowtide.record.control import build_marker_batch
from lowtide.replica.registry import PartitionRegistry
from lowtide.replica.requests import ReplicaRequests
from tests.unit.replica.conftest import BROKERS, TOPIC

TXN_PID, IDEMPOTENT_PID = 7000, 7001


def requests_on(replicas, broker: int) -> ReplicaRequests:
    registry = PartitionRegistry(broker_id=broker)
    registry.apply_assignment({replicas.by_broker[broker].key: replicas.state},
                              open_partition=lambda tp: replicas.by_broker[broker])
    registry.update_live_brokers(BROKERS)
    return ReplicaRequests(registry=registry, isr=None, deletes=None, min_insync_replicas=1)


def append(replicas, raw: bytes, *, coordinator: bool = False) -> int:
    return replicas.leader.append_as_leader(raw, acks=1, min_insync_replicas=1,
                                            from_coordinator=coordinator).base_offset


def test_the_leader_describes_its_producers_and_a_follower_what_it_replicated(make_replicas):
    replicas = make_replicas()
    replicas.produce(3)  # no producer id: not a producer of the state
    txn_start = append(replicas, encode_batch([b"a", b"b"], timestamp_ms=[1000, 1500], producer_id=TXN_PID,
                                              producer_epoch=2, base_sequence=0, is_transactional=True))
    append(replicas, encode_batch([b"c"], timestamp_ms=1700, producer_id=TXN_PID, producer_epoch=2,
                                  base_sequence=2, is_transactional=True))
    assert txn_start == 3
    follower = requests_on(replicas, 1)
    [(_, _, before)] = follower.describe_producers([(TOPIC, 0)])
    assert before == []  # nothing replicated yet: its own log knows no producer
    append(replicas, encode_batch([b"x"] * 4, timestamp_ms=2000, producer_id=IDEMPOTENT_PID, producer_epoch=0,
                                  base_sequence=10))
    replicas.replicate()

    [(topic, partition, producers)] = requests_on(replicas, 0).describe_producers([(TOPIC, 0)])
    assert (topic, partition) == (TOPIC, 0)
    assert producers == [
        ProducerDescription(producer_id=TXN_PID, producer_epoch=2, last_sequence=2, last_timestamp=1700,
                            coordinator_epoch=-1, current_txn_start_offset=txn_start),
        ProducerDescription(producer_id=IDEMPOTENT_PID, producer_epoch=0, last_sequence=13, last_timestamp=2000,
                            coordinator_epoch=-1, current_txn_start_offset=-1),
    ]
    [(_, _, replicated)] = follower.describe_producers([(TOPIC, 0)])
    assert replicated == producers
    [(_, _, unknown)] = follower.describe_producers([(TOPIC, 5)])
    assert isinstance(unknown, UnknownTopicOrPartition)

    replicas.elect(1, leader_epoch=2)  # the new leader answers the same
    [(_, _, after)] = follower.describe_producers([(TOPIC, 0)])
    assert after == producers


def test_a_marker_ends_the_producers_transaction_in_the_description(make_replicas):
    replicas = make_replicas()
    append(replicas, encode_batch([b"a"], timestamp_ms=1000, producer_id=TXN_PID, producer_epoch=0, base_sequence=0,
                                  is_transactional=True))
    append(replicas, build_marker_batch(producer_id=TXN_PID, producer_epoch=0, commit=False, coordinator_epoch=3,
                                        timestamp_ms=5000), coordinator=True)
    [(_, _, producers)] = requests_on(replicas, 0).describe_producers([(TOPIC, 0)])
    assert producers == [ProducerDescription(producer_id=TXN_PID, producer_epoch=0, last_sequence=0,
                                             last_timestamp=5000, coordinator_epoch=-1, current_txn_start_offset=-1)]
