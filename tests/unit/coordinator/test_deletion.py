"""DeleteRecords, DeleteTopics, CreatePartitions, and the file lifetime (owner handover, deletion)."""

from __future__ import annotations

import pytest

from lowtide.coordinator.errors import UnknownTopicId
from lowtide.coordinator.records import CommittedBatch, FileCommitted
from lowtide.errors import InvalidPartitions, InvalidRequest, InvalidTopic, OffsetOutOfRange, TopicAlreadyExists
from lowtide.messages.coordinator import (
    CreatablePartitions,
    CreatePartitionsRequest,
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
    DeleteTopicsRequest,
    FindBatchesPartition,
    FindBatchesRequest,
    FindBatchesTopic,
)
from tests.unit.coordinator.shard import Clock, Shard, batch, commit, create_topic, topic_id


def delete_records(shard, tid, *offsets):
    r = shard.run(shard.core.delete_records(DeleteRecordsRequest(topics=[DeleteRecordsTopic(
        topic_id=tid, partitions=[DeleteRecordsPartition(partition_index=p, offset=o) for p, o in offsets])])))
    return [(p.error_code, p.low_watermark) for p in r.topics[0].partitions]


def live_offsets(shard, tid, partition=0):
    p = shard.state.partition(tid, partition)
    r = shard.core.find_batches(FindBatchesRequest(fetch_max_bytes=10**9, max_batches_per_partition=10**6, topics=[
        FindBatchesTopic(topic_id=tid, partitions=[FindBatchesPartition(
            partition_index=partition, offset=p.log_start_offset, max_partition_fetch_bytes=10**9)])]))
    return [(b.base_offset, b.last_offset) for b in r.topics[0].partitions[0].batches]


def test_delete_records_returns_the_low_watermark_and_drops_batches_wholly_below_it(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, records=3), batch(tid, records=3),
                                                   batch(tid, records=3)])))
    assert delete_records(shard, tid, (0, 4)) == [(0, 4)]
    assert live_offsets(shard, tid) == [(3, 5), (6, 8)]  # 3-5 still holds the live offsets 4 and 5
    assert shard.state.file("f1").live_batches == 2


def test_delete_records_minus_one_means_the_high_watermark(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, records=5)])))
    assert delete_records(shard, tid, (0, -1)) == [(0, 5)]
    assert live_offsets(shard, tid) == []


def test_delete_records_below_the_log_start_appends_nothing_and_returns_it(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, records=5)])))
    delete_records(shard, tid, (0, 3))
    decision = shard.core.delete_records(DeleteRecordsRequest(topics=[DeleteRecordsTopic(
        topic_id=tid, partitions=[DeleteRecordsPartition(partition_index=0, offset=1)])]))
    assert decision.records == []
    assert decision.response.topics[0].partitions[0].low_watermark == 3


def test_delete_records_past_the_high_watermark_is_out_of_range_and_changes_nothing(shard):
    tid = create_topic(shard, "t", 2)
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, 0, records=5), batch(tid, 1, records=5)])))
    before = shard.state.dump()
    assert delete_records(shard, tid, (0, 6), (1, -5), (7, 1)) == [
        (OffsetOutOfRange.code, -1), (OffsetOutOfRange.code, -1), (3, -1)]
    assert shard.state.dump()["partitions"] == before["partitions"]


def test_delete_records_checks_against_a_pending_commit(shard):
    tid = create_topic(shard, "t")
    shard.append(shard.core.commit_file(commit("f1", [batch(tid, records=5)])))
    assert delete_records(shard, tid, (0, 5)) == [(0, 5)]


def test_a_file_whose_batches_are_all_deleted_by_its_only_owner_is_marked_for_deletion(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid), batch(tid)])))
    shard.clock.now += 1_000
    delete_records(shard, tid, (0, 1))
    assert shard.state.file("f1").state == "live"
    shard.clock.now += 1_000
    delete_records(shard, tid, (0, 2))
    row = shard.state.file("f1")
    assert (row.state, row.live_batches, row.marked_for_deletion_at_ms) == ("deletable", 0, shard.clock.now)
    shard.run(shard.core.file_deleted(object_key="f1"))
    assert shard.state.file("f1") is None


def test_a_live_file_cannot_be_recorded_as_deleted(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid)])))
    with pytest.raises(InvalidRequest):
        shard.core.file_deleted(object_key="f1")


def test_a_file_shared_by_two_owners_is_handed_over_then_marked_for_deletion_by_the_last(tmp_path):
    clock = Clock()
    dc0, dc1 = Shard(tmp_path / "dc0", coordinator_id=0, clock=clock), Shard(tmp_path / "dc1", coordinator_id=1,
                                                                             clock=clock)
    a, b = create_topic(dc0, "a"), create_topic(dc1, "b")
    owners = (0, 1)  # the broker's (permuted) owner list: dc0 owns first
    dc0.run(dc0.core.commit_file(commit("wal", [batch(a, records=2), batch(b, records=3)], owners=owners)))
    dc1.run(dc1.core.commit_file(commit("wal", [batch(a, records=2), batch(b, records=3)], owners=owners)))
    assert (dc0.state.file("wal").state, dc1.state.file("wal").state) == ("live", "live")

    # dc1 deletes its batches first: it is not the owner yet, so it only waits.
    delete_records(dc1, b, (0, -1))
    assert dc1.state.file("wal").state == "released"
    # dc0's last batch goes: dc0 owns the file, so it must hand it to dc1.
    delete_records(dc0, a, (0, -1))
    assert dc0.state.file("wal").state == "handing_over"
    # The handover: dc1 records that it owns the file now (it has no batches left: deletable),
    # then dc0 records that dc1 has it (its row goes).
    clock.now += 500
    dc1.run(dc1.core.hand_over_file(object_key="wal", owner_ids=owners, to_owner_index=1))
    row = dc1.state.file("wal")
    assert (row.state, row.current_owner_index, row.marked_for_deletion_at_ms) == ("deletable", 1, clock.now)
    dc0.run(dc0.core.hand_over_file(object_key="wal", owner_ids=owners, to_owner_index=1))
    assert dc0.state.file("wal") is None


def test_a_received_file_with_live_batches_waits_for_them_before_deletion(tmp_path):
    clock = Clock()
    dc0, dc1 = Shard(tmp_path / "dc0", coordinator_id=0, clock=clock), Shard(tmp_path / "dc1", coordinator_id=1,
                                                                             clock=clock)
    a, b = create_topic(dc0, "a"), create_topic(dc1, "b")
    dc0.run(dc0.core.commit_file(commit("wal", [batch(a), batch(b)], owners=(0, 1))))
    dc1.run(dc1.core.commit_file(commit("wal", [batch(a), batch(b)], owners=(0, 1))))
    delete_records(dc0, a, (0, -1))
    dc1.run(dc1.core.hand_over_file(object_key="wal", owner_ids=(0, 1), to_owner_index=1))
    assert dc1.state.file("wal").state == "live"
    delete_records(dc1, b, (0, -1))
    assert dc1.state.file("wal").state == "deletable"


def test_a_handover_of_a_file_this_shard_never_saw_makes_it_deletable_here(tmp_path):
    dc2 = Shard(tmp_path / "dc2", coordinator_id=2)
    dc2.run(dc2.core.hand_over_file(object_key="wal", owner_ids=(1, 2), to_owner_index=1))
    assert dc2.state.file("wal").state == "deletable"


def test_a_first_owner_with_no_accepted_batch_hands_the_file_over_at_once(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("wal", [batch(tid, 3)], owners=(0, 5))))
    assert shard.state.file("wal").state == "handing_over"


def test_delete_topics_removes_partitions_batches_and_producers_and_releases_files(shard):
    tid = create_topic(shard, "t", 2)
    keep = create_topic(shard, "keep")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, 0, producer_id=1, epoch=0, seq=0), batch(tid, 1),
                                                   batch(keep)])))
    shard.run(shard.core.commit_file(commit("f2", [batch(tid, 1)])))
    r = shard.run(shard.core.delete_topics(DeleteTopicsRequest(topic_ids=[tid, topic_id("nope")])))
    assert [x.error_code for x in r.responses] == [0, UnknownTopicId.code]
    assert shard.state.partition(tid, 0) is None and shard.state.producer(tid, 0, 1) is None
    assert (shard.state.file("f1").state, shard.state.file("f2").state) == ("live", "deletable")
    assert shard.state.file("f1").live_batches == 1


def test_create_partitions_adds_the_missing_indexes_up_to_the_count(shard):
    tid = create_topic(shard, "t", 2)
    r = shard.run(shard.core.create_partitions(CreatePartitionsRequest(topics=[
        CreatablePartitions(topic_id=tid, name="t", num_partitions=4)])))
    assert r.topics[0].error_code == 0
    assert shard.state.topic(tid) == ("t", {0, 1, 2, 3})


def test_create_partitions_with_explicit_indexes_creates_only_those(shard):
    tid = topic_id("t")
    shard.run(shard.core.create_partitions(CreatePartitionsRequest(topics=[
        CreatablePartitions(topic_id=tid, name="t", num_partitions=8, partition_indexes=[1, 5])])))
    assert shard.state.topic(tid) == ("t", {1, 5})


@pytest.mark.parametrize("name, count, indexes, error", [
    ("t", 2, (), InvalidPartitions),        # already has 2
    ("t", 0, (), InvalidPartitions),
    ("t", 3, (1,), InvalidPartitions),      # index 1 exists
    ("other", 3, (), InvalidRequest),       # the id is topic t
    ("bad name", 1, (), InvalidTopic),
])
def test_create_partitions_refuses_bad_requests_per_topic(shard, name, count, indexes, error):
    tid = create_topic(shard, "t", 2)
    before = shard.state.dump()
    r = shard.run(shard.core.create_partitions(CreatePartitionsRequest(topics=[
        CreatablePartitions(topic_id=tid, name=name, num_partitions=count, partition_indexes=indexes)])))
    assert r.topics[0].error_code == error.code
    assert shard.state.dump() == before


def test_a_name_taken_by_another_topic_id_already_exists(shard):
    create_topic(shard, "t")
    r = shard.run(shard.core.create_partitions(CreatePartitionsRequest(topics=[
        CreatablePartitions(topic_id=topic_id("x"), name="t", num_partitions=1)])))
    assert r.topics[0].error_code == TopicAlreadyExists.code


def test_a_topic_whose_deletion_is_pending_cannot_be_created_again(shard):
    tid = create_topic(shard, "t")
    shard.append(shard.core.delete_topics(DeleteTopicsRequest(topic_ids=[tid])))
    decision = shard.core.create_partitions(CreatePartitionsRequest(topics=[
        CreatablePartitions(topic_id=tid, name="t", num_partitions=1)]))
    assert decision.response.topics[0].error_code == TopicAlreadyExists.code
    shard.replicate()
    assert shard.state.topic(tid) is None



def test_a_file_committed_record_on_a_row_a_handover_made_first_adds_its_batches_to_that_row(tmp_path):
    # The core refuses such a commit (the key is known), but the log may hold one (written by an
    # earlier leader): its apply finds the row there and settles it again.
    dc1 = Shard(tmp_path / "dc1", coordinator_id=1)
    b = create_topic(dc1, "b")
    dc1.run(dc1.core.hand_over_file(object_key="wal", owner_ids=(0, 1), to_owner_index=1))
    before = dc1.state.file("wal")
    assert before.state == "deletable"
    committed = CommittedBatch(b, 0, 2, 0, 100, 0, 0, 7, 7, 0, -1, -1, -1, -1)
    dc1.state.apply_all([(FileCommitted("wal", 1, 100, 0, 5, (0, 1), (committed,)), len(dc1.log), 0)])
    after = dc1.state.file("wal")
    assert (after.file_id, after.created_at_ms, after.live_batches, after.state) == (before.file_id,
                                                                                     before.created_at_ms, 1, "live")
