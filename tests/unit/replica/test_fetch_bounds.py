"""Bounded fetch (issue 9, finding 5): capped waits, parked consumer fetches counted in total and
per connection, and a cancelled fetch returns at once. Real partition logs, no server."""

from __future__ import annotations

import threading

from lowtide.messages.replica import FetchPosition
from lowtide.replica.parking import FetchLimits
from lowtide.replica.requests import ReplicaRequests
from tests.unit.replica.conftest import TOPIC
from tests.waiting import wait_until

HUGE = 1 << 30
TEN_MINUTES_MS = 600_000


def requests_over(registry, **limits) -> ReplicaRequests:
    # Consumer fetches never touch the ISR updater or the DeleteRecords handler.
    return ReplicaRequests(registry=registry, isr=None, deletes=None, min_insync_replicas=1,
                           fetch_limits=FetchLimits(**limits))


def start_fetch(requests: ReplicaRequests, *, peer: str, on_cancel=None) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        out.append(requests.fetch([FetchPosition(topic=TOPIC, partition=0, fetch_offset=20)], replica_id=-1,
                                  max_wait_ms=TEN_MINUTES_MS, min_bytes=HUGE, max_bytes=0, peer=peer,
                                  on_cancel=on_cancel))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def wait_parked(requests: ReplicaRequests, count: int) -> None:
    wait_until(lambda: requests.parking.parked == count, timeout_s=5, what=f"{count} parked fetches")


def test_a_consumer_wait_is_capped_by_the_server(registry):
    requests = requests_over(registry, max_wait_ms=100)
    t, out = start_fetch(requests, peer="a")
    t.join(timeout=10)
    assert not t.is_alive() and out[0][0].records == b""
    assert requests.parking.parked == 0


def test_a_cancelled_parked_fetch_returns_at_once_and_frees_its_slot(registry):
    requests = requests_over(registry)
    callbacks: list = []
    t, out = start_fetch(requests, peer="a", on_cancel=callbacks.append)
    wait_parked(requests, 1)

    callbacks[0]()  # what gRPC does when the caller cancels or disconnects

    t.join(timeout=10)
    assert not t.is_alive() and len(out) == 1
    assert requests.parking.parked == 0


def test_fetches_beyond_the_per_connection_bound_are_answered_at_once_not_parked(registry):
    requests = requests_over(registry, max_parked=10, max_parked_per_connection=2)
    callbacks: list = []
    parked = [start_fetch(requests, peer="a", on_cancel=callbacks.append) for _ in range(2)]
    wait_parked(requests, 2)

    extra, out = start_fetch(requests, peer="a")
    extra.join(timeout=10)
    assert not extra.is_alive() and out[0][0].error is None  # answered, empty, not refused

    other, _ = start_fetch(requests, peer="b", on_cancel=callbacks.append)
    wait_parked(requests, 3)  # another connection still parks
    for cb in callbacks:
        cb()
    for t, _ in parked + [(other, None)]:
        t.join(timeout=10)
    assert requests.parking.parked == 0


def test_fetches_beyond_the_total_bound_are_answered_at_once(registry):
    requests = requests_over(registry, max_parked=1, max_parked_per_connection=1)
    callbacks: list = []
    first, _ = start_fetch(requests, peer="a", on_cancel=callbacks.append)
    wait_parked(requests, 1)
    second, _ = start_fetch(requests, peer="b")
    second.join(timeout=10)
    assert not second.is_alive()
    callbacks[0]()
    first.join(timeout=10)
