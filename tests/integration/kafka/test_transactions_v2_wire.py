"""Transactions version 2 (KIP-890 part 2) on the wire, request by request, as a Kafka 4 producer
sends them to the brokers' Kafka listeners (raw ``kio`` requests: no client library decides):
InitProducerId, a transactional Produce v12 whose partition the leader adds to the transaction
itself (no AddPartitionsToTxn), EndTxn v5 answering the bumped epoch (asked again: the same answer),
a late Produce of the ended epoch refused with nothing appended, and AddPartitionsToTxn's
broker-to-broker verify-only form (v4: INVALID_TXN_STATE, v5: TRANSACTION_ABORTABLE)."""

from __future__ import annotations

import datetime

from lowtide.record import encode_batch
from tests.integration import support as s
from tests.integration.kafka.test_exactly_once_copier import PARTITIONS as COPY_PARTITIONS
from tests.integration.kafka.test_exactly_once_copier import read_committed
from tests.integration.kafka.wire import KafkaConnection, request_module

NONE, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, PRODUCER_FENCED, TRANSACTION_ABORTABLE = 0, 47, 48, 90, 120
init_v5, produce_v12, end_v5 = request_module(22, 5), request_module(0, 12), request_module(26, 5)
add_v4, add_v5, describe_v0 = request_module(24, 4), request_module(24, 5), request_module(65, 0)
TOPIC, TID = "txv2-wire", "txv2-wire-tx"


def produce(conn: KafkaConnection, *, pid: int, epoch: int, seq: int, values: list[bytes]) -> int:
    batch = encode_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    answer = conn.call(produce_v12.ProduceRequest(
        transactional_id=TID, acks=-1, timeout=datetime.timedelta(seconds=10), topic_data=(
            produce_v12.TopicProduceData(name=TOPIC, partition_data=(
                produce_v12.PartitionProduceData(index=0, records=batch),)),)))
    [topic] = answer.responses
    [partition] = topic.partition_responses
    return int(partition.error_code)


def end_txn(conn: KafkaConnection, *, pid: int, epoch: int, commit: bool) -> tuple[int, int, int]:
    answer = conn.call(end_v5.EndTxnRequest(transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                                            committed=commit))
    return int(answer.error_code), int(answer.producer_id), int(answer.producer_epoch)


def verify(conn: KafkaConnection, module, *, pid: int, epoch: int) -> int:
    """AddPartitionsToTxn v4+ verify-only of partition 0; its error code."""
    answer = conn.call(module.AddPartitionsToTxnRequest(transactions=(module.AddPartitionsToTxnTransaction(
        transactional_id=TID, producer_id=pid, producer_epoch=epoch, verify_only=True,
        topics=(module.AddPartitionsToTxnTopic(name=TOPIC, partitions=(0,)),)),)))
    [txn] = answer.results_by_transaction
    [topic] = txn.topic_results
    [partition] = topic.results_by_partition
    return int(partition.partition_error_code)


def described(conn: KafkaConnection):
    [st] = conn.call(describe_v0.DescribeTransactionsRequest(transactional_ids=(TID,))).transaction_states
    return st.transaction_state, int(st.producer_epoch), [(t.topic, list(t.partitions)) for t in st.topics]


def test_a_version_2_transaction_on_the_wire_adds_its_partition_at_the_leader_and_bumps_the_epoch(shared_cluster):
    cluster = shared_cluster
    s.create_topic(cluster, TOPIC, partitions=COPY_PARTITIONS, rf=3)  # read_committed reads them all
    leader = cluster.service(f"replica-{s.leader_of(cluster, TOPIC)}").kafka
    with KafkaConnection(leader) as conn:
        init = conn.call(init_v5.InitProducerIdRequest(transactional_id=TID,
                                                       transaction_timeout=datetime.timedelta(seconds=60)))
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        assert int(init.error_code) == NONE and pid >= 0
        assert verify(conn, add_v5, pid=pid, epoch=epoch) == TRANSACTION_ABORTABLE  # nothing added yet
        assert verify(conn, add_v4, pid=pid, epoch=epoch) == INVALID_TXN_STATE      # v4 predates that error

        # No AddPartitionsToTxn: the leader adds the partition before it appends.
        assert produce(conn, pid=pid, epoch=epoch, seq=0, values=[b"a", b"b"]) == NONE
        assert described(conn) == ("Ongoing", epoch, [(TOPIC, [0])])
        assert verify(conn, add_v5, pid=pid, epoch=epoch) == NONE
        assert produce(conn, pid=pid, epoch=epoch, seq=2, values=[b"c"]) == NONE

        assert end_txn(conn, pid=pid, epoch=epoch, commit=True) == (NONE, pid, epoch + 1)
        assert end_txn(conn, pid=pid, epoch=epoch, commit=True) == (NONE, pid, epoch + 1)  # asked again
        assert described(conn)[:2] == ("CompleteCommit", epoch + 1)
        before = s.read_all(cluster, TOPIC)

        # A late batch of the ended transaction: fenced by the coordinator, nothing appended.
        assert produce(conn, pid=pid, epoch=epoch, seq=3, values=[b"late"]) in (PRODUCER_FENCED,
                                                                                INVALID_PRODUCER_EPOCH)
        assert s.read_all(cluster, TOPIC) == before

        # The next transaction runs at the bumped epoch, sequences from 0; its abort bumps again.
        assert produce(conn, pid=pid, epoch=epoch + 1, seq=0, values=[b"aborted"]) == NONE
        assert end_txn(conn, pid=pid, epoch=epoch + 1, commit=False) == (NONE, pid, epoch + 2)
    assert read_committed(cluster.bootstrap, TOPIC) == {0: [b"a", b"b", b"c"], 1: []}
    assert b"late" not in [v for _, v in s.read_all(cluster, TOPIC)]
