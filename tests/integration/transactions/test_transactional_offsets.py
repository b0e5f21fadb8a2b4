"""Offsets committed inside a transaction (Kafka's AddOffsetsToTxn + TxnOffsetCommit, KIP-447), the
coordinator's descriptions (ListTransactions, DescribeTransactions, KIP-664) and the expiry of idle
transactional ids, through the front door's gRPC Admin service of a real cluster."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.clock import now_ms
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.transactions.transactions import COMPLETE_COMMIT, EMPTY, ONGOING, TransactionCoordinator
from lowtide.frontdoor.transactions.txn_log import TxnStateLog
from lowtide.groups import OFFSETS_TOPIC
from lowtide_pb import admin_pb2, common_pb2, transactions_pb2
from tests.integration import support as s

UNSTABLE_OFFSET_COMMIT, INVALID_TXN_STATE, PRODUCER_FENCED, TRANSACTIONAL_ID_NOT_FOUND = 88, 48, 90, 105


SRC = "txo-src"


@pytest.fixture(scope="module")
def txn_cluster(shared_cluster):
    """The worker's shared cluster: these tests fault nothing, and their topic, groups and
    transactional ids are their own (``txo-``)."""
    s.create_topic(shared_cluster, SRC, partitions=2, rf=3)
    return shared_cluster


class Txn:
    """One transactional producer's calls to the coordinator, as a Kafka client makes them."""

    def __init__(self, cluster, transactional_id: str) -> None:
        self.admin = s.admin(cluster)
        self.id = transactional_id
        answer = self.admin.InitProducerId(transactions_pb2.InitProducerIdRequest(transactional_id=transactional_id))
        assert answer.error_code == 0, answer
        self.pid, self.epoch = answer.producer_id, answer.producer_epoch

    def add_offsets(self, group: str) -> int:
        return self.admin.AddOffsetsToTxn(transactions_pb2.AddOffsetsToTxnRequest(
            transactional_id=self.id, producer_id=self.pid, producer_epoch=self.epoch, group_id=group)).error_code

    def commit_offsets(self, group: str, offsets: dict[int, int], *, epoch: int | None = None) -> list[int]:
        answer = self.admin.TxnOffsetCommit(transactions_pb2.TxnOffsetCommitRequest(
            transactional_id=self.id, group_id=group, producer_id=self.pid,
            producer_epoch=self.epoch if epoch is None else epoch,
            partitions=[transactions_pb2.TxnOffsetCommitPartition(topic=SRC, partition=p, offset=o)
                        for p, o in offsets.items()]))
        return [r.error_code for r in answer.partitions]

    def end(self, *, commit: bool) -> int:
        return self.admin.EndTxn(transactions_pb2.EndTxnRequest(
            transactional_id=self.id, producer_id=self.pid, producer_epoch=self.epoch, commit=commit)).error_code


def fetched(cluster, group: str, *, require_stable: bool) -> dict[int, tuple[int, int]]:
    """partition -> (offset, error code) of ``src`` as OffsetFetch answers."""
    answer = s.admin(cluster).OffsetFetch(admin_pb2.OffsetFetchRequest(
        group_id=group, require_stable=require_stable,
        partitions=[common_pb2.TopicPartition(topic=SRC, partition=p) for p in range(2)]))
    return {r.partition: (r.offset, r.error_code) for r in answer.partitions}


def test_offsets_committed_in_a_transaction_show_only_once_it_commits(txn_cluster):
    txn = Txn(txn_cluster, "txo-copy-1")
    assert txn.add_offsets("txo-g-commit") == 0
    assert txn.commit_offsets("txo-g-commit", {0: 10, 1: 20}) == [0, 0]
    assert fetched(txn_cluster, "txo-g-commit", require_stable=False) == {0: (-1, 0), 1: (-1, 0)}
    assert fetched(txn_cluster, "txo-g-commit", require_stable=True) == {
        0: (-1, UNSTABLE_OFFSET_COMMIT), 1: (-1, UNSTABLE_OFFSET_COMMIT)}
    assert txn.end(commit=True) == 0
    assert fetched(txn_cluster, "txo-g-commit", require_stable=True) == {0: (10, 0), 1: (20, 0)}


def test_offsets_of_an_aborted_transaction_leave_the_last_committed_ones(txn_cluster):
    txn = Txn(txn_cluster, "txo-copy-2")
    assert txn.add_offsets("txo-g-abort") == 0
    assert txn.commit_offsets("txo-g-abort", {0: 5}) == [0]
    assert txn.end(commit=True) == 0
    assert txn.add_offsets("txo-g-abort") == 0
    assert txn.commit_offsets("txo-g-abort", {0: 50}) == [0]
    assert txn.end(commit=False) == 0
    assert fetched(txn_cluster, "txo-g-abort", require_stable=True)[0] == (5, 0)


def test_offsets_without_add_offsets_to_txn_are_refused(txn_cluster):
    txn = Txn(txn_cluster, "txo-copy-3")
    assert txn.commit_offsets("txo-g-unadded", {0: 7}) == [INVALID_TXN_STATE]
    assert fetched(txn_cluster, "txo-g-unadded", require_stable=True)[0] == (-1, 0)


def test_a_fenced_producer_cannot_commit_offsets(txn_cluster):
    old = Txn(txn_cluster, "txo-copy-4")
    assert old.add_offsets("txo-g-fenced") == 0
    new = Txn(txn_cluster, "txo-copy-4")  # bumps the epoch and aborts the old transaction
    assert new.epoch > old.epoch
    assert old.commit_offsets("txo-g-fenced", {0: 99}) == [PRODUCER_FENCED]
    assert fetched(txn_cluster, "txo-g-fenced", require_stable=True)[0] == (-1, 0)


def test_list_and_describe_transactions_show_the_coordinators_states(txn_cluster):
    ongoing = Txn(txn_cluster, "txo-listed-ongoing")
    assert ongoing.add_offsets("txo-g-listed") == 0
    Txn(txn_cluster, "txo-listed-empty")
    admin = s.admin(txn_cluster)
    listed = {t.transactional_id: (t.state, t.producer_id) for t in admin.ListTransactions(
        transactions_pb2.ListTransactionsRequest(state_filters=[ONGOING])).transactions}
    assert listed.get("txo-listed-ongoing") == (ONGOING, ongoing.pid)
    assert "txo-listed-empty" not in listed
    described = {d.transactional_id: d for d in admin.DescribeTransactions(
        transactions_pb2.DescribeTransactionsRequest(
            transactional_ids=["txo-listed-ongoing", "txo-never-used"])).transactions}
    d = described["txo-listed-ongoing"]
    assert (d.error_code, d.state, d.producer_id, d.producer_epoch) == (0, ONGOING, ongoing.pid, ongoing.epoch)
    assert [(p.topic, p.partition) for p in d.partitions] == [(OFFSETS_TOPIC, p.partition) for p in d.partitions]
    assert len(d.partitions) == 1 and d.start_ms > 0
    assert described["txo-never-used"].error_code == TRANSACTIONAL_ID_NOT_FOUND
    assert ongoing.end(commit=True) == 0


def test_an_idle_transactional_id_expires_and_its_next_producer_starts_with_a_new_id(txn_cluster):
    done = Txn(txn_cluster, "txo-expiring")
    assert done.add_offsets("txo-g-expiring") == 0
    assert done.end(commit=True) == 0
    open_txn = Txn(txn_cluster, "txo-expiring-open")
    assert open_txn.add_offsets("txo-g-expiring-open") == 0
    store = s.store(txn_cluster)
    client = ReplicaClient()
    authorizer = Authorizer(store=AclStore(metadata=store), enabled=False)
    txns = TxnStateLog(store=store, replicas=client,
                       topics=TopicAdmin(store=store, authorizer=authorizer, replicas=client,
                                         pool=ThreadPoolExecutor(max_workers=2)))
    coordinator = TransactionCoordinator(store=txns, metadata=store, replicas=client, authorizer=authorizer,
                                         transactional_id_expiration_ms=60_000)
    assert txns.load("txo-expiring").state == COMPLETE_COMMIT
    # (expire scans every transactional id of the shared cluster: what the worker's earlier tests left
    # idle is forgotten too, and none of them comes back to its ids)
    coordinator.expire(now=now_ms() + 30_000)  # not idle long enough yet
    assert txns.load("txo-expiring") is not None
    coordinator.expire(now=now_ms() + 61_000)
    assert txns.load("txo-expiring") is None
    # An ongoing transaction is never forgotten: it times out (aborted, its epoch bumped) first.
    assert txns.load("txo-expiring-open").state != EMPTY
    assert Txn(txn_cluster, "txo-expiring").pid != done.pid
