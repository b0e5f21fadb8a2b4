"""Transaction states in ``__transaction_state`` (frontdoor/transactions/txn_log.py) on a real 3-replica cluster:
two stores stand for two front doors; the compare-and-set between them, the states read back by a
store that starts later, the move of states kept in the metadata store, a kill -9 of the
partition's leader, and a commit left half-way by a front door that died, completed once."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.client import Consumer, Producer
from lowtide.client.replica import ReplicaClient
from lowtide.clock import now_ms
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.transactions.transactions import (
    ABANDONED_PREPARE_MS,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_COMMIT,
    TransactionCoordinator,
    TxnState,
    TxnStateStore,
)
from lowtide.frontdoor.transactions.txn_log import TxnStateLog
from lowtide.frontdoor.transactions.txn_records import TXN_STATE_TOPIC, partition_for_transactional_id
from tests.integration import support as s


def no_acls(cluster) -> Authorizer:
    return Authorizer(store=AclStore(metadata=s.store(cluster)), enabled=False)


def new_log(cluster, *, migrate: bool = False) -> TxnStateLog:
    """A store as one front door holds it."""
    store = s.store(cluster)
    client = ReplicaClient()
    return TxnStateLog(store=store, replicas=client,
                       topics=TopicAdmin(store=store, authorizer=no_acls(cluster), replicas=client,
                                         pool=ThreadPoolExecutor(max_workers=2)),
                       migrate_from=TxnStateStore(metadata=store) if migrate else None)


def coordinator_on(cluster, txns: TxnStateLog) -> TransactionCoordinator:
    return TransactionCoordinator(store=txns, metadata=s.store(cluster), replicas=ReplicaClient(),
                                  authorizer=no_acls(cluster))


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    from lowtide.localcluster.config import ClusterConfig
    from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("txn-log"), replicas=3,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG), session_timeout_ms=2000)
    for c in running_cluster(request, config):
        # States kept in the metadata store (where a migration from an older lowtide puts them),
        # before anything created the topic.
        TxnStateStore(metadata=s.store(c)).save(TxnState(transactional_id="from-metadata", producer_id=4242,
                                                         producer_epoch=3, state=COMPLETE_COMMIT))
        yield c


def test_the_front_door_that_creates_the_topic_moves_the_states_kept_in_the_metadata_store(cluster):
    txns = new_log(cluster, migrate=True)
    txns.save(TxnState(transactional_id="first", producer_id=1, producer_epoch=0))  # creates the topic
    moved = new_log(cluster).load("from-metadata")
    assert (moved.producer_id, moved.producer_epoch, moved.state) == (4242, 3, COMPLETE_COMMIT)


def test_a_state_one_front_door_saved_is_what_another_loads(cluster):
    a, b = new_log(cluster), new_log(cluster)
    saved = a.save(TxnState(transactional_id="shared", producer_id=7, producer_epoch=0,
                            partitions=frozenset({("t", 0), ("t", 1)}), state=ONGOING, start_ms=now_ms()))
    assert saved is not None and saved.version > 0
    assert b.load("shared") == saved


def test_a_save_on_a_state_another_front_door_moved_writes_nothing(cluster):
    a, b = new_log(cluster), new_log(cluster)
    st = a.save(TxnState(transactional_id="contended", producer_id=8, producer_epoch=0))
    seen_by_b = b.load("contended")
    moved = a.save(replace(st, producer_epoch=1))
    assert moved is not None
    assert b.save(replace(seen_by_b, producer_epoch=5)) is None
    assert a.load("contended").producer_epoch == 1


def test_of_two_front_doors_saving_the_same_version_at_once_exactly_one_wins(cluster):
    base = new_log(cluster).save(TxnState(transactional_id="race", producer_id=9, producer_epoch=0))
    stores = [new_log(cluster) for _ in range(4)]
    for st in stores:
        st.load("race")
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
    assert new_log(cluster).load("race").producer_epoch == winners[0].producer_epoch


def test_states_are_read_from_the_new_leader_after_a_kill_9_of_the_partitions_leader(cluster):
    # Started now: the cluster's own front door aborts an Ongoing state past its timeout.
    txns = new_log(cluster)
    saved = txns.save(TxnState(transactional_id="survivor", producer_id=11, producer_epoch=2, state=ONGOING,
                               partitions=frozenset({("t", 3)}), start_ms=now_ms()))
    partitions = s.store(cluster).topic(TXN_STATE_TOPIC).partitions
    partition = partition_for_transactional_id("survivor", partitions=partitions)
    leader = s.leader_of(cluster, TXN_STATE_TOPIC, partition)
    cluster.kill(f"replica-{leader}", signal.SIGKILL)
    try:
        s.wait_until(lambda: s.leader_of(cluster, TXN_STATE_TOPIC, partition) not in (leader, -1), timeout_s=20,
                     what="a new leader")
        assert new_log(cluster).load("survivor") == saved
    finally:
        cluster.start_service(f"replica-{leader}")


def test_a_commit_left_half_way_by_a_dead_front_door_is_completed_once_by_another(cluster):
    s.create_topic(cluster, "half-way", partitions=1, rf=3)
    with Producer(cluster.bootstrap, transactional_id="half-way") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce_values("half-way", [b"a", b"b"], partition=0)
        # The front door that took EndTxn wrote PrepareCommit and died before any marker.
        txns = new_log(cluster)
        st = txns.load("half-way")
        assert st.state == ONGOING
        assert txns.save(replace(st, state=PREPARE_COMMIT)) is not None
    survivor = coordinator_on(cluster, new_log(cluster))
    assert survivor.expire(now=now_ms() + ABANDONED_PREPARE_MS + 1000) == 1
    assert survivor.expire(now=now_ms() + ABANDONED_PREPARE_MS + 2000) == 0  # nothing left to complete
    assert new_log(cluster).load("half-way").state == COMPLETE_COMMIT
    with Consumer(cluster.bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign([("half-way", 0)])
        got: list[bytes] = []
        s.wait_until(lambda: got.extend(r.value for r in consumer.poll(max_wait_ms=200)) or len(got) >= 2,
                     timeout_s=20, what="the committed records")
    assert got == [b"a", b"b"]


def test_an_expired_transactional_id_is_a_tombstone_no_store_reads_back(cluster):
    txns = new_log(cluster)
    st = txns.save(TxnState(transactional_id="to-expire", producer_id=12, producer_epoch=0, state=EMPTY))
    assert txns.delete(st)
    assert new_log(cluster).load("to-expire") is None
    assert "to-expire" not in new_log(cluster).transactional_ids()
