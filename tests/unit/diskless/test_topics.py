"""DisklessTopics: which topics are diskless, cached from the metadata store on a real etcd; and
ShardDirectory: where the coordinator shards are, from the shard registry in the same store."""

from __future__ import annotations

import time

import pytest

from lowtide.coordinator.leadership import ShardAddress, register_shard
from lowtide.diskless.topics import DisklessTopics, ShardDirectory
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.store import MetadataStore
from tests.conftest import start_ready_etcd
from tests.waiting import wait_until


def create(store: MetadataStore, name: str, *, diskless: bool) -> None:
    store.create_topic(name=name, partitions=1, replication_factor=1, config={}, diskless=diskless,
                       assignment=[[0]], diskless_shards=[0] if diskless else None)


@pytest.fixture
def own_etcd(tmp_path):
    """An etcd of this test's own: the test stops it."""
    [member] = start_ready_etcd(tmp_path / "etcd")
    yield member
    member.stop()


def test_a_topic_created_a_moment_ago_is_found_at_once_whether_refreshed_or_not(metadata_store):
    store = metadata_store
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


def test_a_topic_created_by_another_process_is_found_at_once(metadata_store):
    other = MetadataStore(client=EtcdClient(metadata_store.client.endpoints), root=metadata_store.root)
    try:
        topics = DisklessTopics(store=metadata_store)
        assert topics.get("dl") is None
        create(other, "dl", diskless=True)
        assert topics.get("dl").name == "dl"  # an unknown name catches up with etcd first
    finally:
        other.close()


def test_the_refresher_sees_a_known_name_recreated_as_a_classic_topic(metadata_store):
    store = metadata_store
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


def test_with_the_refresher_a_known_topic_is_answered_while_etcd_is_down(own_etcd):
    store = MetadataStore(client=EtcdClient([own_etcd.endpoint], timeout_s=1.0))
    create(store, "dl", diskless=True)
    create(store, "classic", diskless=False)
    topics = DisklessTopics(store=store)
    topics.start()
    try:
        assert topics.get("dl") is not None
        own_etcd.stop()
        until = time.monotonic() + 0.6  # past several refreshes: the request path never waits on etcd
        while time.monotonic() < until:
            started = time.monotonic()
            assert topics.get("dl").name == "dl"
            assert topics.get("classic") is None
            assert time.monotonic() - started < 0.1
            time.sleep(0.01)
    finally:
        topics.stop()
        store.close()


def test_the_shard_directory_follows_the_registry_a_new_leader_writes_in_another_process(metadata_store):
    other = MetadataStore(client=EtcdClient(metadata_store.client.endpoints), root=metadata_store.root)
    try:
        directory = ShardDirectory(store=metadata_store)
        assert directory.lookup(0) is None and directory.count() == 0
        register_shard(other, ShardAddress(shard=0, grpc="h:1", metrics="", owner="a"))
        register_shard(other, ShardAddress(shard=1, grpc="h:2", metrics="", owner="b", framed="h:3"))
        wait_until(lambda: directory.count() == 2, what="the registry to reach this process's image")
        assert (directory.lookup(0), directory.lookup_framed(0)) == ("h:1", None)
        assert (directory.lookup(1), directory.lookup_framed(1)) == ("h:2", "h:3")
        register_shard(other, ShardAddress(shard=0, grpc="h:4", metrics="", owner="c"))  # a takeover
        wait_until(lambda: directory.lookup(0, refresh=True) == "h:4", what="the new leader's address")
    finally:
        other.close()
