"""What a produce wakes (requests.py ``_notify_appended``): a follower fetch parked on the partition
(it reads up to the LEO, which the append moved), not what waits for the partition's HW (acks=all
requests, consumers) while the append leaves the HW where it was; an append into an ISR of one
moves the HW and wakes those too. Real partition logs and a real DeleteRecords handler, no
server."""

from __future__ import annotations

import threading
import time

from lowtide.messages.replica import FetchPosition
from lowtide.record import encode_batch
from lowtide.replica.delete_records import DeleteRecordsHandler
from lowtide.replica.requests import ReplicaRequests
from tests.unit.replica.conftest import TOPIC, leader_registry

KEY = (TOPIC, 0)


def requests_for(replicas, purgatory) -> ReplicaRequests:
    registry = leader_registry(replicas)
    return ReplicaRequests(registry=registry, isr=None, deletes=DeleteRecordsHandler(registry=registry,
                                                                                     purgatory=purgatory),
                           min_insync_replicas=1)


def test_an_append_wakes_the_parked_follower_fetch_but_not_what_waits_for_the_hw(replicas, purgatory):
    requests = requests_for(replicas, purgatory)
    leo = replicas.leader.log.log_end_offset
    fetched: list = []
    fetch = threading.Thread(target=lambda: fetched.append(requests.fetch(
        [FetchPosition(topic=TOPIC, partition=0, fetch_offset=leo, log_start_offset=0)], replica_id=1,
        max_wait_ms=60_000, min_bytes=1, max_bytes=1 << 20)), daemon=True)
    fetch.start()
    time.sleep(0.2)  # parked: nothing past the LEO yet
    assert not fetched
    with requests.registry.waiting([KEY]) as hw_waiter:
        began = time.monotonic()
        [(_, _, info)] = requests.produce([(TOPIC, 0, encode_batch([b"v"] * 3))], acks=1, timeout_ms=1000)
        fetch.join(10)
        assert fetched and fetched[0][0].records, "the follower fetch was not woken by the append"
        assert time.monotonic() - began < 10
        assert info.base_offset == leo
        # ISR of three and no follower has the batch yet: the HW did not move, nothing to wake
        assert replicas.leader.log.high_watermark == leo
        assert not hw_waiter.is_set()


def test_an_append_that_moves_the_hw_wakes_what_waits_for_it(make_replicas, purgatory):
    replicas = make_replicas(isr=(0,))  # an ISR of one: the leader's append is the HW
    requests = requests_for(replicas, purgatory)
    with requests.registry.waiting([KEY]) as hw_waiter:
        [(_, _, info)] = requests.produce([(TOPIC, 0, encode_batch([b"v"] * 3))], acks=1, timeout_ms=1000)
        assert replicas.leader.log.high_watermark == info.last_offset + 1
        assert hw_waiter.is_set()


def start_acks_all_produce(requests: ReplicaRequests, replicas) -> tuple[threading.Thread, list, int]:
    """An acks=all produce of 3 records on a thread, returned once it appended and waits for the HW:
    (the thread, its result list, the LEO before it)."""
    leo = replicas.leader.log.log_end_offset
    out: list = []
    produce = threading.Thread(target=lambda: out.append(requests.produce(
        [(TOPIC, 0, encode_batch([b"v"] * 3))], acks=-1, timeout_ms=30_000)), daemon=True)
    produce.start()
    deadline = time.monotonic() + 10
    while replicas.leader.log.log_end_offset == leo and time.monotonic() < deadline:
        time.sleep(0.01)
    assert replicas.leader.log.log_end_offset == leo + 3
    time.sleep(0.1)  # the produce is waiting for the HW now
    return produce, out, leo


def test_an_acks_all_produce_returns_once_the_followers_fetches_move_the_hw_past_it(replicas, purgatory):
    requests = requests_for(replicas, purgatory)
    produce, out, leo = start_acks_all_produce(requests, replicas)
    new_leo = leo + 3
    assert not out
    began = time.monotonic()
    for broker in (1, 2):  # each follower reports it has everything: the second one moves the HW
        requests.fetch([FetchPosition(topic=TOPIC, partition=0, fetch_offset=new_leo, log_start_offset=0)],
                       replica_id=broker, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
    produce.join(10)
    assert out, "the acks=all produce was not woken by the HW move"
    assert time.monotonic() - began < 10
    [(_, _, info)] = out[0]
    assert info.base_offset == leo
    assert replicas.leader.log.high_watermark == new_leo


def test_a_finished_fetch_and_a_finished_acks_all_wait_leave_no_wake_up_registered(replicas, purgatory):
    # Their wake-ups are registered and removed by hand on the hot path (no context manager): a
    # leftover would be woken on every later append, for ever.
    requests = requests_for(replicas, purgatory)
    produce, out, leo = start_acks_all_produce(requests, replicas)
    # Waiting: registered under the partition and under its last offset.
    assert requests.registry._waiters._by_key and requests._hw_waiters._by_key
    for broker in (1, 2):
        requests.fetch([FetchPosition(topic=TOPIC, partition=0, fetch_offset=leo + 3, log_start_offset=0)],
                       replica_id=broker, max_wait_ms=50, min_bytes=1, max_bytes=1 << 20)
    produce.join(10)
    assert out and out[0][0][2].base_offset == leo
    assert requests.registry._waiters._by_key == {}
    assert requests._hw_waiters._by_key == {}
