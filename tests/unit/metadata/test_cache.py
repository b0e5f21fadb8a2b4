"""The metadata cache (routing snapshots of the store's image) on a real etcd: what a snapshot
shows, how changes by other processes and silent session expiry reach it, ``mark_stale``, serving
while etcd is down, and routing from it."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from lowtide.common.procs import EtcdMember
from lowtide.frontdoor.routing import route_partitions
from lowtide.metadata.cache import MetadataCache
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.model import BrokerInfo, PartitionState
from lowtide.metadata.store import MetadataStore
from tests.conftest import start_ready_etcd
from tests.waiting import wait_until


@pytest.fixture
def store(metadata_store) -> MetadataStore:
    return metadata_store


@pytest.fixture
def cache(store) -> Iterator[MetadataCache]:
    c = MetadataCache(store=store)
    c.start()
    yield c
    c.stop()


@pytest.fixture
def controller(store) -> Iterator[MetadataStore]:
    """Another process's store (the controller's): same etcd and root, its own connection and image."""
    s = MetadataStore(client=EtcdClient(store.client.endpoints), root=store.root)
    yield s
    s.close()


@pytest.fixture
def own_etcd(tmp_path) -> Iterator[EtcdMember]:
    """A one-member etcd of this test's own: the test stops it."""
    [member] = start_ready_etcd(tmp_path / "etcd")
    yield member
    if member.proc.poll() is None:
        os.kill(member.pid, signal.SIGCONT)  # a test that paused it and failed before resuming it
    member.stop()


def register(store: MetadataStore, broker_id: int, port: int, *, session_timeout_ms: int = 60_000) -> None:
    store.register_broker(BrokerInfo(id=broker_id, host="127.0.0.1", port=port), incarnation=uuid.uuid4().hex,
                          session_timeout_ms=session_timeout_ms)


def current(cache: MetadataCache):
    wait_until(lambda: cache.snapshot() is not None, what="a metadata snapshot")
    return cache.snapshot()


def test_the_snapshot_holds_topics_partitions_brokers_and_liveness(store, cache):
    register(store, 0, 9000)
    register(store, 1, 9001)
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={"retention.ms": "5"},
                       assignment=[[0, 1], [1, 0]])
    snap = current(cache)  # this process's own writes: in the next snapshot
    assert snap.topics["orders"].config == {"retention.ms": "5"}
    assert snap.states[("orders", 1)].leader == 1
    assert snap.brokers[1].address == "127.0.0.1:9001"
    assert snap.live == {0, 1}
    assert snap.version == store.version()


def test_a_leader_change_made_by_the_controller_reaches_the_cache(store, cache, controller):
    register(store, 0, 9000)
    register(store, 1, 9001)
    store.create_topic(name="t", partitions=1, replication_factor=2, config={}, assignment=[[0, 1]])
    assert ("t", 0) in current(cache).states
    old = controller.partition_state("t", 0)
    moved = PartitionState(topic="t", partition=0, leader=1, leader_epoch=1, replicas=old.replicas, isr=(1,),
                           partition_epoch=old.partition_epoch)
    assert controller.compare_and_set_partition(old, moved)
    wait_until(lambda: cache.snapshot().states[("t", 0)].leader == 1, what="the new leader in the cache")
    assert cache.snapshot().version == store.version()


def test_a_session_that_expires_silently_leaves_the_live_set(store, cache):
    register(store, 0, 9000)
    register(store, 1, 9001, session_timeout_ms=2000)  # never renewed
    assert current(cache).live == {0, 1}
    wait_until(lambda: cache.snapshot().live == {0}, timeout_s=10, interval_s=0.1,
               what="broker 1's lapsed session to leave the live set")
    assert 1 in cache.snapshot().brokers  # registered, not live


def test_a_snapshot_is_rebuilt_only_when_the_metadata_moved(store, cache):
    register(store, 0, 9000)
    first = current(cache)
    assert cache.snapshot() is first  # nothing changed: the same immutable snapshot
    store.create_topic(name="t", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    second = cache.snapshot()
    assert second is not first and ("t", 0) in second.states and ("t", 0) not in first.states
    assert second.version > first.version


def test_mark_stale_makes_the_next_snapshot_catch_up_with_etcd(store, cache, controller):
    register(store, 0, 9000)
    current(cache)
    for i in range(10):
        controller.create_topic(name=f"t{i}", partitions=1, replication_factor=1, config={}, assignment=[[0]])
        cache.mark_stale()
        assert f"t{i}" in cache.snapshot().topics  # at once: the snapshot caught up first
    controller.delete_topic("t0")
    cache.mark_stale()
    assert "t0" not in cache.snapshot().topics


def test_the_snapshot_is_offered_from_the_start_and_while_etcd_is_down(own_etcd):
    store = MetadataStore(client=EtcdClient([own_etcd.endpoint], timeout_s=1.0), root="/lowtide/")
    cache = MetadataCache(store=store)
    try:
        assert cache.snapshot() is None  # nothing loaded yet: nothing to offer
        register(store, 0, 9000)
        store.create_topic(name="t", partitions=1, replication_factor=1, config={}, assignment=[[0]])
        cache.start()
        version = current(cache).version
        os.kill(own_etcd.pid, signal.SIGSTOP)
        time.sleep(0.5)
        cache.mark_stale()  # cannot catch up: the image as it was
        snap = cache.snapshot()
        assert snap is not None and snap.version == version and ("t", 0) in snap.states and snap.live == {0}
    finally:
        cache.stop()
        store.close()


def test_routes_come_from_the_cache_while_etcd_is_down(own_etcd):
    store = MetadataStore(client=EtcdClient([own_etcd.endpoint], timeout_s=1.0), root="/lowtide/")
    cache = MetadataCache(store=store)
    cache.start()
    try:
        register(store, 0, 9000)
        register(store, 1, 9001)
        store.create_topic(name="orders", partitions=2, replication_factor=2, config={},
                           assignment=[[0, 1], [1, 0]])
        assert ("orders", 1) in current(cache).states
        own_etcd.stop()
        started = time.monotonic()
        routes = route_partitions(store, [("orders", 0), ("orders", 1)], cache=cache)
        assert routes.by_address == {"127.0.0.1:9000": [("orders", 0)], "127.0.0.1:9001": [("orders", 1)]}
        assert time.monotonic() - started < 0.5  # from memory, no timeout waited out
        # A partition the cache does not know is looked up in the store (which cannot catch up, and
        # answers from its image): unknown, after trying, not a failure of the whole request.
        routes = route_partitions(store, [("orders", 0), ("created-elsewhere", 0)], cache=cache)
        assert routes.by_address == {"127.0.0.1:9000": [("orders", 0)]}
        assert routes.unknown[("created-elsewhere", 0)].name == "UNKNOWN_TOPIC_OR_PARTITION"
        # Without a cache, the same store answers from its image too.
        assert route_partitions(store, [("orders", 1)]).by_address == {"127.0.0.1:9001": [("orders", 1)]}
    finally:
        cache.stop()
        store.close()


def test_a_leader_the_cache_sees_as_not_live_is_unroutable(store, cache):
    register(store, 0, 9000)
    register(store, 1, 9001)
    store.create_topic(name="t", partitions=1, replication_factor=2, config={}, assignment=[[1, 0]])
    store.unregister_broker(1, incarnation="")  # its session ends
    wait_until(lambda: (s := cache.snapshot()) is not None and ("t", 0) in s.states and s.live == {0},
               what="t cached with broker 1 not live")
    routes = route_partitions(store, [("t", 0)], cache=cache)
    assert not routes.by_address
    assert routes.unroutable[("t", 0)].name == "LEADER_NOT_AVAILABLE"
