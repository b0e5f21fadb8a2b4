"""The coordinator in transactions version 2 (KIP-890, ``frontdoor/transactions/txn_v2.py``) on a real
etcd (``TxnStateStore``): EndTxn v5 bumps the epoch on every commit and abort and answers it, a
retried EndTxn is answered again without a write, the old epoch is fenced afterwards, the last
epoch hands over a new producer id, a timed-out version-2 transaction is fenced by 2, and each
completed transaction is counted by version on /metrics. Version 1 keeps its epoch.

The transactions hold only the group's ``__consumer_offsets`` partition (AddOffsetsToTxn, or
TxnOffsetCommit v5's add): a topic the metadata does not have, so completing one writes no
marker and needs no replica."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.errors import InvalidTxnState, ProducerFenced
from lowtide.frontdoor.transactions.transactions import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    MAX_EPOCH,
    ONGOING,
    TransactionCoordinator,
    TxnStateStore,
)
from lowtide.groups import OFFSETS_TOPIC
from lowtide.messages.admin import TRANSACTION_VERSION_1, TRANSACTION_VERSION_2

V2 = TRANSACTION_VERSION_2
ANON = "User:ANONYMOUS"


@pytest.fixture
def coord(metadata_store):
    txns = TxnStateStore(metadata=metadata_store)
    return TransactionCoordinator(store=txns, metadata=metadata_store, replicas=ReplicaClient(),
                                  authorizer=Authorizer(store=AclStore(metadata=metadata_store), enabled=False),
                                  offsets_partition=lambda group: 0), txns


def begin(c: TransactionCoordinator, tid: str, pid: int, epoch: int, *, version: int = V2) -> None:
    c.add_offsets(principal=ANON, transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id="g",
                  transaction_version=version)


def end(c: TransactionCoordinator, tid: str, pid: int, epoch: int, *, commit: bool = True,
        version: int = V2) -> tuple[int, int]:
    return c.end_txn(principal=ANON, transactional_id=tid, producer_id=pid, producer_epoch=epoch, commit=commit,
                     transaction_version=version)


def ended(version: str, result: str) -> float:
    return REGISTRY.get_sample_value("lowtide_transactions_ended_total",
                                     {"transaction_version": version, "result": result}) or 0.0


def test_every_end_txn_v5_bumps_the_epoch_answers_it_and_fences_the_old_one(coord):
    c, txns = coord
    pid, epoch = c.init_producer_id(principal=ANON, transactional_id="bump")
    commits, aborts = ended("2", "commit"), ended("2", "abort")
    begin(c, "bump", pid, epoch)
    assert txns.load("bump").transaction_version == V2
    assert end(c, "bump", pid, epoch) == (pid, epoch + 1)
    st = txns.load("bump")
    assert (st.state, st.producer_epoch, st.partitions, st.transaction_version) == (COMPLETE_COMMIT, epoch + 1,
                                                                                    frozenset(), V2)
    # The same EndTxn asked again (its answer lost): the same answer, nothing written.
    assert end(c, "bump", pid, epoch) == (pid, epoch + 1) and txns.load("bump").version == st.version
    # The old epoch can start nothing more; the new one can, and its abort bumps again.
    with pytest.raises(ProducerFenced):
        c.check_offsets_in_txn(principal=ANON, transactional_id="bump", producer_id=pid, producer_epoch=epoch,
                               group_id="g")
    with pytest.raises(ProducerFenced):
        begin(c, "bump", pid, epoch)
    begin(c, "bump", pid, epoch + 1)
    assert end(c, "bump", pid, epoch + 1, commit=False) == (pid, epoch + 2)
    assert txns.load("bump").state == COMPLETE_ABORT
    assert (ended("2", "commit") - commits, ended("2", "abort") - aborts) == (1, 1)
    # A commit of nothing is refused; an abort of nothing still bumps (the producer's failed sends).
    with pytest.raises(InvalidTxnState):
        end(c, "bump", pid, epoch + 2)
    assert end(c, "bump", pid, epoch + 2, commit=False) == (pid, epoch + 3)
    assert txns.load("bump").producer_epoch == epoch + 3


def test_version_1_keeps_the_epoch_and_writes_its_state_as_before(coord):
    c, txns = coord
    pid, epoch = c.init_producer_id(principal=ANON, transactional_id="v1")
    commits = ended("1", "commit")
    begin(c, "v1", pid, epoch, version=TRANSACTION_VERSION_1)
    assert end(c, "v1", pid, epoch, version=TRANSACTION_VERSION_1) == (pid, epoch)
    st = txns.load("v1")
    assert (st.state, st.producer_epoch, st.transaction_version) == (COMPLETE_COMMIT, epoch, TRANSACTION_VERSION_1)
    assert b"transaction_version" not in metadata_value(txns, "v1")
    assert ended("1", "commit") - commits == 1


def metadata_value(txns: TxnStateStore, tid: str) -> bytes:
    return txns._records.read(tid).value  # noqa: SLF001 - the stored JSON itself is what is checked


def test_the_last_epoch_hands_over_a_new_producer_id_and_the_retry_gets_it_too(coord):
    c, txns = coord
    pid, _ = c.init_producer_id(principal=ANON, transactional_id="overflow")
    st = txns.load("overflow")
    txns.save(replace(st, producer_epoch=MAX_EPOCH - 1, state=ONGOING, partitions=frozenset({(OFFSETS_TOPIC, 0)}),
                      start_ms=1, transaction_version=V2))
    new_pid, new_epoch = end(c, "overflow", pid, MAX_EPOCH - 1)
    assert new_pid not in (pid, -1) and new_epoch == 0
    st = txns.load("overflow")
    assert (st.state, st.producer_id, st.producer_epoch, st.previous_producer_id, st.next_producer_id) == (
        COMPLETE_COMMIT, new_pid, 0, pid, -1)
    assert end(c, "overflow", pid, MAX_EPOCH - 1) == (new_pid, 0)
    begin(c, "overflow", new_pid, 0)
    assert end(c, "overflow", new_pid, 0) == (new_pid, 1)


def test_a_timed_out_version_2_transaction_is_fenced_by_two_epochs(coord):
    c, txns = coord
    pid, epoch = c.init_producer_id(principal=ANON, transactional_id="late", timeout_ms=1000)
    begin(c, "late", pid, epoch)
    st = txns.load("late")
    assert c.expire(now=st.start_ms + 5000) >= 1
    st = txns.load("late")
    assert (st.state, st.producer_epoch) == (COMPLETE_ABORT, epoch + 2)
    # Its producer's own abort is no retry of that one: it is fenced, and so is its next start.
    with pytest.raises(ProducerFenced):
        end(c, "late", pid, epoch, commit=False)
    with pytest.raises(ProducerFenced):
        begin(c, "late", pid, epoch)


def test_init_producer_id_after_version_2_starts_the_next_instance_over(coord):
    c, txns = coord
    pid, epoch = c.init_producer_id(principal=ANON, transactional_id="again")
    begin(c, "again", pid, epoch)
    end(c, "again", pid, epoch)
    assert c.init_producer_id(principal=ANON, transactional_id="again") == (pid, epoch + 2)
    st = txns.load("again")
    assert (st.state, st.transaction_version, st.previous_producer_id, st.next_producer_id) == (EMPTY, 0, -1, -1)


def test_the_add_that_starts_a_transaction_says_its_version_and_a_later_add_does_not_change_it(coord):
    c, txns = coord
    pid, epoch = c.init_producer_id(principal=ANON, transactional_id="mixed")
    # A version-1 client whose Produce is v12: its AddOffsetsToTxn (or AddPartitionsToTxn) came
    # first, the produce's implicit add finds the partition in and writes nothing.
    begin(c, "mixed", pid, epoch, version=TRANSACTION_VERSION_1)
    st = txns.load("mixed")
    begin(c, "mixed", pid, epoch, version=V2)
    assert txns.load("mixed") == st and st.transaction_version == TRANSACTION_VERSION_1
    commits = ended("1", "commit")
    assert end(c, "mixed", pid, epoch, version=TRANSACTION_VERSION_1) == (pid, epoch)
    assert ended("1", "commit") - commits == 1


def test_init_producer_id_from_the_second_to_last_epoch_gives_a_new_producer_id(coord):
    # As Kafka's: a producer never holds MAX_EPOCH, which only a fencing abort may use.
    c, txns = coord
    pid, _ = c.init_producer_id(principal=ANON, transactional_id="worn")
    txns.save(replace(txns.load("worn"), producer_epoch=MAX_EPOCH - 2))
    assert c.init_producer_id(principal=ANON, transactional_id="worn") == (pid, MAX_EPOCH - 1)
    new_pid, epoch = c.init_producer_id(principal=ANON, transactional_id="worn")
    assert new_pid != pid and epoch == 0
