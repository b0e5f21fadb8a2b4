"""Kafka's WriteTxnMarkers (what ``kafka-transactions abort`` sends the partition's leader) mapped
onto the replica's WriteTxnMarkers handler (lowtide.kafka.apis_txn, lowtide.messages types): every
marker and partition in order, ``transaction_result`` true is COMMIT, and the answer per marker and
partition, a whole-call refusal (CLUSTER_AUTHORIZATION_FAILED) or a partition the replica left out
answering each partition with an error, as Kafka's ``getErrorResponse`` does, never with an empty
marker list."""

from __future__ import annotations

import pytest
from kio.schema.write_txn_markers.v1 import request as v1
from kio.schema.write_txn_markers.v2 import request as v2

from lowtide.errors import ClusterAuthorizationFailed, NotLeaderOrFollower, UnknownServerError, error_or_none
from lowtide.kafka.apis_txn import txn_marker_codes, txn_markers_request, write_txn_markers
from lowtide.kafka.broker import Call, KafkaServices, Node
from lowtide.kafka.protocol import RequestHead, encode_response
from lowtide.messages import TopicPartition
from lowtide.messages.replica import TxnMarkerRequest, TxnMarkerResult

ABORT, COMMIT = False, True


def markers_v1() -> v1.WriteTxnMarkersRequest:
    return v1.WriteTxnMarkersRequest(markers=(
        v1.WritableTxnMarker(producer_id=7, producer_epoch=3, transaction_result=ABORT, coordinator_epoch=0,
                             topics=(v1.WritableTxnMarkerTopic(name="orders", partition_indexes=(2, 0)),
                                     v1.WritableTxnMarkerTopic(name="audit", partition_indexes=(1,)))),
        v1.WritableTxnMarker(producer_id=9, producer_epoch=0, transaction_result=COMMIT, coordinator_epoch=4,
                             topics=(v1.WritableTxnMarkerTopic(name="orders", partition_indexes=(1,)),)),
    ))


def tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic, partition)


def test_every_marker_and_partition_maps_in_order_and_true_is_commit():
    assert txn_markers_request(markers_v1()) == [
        TxnMarkerRequest(producer_id=7, producer_epoch=3, commit=False, coordinator_epoch=0,
                         partitions=(tp("orders", 2), tp("orders", 0), tp("audit", 1))),
        TxnMarkerRequest(producer_id=9, producer_epoch=0, commit=True, coordinator_epoch=4,
                         partitions=(tp("orders", 1),)),
    ]


def test_a_v2_marker_maps_the_same_whatever_its_transaction_version():
    body = v2.WriteTxnMarkersRequest(markers=(v2.WritableTxnMarker(
        producer_id=7, producer_epoch=3, transaction_result=ABORT, coordinator_epoch=0, transaction_version=2,
        topics=(v2.WritableTxnMarkerTopic(name="orders", partition_indexes=(0,)),)),))
    assert txn_markers_request(body)[0] == TxnMarkerRequest(
        producer_id=7, producer_epoch=3, commit=False, coordinator_epoch=0, partitions=(tp("orders", 0),))


def result(producer_id: int, *codes: tuple[str, int, int]) -> list[TxnMarkerResult]:
    return [TxnMarkerResult(topic=t, partition=p, producer_id=producer_id, error=error_or_none(c))
            for t, p, c in codes]


def test_the_replicas_answer_is_read_per_marker_and_partition():
    answer = [
        result(7, ("orders", 0, 0), ("orders", 2, NotLeaderOrFollower.code), ("audit", 1, 0)),
        result(9, ("orders", 1, 47)),
    ]
    assert txn_marker_codes(markers_v1(), answer) == [
        {("orders", 2): NotLeaderOrFollower.code, ("orders", 0): 0, ("audit", 1): 0},
        {("orders", 1): 47},
    ]


def test_a_partition_or_marker_the_replica_left_out_is_an_unknown_server_error():
    short = [result(7, ("orders", 0, 0)), result(9)]
    assert txn_marker_codes(markers_v1(), short) == [
        {("orders", 2): UnknownServerError.code, ("orders", 0): 0, ("audit", 1): UnknownServerError.code},
        {("orders", 1): UnknownServerError.code},
    ]
    one_marker = [result(7, ("orders", 0, 0))]
    assert all(set(codes.values()) == {UnknownServerError.code} for codes in txn_marker_codes(markers_v1(),
                                                                                             one_marker))


def test_a_whole_call_refusal_answers_every_partition_with_its_error():
    refused = ClusterAuthorizationFailed("User:bob may not CLUSTER_ACTION on the cluster")
    assert txn_marker_codes(markers_v1(), refused) == [
        {("orders", 2): refused.code, ("orders", 0): refused.code, ("audit", 1): refused.code},
        {("orders", 1): refused.code},
    ]


@pytest.mark.parametrize("version", [1, 2])
def test_a_listener_leading_nothing_answers_each_partition_not_leader_and_the_answer_encodes(version):
    """The front door's listener (no replica): every partition NOT_LEADER_OR_FOLLOWER, so the
    admin client looks the leader up again; the answer is a whole WriteTxnMarkers response."""
    head = RequestHead(api_key=27, api_version=version, correlation_id=5)
    services = KafkaServices(node=Node(node_id=-1, host="127.0.0.1", port=9092))
    answer = write_txn_markers(Call(conn=None, head=head, client_id="test", services=services), markers_v1())
    assert [(m.producer_id, [(t.name, [(p.partition_index, int(p.error_code)) for p in t.partitions])
                             for t in m.topics]) for m in answer.markers] == [
        (7, [("orders", [(2, NotLeaderOrFollower.code), (0, NotLeaderOrFollower.code)]),
             ("audit", [(1, NotLeaderOrFollower.code)])]),
        (9, [("orders", [(1, NotLeaderOrFollower.code)])]),
    ]
    assert len(encode_response(head, answer)) > 4
