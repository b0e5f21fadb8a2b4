"""ListOffsets, FindBatches and DescribeFiles against the committed state."""

from __future__ import annotations

import time

import pytest

from lowtide.errors import InvalidRequest, OffsetOutOfRange, UnknownTopicOrPartition
from lowtide.messages.coordinator import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
    DescribeFilesRequest,
    FindBatchesPartition,
    FindBatchesRequest,
    FindBatchesTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from tests.unit.coordinator.shard import batch, commit, create_topic


def list_offset(shard, tid, timestamp, partition=0):
    r = shard.core.list_offsets(ListOffsetsRequest(topics=[ListOffsetsTopic(
        topic_id=tid, partitions=[ListOffsetsPartition(partition_index=partition, timestamp=timestamp)])]))
    p = r.topics[0].partitions[0]
    return (p.error_code, p.timestamp, p.offset)


def delete_to(shard, tid, offset, partition=0):
    return shard.run(shard.core.delete_records(DeleteRecordsRequest(topics=[DeleteRecordsTopic(
        topic_id=tid, partitions=[DeleteRecordsPartition(partition_index=partition, offset=offset)])])))


def find(shard, tid, offset, *, max_bytes=10**9, partition_bytes=10**9, max_batches=1000, partition=0):
    r = shard.core.find_batches(FindBatchesRequest(
        fetch_max_bytes=max_bytes, max_batches_per_partition=max_batches, topics=[FindBatchesTopic(
            topic_id=tid, partitions=[FindBatchesPartition(partition_index=partition, offset=offset,
                                                           max_partition_fetch_bytes=partition_bytes)])]))
    return r.topics[0].partitions[0]


@pytest.fixture
def filled(shard):
    """Offsets 0-2 (ts 100), 3-4 (ts 300), 5 (ts 200) in file f1; 6-9 (ts 250) in f2."""
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, records=3, max_ts=100), batch(tid, records=2, max_ts=300),
                                                   batch(tid, max_ts=200)])))
    shard.run(shard.core.commit_file(commit("f2", [batch(tid, records=4, max_ts=250)])))
    return shard, tid


def test_list_offsets_latest_is_the_high_watermark_and_earliest_the_log_start(filled):
    shard, tid = filled
    assert list_offset(shard, tid, -1) == (0, -1, 10)
    assert list_offset(shard, tid, -2) == (0, -1, 0)
    delete_to(shard, tid, 4)
    assert list_offset(shard, tid, -2) == (0, -1, 4)


def test_list_offsets_max_timestamp_names_the_batch_holding_it(filled):
    shard, tid = filled
    assert list_offset(shard, tid, -3) == (0, 300, 4)


def test_list_offsets_max_timestamp_moves_when_deletion_removes_its_batch(filled):
    shard, tid = filled
    delete_to(shard, tid, 5)
    assert list_offset(shard, tid, -3) == (0, 250, 9)


def test_list_offsets_by_time_finds_the_first_batch_reaching_the_timestamp(filled):
    shard, tid = filled
    assert list_offset(shard, tid, 0) == (0, 100, 0)
    assert list_offset(shard, tid, 150) == (0, 300, 3)
    assert list_offset(shard, tid, 301) == (0, -1, -1)
    delete_to(shard, tid, 4)
    assert list_offset(shard, tid, 0) == (0, 300, 4)  # never before the log start offset


def test_list_offsets_of_an_empty_partition(shard):
    tid = create_topic(shard, "t")
    assert [list_offset(shard, tid, ts) for ts in (-1, -2, -3, 0)] == [(0, -1, 0), (0, -1, 0), (0, -1, -1),
                                                                       (0, -1, -1)]


def test_list_offsets_of_an_unknown_partition_or_timestamp_is_an_error(filled):
    shard, tid = filled
    assert list_offset(shard, tid, -1, partition=9)[0] == UnknownTopicOrPartition.code
    assert list_offset(shard, tid, -7)[0] == InvalidRequest.code


def test_list_offsets_of_log_append_time_batches_uses_the_commit_time(shard):
    tid = create_topic(shard, "t")
    shard.clock.now = 7_000
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, max_ts=1, ts_type=1)])))
    assert list_offset(shard, tid, -3) == (0, 7_000, 0)
    assert list_offset(shard, tid, 6_999) == (0, 7_000, 0)


def test_find_batches_returns_the_batch_holding_the_offset_and_the_ones_after(filled):
    shard, tid = filled
    p = find(shard, tid, 4)
    assert (p.error_code, p.log_start_offset, p.high_watermark) == (0, 0, 10)
    assert [(b.base_offset, b.last_offset, b.object_key) for b in p.batches] == [(3, 4, "f1"), (5, 5, "f1"),
                                                                                  (6, 9, "f2")]
    assert [(b.byte_offset, b.byte_size) for b in p.batches] == [(100, 100), (200, 100), (0, 100)]


def test_find_batches_stops_at_the_byte_budget_but_always_returns_a_first_batch(filled):
    shard, tid = filled
    assert [b.base_offset for b in find(shard, tid, 0, max_bytes=250).batches] == [0, 3]
    assert [b.base_offset for b in find(shard, tid, 0, partition_bytes=199).batches] == [0]
    assert [b.base_offset for b in find(shard, tid, 0, max_bytes=1).batches] == [0]
    assert [b.base_offset for b in find(shard, tid, 0, max_batches=3).batches] == [0, 3, 5]


def test_find_batches_at_the_high_watermark_is_empty_and_outside_the_log_out_of_range(filled):
    shard, tid = filled
    assert find(shard, tid, 10).batches == []
    assert find(shard, tid, 11).error_code == OffsetOutOfRange.code
    delete_to(shard, tid, 3)
    assert find(shard, tid, 2).error_code == OffsetOutOfRange.code
    assert [b.base_offset for b in find(shard, tid, 3).batches] == [3, 5, 6]


def test_find_batches_cost_follows_the_bytes_returned_not_the_partition_length(shard):
    tid = create_topic(shard, "t")
    for f in range(200):
        shard.run(shard.core.commit_file(commit(f"f{f}", [batch(tid, size=1000) for _ in range(100)])))
    assert shard.state.partition(tid, 0).high_watermark == 20_000

    def timed(offset):
        # This thread's CPU time, not wall time: the lookup runs in this thread, and the parallel
        # suite's other workers on the same 2 cores stretch wall time by several times at random.
        started = time.thread_time()
        for _ in range(50):
            p = find(shard, tid, offset, max_bytes=10_000)
        assert len(p.batches) == 10
        return time.thread_time() - started

    # From the start of 20,000 batches or from near the end: the same 10 batches' work.
    early, late = min(timed(0) for _ in range(3)), min(timed(19_980) for _ in range(3))
    assert early < late * 3 and late < early * 3


def test_describe_files_tells_whether_this_shard_has_live_batches_in_each_file(filled):
    shard, tid = filled
    response = shard.core.describe_files(DescribeFilesRequest(object_keys=["f1", "f2", "unknown", "../bad"]))
    assert [(f.object_key, f.error_code, f.has_live_batches) for f in response.files] == [
        ("f1", 0, True), ("f2", 0, True), ("unknown", 0, False), ("../bad", InvalidRequest.code, False)]
    delete_to(shard, tid, 6)
    assert shard.core.describe_files(DescribeFilesRequest(object_keys=["f1"])).files[0].has_live_batches is False


def test_describe_files_counts_a_pending_commit_as_live(shard):
    tid = create_topic(shard, "t")
    shard.append(shard.core.commit_file(commit("f1", [batch(tid)])))
    assert shard.core.describe_files(DescribeFilesRequest(object_keys=["f1"])).files[0].has_live_batches
