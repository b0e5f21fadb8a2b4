"""The metadata image (``MetadataImage``, served through ``MetadataStore``) on a real etcd: a
process reads its own writes at once, sees other processes' writes through its watch, catches up
on demand (``sync``), tells listeners what changed, and keeps answering reads while etcd is down."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from lowtide.common.procs import EtcdMember
from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.etcd import EtcdClient, WatchEvent
from lowtide.metadata.image import MetadataImage
from lowtide.metadata.model import BrokerInfo
from lowtide.metadata.store import MetadataStore
from tests.conftest import start_ready_etcd
from tests.waiting import wait_until


def create(store: MetadataStore, name: str, partitions: int = 1) -> None:
    store.create_topic(name=name, partitions=partitions, replication_factor=1, config={},
                       assignment=[[0]] * partitions)


@pytest.fixture
def other_process(metadata_store) -> Iterator[MetadataStore]:
    """Another store on the same etcd and root, with its own connection and image: another process."""
    other = MetadataStore(client=EtcdClient(metadata_store.client.endpoints), root=metadata_store.root)
    yield other
    other.close()


@pytest.fixture
def own_etcd(tmp_path) -> Iterator[EtcdMember]:
    """A one-member etcd of this test's own: the test stops it."""
    [member] = start_ready_etcd(tmp_path / "etcd")
    yield member
    member.stop()


def test_a_store_reads_its_own_writes_at_once(metadata_store):
    for i in range(20):
        create(metadata_store, f"t{i}", partitions=2)
        # Straight from the image, without catching up: the write returned once the image showed it.
        assert f"t{i}" in metadata_store.topics()
        assert metadata_store.image.get(metadata_store._k("partitions", f"t{i}", 1)) is not None
    revision = metadata_store.client.revision()
    assert metadata_store.version() == revision


def test_a_write_by_another_process_appears_in_the_image(metadata_store, other_process):
    metadata_store.start()
    before = metadata_store.version()
    create(other_process, "elsewhere")
    wait_until(lambda: "elsewhere" in metadata_store.topics(), what="the other process's topic in the image")
    assert metadata_store.version() > before
    other_process.delete_topic("elsewhere")
    wait_until(lambda: "elsewhere" not in metadata_store.topics(), what="the deletion in the image")
    assert metadata_store.all_partition_states() == {}


def test_sync_catches_up_with_a_write_the_watch_may_not_have_delivered_yet(metadata_store, other_process):
    metadata_store.start()
    for i in range(20):
        create(other_process, f"t{i}")
        assert metadata_store.sync()
        assert f"t{i}" in metadata_store.topics()  # no waiting: sync returned once the image had it
        assert metadata_store.version() >= other_process.version()


def test_sync_says_it_could_not_catch_up_rather_than_vouch_for_an_image_that_missed_a_change(
        metadata_store, other_process):
    # The image of a process whose watch delivers nothing (stopped here; a watch behind a member
    # that answers progress requests ahead of its queued changes looked the same, etcd#15220).
    metadata_store.start()
    assert metadata_store.sync()
    # start() returns once the image is loaded; its watch is made just after, on the load thread.
    wait_until(lambda: metadata_store.image._watch is not None, what="the image's watch")
    metadata_store.image._watch.stop()
    create(other_process, "unseen")
    assert not metadata_store.sync(timeout_s=0.3)
    assert "unseen" not in metadata_store.topics()


def test_sync_answers_at_once_when_keys_changed_and_changed_back(metadata_store, other_process):
    metadata_store.start()
    create(other_process, "brief")
    other_process.delete_topic("brief")
    started = time.monotonic()
    assert metadata_store.sync() and "brief" not in metadata_store.topics()
    assert time.monotonic() - started < 1.0


def test_a_name_the_image_lacks_is_looked_up_after_catching_up(metadata_store, other_process):
    metadata_store.start()
    create(other_process, "fresh")
    assert metadata_store.topic("fresh").name == "fresh"  # not UNKNOWN_TOPIC_OR_PARTITION
    assert metadata_store.partition_state("fresh", 0).leader == 0


def test_sync_answers_at_once_when_etcd_changed_only_outside_the_image(metadata_store):
    metadata_store.start()
    # Another user of the same etcd (another cluster's root) moves etcd's revision.
    metadata_store.client.put(f"/other{uuid.uuid4().hex}/key", b"v")
    started = time.monotonic()
    assert metadata_store.sync()
    assert time.monotonic() - started < 1.0


def test_listeners_hear_which_keys_changed(metadata_store, other_process):
    heard: list[str] = []
    lock = threading.Lock()

    def listener(keys: list[str]) -> None:
        with lock:
            heard.extend(keys)

    metadata_store.listen(listener)
    metadata_store.start()
    create(other_process, "orders", partitions=2)
    topic_key = metadata_store._k("topics", "orders")
    wait_until(lambda: topic_key in heard, what="the listener to hear of the topic")
    assert {metadata_store._k("partitions", "orders", 0), metadata_store._k("partitions", "orders", 1)} <= set(heard)
    with lock:
        heard.clear()
    other_process.delete_topic("orders")
    wait_until(lambda: topic_key in heard, what="the listener to hear of the deletion")


def test_an_image_holds_only_the_keys_under_its_prefix(metadata_store):
    root = metadata_store.root
    client = metadata_store.client
    client.put(root + "a/1", b"1")
    client.put(root + "a/2", b"2")
    client.put(root.rstrip("/") + "x/1", b"sibling")  # shares the root's characters, not the root
    image = MetadataImage(client, prefix=root)
    image.start()
    try:
        assert sorted(kv.key for kv in image.under(root)) == [root + "a/1", root + "a/2"]
        revision = client.put(root + "a/3", b"3")
        assert image.wait_for(revision)
        assert image.get(root + "a/3").value == b"3"
        assert image.get(root + "a/3").mod_revision == revision
        assert not image.wait_for(revision + 1000, timeout_s=0.2)
    finally:
        image.stop()
        client.delete(root.rstrip("/") + "x/1")


def test_an_entry_changed_after_the_load_is_what_etcd_holds_for_the_key(metadata_store):
    client, root = metadata_store.client, metadata_store.root
    lease = client.grant_lease(60)
    client.put(root + "loaded", b"0", lease=lease)
    image = MetadataImage(client, prefix=root)
    image.start()
    try:
        assert image.get(root + "loaded") == client.get(root + "loaded")
        # Changed after the load: the watch delivers it (lease, version and revisions included).
        client.put(root + "loaded", b"1", lease=lease)
        revision = client.put(root + "new", b"2", lease=lease)
        assert image.wait_for(revision)
        for key in ("loaded", "new"):
            assert image.get(root + key) == client.get(root + key)
    finally:
        image.stop()
        client.revoke_lease(lease)


def test_closing_a_store_right_after_it_loaded_is_prompt_and_leaves_no_watch_running(metadata_store):
    metadata_store.cluster_id()
    # Other stores of this process (a cluster fixture's) may be following etcd: only ours count.
    before = {t for t in threading.enumerate() if t.name == "metadata-watch"}
    for _ in range(20):
        store = MetadataStore(client=metadata_store.client, root=metadata_store.root, owns_client=False)
        store.start()
        started = time.monotonic()
        store.close()
        assert time.monotonic() - started < 1.0
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "metadata-watch" and t.is_alive()
                            and t not in before],
               timeout_s=3, what="every closed store's watch thread to end")


def test_reads_keep_answering_from_the_image_while_etcd_is_stopped(own_etcd):
    store = MetadataStore(client=EtcdClient([own_etcd.endpoint], timeout_s=1.0), root="/lowtide/")
    try:
        store.register_broker(BrokerInfo(id=0, host="127.0.0.1", port=9000), incarnation="i0",
                              session_timeout_ms=60_000)
        create(store, "orders", partitions=3)
        store.update_broker_config("", lambda current: {**current, "leader.replication.throttled.rate": "5"})
        version = store.version()
        os.kill(own_etcd.pid, signal.SIGSTOP)  # a hung etcd: connected, answering nothing
        try:
            started = time.monotonic()
            assert set(store.topics()) == {"orders"}
            assert [s.partition for s in store.partition_states("orders")] == [0, 1, 2]
            assert store.partition_state("orders", 2).leader == 0
            assert store.brokers()[0].address == "127.0.0.1:9000"
            assert store.live_broker_ids() == {0}
            assert store.broker_config("") == {"leader.replication.throttled.rate": "5"}
            assert store.version() == version
            assert time.monotonic() - started < 0.5  # from memory, not after a timeout
            assert not store.sync()  # cannot catch up, says so
            with pytest.raises(MetadataStoreUnavailable):
                create(store, "refused")
        finally:
            os.kill(own_etcd.pid, signal.SIGCONT)
        own_etcd.stop()  # and down for good: still answering
        assert store.topic("orders").partitions == 3
        assert store.cluster_id() == store.stored_cluster_id()
    finally:
        store.close()


def test_the_image_follows_changes_while_the_member_its_watch_used_is_stopped(tmp_path):
    members = start_ready_etcd(tmp_path / "etcd3", members=3)
    # A new client starts at the first member: the watch and the first calls go there. The
    # generous call deadline: when the stopped member led, the others elect a new leader first,
    # which took over 8 s once on CI's loaded 2 cores.
    store = MetadataStore(client=EtcdClient([m.endpoint for m in members], timeout_s=20.0), root="/lowtide/")
    try:
        create(store, "before")
        os.kill(members[0].pid, signal.SIGSTOP)  # connected, answering nothing: no error ever arrives
        try:
            create(store, "during")  # the write itself fails over to another member
            wait_until(lambda: "during" in store.topics(), timeout_s=10, interval_s=0.1,
                       what="the image to follow etcd through another member")
            create(store, "after")
            assert "after" in store.topics()  # and reads its own writes at once again
        finally:
            os.kill(members[0].pid, signal.SIGCONT)
    finally:
        store.close()
        for m in members:
            m.stop()


def test_an_image_that_started_while_etcd_was_down_loads_once_it_is_back(tmp_path):
    [member] = start_ready_etcd(tmp_path / "etcd")
    ports = [(member.client_port, member.peer_port)]
    store = MetadataStore(client=EtcdClient([member.endpoint], timeout_s=1.0), root="/lowtide/")
    try:
        create(store, "orders")
        store.close()
        member.stop()
        store = MetadataStore(client=EtcdClient([member.endpoint], timeout_s=1.0), root="/lowtide/")
        with pytest.raises(MetadataStoreUnavailable):
            store.start(timeout_s=1.0)
        [member] = start_ready_etcd(tmp_path / "etcd", ports=ports)
        store.start(timeout_s=10.0)
        assert set(store.topics()) == {"orders"}
    finally:
        store.close()
        member.stop()


def test_under_answers_a_prefix_in_key_order_as_keys_come_and_go_without_scanning_the_rest():
    image = MetadataImage(client=None, prefix="/p/")  # fed by hand: no etcd needed to apply events
    image._apply([WatchEvent(key=k, value=b"v", revision=1, deleted=False)
                  for k in ("/p/b/2", "/p/a/1", "/p/b/10", "/p/bb/1", "/p/c")], 1)
    assert [kv.key for kv in image.under("/p/b/")] == ["/p/b/10", "/p/b/2"]
    assert [kv.key for kv in image.under("/p/b")] == ["/p/b/10", "/p/b/2", "/p/bb/1"]
    before = image._keys
    image._apply([WatchEvent(key="/p/b/2", value=b"w", revision=2, deleted=False)], 2)
    assert image._keys is before, "a changed value keeps the key list"
    assert image.under("/p/b/")[1].value == b"w"
    image._apply([WatchEvent(key="/p/b/10", value=b"", revision=3, deleted=True),
                  WatchEvent(key="/p/b/3", value=b"n", revision=3, deleted=False)], 3)
    assert [kv.key for kv in image.under("/p/b/")] == ["/p/b/2", "/p/b/3"]
    assert before == ["/p/a/1", "/p/b/10", "/p/b/2", "/p/bb/1", "/p/c"], "a reader's list never changes under it"
    assert image.under("/p/z") == [] and len(image.under("/p/")) == 5
