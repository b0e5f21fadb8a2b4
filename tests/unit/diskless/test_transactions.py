"""The broker's side of transactions on diskless topics (issue 50): transactional batches go into WAL
files flagged for the shard, markers are control batches committed the same way, and clients'
control batches stay refused."""

from __future__ import annotations

import pytest

from lowtide.diskless.produce import DisklessAppend, DisklessConfig, DisklessProducer
from lowtide.errors import InvalidProducerEpoch, InvalidRecord
from lowtide.messages.coordinator import FindBatchesPartition, FindBatchesRequest, FindBatchesTopic
from lowtide.record import encode_batch
from lowtide.record.control import ABORT, build_marker_batch, read_marker_type
from tests.unit.diskless.harness import GatedStore, InProcessShards

PID = 31


@pytest.fixture
def setup(tmp_path):
    shards = InProcessShards(tmp_path / "shards", count=1)
    store = GatedStore(tmp_path / "store")
    producer = DisklessProducer(config=DisklessConfig(broker_id=7, commit_interval_ms=60_000), store=store,
                                coordinators=shards)
    yield shards, store, producer
    producer.stop()
    store.close()
    shards.close()


def read_committed(shards, topic):
    shard = shards.shards[0]
    response = shard.core.find_batches(FindBatchesRequest(
        fetch_max_bytes=1 << 20, max_batches_per_partition=100, isolation_level=1,
        topics=[FindBatchesTopic(topic_id=bytes.fromhex(topic.topic_id), partitions=[
            FindBatchesPartition(partition_index=0, offset=0, max_partition_fetch_bytes=1 << 20)])]))
    return response.topics[0].partitions[0]


def test_a_transaction_produced_and_aborted_through_the_broker_is_listed_aborted(setup):
    shards, store, producer = setup
    topic = shards.create_topic("t", partitions=1)
    txn = encode_batch([b"a", b"b"], producer_id=PID, producer_epoch=0, base_sequence=0, is_transactional=True)
    [data] = producer.produce([(topic, 0, txn)], timeout_ms=20_000)
    assert isinstance(data, DisklessAppend) and data.base_offset == 0
    assert read_committed(shards, topic).last_stable_offset == 0  # open
    [marker] = producer.write_markers([(topic, 0)], producer_id=PID, producer_epoch=0, commit=False,
                                      coordinator_epoch=3, timeout_ms=20_000)
    assert isinstance(marker, DisklessAppend) and marker.base_offset == 2
    found = read_committed(shards, topic)
    assert (found.last_stable_offset, found.aborted_transactions) == (3, [(PID, 0)])
    # The marker's bytes are a control batch in the WAL file, served like any batch.
    last = found.batches[-1]
    assert read_marker_type(store.get(last.object_key, offset=last.byte_offset, length=last.byte_size)) == ABORT
    # Asked again (a lost answer): nothing to end, nothing written.
    [again] = producer.write_markers([(topic, 0)], producer_id=PID, producer_epoch=0, commit=False,
                                     coordinator_epoch=3, timeout_ms=20_000)
    assert again == DisklessAppend(base_offset=-1, log_start_offset=0, log_append_time=-1)
    assert shards.shards[0].state.partition(bytes.fromhex(topic.topic_id), 0).high_watermark == 3


def test_a_stale_marker_epoch_is_fenced_and_a_clients_control_batch_refused(setup):
    shards, _, producer = setup
    topic = shards.create_topic("t", partitions=1)
    producer.produce([(topic, 0, encode_batch([b"a"], producer_id=PID, producer_epoch=4, base_sequence=0,
                                               is_transactional=True))], timeout_ms=20_000)
    [stale] = producer.write_markers([(topic, 0)], producer_id=PID, producer_epoch=3, commit=True,
                                     coordinator_epoch=0, timeout_ms=20_000)
    assert isinstance(stale, InvalidProducerEpoch)
    control = build_marker_batch(producer_id=PID, producer_epoch=4, commit=True, coordinator_epoch=0,
                                 timestamp_ms=1)
    [refused] = producer.produce([(topic, 0, control)], timeout_ms=20_000)
    assert isinstance(refused, InvalidRecord)
    assert read_committed(shards, topic).last_stable_offset == 0  # still open
