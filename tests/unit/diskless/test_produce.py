"""The broker's diskless produce buffer (lowtide.diskless.produce): when a WAL file closes, what it
carries, and that producers are answered only after their file commits, in order.

Every producer here uses a commit interval of a minute unless a test is about the interval: a
file that waited for its interval would show as a test timing out, not as a slow pass."""

from __future__ import annotations

import threading
import time

import pytest

from lowtide.diskless.produce import DisklessAppend, DisklessConfig, DisklessProducer
from lowtide.errors import LowtideError
from lowtide.record import encode_batch, validate_batches
from tests.unit.diskless.harness import GatedStore, InProcessShards
from tests.waiting import wait_until

A_MINUTE_MS = 60_000


@pytest.fixture
def shards(tmp_path):
    s = InProcessShards(tmp_path / "shards", count=2)
    yield s
    s.close()


@pytest.fixture
def store(tmp_path):
    s = GatedStore(tmp_path / "store")
    yield s
    s.gate.set()
    s.close()


@pytest.fixture
def start_producer(shards, store):
    made = []

    def start(**config) -> DisklessProducer:
        config.setdefault("commit_interval_ms", A_MINUTE_MS)
        producer = DisklessProducer(config=DisklessConfig(broker_id=7, **config), store=store, coordinators=shards)
        made.append(producer)
        return producer

    yield start
    store.gate.set()
    for producer in made:
        producer.stop()


class Background:
    """``produce`` on a thread of its own; ``result`` waits for its answers."""

    def __init__(self, producer: DisklessProducer, items, *, timeout_ms: int = 30_000) -> None:
        self.answers: list[DisklessAppend | LowtideError] | None = None
        self._thread = threading.Thread(target=self._run, args=(producer, items, timeout_ms), daemon=True)
        self._thread.start()

    def _run(self, producer, items, timeout_ms) -> None:
        self.answers = producer.produce(items, timeout_ms=timeout_ms)

    @property
    def answered(self) -> bool:
        return self.answers is not None

    def result(self) -> list[DisklessAppend | LowtideError]:
        self._thread.join(timeout=30)
        assert self.answers is not None, "produce did not return"
        return self.answers


def records(n: int = 1, **idempotence) -> bytes:
    return encode_batch([b"v%d" % i for i in range(n)], **idempotence)


def test_a_lone_small_produce_is_answered_at_once_when_no_file_is_in_flight(shards, start_producer):
    producer = start_producer()
    topic = shards.create_topic("t", partitions=2)
    began = time.monotonic()
    [first] = producer.produce([(topic, 0, records(3))], timeout_ms=20_000)
    [second] = producer.produce([(topic, 0, records(2))], timeout_ms=20_000)
    took = time.monotonic() - began
    assert first == DisklessAppend(base_offset=0, log_start_offset=0, log_append_time=first.log_append_time)
    assert isinstance(second, DisklessAppend) and second.base_offset == 3
    # One upload and one commit each, nowhere near the minute-long interval.
    assert took < 10, took
    assert producer.buffer_state().closed["slot"] == 2


def test_while_files_are_in_flight_requests_gather_and_go_as_one_file_when_a_slot_frees(
        shards, store, start_producer):
    producer = start_producer(files_in_flight=2)
    topic = shards.create_topic("t", partitions=4)
    store.gate.clear()
    first = Background(producer, [(topic, 0, records())])
    wait_until(lambda: len(store.started) == 1, what="the first file's upload")
    second = Background(producer, [(topic, 1, records())])
    wait_until(lambda: len(store.started) == 2, what="the second file's upload")
    gathered = [Background(producer, [(topic, k % 4, records())]) for k in range(12)]
    wait_until(lambda: producer.buffer_state().buffered_items == 12, what="12 requests in the open file")
    assert len(store.started) == 2 and producer.buffer_state().files_in_flight == 2
    assert not any(b.answered for b in [first, second, *gathered]), "answered before its file committed"
    store.gate.set()
    for b in [first, second, *gathered]:
        [answer] = b.result()
        assert isinstance(answer, DisklessAppend), answer
    state = producer.buffer_state()
    assert state.closed == {"slot": 3, "size": 0, "interval": 0, "stop": 0} and state.items_closed == 14
    third = store.started[2]
    assert len(validate_batches(store.get(third))) == 12
    # Each shard was asked once per file that had its batches; the third file's in one call each.
    assert sorted(n for _, key, n in shards.calls if key == third) == [6, 6]


def test_under_concurrent_load_files_carry_many_requests_and_each_partition_keeps_its_order(
        shards, start_producer):
    producer = start_producer()  # one file in flight, the default
    topic = shards.create_topic("t", partitions=32)
    per_producer = 15
    offsets: dict[int, list[int]] = {}

    def closed_loop(partition: int) -> None:
        mine = []
        for i in range(per_producer):
            [answer] = producer.produce([(topic, partition, records(i + 1))], timeout_ms=30_000)
            assert isinstance(answer, DisklessAppend), answer
            mine.append(answer.base_offset)
        offsets[partition] = mine

    threads = [threading.Thread(target=closed_loop, args=(p,)) for p in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    expected = [i * (i + 1) // 2 for i in range(per_producer)]  # request i holds i + 1 records
    assert offsets == {p: expected for p in range(32)}
    state = producer.buffer_state()
    files = sum(state.closed.values())
    assert state.items_closed == 32 * per_producer
    # One file is in flight at a time, so the other producers' requests wait together for the next.
    assert state.items_closed / files >= 4, state


def test_an_idempotent_producer_pipelining_across_files_is_committed_in_sequence(shards, store, start_producer):
    producer = start_producer(files_in_flight=2)
    topic = shards.create_topic("t", partitions=2)
    pid = dict(producer_id=42, producer_epoch=0)
    store.gate.clear()
    sent = []
    for seq in range(5):  # each request handed over only once the previous one is in a file
        sent.append(Background(producer, [(topic, 0, records(1, base_sequence=seq, **pid))]))
        wait_until(lambda n=seq + 1: producer.buffer_state().items_closed + producer.buffer_state().buffered_items
                   == n, what=f"request {seq} enqueued")
    resent = Background(producer, [(topic, 0, records(1, base_sequence=0, **pid))])  # a retry of the first
    wait_until(lambda: producer.buffer_state().buffered_items == 4, what="the retry in the open file")
    store.gate.set()
    assert [b.result()[0].base_offset for b in sent] == [0, 1, 2, 3, 4]
    [duplicate] = resent.result()
    assert duplicate.base_offset == 0  # the original offset, not a new one
    assert len(store.started) == 3  # request 0, request 1, then 2-4 and the retry together


def test_a_file_reaching_the_buffer_max_bytes_closes_even_when_no_slot_is_free(shards, store, start_producer):
    producer = start_producer(files_in_flight=1, buffer_max_bytes=2000)
    topic = shards.create_topic("t", partitions=1)
    store.gate.clear()
    first = Background(producer, [(topic, 0, records())])
    wait_until(lambda: len(store.started) == 1, what="the first file's upload")
    small = Background(producer, [(topic, 0, records())])
    wait_until(lambda: producer.buffer_state().buffered_items == 1, what="a small request lingering")
    big = Background(producer, [(topic, 0, encode_batch([b"x" * 3000]))])
    wait_until(lambda: len(store.started) == 2, what="the full file's upload")
    assert producer.buffer_state().closed == {"slot": 1, "size": 1, "interval": 0, "stop": 0}
    store.gate.set()
    assert [b.result()[0].base_offset for b in (first, small, big)] == [0, 1, 2]


def test_the_commit_interval_bounds_how_long_a_request_lingers_when_no_slot_frees(shards, store, start_producer):
    producer = start_producer(files_in_flight=1, commit_interval_ms=200)
    topic = shards.create_topic("t", partitions=1)
    store.gate.clear()
    first = Background(producer, [(topic, 0, records())])
    wait_until(lambda: len(store.started) == 1, what="the first file's upload")
    lingering = Background(producer, [(topic, 0, records())])
    wait_until(lambda: producer.buffer_state().closed["interval"] == 1, timeout_s=10,
               what="the interval closing the second file")
    wait_until(lambda: len(store.started) == 2, what="the second file's upload")
    store.gate.set()
    assert [b.result()[0].base_offset for b in (first, lingering)] == [0, 1]


def test_stop_commits_the_files_in_flight_and_what_is_buffered_then_refuses_produce(
        shards, store, start_producer):
    producer = start_producer(files_in_flight=1)
    topic = shards.create_topic("t", partitions=1)
    store.gate.clear()
    first = Background(producer, [(topic, 0, records())])
    wait_until(lambda: len(store.started) == 1, what="the first file's upload")
    buffered = Background(producer, [(topic, 0, records())])
    wait_until(lambda: producer.buffer_state().buffered_items == 1, what="a request in the open file")
    stopping = threading.Thread(target=producer.stop)
    stopping.start()
    wait_until(lambda: producer.buffer_state().closed["stop"] == 1, what="stop closing the open file")
    store.gate.set()
    stopping.join(timeout=30)
    assert [b.result()[0].base_offset for b in (first, buffered)] == [0, 1]
    [refused] = producer.produce([(topic, 0, records())], timeout_ms=1000)
    assert isinstance(refused, LowtideError) and "shutting down" in str(refused)


def test_beyond_the_waiting_bound_a_request_is_refused_at_once_retriably_and_nothing_of_it_is_written(
        shards, store, start_producer):
    # Waiting requests hold the replica's gRPC handler threads, which the commits they wait for
    # also need (the shard's metadata-log append): the bound keeps some free.
    producer = start_producer(max_waiting_requests=2)
    topic = shards.create_topic("t", partitions=1)
    store.gate.clear()
    waiting = [Background(producer, [(topic, 0, records())]) for _ in range(2)]
    wait_until(lambda: producer.buffer_state().waiting_requests == 2, what="two requests waiting")
    began = time.monotonic()
    [refused] = producer.produce([(topic, 0, records(5))], timeout_ms=20_000)
    assert isinstance(refused, LowtideError) and refused.retriable and time.monotonic() - began < 5
    state = producer.buffer_state()
    assert state.refused_requests == 1 and state.items_closed + state.buffered_items == 2
    store.gate.set()
    assert sorted(b.result()[0].base_offset for b in waiting) == [0, 1]
    [accepted] = producer.produce([(topic, 0, records())], timeout_ms=20_000)
    assert accepted.base_offset == 2  # the refused request's 5 records took no offsets
    assert producer.buffer_state().waiting_requests == 0
