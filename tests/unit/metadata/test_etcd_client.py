"""``EtcdClient`` against real etcd members: reads, compare-and-set transactions, prefixes, leases,
the watch (order, resumption after a restart) and failover to another member when one is stopped.

Tests on the session's etcd work under a prefix of their own; the restart and failover tests start
etcd members of their own in tmp_path."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from lowtide.common.procs import EtcdMember, start_etcd
from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.etcd import (
    EtcdClient,
    WatchEvent,
    delete_op,
    get_op,
    if_missing,
    if_mod_revision,
    if_value,
    parse_endpoints,
    put_op,
)
from tests.conftest import start_ready_etcd
from tests.waiting import wait_until


@pytest.fixture
def client(etcd_server) -> Iterator[EtcdClient]:
    c = EtcdClient([etcd_server.endpoint])
    yield c
    c.close()


@pytest.fixture
def prefix(client) -> Iterator[str]:
    p = f"/c{uuid.uuid4().hex}/"
    yield p
    client.delete_prefix(p)


@pytest.fixture
def own_etcd(tmp_path) -> Iterator[list[EtcdMember]]:
    """A one-member etcd of this test's own (the test stops and restarts it); ``[0]`` is replaced
    by the test when it restarts the member."""
    members = start_ready_etcd(tmp_path / "etcd")
    yield members
    for m in members:
        m.stop()


class Recorder:
    """Collects what a watch delivers, in delivery order."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self.batches: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, events: list[WatchEvent], revision: int) -> None:
        with self.lock:
            self.events.extend(events)
            self.batches.append(revision)

    def values(self) -> list[tuple[str, bytes, bool]]:
        with self.lock:
            return [(e.key, e.value, e.deleted) for e in self.events]


def test_urls_name_one_or_several_members():
    assert parse_endpoints("etcd://127.0.0.1:2379") == ["127.0.0.1:2379"]
    assert parse_endpoints("etcd://a:1, b:2,c:3/lowtide/") == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError, match="no etcd endpoint"):
        parse_endpoints("etcd://")
    assert parse_endpoints("etcds://a:1,b:2") == ["a:1", "b:2"]


def test_an_etcds_url_dials_with_the_process_certificate(tmp_path, monkeypatch):
    """``etcds://`` (the chart with TLS on): mutual TLS with the process's own certificate
    (``default_client_tls``); the member, TLS only, refuses a plaintext client."""
    from lowtide.tls import config as tls_config
    from lowtide.tls.certs import CertificateAuthority

    files = CertificateAuthority.create(tmp_path / "ca").issue("etcd")
    [member] = start_etcd(tmp_path / "etcd", tls=(files.cert, files.key, files.ca))
    try:
        monkeypatch.setattr(tls_config, "_default", [])
        with pytest.raises(ValueError, match="needs TLS settings"):
            EtcdClient.from_url(f"etcds://{member.endpoint}")
        monkeypatch.setattr(tls_config, "_default", [tls_config.ClientTls(ca=files.ca, cert=files.cert, key=files.key)])
        client = EtcdClient.from_url(f"etcds://{member.endpoint}", timeout_s=20.0)
        try:
            assert client.url == f"etcds://{member.endpoint}"
            client.put("/tls", b"v")
            assert client.get("/tls").value == b"v"
        finally:
            client.close()
        plain = EtcdClient.from_url(f"etcd://{member.endpoint}", timeout_s=1.0)
        try:
            with pytest.raises(MetadataStoreUnavailable):
                plain.get("/tls")
        finally:
            plain.close()
    finally:
        member.stop()


# -- reads and writes ------------------------------------------------------------------------------
def test_a_put_is_read_back_with_the_revision_it_produced(client, prefix):
    assert client.get(prefix + "k") is None
    first = client.put(prefix + "k", b"one")
    kv = client.get(prefix + "k")
    assert (kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.version) == (
        prefix + "k", b"one", first, first, 1)
    second = client.put(prefix + "k", b"two")
    assert second > first
    kv = client.get(prefix + "k")
    assert (kv.value, kv.mod_revision, kv.create_revision, kv.version) == (b"two", second, first, 2)
    assert client.revision() >= second


def test_deleting_a_key_says_whether_there_was_one(client, prefix):
    client.put(prefix + "k", b"v")
    assert client.delete(prefix + "k") == 1
    assert client.get(prefix + "k") is None
    assert client.delete(prefix + "k") == 0


def test_a_compare_and_set_on_the_mod_revision_succeeds_once_and_then_fails(client, prefix):
    key = prefix + "k"
    client.put(key, b"v0")
    read = client.get(key)
    won = client.txn([if_mod_revision(key, read.mod_revision)], [put_op(key, b"v1")])
    assert won.succeeded and won.revision > read.mod_revision
    # A second writer acting on the same read loses, and its failure branch reads what won.
    lost = client.txn([if_mod_revision(key, read.mod_revision)], [put_op(key, b"v2")], [get_op(key)])
    assert not lost.succeeded
    assert [kv.value for kv in lost.reads[0]] == [b"v1"]
    assert client.get(key).value == b"v1"


def test_if_missing_creates_a_key_only_when_it_does_not_exist(client, prefix):
    key = prefix + "k"
    assert client.txn([if_missing(key)], [put_op(key, b"first")]).succeeded
    assert not client.txn([if_missing(key)], [put_op(key, b"second")]).succeeded
    assert client.get(key).value == b"first"
    # if_mod_revision(key, 0) means the same: the key does not exist.
    assert not client.txn([if_mod_revision(key, 0)], [put_op(key, b"third")]).succeeded


def test_if_value_compares_the_stored_bytes_and_a_transaction_applies_all_its_operations(client, prefix):
    client.put(prefix + "id", b"cluster-a")
    client.put(prefix + "old", b"x")
    ops = [put_op(prefix + "new", b"y"), delete_op(prefix + "old")]
    refused = client.txn([if_value(prefix + "id", b"cluster-b")], ops)
    assert not refused.succeeded
    assert client.get(prefix + "new") is None and client.get(prefix + "old") is not None
    done = client.txn([if_value(prefix + "id", b"cluster-a")], ops)
    assert done.succeeded and done.deleted == [1]
    assert client.get(prefix + "new").mod_revision == done.revision  # one revision for the whole transaction
    assert client.get(prefix + "old") is None


def test_a_prefix_read_returns_exactly_the_keys_under_the_prefix_sorted(client, prefix):
    for key in ("a/2", "a/10", "a/1", "ab/1", "a"):
        last = client.put(prefix + key, key.encode())
    kvs, revision = client.get_prefix(prefix + "a/")
    assert [kv.key for kv in kvs] == [prefix + "a/1", prefix + "a/10", prefix + "a/2"]
    assert [kv.value for kv in kvs] == [b"a/1", b"a/10", b"a/2"]
    assert revision >= last
    assert client.get_prefix(prefix + "none/") == ([], client.revision())


def test_prefix_state_counts_the_keys_and_tells_whether_one_was_written_after_a_revision(client, prefix):
    first = client.put(prefix + "p/1", b"1")
    second = client.put(prefix + "p/2", b"2")
    client.put(prefix + "q/1", b"outside")  # moves the store's revision, not the prefix
    revision, keys, changed = client.prefix_state(prefix + "p/", changed_after=second)
    assert (keys, changed) == (2, False) and revision > second
    assert client.prefix_state(prefix + "p/", changed_after=first)[1:] == (2, True)
    client.delete(prefix + "p/1")  # a deletion leaves no key behind: the count tells it
    assert client.prefix_state(prefix + "p/", changed_after=second)[1:] == (1, False)


def test_deleting_a_prefix_leaves_keys_that_merely_share_its_first_characters(client, prefix):
    for key in ("t/orders/0", "t/orders/1", "t/orders2/0"):
        client.put(prefix + key, b"")
    assert client.delete_prefix(prefix + "t/orders/") == 2
    assert [kv.key for kv in client.get_prefix(prefix)[0]] == [prefix + "t/orders2/0"]
    deleted = client.txn([], [delete_op(prefix + "t/", prefix=True)])
    assert deleted.deleted == [1]
    assert client.get_prefix(prefix)[0] == []


# -- leases ----------------------------------------------------------------------------------------
def test_a_key_put_with_a_lease_vanishes_when_the_lease_expires(client, prefix):
    lease = client.grant_lease(1)  # etcd rounds it up to its minimum (2 s with default timings)
    client.put(prefix + "alive/1", b"incarnation", lease=lease)
    assert client.get(prefix + "alive/1").lease == lease
    started = time.monotonic()
    wait_until(lambda: client.get(prefix + "alive/1") is None, timeout_s=10, interval_s=0.1,
               what="the leased key to vanish")
    assert time.monotonic() - started >= 0.5  # not at once: it lived out its lease
    assert client.keep_alive(lease) == 0  # an expired lease cannot be renewed


def test_keep_alive_keeps_a_leased_key_and_revoking_the_lease_deletes_it_at_once(client, prefix):
    lease = client.grant_lease(2)
    client.put(prefix + "alive/1", b"x", lease=lease)
    until = time.monotonic() + 4.0  # twice the lease's TTL
    while time.monotonic() < until:
        assert client.keep_alive(lease) >= 1
        assert client.get(prefix + "alive/1") is not None
        time.sleep(0.5)
    client.revoke_lease(lease)
    assert client.get(prefix + "alive/1") is None
    client.revoke_lease(lease)  # revoking twice is not an error


def test_keep_alive_with_etcd_down_raises_metadata_store_unavailable(own_etcd):
    c = EtcdClient([own_etcd[0].endpoint], timeout_s=1.0)
    try:
        lease = c.grant_lease(10)
        own_etcd[0].stop()
        started = time.monotonic()
        with pytest.raises(MetadataStoreUnavailable):
            c.keep_alive(lease)
        assert time.monotonic() - started < 5.0
    finally:
        c.close()


# -- watching --------------------------------------------------------------------------------------
def test_a_watch_delivers_every_change_under_its_prefix_in_revision_order(client, prefix):
    start = client.revision() + 1
    got = Recorder()
    watch = client.watch_prefix(prefix + "w/", start_revision=start, on_events=got, on_reset=client.revision)
    try:
        expected = []
        for i in range(30):
            key = prefix + f"w/{i % 4}"
            if i % 5 == 4:
                client.delete(key)
                expected.append((key, b"", True))
            else:
                client.put(key, b"%d" % i)
                expected.append((key, b"%d" % i, False))
            client.put(prefix + "elsewhere", b"%d" % i)  # outside the prefix: not delivered
        # A transaction's changes arrive together, at one revision.
        txn = client.txn([], [put_op(prefix + "w/a", b"A"), put_op(prefix + "w/b", b"B")])
        expected += [(prefix + "w/a", b"A", False), (prefix + "w/b", b"B", False)]
        wait_until(lambda: len(got.values()) >= len(expected), what="every change delivered")
        assert got.values() == expected
        revisions = [e.revision for e in got.events]
        assert revisions[:-2] == sorted(set(revisions[:-2]))  # strictly increasing
        assert revisions[-2:] == [txn.revision, txn.revision]
        assert got.batches == sorted(got.batches) and got.batches[-1] == txn.revision
    finally:
        watch.stop()


def test_a_watch_started_at_an_older_revision_replays_the_changes_since(client, prefix):
    first = client.put(prefix + "k", b"1")
    client.put(prefix + "k", b"2")
    client.delete(prefix + "k")
    got = Recorder()
    watch = client.watch_prefix(prefix, start_revision=first, on_events=got, on_reset=client.revision)
    try:
        wait_until(lambda: len(got.values()) >= 3, what="the history replayed")
        assert got.values() == [(prefix + "k", b"1", False), (prefix + "k", b"2", False), (prefix + "k", b"", True)]
    finally:
        watch.stop()


def test_a_watch_resumes_after_the_member_restarts_without_missing_or_repeating_a_change(own_etcd, tmp_path):
    member = own_etcd[0]
    c = EtcdClient([member.endpoint])
    got = Recorder()
    watch = c.watch_prefix("/w/", start_revision=c.revision() + 1, on_events=got, on_reset=c.revision)
    try:
        c.put("/w/a", b"1")
        wait_until(lambda: got.values() == [("/w/a", b"1", False)], what="the first change")
        member.stop()
        own_etcd[0] = member = start_etcd(tmp_path / "etcd", ports=[(member.client_port, member.peer_port)])[0]
        # Written as soon as the member answers again (the client retries until it does), most
        # likely before the watch, backing off, reconnected.
        c.put("/w/b", b"2")
        c.delete("/w/a")
        c.put("/w/c", b"3")
        wait_until(lambda: len(got.values()) >= 4, timeout_s=10, what="the changes after the restart")
        time.sleep(0.3)  # a repeated change would arrive now
        assert got.values() == [("/w/a", b"1", False), ("/w/b", b"2", False), ("/w/a", b"", True),
                                ("/w/c", b"3", False)]
        assert watch.connected.is_set()
    finally:
        watch.stop()
        c.close()


# -- failover --------------------------------------------------------------------------------------
@pytest.fixture
def three_members(tmp_path) -> Iterator[list[EtcdMember]]:
    members = start_ready_etcd(tmp_path / "etcd3", members=3)
    try:
        yield members
    finally:
        for m in members:
            os.kill(m.pid, signal.SIGCONT)
            m.stop()


def leader_first(members: list[EtcdMember]) -> list[str]:
    """The members' endpoints with the current leader first (where a new client starts)."""
    probe = EtcdClient([m.endpoint for m in members])
    try:
        statuses = {m.endpoint: probe.status(m.endpoint) for m in members}
    finally:
        probe.close()
    leader = next(e for e, s in statuses.items() if s.member == s.leader)
    return [leader, *(e for e in statuses if e != leader)]


def test_with_the_leader_stopped_calls_succeed_through_another_member(three_members):
    endpoints = leader_first(three_members)
    stopped = next(m for m in three_members if m.endpoint == endpoints[0])
    c = EtcdClient(endpoints, timeout_s=8.0)
    os.kill(stopped.pid, signal.SIGSTOP)  # alive and connected, answering nothing
    try:
        revision = c.put("/k", b"after")
        assert c.get("/k").value == b"after"
        assert c.txn([if_mod_revision("/k", revision)], [put_op("/k", b"cas")]).succeeded
        assert [kv.value for kv in c.get_prefix("/k")[0]] == [b"cas"]
        status = c.status()
        assert status.leader != 0 and status.member != 0
        assert c.status(endpoints[1]).leader == c.status(endpoints[2]).leader  # the two agree on a new leader
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
        c.close()


def test_with_one_member_stopped_leases_are_granted_and_kept_through_another(three_members):
    endpoints = [m.endpoint for m in three_members]
    stopped = three_members[0]  # where a new client starts
    c = EtcdClient(endpoints, timeout_s=8.0)
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        lease = c.grant_lease(5)
        c.put("/alive/1", b"x", lease=lease)
        assert c.keep_alive(lease) >= 1
        assert c.get("/alive/1").lease == lease
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
        c.close()


def test_with_every_member_down_a_call_fails_with_metadata_store_unavailable_within_its_deadline(own_etcd):
    c = EtcdClient([own_etcd[0].endpoint], timeout_s=1.0)
    try:
        own_etcd[0].stop()
        started = time.monotonic()
        with pytest.raises(MetadataStoreUnavailable, match="unreachable"):
            c.put("/k", b"v")
        assert time.monotonic() - started < 3.0
    finally:
        c.close()
