"""Producer idempotence in CommitFile: Kafka's rules, checked against committed + pending state."""

from __future__ import annotations

from lowtide.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber
from tests.unit.coordinator.shard import batch, commit, create_topic

PID = 4242


def results(response):
    return [(r.error_code, r.assigned_base_offset, r.is_duplicate) for r in response.batches]


def test_a_retried_batch_returns_its_original_offset_marked_duplicate_and_appends_nothing(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, records=3, producer_id=PID, epoch=0, seq=0),
                                                   batch(tid, records=2, producer_id=PID, epoch=0, seq=3)])))
    before = shard.state.partition(tid, 0).high_watermark
    retry = shard.run(shard.core.commit_file(commit("f2", [batch(tid, records=2, producer_id=PID, epoch=0, seq=3)])))
    assert results(retry) == [(0, 3, True)]
    assert shard.state.partition(tid, 0).high_watermark == before == 5
    assert shard.state.file("f2").state == "deletable"  # nothing of f2 was accepted


def test_a_duplicate_of_any_of_the_last_five_batches_is_recognised_but_not_an_older_one(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, producer_id=PID, epoch=0, seq=s) for s in range(7)])))
    retry = shard.run(shard.core.commit_file(commit("f2", [batch(tid, producer_id=PID, epoch=0, seq=2),
                                                           batch(tid, producer_id=PID, epoch=0, seq=1)])))
    assert results(retry) == [(0, 2, True), (OutOfOrderSequenceNumber.code, -1, False)]


def test_a_retried_commit_of_the_same_file_returns_duplicates_with_the_original_offsets(shard):
    tid = create_topic(shard, "t", 2)
    request = commit("f1", [batch(tid, 0, records=2, producer_id=PID, epoch=0, seq=0),
                            batch(tid, 1, records=1, producer_id=PID, epoch=0, seq=0)])
    first = shard.run(shard.core.commit_file(request))
    again = shard.core.commit_file(request)
    assert again.records == []
    assert results(first) == [(0, 0, False), (0, 0, False)]
    assert results(again.response) == [(0, 0, True), (0, 0, True)]


def test_a_duplicate_of_a_still_pending_batch_is_recognised(shard):
    tid = create_topic(shard, "t")
    shard.append(shard.core.commit_file(commit("f1", [batch(tid, records=4, producer_id=PID, epoch=0, seq=0)])))
    retry = shard.append(shard.core.commit_file(commit("f2", [batch(tid, records=4, producer_id=PID, epoch=0,
                                                                    seq=0)])))
    shard.replicate()
    assert results(retry.response) == [(0, 0, True)]


def test_a_gap_in_sequences_is_out_of_order_and_changes_nothing(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, producer_id=PID, epoch=0, seq=0)])))
    response = shard.run(shard.core.commit_file(commit("f2", [batch(tid, producer_id=PID, epoch=0, seq=2)])))
    assert results(response) == [(OutOfOrderSequenceNumber.code, -1, False)]
    assert shard.state.partition(tid, 0).high_watermark == 1
    assert shard.state.producer(tid, 0, PID).entries[-1].last_sequence == 0


def test_sequences_within_one_commit_are_checked_in_request_order(shard):
    tid = create_topic(shard, "t")
    response = shard.run(shard.core.commit_file(commit("f1", [
        batch(tid, records=2, producer_id=PID, epoch=0, seq=0),
        batch(tid, records=2, producer_id=PID, epoch=0, seq=2),
        batch(tid, records=2, producer_id=PID, epoch=0, seq=9)])))
    assert results(response) == [(0, 0, False), (0, 2, False), (OutOfOrderSequenceNumber.code, -1, False)]


def test_a_higher_epoch_fences_the_old_one(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, producer_id=PID, epoch=0, seq=0)])))
    shard.run(shard.core.commit_file(commit("f2", [batch(tid, producer_id=PID, epoch=1, seq=0)])))
    old = shard.run(shard.core.commit_file(commit("f3", [batch(tid, producer_id=PID, epoch=0, seq=1)])))
    assert results(old) == [(InvalidProducerEpoch.code, -1, False)]
    assert shard.state.producer(tid, 0, PID).producer_epoch == 1
    assert shard.state.partition(tid, 0).high_watermark == 2


def test_the_first_sequence_of_a_new_epoch_must_be_zero(shard):
    tid = create_topic(shard, "t")
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, producer_id=PID, epoch=0, seq=0)])))
    bumped = shard.run(shard.core.commit_file(commit("f2", [batch(tid, producer_id=PID, epoch=1, seq=1)])))
    fresh = shard.run(shard.core.commit_file(commit("f3", [batch(tid, producer_id=PID + 1, epoch=0, seq=5)])))
    assert results(bumped) == [(OutOfOrderSequenceNumber.code, -1, False)]
    assert results(fresh) == [(OutOfOrderSequenceNumber.code, -1, False)]
    assert shard.state.producer(tid, 0, PID).producer_epoch == 0
    assert shard.state.producer(tid, 0, PID + 1) is None


def test_sequences_wrap_from_int32_max_to_zero(shard):
    tid = create_topic(shard, "t")
    top = 2**31 - 1
    shard.run(shard.core.commit_file(commit("f1", [batch(tid, producer_id=PID, epoch=0, seq=0)])))
    # Forge a producer whose last sequence is INT32_MAX by committing up to it in one batch.
    shard.run(shard.core.commit_file(commit("f2", [batch(tid, records=top, producer_id=PID, epoch=0, seq=1)])))
    # seq 0..1 (not 0..0, which is an exact duplicate of f1's batch, still among the last five).
    wrapped = shard.run(shard.core.commit_file(commit("f3", [batch(tid, records=2, producer_id=PID, epoch=0,
                                                                   seq=0)])))
    assert results(wrapped) == [(0, top + 1, False)]


def test_producers_are_tracked_per_partition(shard):
    tid = create_topic(shard, "t", 2)
    response = shard.run(shard.core.commit_file(commit("f1", [batch(tid, 0, producer_id=PID, epoch=0, seq=0),
                                                              batch(tid, 1, producer_id=PID, epoch=0, seq=0)])))
    assert results(response) == [(0, 0, False), (0, 0, False)]
