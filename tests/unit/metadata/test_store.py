"""``MetadataStore`` on a real etcd (``metadata_store``: a root of its own per test): topics and
their deletion records, the cluster id every write is guarded by, broker sessions on leases, the
controller lease, and compare-and-set of configs. A second store on the same root stands for
another process."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from lowtide.errors import MetadataStoreUnavailable, TopicAlreadyExists, UnknownTopicOrPartition
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.model import BrokerInfo
from lowtide.metadata.store import MetadataStore
from tests.waiting import wait_until

RATE = "leader.replication.throttled.rate"


@pytest.fixture
def store(metadata_store) -> MetadataStore:
    return metadata_store


@pytest.fixture
def other(metadata_store) -> Iterator[MetadataStore]:
    """Another process's store: same etcd and root, its own connection and image."""
    s = MetadataStore(client=EtcdClient(metadata_store.client.endpoints), root=metadata_store.root)
    yield s
    s.close()


def create(store: MetadataStore, name: str, partitions: int = 1) -> None:
    store.create_topic(name=name, partitions=partitions, replication_factor=1, config={},
                       assignment=[[0]] * partitions)


def register(store: MetadataStore, broker_id: int, *, incarnation: str = "i", session_ms: int = 60_000) -> None:
    store.register_broker(BrokerInfo(id=broker_id, host="127.0.0.1", port=9000 + broker_id),
                          incarnation=incarnation, session_timeout_ms=session_ms)


# -- topics ----------------------------------------------------------------------------------------
def test_deleting_a_topic_records_its_id_and_removes_its_partitions(store):
    create(store, "orders", partitions=3)
    create(store, "orders2")
    first_id = store.topic("orders").topic_id
    assert store.deleted_topic_ids() == set()
    store.delete_topic("orders")
    assert store.deleted_topic_ids() == {first_id}
    assert "orders" not in store.topics()
    assert store.partition_states("orders") == []
    assert [s.topic for s in store.all_partition_states().values()] == ["orders2"]  # the other name kept
    # Recreated under the same name: a new id, and the old one stays recorded.
    create(store, "orders")
    second_id = store.topic("orders").topic_id
    assert second_id != first_id
    store.delete_topic("orders")
    assert store.deleted_topic_ids() == {first_id, second_id}


def test_another_process_sees_the_deletion_record(store, other):
    create(store, "orders")
    topic_id = store.topic("orders").topic_id
    store.delete_topic("orders")
    other.sync()
    assert topic_id in other.deleted_topic_ids()
    with pytest.raises(UnknownTopicOrPartition):
        other.topic("orders")


def test_deleting_a_topic_that_does_not_exist_is_unknown(store):
    with pytest.raises(UnknownTopicOrPartition):
        store.delete_topic("nosuch")
    assert store.deleted_topic_ids() == set()


def test_of_two_processes_creating_the_same_topic_exactly_one_succeeds(store, other):
    store.cluster_id()
    start = threading.Barrier(2)
    outcomes: list[object] = []

    def attempt(s: MetadataStore) -> None:
        start.wait()
        try:
            create(s, "orders", partitions=2)
            outcomes.append("created")
        except TopicAlreadyExists as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=attempt, args=(s,)) for s in (store, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(type, outcomes), key=str) == sorted([str, TopicAlreadyExists], key=str)
    with pytest.raises(TopicAlreadyExists):
        create(store, "orders")


def test_adding_partitions_to_a_topic_record_that_changed_since_it_was_read_writes_nothing(store):
    create(store, "orders")
    expected, topic = store.topic_record("orders")
    store.update_topic_config("orders", lambda t: {"retention.ms": "5"})
    assert store.add_partitions(expected=expected, topic=topic, assignment=[[0]]) is None
    assert [s.partition for s in store.partition_states("orders")] == [0]
    expected, topic = store.topic_record("orders")
    grown = store.add_partitions(expected=expected, topic=topic, assignment=[[0], [0]])
    assert grown.partitions == 3 and grown.config == {"retention.ms": "5"}
    assert [s.partition for s in store.partition_states("orders")] == [0, 1, 2]


# -- the cluster id --------------------------------------------------------------------------------
def test_the_cluster_id_is_created_once_and_every_process_reads_the_same(store, other):
    assert store.stored_cluster_id() is None
    first = store.cluster_id()
    assert other.cluster_id() == first == store.stored_cluster_id()
    assert not other.create_cluster_id(uuid.uuid4().hex)  # put-if-absent: the first one stays
    assert store.cluster_id() == first


def test_a_write_after_the_cluster_id_vanished_from_etcd_is_refused(store):
    create(store, "orders")
    store.adopt_cluster_id(store.cluster_id())  # as a service does with the id its data directory holds
    store.client.delete(store.cluster_id_key)  # etcd emptied, or this key lost
    with pytest.raises(MetadataStoreUnavailable, match="no longer holds cluster id"):
        create(store, "refused")
    with pytest.raises(MetadataStoreUnavailable):
        store.update_topic_config("orders", lambda t: {"retention.ms": "1"})
    with pytest.raises(MetadataStoreUnavailable):
        store.delete_topic("orders")
    store.sync()
    assert set(store.topics()) == {"orders"}  # nothing was written
    assert store.topic("orders").config == {}


def test_a_store_of_another_cluster_refuses_to_write(store, other):
    store.cluster_id()
    other.adopt_cluster_id("another-cluster")
    with pytest.raises(MetadataStoreUnavailable, match="belongs to cluster"):
        create(other, "orders")
    other.sync()
    assert other.topics() == {}


# -- brokers and their sessions --------------------------------------------------------------------
def test_a_registered_broker_is_live_until_it_unregisters(store, other):
    register(store, 1)
    register(store, 2)
    assert store.brokers()[1].address == "127.0.0.1:9001"
    assert store.live_broker_ids() == {1, 2}
    assert store.live_broker_ids([2, 3]) == {2}
    assert store.broker_racks() == {1: "", 2: ""}
    store.unregister_broker(1, incarnation="i")
    assert other.sync() and other.live_broker_ids() == {2}
    assert set(other.brokers()) == {1, 2}  # the registration stays; only liveness goes


def test_a_session_not_renewed_expires_and_its_heartbeat_then_says_so(store):
    register(store, 1, incarnation="a", session_ms=2000)
    assert store.heartbeat(1, incarnation="a", session_timeout_ms=2000)
    wait_until(lambda: 1 not in store.live_broker_ids(), timeout_s=10, interval_s=0.1,
               what="the unrenewed session to expire")
    assert not store.heartbeat(1, incarnation="a", session_timeout_ms=2000)
    register(store, 1, incarnation="b", session_ms=2000)  # the broker registers again
    assert store.live_broker_ids() == {1}


def test_heartbeats_keep_a_session_past_its_timeout(store):
    register(store, 1, incarnation="a", session_ms=2000)
    for _ in range(10):  # 5 s: more than twice the session timeout
        assert store.heartbeat(1, incarnation="a", session_timeout_ms=2000)
        assert store.live_broker_ids() == {1}
        threading.Event().wait(0.5)


def test_a_heartbeat_of_an_incarnation_another_process_replaced_fails(store, other):
    register(store, 1, incarnation="old")
    register(other, 1, incarnation="new")  # the broker restarted elsewhere with the same id
    wait_until(lambda: store.image.get(store._k("alive", 1)).value == b"new", what="the new incarnation seen")
    assert not store.heartbeat(1, incarnation="old", session_timeout_ms=60_000)
    assert not store.heartbeat(7, incarnation="old", session_timeout_ms=60_000)  # never opened here
    assert other.heartbeat(1, incarnation="new", session_timeout_ms=60_000)


# -- the controller lease --------------------------------------------------------------------------
def test_one_controller_at_a_time_and_a_lapsed_lease_passes_the_role_on(store, other):
    store.cluster_id()
    assert store.try_acquire_controller("fd-a", lease_ms=2000)
    assert not other.try_acquire_controller("fd-b", lease_ms=2000)
    assert store.try_acquire_controller("fd-a", lease_ms=2000)  # renewing keeps it
    # fd-a stops renewing: its lease lapses and fd-b takes over.
    wait_until(lambda: other.try_acquire_controller("fd-b", lease_ms=2000), timeout_s=10, interval_s=0.2,
               what="fd-b to take the lapsed controller role")
    other.sync()
    assert not store.try_acquire_controller("fd-a", lease_ms=2000)


# -- dynamic broker configs and topic configs -------------------------------------------------------
def test_broker_configs_are_set_overridden_and_removed(store, other):
    store.update_broker_config("", lambda c: {**c, RATE: "50"})
    store.update_broker_config("1", lambda c: {**c, RATE: "10"})
    assert store.broker_configs() == {"": {RATE: "50"}, "1": {RATE: "10"}}
    assert store.effective_broker_config(1) == {RATE: "10"}
    assert store.effective_broker_config(2) == {RATE: "50"}
    assert store.update_broker_config("1", lambda c: {}) == {}
    assert other.sync() and other.broker_configs() == {"": {RATE: "50"}}
    assert store.update_broker_config("", lambda c: {**c, "x": "1"}, dry_run=True) == {RATE: "50", "x": "1"}
    assert store.broker_config("") == {RATE: "50"}


def test_concurrent_config_changes_from_two_processes_all_land(store, other):
    create(store, "orders")
    keys = [f"k{i}" for i in range(8)]
    start = threading.Barrier(len(keys))

    def change(s: MetadataStore, key: str) -> None:
        start.wait()
        s.update_topic_config("orders", lambda t: {**t.config, key: "v"})
        s.update_broker_config("", lambda c: {**c, key: "v"})

    threads = [threading.Thread(target=change, args=(store if i % 2 else other, k)) for i, k in enumerate(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.sync()
    assert store.topic("orders").config == dict.fromkeys(keys, "v")
    assert store.broker_config("") == dict.fromkeys(keys, "v")
