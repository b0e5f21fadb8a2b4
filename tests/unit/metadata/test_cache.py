"""The metadata cache on a real redis-server: what it shows, how it learns of changes (pub/sub,
silent session expiry, a lost event), when it refuses to answer, and routing from it."""

from __future__ import annotations

import time
import uuid

import pytest
import redis as redis_lib

from lowtide.frontdoor.routing import route_partitions
from lowtide.metadata.cache import MetadataCache
from lowtide.metadata.model import BrokerInfo, PartitionState
from lowtide.metadata.store import VERSION, MetadataStore, alive_key, partitions_key
from tests.waiting import wait_until


@pytest.fixture
def cache(store):
    c = MetadataCache(redis=store.redis, check_interval_s=0.05, max_age_s=1.0)
    c.start()
    yield c
    c.stop()


def register(store: MetadataStore, broker_id: int, port: int) -> None:
    store.register_broker(BrokerInfo(id=broker_id, host="127.0.0.1", port=port), incarnation=uuid.uuid4().hex,
                          session_timeout_ms=60_000)


def current(cache: MetadataCache):
    wait_until(lambda: cache.snapshot() is not None, what="a metadata snapshot")
    return cache.snapshot()


def test_the_snapshot_holds_topics_partitions_brokers_and_liveness(store, cache):
    register(store, 0, 9000)
    register(store, 1, 9001)
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={"retention.ms": "5"},
                       assignment=[[0, 1], [1, 0]])
    wait_until(lambda: (s := cache.snapshot()) is not None and ("orders", 1) in s.states, what="orders in cache")
    snap = cache.snapshot()
    assert snap.topics["orders"].config == {"retention.ms": "5"}
    assert snap.states[("orders", 1)].leader == 1
    assert snap.brokers[1].address == "127.0.0.1:9001"
    assert snap.live == {0, 1}
    assert snap.version == store.version()


def test_a_leader_change_published_by_the_controller_reaches_the_cache(store, cache):
    register(store, 0, 9000)
    register(store, 1, 9001)
    store.create_topic(name="t", partitions=1, replication_factor=2, config={}, assignment=[[0, 1]])
    wait_until(lambda: (s := cache.snapshot()) is not None and ("t", 0) in s.states, what="t in cache")
    old = store.partition_state("t", 0)
    moved = PartitionState(topic="t", partition=0, leader=1, leader_epoch=1, replicas=old.replicas, isr=(1,),
                           partition_epoch=old.partition_epoch)
    assert store.compare_and_set_partition(old, moved)
    wait_until(lambda: cache.snapshot() is not None and cache.snapshot().states[("t", 0)].leader == 1,
               what="the new leader in the cache")


def test_a_session_that_expires_silently_leaves_the_live_set(store, cache):
    register(store, 0, 9000)
    register(store, 1, 9001)
    wait_until(lambda: (s := cache.snapshot()) is not None and s.live == {0, 1}, what="both live")
    store.redis.delete(alive_key(1))  # a TTL running out publishes nothing
    wait_until(lambda: (s := cache.snapshot()) is not None and s.live == {0}, what="broker 1 no longer live")


def test_a_change_whose_event_was_lost_is_found_by_the_version_check(store, cache):
    register(store, 0, 9000)
    store.create_topic(name="t", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    wait_until(lambda: (s := cache.snapshot()) is not None and ("t", 0) in s.states, what="t in cache")
    state = store.partition_state("t", 0)
    moved = PartitionState(topic="t", partition=0, leader=-1, leader_epoch=1, replicas=state.replicas, isr=(),
                           partition_epoch=state.partition_epoch + 1)
    # Written the way a publisher that died before PUBLISH would leave it: data and version only.
    store.redis.hset(partitions_key("t"), "0", moved.to_json())
    store.redis.incr(VERSION)
    wait_until(lambda: cache.snapshot() is not None and cache.snapshot().states[("t", 0)].leader == -1,
               what="the unpublished change in the cache")


def test_mark_stale_hides_the_snapshot_until_a_fresh_reload(store, cache):
    register(store, 0, 9000)
    store.create_topic(name="t", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    wait_until(lambda: (s := cache.snapshot()) is not None and ("t", 0) in s.states, what="t in cache")
    store.delete_topic("t")
    cache.mark_stale()
    snap = cache.snapshot()
    assert snap is None or "t" not in snap.topics
    assert "t" not in current(cache).topics


def test_a_snapshot_not_confirmed_within_max_age_is_not_offered(store):
    cache = MetadataCache(redis=store.redis, check_interval_s=0.05, max_age_s=0.3)
    cache.start()
    try:
        current(cache)
    finally:
        cache.stop()  # no more checks from here on
    time.sleep(0.4)
    assert cache.snapshot() is None


def test_routes_come_from_the_cache_without_reading_redis(store, cache, redis_url):
    register(store, 0, 9000)
    register(store, 1, 9001)
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={}, assignment=[[0, 1], [1, 0]])
    wait_until(lambda: (s := cache.snapshot()) is not None and ("orders", 1) in s.states and s.live == {0, 1},
               what="orders in cache")
    # A store whose Redis cannot be reached: any read from it raises.
    unreachable = MetadataStore(redis=redis_lib.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2))
    routes = route_partitions(unreachable, [("orders", 0), ("orders", 1)], cache=cache)
    assert routes.by_address == {"127.0.0.1:9000": [("orders", 0)], "127.0.0.1:9001": [("orders", 1)]}
    # A partition the cache does not know goes to Redis (here: fails), never UNKNOWN from the cache.
    with pytest.raises(redis_lib.ConnectionError):
        route_partitions(unreachable, [("orders", 0), ("created-elsewhere", 0)], cache=cache)
    # Without a cache, the same store reads Redis.
    with pytest.raises(redis_lib.ConnectionError):
        route_partitions(unreachable, [("orders", 0)])


def test_a_leader_the_cache_sees_as_not_live_is_unroutable(store, cache):
    register(store, 0, 9000)
    register(store, 1, 9001)
    store.create_topic(name="t", partitions=1, replication_factor=2, config={}, assignment=[[1, 0]])
    store.redis.delete(alive_key(1))
    wait_until(lambda: (s := cache.snapshot()) is not None and ("t", 0) in s.states and s.live == {0},
               what="t cached with broker 1 not live")
    routes = route_partitions(store, [("t", 0)], cache=cache)
    assert not routes.by_address
    assert routes.unroutable[("t", 0)].name == "LEADER_NOT_AVAILABLE"
