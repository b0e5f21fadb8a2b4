"""Replication throttles (KIP-73, replica/quota.py): the token bucket on a fake clock (long-run
rate, debt, a new limit starting empty), the throttled-replicas parser, and both places the
buckets apply: the leader's read of a follower fetch (``ReplicaRequests._read``, real partition
logs) and the follower's request (``Fetcher._positions``). No server, no network."""

from __future__ import annotations

import time

import pytest
import redis as redis_lib

from lowtide.client.replica import ReplicaClient
from lowtide.messages.replica import FetchPosition
from lowtide.purgatory.purgatory import Purgatory
from lowtide.replica.delete_records import DeleteRecordsHandler
from lowtide.replica.fetcher import Fetcher, FetcherConfig
from lowtide.replica.isr import IsrUpdater
from lowtide.replica.quota import (
    UNLIMITED,
    QuotaConfigWatcher,
    ReplicationQuotas,
    ThrottledReplicas,
    TokenBucket,
    parse_rate,
    parse_throttled_replicas,
    topic_throttles,
)
from lowtide.replica.registry import PartitionRegistry
from lowtide.replica.requests import ReplicaRequests
from tests.waiting import wait_until

MB = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def copy_for(bucket: TokenBucket, clock: FakeClock, *, total: int, batch: int) -> float:
    """A reader that copies ``total`` bytes in whole ``batch``-byte batches as fast as the bucket
    lets it, as the replication paths do: read while anything is available (at least one batch,
    whatever the cap), be charged what was read, sleep until the refill otherwise. Returns the
    simulated seconds until the copy is paid for (the bucket out of debt again)."""
    start = clock.now
    copied = 0
    while copied < total:
        allowed = bucket.available()
        if allowed <= 0:
            clock.advance(bucket.wait_s())
            continue
        got = min(total - copied, max(batch, allowed // batch * batch))  # whole batches, at least one
        bucket.charge(got)
        copied += got
        clock.advance(0.0005)  # the read itself takes a little time
    return clock.now + bucket.wait_s() - start


# -- the bucket -----------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [16 * 1024, 300 * 1024, 3 * MB])
def test_the_long_run_rate_is_within_2_percent_over_10_simulated_seconds(batch):
    clock = FakeClock()
    bucket = TokenBucket(rate=MB, clock=clock, min_capacity_bytes=0)
    took = copy_for(bucket, clock, total=10 * MB, batch=batch)
    assert abs(10 * MB / took - MB) / MB < 0.02, took


def test_an_idle_bucket_adds_at_most_its_capacity_to_a_copy():
    clock = FakeClock()
    bucket = TokenBucket(rate=MB, clock=clock, min_capacity_bytes=0)
    clock.advance(60.0)  # idle: full (100 ms of the rate), not 60 s of it
    took = copy_for(bucket, clock, total=10 * MB, batch=16 * 1024)
    assert 9.85 < took < 9.95, took


def test_the_capacity_is_100_ms_of_the_rate_but_at_least_the_minimum():
    assert TokenBucket(rate=50 * MB, min_capacity_bytes=1 << 20).capacity == 5 * MB
    assert TokenBucket(rate=MB, min_capacity_bytes=1 << 20).capacity == 1 << 20


def test_a_read_larger_than_the_bucket_goes_into_debt_and_the_debt_is_paid_back_first():
    clock = FakeClock()
    bucket = TokenBucket(rate=MB, clock=clock, min_capacity_bytes=0)  # capacity 100 KB
    clock.advance(1.0)
    assert bucket.available() == 100_000  # an idle bucket holds its capacity, no more
    bucket.charge(400_000)  # one big batch: 300 KB of debt
    assert bucket.available() == 0
    assert bucket.wait_s() == pytest.approx(0.3, abs=1e-3)
    clock.advance(0.299)
    assert bucket.available() == 0
    clock.advance(0.002)
    assert 0 < bucket.available() < 2_000


def test_a_new_limit_starts_empty_and_removing_it_makes_the_bucket_unlimited():
    clock = FakeClock()
    bucket = TokenBucket(clock=clock, min_capacity_bytes=0)
    assert bucket.available() == UNLIMITED and bucket.wait_s() == 0
    bucket.charge(10 * MB)  # counted nowhere: no limit
    bucket.set_rate(MB)
    assert bucket.available() == 0  # no free burst on top of a throttle that was just set
    clock.advance(0.0625)
    assert bucket.available() == 62_500
    bucket.set_rate(None)
    assert bucket.available() == UNLIMITED


def test_a_rate_change_keeps_the_tokens_earned_up_to_the_new_capacity():
    clock = FakeClock()
    bucket = TokenBucket(rate=10 * MB, clock=clock, min_capacity_bytes=0)  # capacity 1 MB
    clock.advance(1.0)
    bucket.set_rate(MB)  # capacity 100 KB
    assert bucket.available() == 100_000


# -- the configs ----------------------------------------------------------------------------------
def test_throttled_replicas_parse_star_pairs_and_empty():
    assert parse_throttled_replicas("*") == ThrottledReplicas(every=True)
    parsed = parse_throttled_replicas("0:1, 0:2,3:1")
    assert parsed.replicas == {(0, 1), (0, 2), (3, 1)} and not parsed.every
    assert parsed.names(0, 2) and not parsed.names(1, 2) and not parsed.names(0, 3)
    assert parse_throttled_replicas("") == ThrottledReplicas()
    assert parse_throttled_replicas("0:1,x:2,5") == ThrottledReplicas(replicas=frozenset({(0, 1)}))


def test_topic_throttles_are_parsed_once_per_config_object():
    config = {"leader.replication.throttled.replicas": "0:1", "follower.replication.throttled.replicas": "*"}
    first = topic_throttles(config)
    assert first.leader.names(0, 1) and first.follower.every
    assert topic_throttles(config) is first
    changed = {**config, "leader.replication.throttled.replicas": "*"}  # a new topic record: a new dict
    assert topic_throttles(changed).leader.every
    assert not topic_throttles({}).leader.names(0, 0)


def test_stored_rates_parse_to_bytes_per_second_or_unlimited():
    assert parse_rate("1000000") == MB
    assert parse_rate(None) is None and parse_rate("lots") is None and parse_rate("-1") is None


# -- leader: a follower fetch ---------------------------------------------------------------------
BIG_SEGMENTS = {"segment.bytes": str(1 << 20)}


@pytest.fixture
def throttled_leader(make_replicas):
    """Leader 0 with 40 batches; follower 1 in the ISR, follower 2 out of it; the leader list
    names every replica; a leader bucket of 1000 B/s holding 1500 bytes (min capacity)."""
    r = make_replicas(topic_config={**BIG_SEGMENTS, "leader.replication.throttled.replicas": "*"}, isr=(0, 1))
    for _ in range(40):
        r.produce(5)
    r.replicate(1)  # the HW moves with the in-sync follower
    registry = PartitionRegistry(broker_id=0)
    registry.apply_assignment({r.leader.key: r.state}, open_partition=lambda tp: r.leader)
    clock = FakeClock()
    quotas = ReplicationQuotas(broker_id=0, clock=clock, min_capacity_bytes=1500)
    quotas.set_rates(leader=1000, follower=None)
    clock.advance(10.0)
    requests = ReplicaRequests(registry=registry, isr=None, deletes=None, min_insync_replicas=1, quotas=quotas)
    return r, requests, quotas, clock


def follower_read(requests: ReplicaRequests, replica_id: int) -> tuple[bytes, float]:
    outcomes, _, _, refill_s = requests._read([FetchPosition(topic="orders", partition=0, fetch_offset=0)],
                                              follower=True, max_bytes=1 << 20, replica_id=replica_id)
    return outcomes[0].records, refill_s


def test_a_follower_outside_the_isr_reads_what_the_bucket_holds_then_nothing_until_it_refills(throttled_leader):
    r, requests, quotas, clock = throttled_leader
    everything = r.leader.log.read(0, max_bytes=1 << 20, max_offset=r.leader.log.log_end_offset)
    batch = len(everything) // 40

    records, refill_s = follower_read(requests, 2)
    assert 0 < len(records) <= 1500 and len(records) % batch == 0 and refill_s == 0
    assert quotas.leader.available() < batch  # charged what it got

    left = quotas.leader.available()
    quotas.charge("leader", left + 300)  # another follower's read took the rest and 300 more
    records, refill_s = follower_read(requests, 2)
    assert records == b"" and refill_s == pytest.approx(0.301, abs=0.002)  # until one byte is back

    clock.advance(refill_s)
    records, _ = follower_read(requests, 2)
    assert len(records) == batch  # a byte's worth allowed: one whole batch, into debt again
    assert quotas.leader.available() == 0


def test_an_in_sync_follower_and_an_unnamed_replica_are_never_throttled(throttled_leader, make_replicas):
    r, requests, quotas, clock = throttled_leader
    everything = r.leader.log.read(0, max_bytes=1 << 20, max_offset=r.leader.log.log_end_offset)
    quotas.leader.charge(10_000)  # the bucket deep in debt
    records, refill_s = follower_read(requests, 1)  # in the ISR
    assert records == everything and refill_s == 0
    # A leader list naming another broker's replica does not throttle this leader.
    r.leader.topic_info = type(r.topic)(**{**r.topic.__dict__, "config": {
        **BIG_SEGMENTS, "leader.replication.throttled.replicas": "0:1,0:2"}})
    records, _ = follower_read(requests, 2)
    assert records == everything
    # Nor does a consumer fetch, ever.
    outcomes, _, _, _ = requests._read([FetchPosition(topic="orders", partition=0, fetch_offset=0)],
                                       follower=False, max_bytes=1 << 20)
    assert outcomes[0].records  # up to the HW; the bucket is not consulted


def test_a_parked_follower_fetch_returns_once_the_bucket_refilled(make_replicas, store, redis_url):
    """Real clock: a follower fetch held back by the throttle waits for the refill, not for its
    whole long poll."""
    r = make_replicas(topic_config={**BIG_SEGMENTS, "leader.replication.throttled.replicas": "*"}, isr=(0, 1))
    for _ in range(10):
        r.produce(5)
    r.replicate(1)  # HW 50: broker 2 at offset 0 is far from joining the ISR
    registry = PartitionRegistry(broker_id=0)
    registry.apply_assignment({r.leader.key: r.state}, open_partition=lambda tp: r.leader)
    quotas = ReplicationQuotas(broker_id=0, min_capacity_bytes=0)
    quotas.set_rates(leader=10_000, follower=None)
    quotas.leader.charge(2_000)  # 0.2 s of debt
    purgatory = Purgatory(name="DeleteRecords", redis=redis_lib.Redis.from_url(redis_url), owner="replica-0")
    purgatory.start()
    try:
        requests = ReplicaRequests(registry=registry, isr=IsrUpdater(store=store, registry=registry,
                                                                     wake_reconciler=lambda: None),
                                   deletes=DeleteRecordsHandler(registry=registry, purgatory=purgatory),
                                   min_insync_replicas=1, quotas=quotas)
        started = time.monotonic()
        [answer] = requests.fetch([FetchPosition(topic="orders", partition=0, fetch_offset=0)],
                                  replica_id=2, max_wait_ms=5000, min_bytes=1, max_bytes=1 << 20)
        took = time.monotonic() - started
    finally:
        purgatory.close()
    assert answer.records and 0.15 < took < 2.0, took


# -- follower: the request ------------------------------------------------------------------------
def test_the_fetcher_caps_and_then_leaves_out_a_throttled_partition_but_not_an_in_sync_one(make_replicas):
    r = make_replicas(topic_config={"follower.replication.throttled.replicas": "0:2"}, isr=(0, 1))
    registry = PartitionRegistry(broker_id=2)
    clock = FakeClock()
    quotas = ReplicationQuotas(broker_id=2, clock=clock, min_capacity_bytes=4096)
    quotas.set_rates(leader=None, follower=1000)
    clock.advance(10.0)
    client = ReplicaClient()
    try:
        fetcher = Fetcher(registry=registry, client=client,
                                config=FetcherConfig(replica_id=2, max_wait_ms=500, max_bytes=1 << 20),
                                leader_id=0, lookup_brokers=dict, request_reconcile=lambda: None, quotas=quotas)
        follower = r.follower(2)
        positions, throttled, refill_s = fetcher._positions([follower])
        assert [p.max_bytes for p in positions] == [4096] and throttled == {follower.key} and refill_s == 0

        quotas.charge("follower", 5000)  # the answer came back bigger than asked: debt
        positions, throttled, refill_s = fetcher._positions([follower])
        assert positions == [] and throttled == set() and refill_s == pytest.approx(0.905, abs=0.01)

        # Broker 1's replica is in the ISR: never throttled, even with the bucket empty.
        in_sync = ReplicationQuotas(broker_id=1, clock=clock, min_capacity_bytes=4096)
        in_sync.set_rates(leader=None, follower=1000)
        fetcher.quotas = in_sync
        positions, throttled, _ = fetcher._positions([r.follower(1)])
        assert [p.max_bytes for p in positions] == [1 << 20] and throttled == set()
    finally:
        client.close()


# -- the rates from the store ---------------------------------------------------------------------
def test_the_watcher_applies_the_cluster_default_overridden_by_the_brokers_own_rate(store):
    store.update_broker_config("", lambda c: {**c, "leader.replication.throttled.rate": "500",
                                              "follower.replication.throttled.rate": "700"})
    store.update_broker_config("3", lambda c: {**c, "leader.replication.throttled.rate": "900"})
    quotas = ReplicationQuotas(broker_id=3)
    watcher = QuotaConfigWatcher(store=store, quotas=quotas, reload_s=60.0)
    watcher.start()
    try:
        assert (quotas.leader.rate, quotas.follower.rate) == (900, 700)  # read before start returns
        store.update_broker_config("", lambda c: {})
        watcher.wake()  # what the metadata event listener does
        wait_until(lambda: quotas.follower.rate is None, timeout_s=5, what="the default rate gone")
        assert quotas.leader.rate == 900
    finally:
        watcher.stop()
