"""Producer ids in blocks claimed in the metadata store (frontdoor/transactions/producer_ids.py, Kafka's
AllocateProducerIds) on a real etcd: never handed out twice, by two processes racing (two stores
on one etcd and root, each with its own connection and image) or across restarts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from lowtide.frontdoor.transactions.producer_ids import FIRST_PRODUCER_ID, ProducerIdBlocks, encode_next
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore


@pytest.fixture
def process(metadata_store) -> Iterator:
    """Opens the store of another process (same etcd and root, its own connection and image)."""
    opened: list[MetadataStore] = []

    def open_store() -> MetadataStore:
        s = MetadataStore(client=EtcdClient(metadata_store.client.endpoints), root=metadata_store.root)
        opened.append(s)
        return s

    yield open_store
    for s in opened:
        s.close()


def recorded_next(store: MetadataStore) -> int:
    # etcd itself: the image of this store may not show the other process's last claim yet
    return json.loads(section(store, "producer_ids").read("next").value)["next"]


def test_ids_are_served_from_a_claimed_block_and_the_next_block_is_claimed_when_it_runs_out(metadata_store):
    ids = ProducerIdBlocks(store=metadata_store, block_size=3)
    assert [ids.next_id() for _ in range(3)] == [FIRST_PRODUCER_ID + i for i in range(3)]
    assert recorded_next(metadata_store) == FIRST_PRODUCER_ID + 3  # one block claimed, nothing more
    assert ids.next_id() == FIRST_PRODUCER_ID + 3
    assert recorded_next(metadata_store) == FIRST_PRODUCER_ID + 6


def test_two_processes_racing_never_hand_out_one_id_twice(metadata_store, process):
    allocators = [ProducerIdBlocks(store=s, block_size=5) for s in (metadata_store, process())]
    threads_per_process, ids_per_thread = 4, 150
    got: list[list[int]] = []
    start = threading.Barrier(len(allocators) * threads_per_process)

    def take(ids: ProducerIdBlocks) -> None:
        mine: list[int] = []
        got.append(mine)
        start.wait()
        for _ in range(ids_per_thread):
            mine.append(ids.next_id())

    threads = [threading.Thread(target=take, args=(ids,)) for ids in allocators for _ in range(threads_per_process)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    handed_out = [pid for mine in got for pid in mine]
    assert len(handed_out) == len(allocators) * threads_per_process * ids_per_thread
    assert len(set(handed_out)) == len(handed_out), "a producer id was handed out twice"
    assert max(handed_out) < recorded_next(metadata_store)  # every id came from a recorded block


def test_an_allocator_started_after_a_restart_never_hands_out_an_id_given_before(metadata_store, process):
    first = process()
    before = [ProducerIdBlocks(store=first, block_size=10).next_id() for _ in range(3)]  # three allocators
    first.close()  # the process stops: what it had not handed out of its blocks is skipped
    for _ in range(2):  # restarted twice
        again = ProducerIdBlocks(store=process(), block_size=10)
        after = [again.next_id() for _ in range(25)]
        assert min(after) > max(before), (before, after)
        before += after


def test_ids_continue_from_a_counter_a_migration_recorded(metadata_store):
    section(metadata_store, "producer_ids").put("next", encode_next(5000))
    assert ProducerIdBlocks(store=metadata_store).next_id() == 5000
    assert recorded_next(metadata_store) == 6000
