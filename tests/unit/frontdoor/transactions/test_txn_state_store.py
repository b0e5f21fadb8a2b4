"""``TxnStateStore`` (frontdoor/transactions/transactions.py): transaction states in the metadata store's
``transactions`` section on a real etcd, compare-and-set on the record's revision; a second store
on the same etcd and root stands for another front door. The coordinator runs on it, and a Redis
FLUSHALL (a real redis-server) loses no state and no producer id."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest
import redis as redis_lib

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.frontdoor.transactions.transactions import (
    COMPLETE_ABORT,
    EMPTY,
    ONGOING,
    TransactionCoordinator,
    TxnState,
    TxnStateStore,
)
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.store import MetadataStore


@pytest.fixture
def process(metadata_store) -> Iterator:
    """Opens the metadata store of another front door (same etcd and root, its own image)."""
    opened: list[MetadataStore] = []

    def open_store() -> MetadataStore:
        s = MetadataStore(client=EtcdClient(metadata_store.client.endpoints), root=metadata_store.root)
        opened.append(s)
        return s

    yield open_store
    for s in opened:
        s.close()


def coordinator(store: MetadataStore) -> tuple[TransactionCoordinator, TxnStateStore]:
    txns = TxnStateStore(metadata=store)
    return TransactionCoordinator(store=txns, metadata=store, replicas=ReplicaClient(),
                                  authorizer=Authorizer(store=AclStore(metadata=store), enabled=False)), txns


def test_a_saved_state_loads_back_in_another_process_at_the_records_revision(metadata_store, process):
    txns = TxnStateStore(metadata=metadata_store)
    assert txns.load("tx") is None
    saved = txns.save(TxnState(transactional_id="tx", producer_id=7, producer_epoch=2, state=ONGOING,
                               partitions=frozenset({("t", 0), ("t", 1)}), start_ms=123, timeout_ms=9000))
    assert saved is not None and saved.version > 0 and saved.updated_ms > 0
    other = TxnStateStore(metadata=process())
    assert other.load("tx") == saved
    assert other.transactional_ids() == ["tx"]
    assert other.states() == [saved]


def test_a_save_or_delete_on_a_state_another_store_moved_changes_nothing(metadata_store, process):
    a, b = TxnStateStore(metadata=metadata_store), TxnStateStore(metadata=process())
    st = a.save(TxnState(transactional_id="contended", producer_id=8, producer_epoch=0))
    seen_by_b = b.load("contended")
    moved = a.save(replace(st, producer_epoch=1))
    assert moved is not None and moved.version > st.version
    assert b.save(replace(seen_by_b, producer_epoch=5)) is None
    assert not b.delete(seen_by_b)
    assert a.save(TxnState(transactional_id="contended", producer_id=9, producer_epoch=0)) is None  # version 0: new
    assert b.load("contended").producer_epoch == 1
    assert b.delete(b.load("contended"))
    assert a.load("contended") is None and a.transactional_ids() == []


def test_of_front_doors_saving_the_same_version_at_once_exactly_one_wins(metadata_store, process):
    base = TxnStateStore(metadata=metadata_store).save(TxnState(transactional_id="race", producer_id=9,
                                                                producer_epoch=0))
    stores = [TxnStateStore(metadata=process()) for _ in range(4)]
    results: list[TxnState | None] = [None] * len(stores)
    start = threading.Barrier(len(stores))

    def bump(i: int) -> None:
        start.wait()
        results[i] = stores[i].save(replace(base, producer_epoch=10 + i))

    threads = [threading.Thread(target=bump, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert TxnStateStore(metadata=process()).load("race") == winners[0]


def test_the_coordinator_on_it_bumps_the_epoch_and_hands_out_fresh_producer_ids(metadata_store):
    txns_coordinator, txns = coordinator(metadata_store)
    pid, epoch = txns_coordinator.init_producer_id(principal="User:a", transactional_id="tx-a")
    assert epoch == 0
    assert txns_coordinator.init_producer_id(principal="User:a", transactional_id="tx-a") == (pid, 1)
    txns.save(replace(txns.load("tx-a"), state=ONGOING, start_ms=1))  # an open transaction, no partitions
    assert txns_coordinator.init_producer_id(principal="User:a", transactional_id="tx-a") == (pid, 3)  # aborted: 2
    idempotent = [txns_coordinator.init_producer_id(principal="User:a", transactional_id="")[0] for _ in range(3)]
    assert len({pid, *idempotent}) == 4
    listed = txns_coordinator.list_transactions(principal="User:a")
    assert [(st.transactional_id, st.state) for st in listed] == [("tx-a", EMPTY)]


def test_a_redis_flushall_loses_no_transaction_state_and_no_producer_id(metadata_store, process, redis_url):
    client = redis_lib.Redis.from_url(redis_url)
    try:
        txns_coordinator, txns = coordinator(metadata_store)
        pid, _ = txns_coordinator.init_producer_id(principal="User:a", transactional_id="tx-flush")
        txns.save(replace(txns.load("tx-flush"), state=COMPLETE_ABORT))
        given = {pid, *(txns_coordinator.init_producer_id(principal="User:a", transactional_id="")[0]
                        for _ in range(5))}
        client.set("unrelated", b"1")
        client.flushall()  # the real redis-server forgets everything
        assert client.dbsize() == 0
        # A front door started afterwards finds the state and never hands out an id given before.
        again, txns_again = coordinator(process())
        st = txns_again.load("tx-flush")
        assert (st.producer_id, st.producer_epoch, st.state) == (pid, 0, COMPLETE_ABORT)
        assert again.init_producer_id(principal="User:a", transactional_id="tx-flush") == (pid, 1)
        fresh = [again.init_producer_id(principal="User:a", transactional_id="")[0] for _ in range(5)]
        assert not given & set(fresh) and min(fresh) > max(given)
    finally:
        client.close()
