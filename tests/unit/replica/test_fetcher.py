"""The follower fetchers' lifecycle (lowtide.replica.fetcher), on a thread and on an event loop:
no leader to reach here, so no round is ever sent; what is checked is who runs the rounds."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lowtide.replica.fetcher import FetcherConfig, FetcherManager
from lowtide.replica.registry import PartitionRegistry
from tests.waiting import wait_until


@pytest.fixture(params=["thread", "loop"])
def manager_on(request, make_replicas):
    r = make_replicas(isr=(0, 1, 2))
    registry = PartitionRegistry(broker_id=2)
    registry.apply_assignment({(r.topic.name, 0): r.state}, open_partition=lambda tp: r.follower(2))
    reconciles = threading.Event()
    manager = FetcherManager(registry=registry, config=FetcherConfig(replica_id=2, max_wait_ms=100, max_bytes=1 << 20),
                             lookup_brokers=dict, request_reconcile=reconciles.set)
    loop = None
    if request.param == "loop":
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        manager.run_on(loop)
    try:
        yield manager, registry, reconciles
    finally:
        manager.stop()
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def test_a_fetcher_that_fails_asks_for_a_reconcile_and_the_next_sync_replaces_it(manager_on, monkeypatch):
    manager, registry, reconciles = manager_on
    real_following = registry.following
    calls = []

    def failing_once(leader_id):
        calls.append(leader_id)
        if len(calls) == 1:
            raise RuntimeError("a bug in a round")
        return real_following(leader_id)

    monkeypatch.setattr(registry, "following", failing_once)
    manager.sync()
    first = manager.running()[0]
    assert reconciles.wait(5), "the failed fetcher asked for no reconcile"
    wait_until(lambda: first.finished, what="the failed fetcher to end")
    manager.sync()  # what the reconcile it asked for runs
    second = manager.running()[0]
    assert second is not first
    wait_until(lambda: len(calls) >= 2, what="the new fetcher's first round")
    registry.version += 1  # the followed set may have changed: the next round lists it again
    wait_until(lambda: len(calls) >= 3, what="the new fetcher's rounds")  # no leader address: it pauses and looks again
    assert not second.finished


def test_stop_ends_every_fetcher_and_a_sync_without_followed_leaders_stops_theirs(manager_on):
    manager, registry, _ = manager_on
    manager.sync()
    fetcher = manager.running()[0]
    registry.apply_assignment({}, open_partition=lambda tp: None)
    manager.sync()
    assert manager.running() == {}
    wait_until(lambda: fetcher.finished, what="the fetcher of a leader no longer followed to end")
