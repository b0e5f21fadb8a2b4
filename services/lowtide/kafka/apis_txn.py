"""Transactions over the Kafka protocol (KIP-98, KIP-447, KIP-664): the front door's transaction
coordinator (``lowtide.frontdoor.transactions``) answers, through the front door's gRPC Admin
service, as every group request does; DescribeProducers and WriteTxnMarkers are answered by the
replicas' gRPC Replica service (DescribeProducers by any replica of the partition, from its own
log, as Kafka's brokers answer it; WriteTxnMarkers by the partition's leader).

What a Kafka transactional producer sends, and where it goes here::

    FindCoordinator(TRANSACTION)  any broker (apis_admin.find_coordinator): each forwards to the front door
    InitProducerId                -> Admin.InitProducerId           (also idempotent producers: no id)
    AddPartitionsToTxn v0-3       -> Admin.AddPartitionsToTxn       (v4+ is broker-to-broker, KIP-890)
    Produce (transactional)       the leaders, as any produce
    AddOffsetsToTxn               -> Admin.AddOffsetsToTxn          (the group's __consumer_offsets partition)
    TxnOffsetCommit               -> Admin.TxnOffsetCommit          (offsets pending until the marker)
    EndTxn v0-4                   -> Admin.EndTxn                   (v5 is transaction version 2, KIP-890)

Versions stop where Kafka's transaction version 2 (KIP-890 part 2) starts: a broker that does not
advertise the ``transaction.version`` feature is spoken to in version 1, so clients send
AddPartitionsToTxn and never need the v5 answers.

``kafka-transactions`` (KIP-664) uses ListTransactions, DescribeTransactions (the coordinator's
states) and DescribeProducers (a replica's producer state). ``kafka-transactions abort``
(Kafka's ``Admin.abortTransaction``) sends WriteTxnMarkers v1-2 with one ABORT marker to the
partition's leader, which answers it as the coordinator's markers are answered::

    DescribeProducers             -> Replica.DescribeProducers      (READ on the topic, per partition;
                                                                     leader or follower)
    WriteTxnMarkers v1-2          -> Replica.WriteTxnMarkers        (CLUSTER_ACTION on the cluster)

A WriteTxnMarkers the replica refuses as a whole (CLUSTER_AUTHORIZATION_FAILED) answers every
partition of every marker with that error, as Kafka's ``getErrorResponse`` does, so the client
can tell which abort failed. The marker's ``transaction_version`` (v2, KIP-890) is not used: the
replica takes any marker whose epoch is not below the producer's.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from lowtide.errors import (
    BrokerNotAvailable,
    CoordinatorNotAvailable,
    LowtideError,
    NetworkException,
    NotLeaderOrFollower,
    RequestTimedOut,
    UnknownServerError,
)
from lowtide.kafka.apis_admin import coordinator_among, live_kafka_brokers
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code, millis
from lowtide_pb import common_pb2, transactions_pb2

INIT_PRODUCER_ID_KEY = 22
ADD_PARTITIONS_TO_TXN_KEY, ADD_OFFSETS_TO_TXN_KEY, END_TXN_KEY, TXN_OFFSET_COMMIT_KEY = 24, 25, 26, 28
WRITE_TXN_MARKERS_KEY = 27
DESCRIBE_PRODUCERS_KEY, DESCRIBE_TRANSACTIONS_KEY, LIST_TRANSACTIONS_KEY = 61, 65, 66


def _coordinator(call: Call, method: str, request: Any) -> Any:
    """``call.admin`` where a front door that cannot be reached right now is, to a Kafka client,
    COORDINATOR_NOT_AVAILABLE: the one answer every transactional request handles by finding
    the coordinator again and retrying (a NETWORK_EXCEPTION from EndTxn is fatal to the Java producer)."""
    try:
        return call.admin(method, request)
    except (NetworkException, RequestTimedOut, BrokerNotAvailable) as err:
        raise CoordinatorNotAvailable(
            f"the transaction coordinator is unreachable: {err.name}: {err.message}") from None


def _per_partition(call: Call, method: str, request: Any) -> dict[tuple[str, int], int]:
    """(topic, partition) -> error code of a per-partition answer. A whole-call failure is every
    asked partition's error here, not the broker's generic answer: that one has empty lists, and
    the Java producer fails on an AddPartitionsToTxn answer without its partitions (a
    NullPointerException in its I/O thread)."""
    try:
        answer = _coordinator(call, method, request)
    except LowtideError as err:
        return {(p.topic, p.partition): err.code for p in request.partitions}
    return {(r.topic, r.partition): r.error_code for r in answer.partitions}


def _v3(body: Any, name: str) -> Any:
    """AddPartitionsToTxn v0-3 fields are named ``v3_and_below_*`` by kio."""
    return getattr(body, f"v3_and_below_{name}")


# -- the producer's calls ----------------------------------------------------------------------
def init_producer_id(call: Call, body: Any) -> Any:
    answer = _coordinator(call, "InitProducerId", transactions_pb2.InitProducerIdRequest(
        transactional_id=body.transactional_id or "", transaction_timeout_ms=millis(body.transaction_timeout)))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(answer.error_code),
                     producer_id=answer.producer_id if not answer.error_code else -1,
                     producer_epoch=answer.producer_epoch if not answer.error_code else -1)


def add_partitions_to_txn(call: Call, body: Any) -> Any:
    request = transactions_pb2.AddPartitionsToTxnRequest(
        transactional_id=_v3(body, "transactional_id"), producer_id=_v3(body, "producer_id"),
        producer_epoch=_v3(body, "producer_epoch"),
        partitions=[common_pb2.TopicPartition(topic=t.name, partition=p)
                    for t in _v3(body, "topics") for p in t.partitions])
    results = _per_partition(call, "AddPartitionsToTxn", request)
    return call.make(call.response, throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=tuple(
        call.make("AddPartitionsToTxnTopicResult", name=t.name, results_by_partition=tuple(
            call.make("AddPartitionsToTxnPartitionResult", partition_index=p,
                      partition_error_code=error_code(results.get((t.name, p), -1)))
            for p in t.partitions)) for t in _v3(body, "topics")))


def add_offsets_to_txn(call: Call, body: Any) -> Any:
    answer = _coordinator(call, "AddOffsetsToTxn", transactions_pb2.AddOffsetsToTxnRequest(
        transactional_id=body.transactional_id, producer_id=body.producer_id, producer_epoch=body.producer_epoch,
        group_id=body.group_id))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(answer.error_code))


def txn_offset_commit(call: Call, body: Any) -> Any:
    request = transactions_pb2.TxnOffsetCommitRequest(
        transactional_id=body.transactional_id, group_id=body.group_id, producer_id=body.producer_id,
        producer_epoch=body.producer_epoch, member_id=getattr(body, "member_id", "") or "",
        group_instance_id=getattr(body, "group_instance_id", None) or "",
        partitions=[transactions_pb2.TxnOffsetCommitPartition(topic=t.name, partition=p.partition_index,
                                                              offset=p.committed_offset,
                                                              metadata=p.committed_metadata or "",
                                                              leader_epoch=getattr(p, "committed_leader_epoch", -1))
                    for t in body.topics for p in t.partitions])
    generation = getattr(body, "generation_id", -1)
    if generation >= 0:
        request.generation_id = generation
    results = _per_partition(call, "TxnOffsetCommit", request)
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(
        call.make("TxnOffsetCommitResponseTopic", name=t.name, partitions=tuple(
            call.make("TxnOffsetCommitResponsePartition", partition_index=p.partition_index,
                      error_code=error_code(results.get((t.name, p.partition_index), -1)))
            for p in t.partitions)) for t in body.topics))


def end_txn(call: Call, body: Any) -> Any:
    answer = _coordinator(call, "EndTxn", transactions_pb2.EndTxnRequest(
        transactional_id=body.transactional_id, producer_id=body.producer_id, producer_epoch=body.producer_epoch,
        commit=bool(body.committed)))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(answer.error_code))


# -- kafka-transactions (KIP-664) --------------------------------------------------------------
_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead",
           "PrepareEpochFence")


def coordinated_here(call: Call, listed: Sequence[Any]) -> list[Any]:
    """The transactions (``.transactional_id``) whose coordinator is this broker, as
    FindCoordinator names it. Kafka's Admin.listTransactions asks every broker and concatenates
    their answers (each broker lists its own coordinator's transactions), so a broker answering
    the front door's whole list would show each transaction once per broker. A listener that is
    no broker (the front door's: node -1, not in Metadata) lists them all."""
    node = call.services.node.node_id
    if node < 0 or not listed:
        return list(listed)
    brokers = live_kafka_brokers(call)
    if not any(b.id == node for b in brokers):
        return list(listed)  # not live as Metadata sees it: no one would list them, so list them here
    return [t for t in listed if coordinator_among(brokers, t.transactional_id).id == node]


def list_transactions(call: Call, body: Any) -> Any:
    states = list(body.state_filters)
    answer = _coordinator(call, "ListTransactions", transactions_pb2.ListTransactionsRequest(
        state_filters=[s for s in states if s in _STATES], producer_id_filters=list(body.producer_id_filters),
        duration_filter_ms=max(0, int(getattr(body, "duration_filter", -1)))))
    listed = coordinated_here(call, answer.transactions)
    if states and not any(s in _STATES for s in states):
        listed = []  # only unknown states asked: Kafka lists nothing (and names them)
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0),
                     unknown_state_filters=tuple(s for s in states if s not in _STATES),
                     transaction_states=tuple(call.make("TransactionState", transactional_id=t.transactional_id,
                                                        producer_id=t.producer_id, transaction_state=t.state)
                                              for t in listed))


def _time(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def describe_transactions(call: Call, body: Any) -> Any:
    answer = _coordinator(call, "DescribeTransactions", transactions_pb2.DescribeTransactionsRequest(
        transactional_ids=list(body.transactional_ids)))
    states = []
    for d in answer.transactions:
        topics: dict[str, list[int]] = {}
        for tp in d.partitions:
            topics.setdefault(tp.topic, []).append(tp.partition)
        states.append(call.make(
            "TransactionState", error_code=error_code(d.error_code), transactional_id=d.transactional_id,
            transaction_state=d.state, transaction_timeout=datetime.timedelta(milliseconds=d.timeout_ms),
            transaction_start_time=_time(d.start_ms), producer_id=d.producer_id, producer_epoch=d.producer_epoch,
            topics=tuple(call.make("TopicData", topic=t, partitions=tuple(ps)) for t, ps in topics.items())))
    return call.make(call.response, throttle_time=NO_THROTTLE, transaction_states=tuple(states))


def describe_producers(call: Call, body: Any) -> Any:
    request = transactions_pb2.DescribeProducersRequest(partitions=[
        common_pb2.TopicPartition(topic=t.name, partition=p) for t in body.topics for p in t.partition_indexes])
    if call.services.replica is None:
        results = {}
    else:
        results = {(r.topic, r.partition): r for r in call.replica("DescribeProducers", request).partitions}
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partition_indexes:
            r = results.get((t.name, p))
            if r is None:
                parts.append(call.make("PartitionResponse", partition_index=p,
                                       error_code=error_code(NotLeaderOrFollower.code),
                                       error_message="no partition of this broker", active_producers=()))
                continue
            parts.append(call.make(
                "PartitionResponse", partition_index=p, error_code=error_code(r.error_code),
                error_message=r.error_message or None, active_producers=tuple(
                    call.make("ProducerState", producer_id=s.producer_id, producer_epoch=s.producer_epoch,
                              last_sequence=s.last_sequence, last_timestamp=s.last_timestamp,
                              coordinator_epoch=s.coordinator_epoch,
                              current_txn_start_offset=s.current_txn_start_offset)
                    for s in r.producers)))
        topics.append(call.make("TopicResponse", name=t.name, partitions=tuple(parts)))
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(topics))


def txn_markers_request(body: Any) -> transactions_pb2.WriteTxnMarkersRequest:
    """A Kafka WriteTxnMarkers request as the replica's: one TxnMarker per marker, in order
    (``transaction_result`` true is COMMIT)."""
    return transactions_pb2.WriteTxnMarkersRequest(markers=[transactions_pb2.TxnMarker(
        producer_id=m.producer_id, producer_epoch=m.producer_epoch, commit=bool(m.transaction_result),
        coordinator_epoch=m.coordinator_epoch,
        partitions=[common_pb2.TopicPartition(topic=t.name, partition=p) for t in m.topics
                    for p in t.partition_indexes]) for m in body.markers])


def txn_marker_codes(body: Any, answer: transactions_pb2.WriteTxnMarkersResponse | LowtideError
                     ) -> list[dict[tuple[str, int], int]]:
    """Per marker of ``body`` (in order), (topic, partition) -> error code: the replica's answer
    for that marker, or ``answer``'s code everywhere when the whole call failed. A partition the
    answer lacks is UNKNOWN_SERVER_ERROR."""
    asked = [[(t.name, p) for t in m.topics for p in t.partition_indexes] for m in body.markers]
    if isinstance(answer, LowtideError):
        return [dict.fromkeys(keys, answer.code) for keys in asked]
    if len(answer.markers) != len(asked):
        return [dict.fromkeys(keys, UnknownServerError.code) for keys in asked]
    out = []
    for keys, result in zip(asked, answer.markers, strict=True):
        found = {(r.topic, r.partition): r.error_code for r in result.partitions}
        out.append({k: found.get(k, UnknownServerError.code) for k in keys})
    return out


def write_txn_markers(call: Call, body: Any) -> Any:
    answer: transactions_pb2.WriteTxnMarkersResponse | LowtideError
    if call.services.replica is None:
        answer = NotLeaderOrFollower("this listener leads no partition (a front door)")
    else:
        try:
            answer = call.replica("WriteTxnMarkers", txn_markers_request(body))
        except LowtideError as err:  # refused whole (CLUSTER_ACTION): every partition says so
            answer = err
    codes = txn_marker_codes(body, answer)
    return call.make(call.response, markers=tuple(
        call.make("WritableTxnMarkerResult", producer_id=m.producer_id, topics=tuple(
            call.make("WritableTxnMarkerTopicResult", name=t.name, partitions=tuple(
                call.make("WritableTxnMarkerPartitionResult", partition_index=p,
                          error_code=error_code(found[(t.name, p)]))
                for p in t.partition_indexes)) for t in m.topics))
        for m, found in zip(body.markers, codes, strict=True)))


APIS: list[Api] = [
    Api(INIT_PRODUCER_ID_KEY, "InitProducerId", 0, 5, init_producer_id),
    Api(ADD_PARTITIONS_TO_TXN_KEY, "AddPartitionsToTxn", 0, 3, add_partitions_to_txn),
    Api(ADD_OFFSETS_TO_TXN_KEY, "AddOffsetsToTxn", 0, 4, add_offsets_to_txn),
    Api(END_TXN_KEY, "EndTxn", 0, 4, end_txn),
    Api(WRITE_TXN_MARKERS_KEY, "WriteTxnMarkers", 1, 2, write_txn_markers),
    Api(TXN_OFFSET_COMMIT_KEY, "TxnOffsetCommit", 0, 4, txn_offset_commit),
    Api(DESCRIBE_PRODUCERS_KEY, "DescribeProducers", 0, 0, describe_producers),
    Api(DESCRIBE_TRANSACTIONS_KEY, "DescribeTransactions", 0, 0, describe_transactions),
    Api(LIST_TRANSACTIONS_KEY, "ListTransactions", 0, 1, list_transactions),
]
