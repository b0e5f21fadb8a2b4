"""DisklessTopics: which topics are diskless, cached from the metadata store in a real Redis."""

from __future__ import annotations

import time

import pytest
import redis as redis_lib

from lowtide.common.procs import start_redis
from lowtide.diskless.topics import DisklessTopics
from lowtide.metadata.store import MetadataStore
from tests.waiting import wait_until


def create(store: MetadataStore, name: str, *, diskless: bool) -> None:
    store.create_topic(name=name, partitions=1, replication_factor=1, config={}, diskless=diskless,
                       assignment=[[0]], diskless_shards=[0] if diskless else None)


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own: the test stops it."""
    proc = start_redis(tmp_path / "redis", appendonly=False)
    yield proc
    proc.stop()


def test_a_topic_created_a_moment_ago_is_found_at_once_whether_refreshed_or_not(redis_url):
    store = MetadataStore(redis=redis_lib.Redis.from_url(redis_url))
    lazy, refreshed = DisklessTopics(store=store), DisklessTopics(store=store)
    refreshed.start()
    try:
        assert lazy.get("dl") is None and refreshed.get("dl") is None
        create(store, "dl", diskless=True)
        create(store, "classic", diskless=False)
        for topics in (lazy, refreshed):
            assert topics.get("dl").name == "dl"
            assert topics.get("classic") is None
    finally:
        refreshed.stop()


def test_the_refresher_sees_a_known_name_recreated_as_a_classic_topic(redis_url):
    store = MetadataStore(redis=redis_lib.Redis.from_url(redis_url))
    create(store, "t", diskless=True)
    topics = DisklessTopics(store=store)
    topics.start()
    try:
        assert topics.get("t") is not None
        store.delete_topic("t")
        create(store, "t", diskless=False)  # the name stays known: only the version tells
        wait_until(lambda: topics.get("t") is None, timeout_s=5, what="the recreated topic seen as classic")
    finally:
        topics.stop()


def test_with_the_refresher_a_known_topic_is_answered_while_redis_is_down(own_redis):
    store = MetadataStore(redis=redis_lib.Redis.from_url(own_redis.url, socket_timeout=1, socket_connect_timeout=1))
    create(store, "dl", diskless=True)
    create(store, "classic", diskless=False)
    topics = DisklessTopics(store=store)
    topics.start()
    try:
        assert topics.get("dl") is not None
        own_redis.stop()
        until = time.monotonic() + 0.6  # past several refreshes: each fails, the request path never looks
        while time.monotonic() < until:
            assert topics.get("dl").name == "dl"
            assert topics.get("classic") is None
            time.sleep(0.01)
    finally:
        topics.stop()
