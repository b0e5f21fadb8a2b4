"""The replication linger (replica/requests.py, common/ordering.py): a follower fetch woken by a
small append waits while another Produce is on its way, so both appends ride one round; with
none on the way, or with enough bytes already, it answers at once; the linger bounds the wait.
Real partition logs and a real DeleteRecords handler, no server; the Produce requests "on their
way" are counted in a ``ProduceArrivals`` of the test's own, as the Kafka listener counts them."""

from __future__ import annotations

import threading
import time

from lowtide.common.ordering import ProduceArrivals
from lowtide.messages.replica import FetchPosition
from lowtide.record import encode_batch
from lowtide.replica.delete_records import DeleteRecordsHandler
from lowtide.replica.requests import LINGER_BYTES, ReplicaRequests
from tests.unit.replica.conftest import TOPIC, leader_registry


def requests_for(replicas, purgatory, *, linger_ms: int, arrivals: ProduceArrivals) -> ReplicaRequests:
    registry = leader_registry(replicas)
    return ReplicaRequests(registry=registry, isr=None, min_insync_replicas=1, replication_linger_ms=linger_ms,
                           arrivals=arrivals,
                           deletes=DeleteRecordsHandler(registry=registry, purgatory=purgatory))


def park_follower_fetch(requests: ReplicaRequests, offset: int) -> tuple[threading.Thread, list]:
    """A follower fetch (broker 1) from ``offset`` on its own thread, parked once nothing is there."""
    fetched: list = []
    fetch = threading.Thread(target=lambda: fetched.append((requests.fetch(
        [FetchPosition(topic=TOPIC, partition=0, fetch_offset=offset, log_start_offset=0)], replica_id=1,
        max_wait_ms=60_000, min_bytes=1, max_bytes=1 << 20), time.monotonic())), daemon=True)
    fetch.start()
    time.sleep(0.2)
    assert not fetched, "the fetch did not park"
    return fetch, fetched


def produce(requests: ReplicaRequests, *, values: int = 3, size: int = 1) -> None:
    [(_, _, info)] = requests.produce([(TOPIC, 0, encode_batch([b"v" * size] * values))], acks=1, timeout_ms=1000)
    assert not isinstance(info, Exception), info


def test_a_woken_follower_fetch_waits_for_the_produce_on_its_way_and_carries_both_appends(replicas, purgatory):
    arrivals = ProduceArrivals()
    requests = requests_for(replicas, purgatory, linger_ms=30_000, arrivals=arrivals)
    leo = replicas.leader.log.log_end_offset
    fetch, fetched = park_follower_fetch(requests, leo)
    arrivals.expect_append()  # the first Produce, read by the listener
    arrivals.expect_append()  # ... and the next one, read behind it
    produce(requests)
    arrivals.appended()
    time.sleep(0.3)
    assert not fetched, "the fetch answered with the first append while the next Produce was on its way"
    produce(requests)
    arrivals.appended()  # nothing on the way now: answered without waiting out the linger
    began = time.monotonic()
    fetch.join(10)
    assert fetched, "the fetch was not answered once no Produce was on its way"
    [(outcomes, answered_at)] = fetched
    assert answered_at - began < 5
    assert replicas.leader.log.log_end_offset == leo + 6
    [partition] = outcomes
    assert partition.log_end_offset == leo + 6
    assert len(partition.records) == 2 * len(encode_batch([b"v"] * 3)), "not both appends in one answer"


def test_a_woken_follower_fetch_answers_at_once_with_no_produce_on_its_way(replicas, purgatory):
    requests = requests_for(replicas, purgatory, linger_ms=30_000, arrivals=ProduceArrivals())
    fetch, fetched = park_follower_fetch(requests, replicas.leader.log.log_end_offset)
    began = time.monotonic()
    produce(requests)  # a gRPC Produce: never counted
    fetch.join(10)
    assert fetched and fetched[0][1] - began < 5
    assert fetched[0][0][0].records


def test_a_woken_follower_fetch_holding_linger_bytes_answers_at_once(make_replicas, purgatory):
    replicas = make_replicas(topic_config={"segment.bytes": str(1 << 20)})
    arrivals = ProduceArrivals()
    requests = requests_for(replicas, purgatory, linger_ms=30_000, arrivals=arrivals)
    fetch, fetched = park_follower_fetch(requests, replicas.leader.log.log_end_offset)
    arrivals.expect_append()
    arrivals.expect_append()
    began = time.monotonic()
    produce(requests, values=8, size=LINGER_BYTES // 8)
    fetch.join(10)
    arrivals.appended()
    arrivals.appended()
    assert fetched and fetched[0][1] - began < 5
    assert len(fetched[0][0][0].records) >= LINGER_BYTES


def test_the_linger_bounds_the_wait_for_a_produce_that_never_appends(replicas, purgatory):
    arrivals = ProduceArrivals()
    requests = requests_for(replicas, purgatory, linger_ms=400, arrivals=arrivals)
    fetch, fetched = park_follower_fetch(requests, replicas.leader.log.log_end_offset)
    arrivals.expect_append()
    arrivals.expect_append()  # stays on its way
    began = time.monotonic()
    produce(requests)
    arrivals.appended()
    fetch.join(10)
    assert fetched, "the linger did not end"
    waited = fetched[0][1] - began
    assert 0.35 <= waited < 5, f"answered after {waited:.3f} s with a 400 ms linger"


def test_the_next_append_is_due_now_while_a_produce_is_on_its_way_then_at_the_arrival_pace():
    arrivals = ProduceArrivals()
    assert arrivals.next_append_due() is None  # nothing known yet
    arrivals.expect_append()
    assert abs(arrivals.next_append_due() - time.monotonic()) < 0.05
    arrivals.appended()
    assert arrivals.next_append_due() is None  # one arrival: no pace yet
    time.sleep(0.2)
    arrivals.expect_append()
    arrivals.appended()
    due = arrivals.next_append_due()
    assert due is not None and 0.15 < due - time.monotonic() <= 0.2 + 0.05
    arrivals.appended()  # an extra one changes nothing (never below zero)
    assert arrivals.next_append_due() == due
