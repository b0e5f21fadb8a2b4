"""Transactions on a diskless coordinator shard (issue 50): ongoing -> committed / aborted, the last
stable offset, the aborted list READ_COMMITTED FindBatches serves, marker idempotence and epoch
fencing, and the state surviving the log, a snapshot and a restore."""

from __future__ import annotations

import sqlite3

import pytest

from lowtide.coordinator.records import FileCommitted, decode_record, encode_record
from lowtide.coordinator.snapshot_store import verify_database
from lowtide.coordinator.snapshots import restore_snapshot
from lowtide.coordinator.state import CoordinatorState
from lowtide.coordinator.transactions import last_stable_offset
from lowtide.errors import (
    CorruptMessage,
    InvalidProducerEpoch,
    InvalidRequest,
    InvalidTxnState,
    OutOfOrderSequenceNumber,
)
from lowtide.messages.coordinator import (
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    TXN_ABORT,
    TXN_COMMIT,
    TXN_DATA,
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
    FindBatchesPartition,
    FindBatchesRequest,
    FindBatchesTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from tests.unit.coordinator.shard import batch, commit, create_topic

A, B = 4242, 777


def marker(tid: bytes, *, producer_id: int, epoch: int, partition: int = 0):
    # A control batch's header: one record, no sequence.
    return batch(tid, partition, producer_id=producer_id, epoch=epoch)


def txn_commit(shard, key, batches, kinds):
    request = commit(key, batches)
    return shard.run(shard.core.commit_file(type(request)(**{**{f: getattr(request, f) for f in (
        "object_key", "object_format", "file_size", "owner_ids", "batches", "uploader_broker_id")},
        "txn_kinds": bytes(kinds)})))


def results(response):
    return [(r.error_code, r.assigned_base_offset, r.is_duplicate) for r in response.batches]


def fetch(shard, tid, offset=0, *, committed=True):
    response = shard.core.find_batches(FindBatchesRequest(
        fetch_max_bytes=1 << 20, max_batches_per_partition=100, isolation_level=READ_COMMITTED if committed else 0,
        topics=[FindBatchesTopic(topic_id=tid, partitions=[
            FindBatchesPartition(partition_index=0, offset=offset, max_partition_fetch_bytes=1 << 20)])]))
    return response.topics[0].partitions[0]


def latest(shard, tid, *, committed):
    response = shard.core.list_offsets(ListOffsetsRequest(isolation_level=READ_COMMITTED if committed else 0, topics=[
        ListOffsetsTopic(topic_id=tid, partitions=[ListOffsetsPartition(partition_index=0,
                                                                        timestamp=LATEST_TIMESTAMP)])]))
    return response.topics[0].partitions[0].offset


def test_an_ongoing_transaction_holds_the_last_stable_offset_until_its_commit(shard):
    tid = create_topic(shard, "t")
    txn_commit(shard, "f0", [batch(tid, records=2)], [0])                                      # 0-1 plain
    txn_commit(shard, "f1", [batch(tid, records=3, producer_id=A, epoch=0, seq=0)], [TXN_DATA])  # 2-4 A
    txn_commit(shard, "f2", [batch(tid, records=1)], [0])                                      # 5 plain
    p = fetch(shard, tid)
    assert (p.high_watermark, p.last_stable_offset) == (6, 2)
    assert [b.base_offset for b in p.batches] == [0]  # READ_COMMITTED stops below the LSO
    assert [b.base_offset for b in fetch(shard, tid, committed=False).batches] == [0, 2, 5]
    assert fetch(shard, tid, 2).batches == []  # at the LSO: nothing yet, not out of range
    assert (latest(shard, tid, committed=True), latest(shard, tid, committed=False)) == (2, 6)
    done = txn_commit(shard, "f3", [marker(tid, producer_id=A, epoch=0)], [TXN_COMMIT])
    assert results(done) == [(0, 6, False)]
    p = fetch(shard, tid)
    assert (p.high_watermark, p.last_stable_offset, p.aborted_transactions) == (7, 7, [])
    assert [b.base_offset for b in p.batches] == [0, 2, 5, 6]
    assert shard.state.dump()["txns"] == []


def test_an_aborted_transaction_is_listed_for_the_reads_that_overlap_it(shard):
    tid = create_topic(shard, "t")
    txn_commit(shard, "f1", [batch(tid, records=2, producer_id=A, epoch=3, seq=0),   # A 0-1, B 2-3
                             batch(tid, records=2, producer_id=B, epoch=0, seq=0)], [TXN_DATA, TXN_DATA])
    txn_commit(shard, "f2", [batch(tid, records=2, producer_id=A, epoch=3, seq=2)], [TXN_DATA])  # A 4-5
    assert fetch(shard, tid).last_stable_offset == 0
    txn_commit(shard, "f3", [marker(tid, producer_id=B, epoch=0)], [TXN_COMMIT])  # 6
    assert fetch(shard, tid).last_stable_offset == 0  # A's is still open, and older
    txn_commit(shard, "f4", [marker(tid, producer_id=A, epoch=3)], [TXN_ABORT])  # 7
    p = fetch(shard, tid)
    assert p.last_stable_offset == p.high_watermark == 8
    assert p.aborted_transactions == [(A, 0)]
    assert fetch(shard, tid, 7).aborted_transactions == [(A, 0)]  # its marker at 7 still overlaps
    assert fetch(shard, tid, 8).aborted_transactions == []
    assert shard.state.dump()["aborted_txns"] == [(1, 7, A, 0)]
    # A's next transaction in the same epoch (version 1) goes on with its sequences.
    again = txn_commit(shard, "f5", [batch(tid, producer_id=A, epoch=3, seq=4)], [TXN_DATA])
    assert results(again) == [(0, 8, False)]
    assert fetch(shard, tid).last_stable_offset == 8


def test_a_retried_marker_writes_nothing_and_answers_success(shard):
    tid = create_topic(shard, "t")
    txn_commit(shard, "f1", [batch(tid, producer_id=A, epoch=0, seq=0)], [TXN_DATA])
    assert results(txn_commit(shard, "f2", [marker(tid, producer_id=A, epoch=0)], [TXN_ABORT])) == [(0, 1, False)]
    retry = txn_commit(shard, "f3", [marker(tid, producer_id=A, epoch=0)], [TXN_ABORT])
    assert results(retry) == [(0, -1, True)]
    assert shard.state.partition(tid, 0).high_watermark == 2
    assert shard.state.dump()["aborted_txns"] == [(1, 1, A, 0)]
    assert shard.state.file("f3").state == "deletable"  # nothing of it is live
    # A marker for a producer that never wrote here: nothing to end, nothing written.
    assert results(txn_commit(shard, "f4", [marker(tid, producer_id=B, epoch=5)], [TXN_COMMIT])) == [(0, -1, True)]


def test_a_marker_while_its_transaction_is_still_pending_ends_it(shard):
    tid = create_topic(shard, "t")
    request = commit("f1", [batch(tid, records=2, producer_id=A, epoch=0, seq=0)])
    shard.append(shard.core.commit_file(type(request)(**{**_fields(request), "txn_kinds": bytes([TXN_DATA])})))
    end = commit("f2", [marker(tid, producer_id=A, epoch=0)])
    decision = shard.append(shard.core.commit_file(type(end)(**{**_fields(end), "txn_kinds": bytes([TXN_ABORT])})))
    assert results(decision.response) == [(0, 2, False)]  # the overlay knew the pending transaction
    shard.replicate()
    assert fetch(shard, tid).aborted_transactions == [(A, 0)]


def _fields(request):
    return {f: getattr(request, f) for f in ("object_key", "object_format", "file_size", "owner_ids", "batches",
                                             "uploader_broker_id")}


def test_markers_are_fenced_by_epoch_and_a_newer_one_starts_the_producer_at_sequence_zero(shard):
    tid = create_topic(shard, "t")
    txn_commit(shard, "f1", [batch(tid, records=2, producer_id=A, epoch=4, seq=0)], [TXN_DATA])
    stale = txn_commit(shard, "f2", [marker(tid, producer_id=A, epoch=3)], [TXN_COMMIT])
    assert results(stale) == [(InvalidProducerEpoch.code, -1, False)]
    assert fetch(shard, tid).last_stable_offset == 0  # still open
    # Transactions version 2: EndTxn bumps the epoch and the marker carries the new one.
    assert results(txn_commit(shard, "f3", [marker(tid, producer_id=A, epoch=5)], [TXN_COMMIT])) == [(0, 2, False)]
    assert shard.state.producer(tid, 0, A).producer_epoch == 5
    late = txn_commit(shard, "f4", [batch(tid, producer_id=A, epoch=4, seq=2)], [TXN_DATA])
    assert results(late) == [(InvalidProducerEpoch.code, -1, False)]  # the old epoch's produce is fenced
    gap = txn_commit(shard, "f5", [batch(tid, producer_id=A, epoch=5, seq=1)], [TXN_DATA])
    assert results(gap) == [(OutOfOrderSequenceNumber.code, -1, False)]
    nxt = txn_commit(shard, "f6", [batch(tid, producer_id=A, epoch=5, seq=0)], [TXN_DATA])
    assert results(nxt) == [(0, 3, False)]
    assert fetch(shard, tid).last_stable_offset == 3


def test_a_non_transactional_batch_during_the_producers_transaction_is_invalid_txn_state(shard):
    tid = create_topic(shard, "t")
    txn_commit(shard, "f1", [batch(tid, producer_id=A, epoch=0, seq=0)], [TXN_DATA])
    plain = shard.run(shard.core.commit_file(commit("f2", [batch(tid, producer_id=A, epoch=0, seq=1),
                                                           batch(tid, producer_id=B, epoch=0, seq=0)])))
    assert results(plain) == [(InvalidTxnState.code, -1, False), (0, 1, False)]  # B has no transaction
    txn_commit(shard, "f3", [marker(tid, producer_id=A, epoch=0)], [TXN_COMMIT])
    assert results(txn_commit(shard, "f4", [batch(tid, producer_id=A, epoch=0, seq=1)], [0])) == [(0, 3, False)]


def test_bad_transaction_kinds_are_refused_whole_or_per_batch(shard):
    tid = create_topic(shard, "t")
    with pytest.raises(InvalidRequest):
        shard.core.commit_file(type(r := commit("f1", [batch(tid)]))(**{**_fields(r), "txn_kinds": bytes([1, 1])}))
    with pytest.raises(InvalidRequest):
        shard.core.commit_file(type(r)(**{**_fields(r), "txn_kinds": bytes([7])}))
    refused = txn_commit(shard, "f2", [batch(tid), batch(tid, records=2, producer_id=A, epoch=0)],
                         [TXN_DATA, TXN_COMMIT])
    assert [code for code, _, _ in results(refused)] == [InvalidRequest.code, InvalidRequest.code]
    assert shard.state.partition(tid, 0).high_watermark == 0


def test_records_with_transactions_round_trip_and_plain_files_keep_their_old_bytes(shard):
    tid = create_topic(shard, "t")
    txn_commit(shard, "f0", [batch(tid)], [0])
    txn_commit(shard, "f1", [batch(tid), batch(tid, producer_id=A, epoch=0, seq=0)], [0, TXN_DATA])
    plain, mixed = decode_record(shard.log[-2]), decode_record(shard.log[-1])
    assert plain.txn_kinds == b"" and shard.log[-2][1] == FileCommitted.TYPE
    assert mixed.txn_kinds == bytes([0, TXN_DATA]) and shard.log[-1][1] == 8
    assert decode_record(encode_record(mixed)) == mixed
    with pytest.raises(CorruptMessage):
        decode_record(shard.log[-1][:-1])


def test_transactions_survive_the_log_a_snapshot_and_deletions(shard, tmp_path):
    tid = create_topic(shard, "t")
    txn_commit(shard, "f1", [batch(tid, records=2, producer_id=A, epoch=0, seq=0)], [TXN_DATA])   # 0-1
    txn_commit(shard, "f2", [marker(tid, producer_id=A, epoch=0)], [TXN_ABORT])                   # 2
    txn_commit(shard, "f3", [batch(tid, records=2, producer_id=B, epoch=0, seq=0)], [TXN_DATA])   # 3-4
    served = shard.state.dump()
    assert served["txns"] == [(1, B, 0, 3)] and served["aborted_txns"] == [(1, 2, A, 0)]
    rebuilt = CoordinatorState(tmp_path / "rebuilt.sqlite", coordinator_id=0)
    rebuilt.apply_all((decode_record(v), o) for o, v in enumerate(shard.log))
    assert rebuilt.dump() == served
    snap = shard.state.snapshot(tmp_path / "snapshots")
    restored = restore_snapshot(snap, tmp_path / "restored.sqlite", coordinator_id=0)
    assert restored.dump() == served
    assert last_stable_offset(restored.db, restored.partition(tid, 0).partition_key, 5) == 3
    # DeleteRecords past the aborted transaction drops it from the list.
    shard.run(shard.core.delete_records(DeleteRecordsRequest(topics=[DeleteRecordsTopic(
        topic_id=tid, partitions=[DeleteRecordsPartition(partition_index=0, offset=3)])])))
    assert shard.state.dump()["aborted_txns"] == [] and shard.state.dump()["txns"] == [(1, B, 0, 3)]
    for state in (rebuilt, restored):
        state.close()


def test_a_snapshot_of_the_version_before_transactions_still_loads(tmp_path):
    old = tmp_path / "old.sqlite"
    state = CoordinatorState(old, coordinator_id=0)
    state.close()
    db = sqlite3.connect(old)
    db.executescript("DROP TABLE txns; DROP TABLE aborted_txns;")  # what issue 50's predecessor wrote
    db.close()
    verify_database(old, offset=-1, key="old")
    reopened = CoordinatorState(old, coordinator_id=0)
    assert reopened.dump()["txns"] == [] and reopened.dump()["aborted_txns"] == []
    reopened.close()
