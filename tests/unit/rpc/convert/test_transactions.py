"""Transactions' protobuf mapping (lowtide.rpc.convert.transactions): what the front door's and the
replica's servicers write, the remote twins (lowtide.client.frontdoor.transactions) read back as
the same messages."""

from __future__ import annotations

from lowtide.errors import (
    ClusterAuthorizationFailed,
    InvalidProducerEpoch,
    NotLeaderOrFollower,
    ProducerFenced,
    TransactionalIdNotFound,
)
from lowtide.messages import TopicPartition
from lowtide.messages.admin import OffsetCommit, TxnState
from lowtide.messages.replica import PartitionProducers, ProducerDescription, TxnMarkerRequest, TxnMarkerResult
from lowtide.rpc.convert import transactions as convert
from lowtide_pb import common_pb2, transactions_pb2
from tests.unit.rpc.convert.test_groups import plain


def test_the_producers_calls_read_back_the_same_arguments():
    assert convert.init_producer_id_args(convert.init_producer_id_request(transactional_id="t", timeout_ms=9000)) == {
        "transactional_id": "t", "timeout_ms": 9000}
    add = dict(transactional_id="t", producer_id=7, producer_epoch=2,
               partitions=[TopicPartition("orders", 0), TopicPartition("audit", 3)])
    assert convert.add_partitions_args(convert.add_partitions_request(**add)) == {
        **add, "transaction_version": 0, "verify_only": False}
    implicit = dict(add, transaction_version=2, verify_only=True)  # KIP-890's forms travel too
    assert convert.add_partitions_args(convert.add_partitions_request(**implicit)) == implicit
    offsets = dict(transactional_id="t", producer_id=7, producer_epoch=2, group_id="g")
    assert convert.add_offsets_args(convert.add_offsets_request(**offsets)) == offsets
    for version in (0, 2):
        end = dict(transactional_id="t", producer_id=7, producer_epoch=2, commit=True, transaction_version=version)
        assert convert.end_txn_args(convert.end_txn_request(**end)) == end


def test_an_end_txn_answer_is_the_producer_id_and_epoch_to_go_on_with_or_the_error():
    assert convert.end_txn_answer(convert.end_txn_response((7, 3))) == (7, 3)
    fenced = convert.end_txn_response(ProducerFenced("old epoch"))
    assert plain(convert.end_txn_answer(fenced)) == plain(ProducerFenced("old epoch"))


def test_an_init_producer_id_answer_is_the_id_and_epoch_or_the_error_with_both_minus_one():
    assert convert.init_producer_id_answer(convert.init_producer_id_response((7, 2))) == (7, 2)
    fenced = convert.init_producer_id_response(ProducerFenced("old epoch"))
    assert (fenced.producer_id, fenced.producer_epoch) == (-1, -1)
    assert plain(convert.init_producer_id_answer(fenced)) == plain(ProducerFenced("old epoch"))


def test_partition_results_read_back_per_partition():
    results = [("orders", 0, None), ("audit", 3, InvalidProducerEpoch("newer"))]
    assert plain(convert.partition_results_from_proto(convert.partition_results_to_proto(results))) == plain(results)


def test_a_txn_offset_commit_reads_back_the_same_and_encodes_byte_for_byte():
    args = dict(transactional_id="t", producer_id=7, producer_epoch=2, group_id="g", generation_id=-1, member_id="",
                group_instance_id="", commits=[OffsetCommit(topic="orders", partition=1, offset=7)],
                transaction_version=0)
    request = convert.txn_offset_commit_request(**args)
    assert convert.txn_offset_commit_args(request) == args
    assert request.SerializeToString() == transactions_pb2.TxnOffsetCommitRequest(
        transactional_id="t", group_id="g", producer_id=7, producer_epoch=2, partitions=[
            transactions_pb2.TxnOffsetCommitPartition(topic="orders", partition=1, offset=7)]).SerializeToString()
    assert request.SerializeToString() == b"\n\x01t\x12\x01g\x18\x07 \x02B\x0c\n\x06orders\x10\x01\x18\x07"
    with_member = dict(args, generation_id=4, member_id="m-1", group_instance_id="i", transaction_version=2, commits=[
        OffsetCommit(topic="orders", partition=0, offset=42, metadata="m", leader_epoch=3)])
    assert convert.txn_offset_commit_args(convert.txn_offset_commit_request(**with_member)) == with_member
    results = [(c, None) for c in with_member["commits"]]
    assert plain(convert.commit_results_from_proto(with_member["commits"], convert.commit_results_to_proto(results))
                 ) == plain(results)


def test_listed_and_described_transactions_read_back_what_travels():
    listed = [TxnState(transactional_id="t", producer_id=7, producer_epoch=-1, state="Ongoing")]
    assert convert.listings_from_proto(convert.listings_to_proto(listed)) == listed
    args = dict(states=["Ongoing"], producer_ids=[7], running_longer_than_ms=5000)
    assert convert.list_args(convert.list_request(**args)) == args
    ongoing = TxnState(transactional_id="t", producer_id=7, producer_epoch=2, state="Ongoing",
                       partitions=frozenset({TopicPartition("orders", 0), TopicPartition("audit", 3)}),
                       start_ms=1000, timeout_ms=9000)
    described = [("t", ongoing, None), ("u", None, TransactionalIdNotFound("none"))]
    assert plain([convert.description_from_proto(convert.description_to_proto(d)) for d in described]
                 ) == plain(described)


def test_markers_and_their_results_read_back_per_marker_in_order():
    markers = [TxnMarkerRequest(producer_id=7, producer_epoch=3, commit=False, coordinator_epoch=1,
                                partitions=(TopicPartition("orders", 2), TopicPartition("orders", 0))),
               TxnMarkerRequest(producer_id=9, producer_epoch=0, commit=True, partitions=())]
    assert convert.markers_from_proto(convert.markers_to_proto(markers, timeout_ms=500)) == markers
    results = [[TxnMarkerResult("orders", 2, producer_id=7), TxnMarkerResult(
        "orders", 0, producer_id=7, error=NotLeaderOrFollower("moved"))], []]
    response = convert.marker_results_to_proto(markers, results)
    assert [m.producer_id for m in response.markers] == [7, 9]
    assert plain(convert.marker_results_from_proto(response)) == plain(results)


def test_described_producers_read_back_per_partition():
    results = [PartitionProducers("orders", 0, producers=(ProducerDescription(
        producer_id=7, producer_epoch=2, last_sequence=5, last_timestamp=1700, coordinator_epoch=-1,
        current_txn_start_offset=3),)), PartitionProducers("orders", 1, error=ClusterAuthorizationFailed("no"))]
    assert plain(convert.producers_from_proto(convert.producers_to_proto(results))) == plain(results)
    request = transactions_pb2.DescribeProducersRequest(partitions=[common_pb2.TopicPartition(topic="orders")])
    assert convert.producers_request_from_proto(request) == [TopicPartition("orders", 0)]


def test_every_error_code_reads_back_as_that_code():
    """An answer's error_code comes back as the error of that code, never as UNKNOWN_SERVER_ERROR:
    a Kafka client sees the code the front door answered (TRANSACTIONAL_ID_NOT_FOUND was once
    declared after the code table and lost its code)."""
    import lowtide.errors as errors

    codes = {c.code for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, errors.LowtideError) and c.code >= 0}
    assert {code for code in codes if errors.error_for_code(code).code != code} == set()
