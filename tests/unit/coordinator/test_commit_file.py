from __future__ import annotations

import pytest

from lowtide.errors import InvalidRequest, OutOfOrderSequenceNumber, UnknownTopicOrPartition
from lowtide.messages.coordinator import CommitFileRequest
from tests.unit.coordinator.shard import batch, commit, create_topic, topic_id


def offsets(response):
    return [(r.error_code, r.assigned_base_offset) for r in response.batches]


def test_offsets_are_assigned_per_partition_in_request_order(shard):
    tid = create_topic(shard, "t", 2)
    response = shard.run(shard.core.commit_file(commit("f1", [
        batch(tid, 0, records=3), batch(tid, 1, records=2), batch(tid, 0, records=5), batch(tid, 1)])))
    assert offsets(response) == [(0, 0), (0, 0), (0, 3), (0, 2)]
    assert shard.state.partition(tid, 0).high_watermark == 8
    assert shard.state.partition(tid, 1).high_watermark == 3


def test_a_pipelined_commit_is_checked_against_the_pending_one_and_gets_the_next_offsets(shard):
    tid = create_topic(shard, "t")
    first = shard.append(shard.core.commit_file(commit("f1", [batch(tid, records=10)])))
    second = shard.append(shard.core.commit_file(commit("f2", [batch(tid, records=4)])))
    # Neither is applied yet: the second was checked against committed state + the first's record.
    assert shard.state.partition(tid, 0).high_watermark == 0
    assert shard.core.pending.pending_count == 2
    shard.replicate()
    assert offsets(first.response) == [(0, 0)]
    assert offsets(second.response) == [(0, 10)]
    assert shard.state.partition(tid, 0).high_watermark == 14
    assert shard.core.pending.pending_count == 0


def test_a_pending_commit_changes_only_the_high_watermark_of_the_partition_row(shard):
    # The check builds the pending row by field position (tuple.__new__, not _replace): a field
    # order change in PartitionRow must show here.
    tid = create_topic(shard, "t")
    committed = shard.state.partition(tid, 0)
    shard.append(shard.core.commit_file(commit("f1", [batch(tid, records=10)])))
    assert shard.core.pending.partition(tid, 0) == committed._replace(high_watermark=10)


def test_the_cached_partition_row_after_an_apply_equals_the_row_in_sqlite(shard):
    # The apply also rebuilds its cached row by position; reads serve that cache, not SQLite.
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, records=10, max_ts=1_234)])))
    cached = shard.state.partition(tid, 0)
    assert cached == shard.state._partition(shard.state.db, tid, 0)
    assert (cached.high_watermark, cached.max_timestamp, cached.max_timestamp_offset) == (10, 1_234, 9)


def test_a_batch_for_an_unknown_partition_fails_alone(shard):
    tid = create_topic(shard, "t")
    response = shard.run(shard.core.commit_file(commit("f1", [batch(tid, 5), batch(tid, 0, records=2)])))
    assert [r.error_code for r in response.batches] == [UnknownTopicOrPartition.code, 0]
    assert response.batches[1].assigned_base_offset == 0


def test_log_append_time_batches_get_the_commit_time_and_create_time_ones_minus_one(shard):
    tid = create_topic(shard, "t")
    shard.clock.now = 5_000
    response = shard.run(shard.core.commit_file(commit("f1", [batch(tid, ts_type=1), batch(tid, ts_type=0)])))
    assert [r.log_append_time for r in response.batches] == [5_000, -1]


def test_the_log_start_offset_is_returned_with_every_accepted_batch(shard):
    from lowtide.messages.coordinator import DeleteRecordsPartition, DeleteRecordsRequest, DeleteRecordsTopic
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, records=10)])))
    shard.run(shard.core.delete_records(DeleteRecordsRequest(topics=[DeleteRecordsTopic(
        topic_id=tid, partitions=[DeleteRecordsPartition(partition_index=0, offset=4)])])))
    response = shard.run(shard.core.commit_file(commit("f2", [batch(tid)])))
    assert (response.batches[0].assigned_base_offset, response.batches[0].log_start_offset) == (10, 4)


def test_a_file_with_no_accepted_batch_is_recorded_deletable_at_once(shard):
    tid = create_topic(shard, "t")
    shard.clock.now = 9_000
    response = shard.run(shard.core.commit_file(commit("f1", [batch(tid, 3), batch(tid, 4)])))
    assert all(r.error_code == UnknownTopicOrPartition.code for r in response.batches)
    row = shard.state.file("f1")
    assert (row.state, row.live_batches, row.marked_for_deletion_at_ms) == ("deletable", 0, 9_000)


def test_committing_a_known_object_key_again_appends_nothing(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid)])))
    decision = shard.core.commit_file(commit("f1", [batch(tid)]))
    assert decision.records == []
    assert decision.response.batches[0].error_code == InvalidRequest.code
    assert shard.state.partition(tid, 0).high_watermark == 1


@pytest.mark.parametrize("change", [
    {"owner_ids": (1, 2)},             # this shard (0) is not an owner
    {"owner_ids": (0, 0)},
    {"file_size": 50},                 # the batch's bytes end past the file
    {"object_key": "../x"},
    {"object_key": ""},
])
def test_a_malformed_commit_is_an_invalid_request_and_changes_nothing(shard, change):
    tid = create_topic(shard, "t")
    good = commit("f1", [batch(tid, size=100)])
    request = CommitFileRequest(**{**{f: getattr(good, f) for f in good.__dataclass_fields__}, **change})
    before = shard.state.dump()
    with pytest.raises(InvalidRequest):
        shard.core.commit_file(request)
    assert shard.core.pending.pending_count == 0
    assert shard.state.dump() == before


def test_a_batch_whose_sequences_do_not_fit_its_record_count_is_refused(shard):
    tid = create_topic(shard, "t")
    b = batch(tid, records=3, producer_id=1, epoch=0, seq=0)
    bad = b._replace(last_sequence=5)
    response = shard.run(shard.core.commit_file(commit("f1", [bad])))
    assert response.batches[0].error_code == InvalidRequest.code


def test_a_batch_of_another_magic_is_unsupported_for_message_format(shard):
    tid = create_topic(shard, "t")
    b = batch(tid)
    old = b._replace(magic=1)
    response = shard.run(shard.core.commit_file(commit("f1", [old, b])))
    assert [r.error_code for r in response.batches] == [43, 0]


def test_commit_to_an_unknown_topic_id_is_unknown_topic_or_partition(shard):
    response = shard.run(shard.core.commit_file(commit("f1", [batch(topic_id("nope"))])))
    assert response.batches[0].error_code == UnknownTopicOrPartition.code
    assert OutOfOrderSequenceNumber.code == 45
