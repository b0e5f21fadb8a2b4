"""Who leads a diskless coordinator shard, its epochs and the shard registry, on a real etcd
(lowtide.coordinator.leadership; each test has a metadata root of its own), and that none of it is
in Redis: a FLUSHALL changes neither who leads nor where the shards are."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis as redis_lib

from lowtide.coordinator.leadership import (
    ShardAddress,
    ShardLease,
    StandbyRegistration,
    epoch_key,
    leader_key,
    read_epoch,
    read_shards,
    read_standbys,
    register_shard,
    shards_section,
    take_epoch,
)
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.store import MetadataStore
from tests.waiting import wait_until


def lease(store: MetadataStore, owner: str, *, shard: int = 7, lease_ms: int = 2000,
          margin_ms: int = 500) -> ShardLease:
    return ShardLease(metadata=store, shard=shard, owner=owner, lease_ms=lease_ms, margin_ms=margin_ms)


@pytest.fixture
def other_process(metadata_store: MetadataStore):
    """Another process's store on the same root: its image is loaded from etcd."""
    store = MetadataStore(client=EtcdClient(metadata_store.client.endpoints), root=metadata_store.root)
    yield store
    store.close()


def test_a_second_owner_cannot_take_a_shard_lease_another_holds(metadata_store, other_process):
    first, second = lease(metadata_store, "a"), lease(other_process, "b")
    assert first.acquire_or_renew() and first.valid()
    assert not second.acquire_or_renew() and not second.valid()
    assert first.acquire_or_renew()  # renewing keeps it
    assert not second.acquire_or_renew()
    assert second.holder() == first.holder() == "a"
    record = shards_section(other_process).get(leader_key(7), fresh=True)
    assert record.value == b"a" and record.lease == first.lease_id  # under the holder's etcd lease


def test_a_lease_not_renewed_expires_and_another_owner_takes_it(metadata_store, other_process):
    first, second = lease(metadata_store, "a"), lease(other_process, "b")
    assert first.acquire_or_renew()
    # Stops acting lease - margin after the call began, before etcd could have expired it.
    time.sleep((first.lease_ms - first.margin_ms) / 1000 + 0.05)
    assert not first.valid()
    assert not second.acquire_or_renew()  # etcd still holds it for "a" (lease_ms from the renewal)
    wait_until(second.acquire_or_renew, timeout_s=15, interval_s=0.1, what="the unrenewed lease to expire")
    assert second.valid() and second.holder() == "b"
    assert not first.acquire_or_renew() and not first.valid()  # its lease is gone: it cannot renew it
    first.release()  # not the holder: changes nothing
    assert shards_section(other_process).get(leader_key(7), fresh=True).value == b"b"


def test_a_released_lease_is_free_at_once(metadata_store, other_process):
    first, second = lease(metadata_store, "a", lease_ms=60_000, margin_ms=1000), lease(other_process, "b")
    assert first.acquire_or_renew()
    first.release()
    assert not first.valid() and first.holder() is None
    assert second.acquire_or_renew()


def test_take_epoch_refuses_an_owner_that_does_not_hold_the_lease(metadata_store):
    holder = lease(metadata_store, "a")
    assert take_epoch(metadata_store, shard=7, owner="a", floor=0) == -1  # nobody holds it yet
    assert holder.acquire_or_renew()
    assert take_epoch(metadata_store, shard=7, owner="b", floor=0) == -1
    assert read_epoch(metadata_store, 7) == 0  # the refused calls wrote nothing
    assert take_epoch(metadata_store, shard=7, owner="a", floor=0) == 1
    assert take_epoch(metadata_store, shard=7, owner="a", floor=0) == 2
    assert take_epoch(metadata_store, shard=7, owner="b", floor=5) == -1
    assert read_epoch(metadata_store, 7) == 2


def test_take_epoch_never_goes_back_below_the_floor_or_the_last_epoch_taken(metadata_store):
    assert lease(metadata_store, "a").acquire_or_renew()
    assert take_epoch(metadata_store, shard=7, owner="a", floor=41) == 42  # the log had 41
    assert take_epoch(metadata_store, shard=7, owner="a", floor=10) == 43  # an older floor: on from 42
    # A store restored from an old backup (the record gone): the log's floor still holds.
    assert shards_section(metadata_store).delete([epoch_key(7)])
    assert take_epoch(metadata_store, shard=7, owner="a", floor=43) == 44
    # Without a lease to check (a Kubernetes Lease), the epoch still only goes up.
    assert take_epoch(metadata_store, shard=7, owner="k8s", floor=0, check_lease=False) == 45


def test_concurrent_epoch_takers_never_get_the_same_epoch(metadata_store, other_process):
    got: list[int] = []

    def take(store: MetadataStore) -> None:
        for _ in range(10):
            got.append(take_epoch(store, shard=3, owner="k8s", floor=0, check_lease=False))

    threads = [threading.Thread(target=take, args=(s,)) for s in (metadata_store, other_process)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == list(range(1, 21))


def test_the_registry_gives_each_shards_latest_address_and_a_deposed_leader_cannot_overwrite_it(
        metadata_store, other_process):
    register_shard(metadata_store, ShardAddress(shard=1, grpc="h:1", metrics="http://h:2/metrics", owner="x"))
    register_shard(metadata_store, ShardAddress(shard=0, grpc="h:3", metrics="", owner="y"))
    register_shard(metadata_store, ShardAddress(shard=1, grpc="h:4", metrics="", owner="z", framed="h:5"))
    shards = read_shards(other_process)
    assert [(s.shard, s.grpc, s.owner, s.framed) for s in shards.values()] == [(0, "h:3", "y", ""),
                                                                                (1, "h:4", "z", "h:5")]
    holder = lease(metadata_store, "z", shard=1)
    assert holder.acquire_or_renew()
    assert not register_shard(metadata_store, ShardAddress(shard=1, grpc="h:9", metrics="", owner="x"),
                              check_lease=True)
    assert register_shard(metadata_store, ShardAddress(shard=1, grpc="h:6", metrics="", owner="z"), check_lease=True)
    assert read_shards(metadata_store)[1].grpc == "h:6"


def test_a_standby_listed_under_its_process_lease_vanishes_when_the_process_stops_renewing_it(metadata_store):
    alive = StandbyRegistration(metadata_store, owner="coordinator-1-alive", ttl_ms=2000)
    dead = StandbyRegistration(metadata_store, owner="coordinator-2-dead", ttl_ms=2000)
    alive.start()
    try:
        alive.add(shard=0, grpc="h:1")
        dead.add(shard=0, grpc="h:2")  # never kept alive: a process killed right after it registered
        assert read_standbys(metadata_store, 0) == {"coordinator-1-alive": "h:1", "coordinator-2-dead": "h:2"}
        wait_until(lambda: read_standbys(metadata_store, 0) == {"coordinator-1-alive": "h:1"}, timeout_s=15,
                   interval_s=0.1, what="the dead standby's record to expire")
    finally:
        alive.stop()
    assert read_standbys(metadata_store, 0) == {}  # a stopped process takes its standbys off


def test_an_emptied_redis_changes_neither_who_leads_a_shard_nor_the_registry(metadata_store, other_process,
                                                                              redis_url):
    holder = lease(metadata_store, "coordinator-0-a", shard=0, lease_ms=4000, margin_ms=500)
    assert holder.acquire_or_renew()
    assert take_epoch(metadata_store, shard=0, owner="coordinator-0-a", floor=3) == 4
    register_shard(metadata_store, ShardAddress(shard=0, grpc="h:1", metrics="", owner="coordinator-0-a"),
                   check_lease=True)
    standbys = StandbyRegistration(metadata_store, owner="coordinator-1-b")
    standbys.add(shard=0, grpc="h:2")
    before = (read_shards(metadata_store), read_standbys(metadata_store, 0), read_epoch(metadata_store, 0))

    redis = redis_lib.Redis.from_url(redis_url)
    try:
        redis.set("lowtide:some-key", b"1")
        assert redis.flushall() and redis.dbsize() == 0
    finally:
        redis.close()

    fresh = MetadataStore(client=EtcdClient(metadata_store.client.endpoints), root=metadata_store.root)
    try:  # a process started after the FLUSHALL reads the same
        assert (read_shards(fresh), read_standbys(fresh, 0), read_epoch(fresh, 0)) == before
        assert json.loads(shards_section(fresh).get("0/address").value)["owner"] == "coordinator-0-a"
        contender = lease(fresh, "coordinator-1-b", shard=0)
        assert contender.holder() == "coordinator-0-a"
        assert not contender.acquire_or_renew()
    finally:
        fresh.close()
    assert holder.acquire_or_renew() and holder.valid()  # still the holder's to renew
    assert take_epoch(metadata_store, shard=0, owner="coordinator-0-a", floor=0) == 5  # epochs go on
    standbys.stop()
