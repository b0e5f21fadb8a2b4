"""Transactions (protos/lowtide/v1/transactions.proto) <-> ``lowtide.messages``: the front door's
``TransactionCoordinator`` on the Admin service (InitProducerId, AddPartitionsToTxn, EndTxn,
AddOffsetsToTxn, TxnOffsetCommit, ListTransactions, DescribeTransactions) and the replica's
WriteTxnMarkers and DescribeProducers on the Replica service.

The servicers read requests and write answers with these; the front door's remote twin
(``lowtide.client.frontdoor.transactions``) writes requests and reads answers. A per-item error
travels as (error_code, error_message) and comes back as the ``LowtideError`` of that code.

What does not travel: a state's ``updated_ms`` and ``version`` (the coordinator's own), and a
listed transaction's epoch, partitions and times (ListTransactions names id, producer and state).
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.errors import LowtideError, error_or_none
from lowtide.messages import TopicPartition
from lowtide.messages.admin import Described, OffsetCommit, TxnState
from lowtide.messages.replica import PartitionProducers, ProducerDescription, TxnMarkerRequest, TxnMarkerResult
from lowtide.rpc.convert import error_fields, error_kwargs
from lowtide.rpc.convert.groups import commit_from_proto
from lowtide.rpc.convert.groups import commit_results_from_proto as groups_commit_results_from_proto
from lowtide_pb import common_pb2, transactions_pb2


def _partitions_to_proto(partitions) -> list[common_pb2.TopicPartition]:
    return [common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions]


def _partitions_from_proto(partitions) -> list[TopicPartition]:
    return [TopicPartition(p.topic, p.partition) for p in partitions]


def _producer_args(r) -> dict:
    """The producer's identity, which every transactional call after InitProducerId carries
    (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn), as the coordinator's keyword arguments."""
    return {"transactional_id": r.transactional_id, "producer_id": r.producer_id, "producer_epoch": r.producer_epoch}


# -- the producer's calls (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn) -----------
def init_producer_id_request(*, transactional_id: str, timeout_ms: int = 0) -> transactions_pb2.InitProducerIdRequest:
    return transactions_pb2.InitProducerIdRequest(transactional_id=transactional_id,
                                                  transaction_timeout_ms=timeout_ms)


def init_producer_id_args(r: transactions_pb2.InitProducerIdRequest) -> dict:
    return {"transactional_id": r.transactional_id, "timeout_ms": r.transaction_timeout_ms}


def init_producer_id_response(answer: tuple[int, int] | LowtideError) -> transactions_pb2.InitProducerIdResponse:
    """The producer id and epoch, or the error (id and epoch -1)."""
    if isinstance(answer, LowtideError):
        return transactions_pb2.InitProducerIdResponse(error_code=answer.code, error_message=answer.message,
                                                       producer_id=-1, producer_epoch=-1)
    return transactions_pb2.InitProducerIdResponse(producer_id=answer[0], producer_epoch=answer[1])


def init_producer_id_answer(r: transactions_pb2.InitProducerIdResponse) -> tuple[int, int] | LowtideError:
    error = error_or_none(r.error_code, r.error_message)
    return error if error is not None else (r.producer_id, r.producer_epoch)


def add_partitions_request(*, transactional_id: str, producer_id: int, producer_epoch: int,
                           partitions: Sequence[tuple[str, int]], transaction_version: int = 0,
                           verify_only: bool = False) -> transactions_pb2.AddPartitionsToTxnRequest:
    return transactions_pb2.AddPartitionsToTxnRequest(transactional_id=transactional_id, producer_id=producer_id,
                                                      producer_epoch=producer_epoch,
                                                      partitions=_partitions_to_proto(partitions),
                                                      transaction_version=transaction_version,
                                                      verify_only=verify_only)


def add_partitions_args(r: transactions_pb2.AddPartitionsToTxnRequest) -> dict:
    """``TransactionCoordinator.add_partitions``' keyword arguments (all but the principal)."""
    return {**_producer_args(r), "partitions": _partitions_from_proto(r.partitions),
            "transaction_version": r.transaction_version, "verify_only": r.verify_only}


def partition_results_to_proto(results: Sequence[tuple[str, int, LowtideError | None]]
                               ) -> list[transactions_pb2.TxnPartitionResult]:
    return [transactions_pb2.TxnPartitionResult(topic=t, partition=p, **error_kwargs(e)) for t, p, e in results]


def partition_results_from_proto(results) -> list[tuple[str, int, LowtideError | None]]:
    return [(r.topic, r.partition, error_or_none(r.error_code, r.error_message)) for r in results]


def add_offsets_request(*, transactional_id: str, producer_id: int, producer_epoch: int,
                        group_id: str) -> transactions_pb2.AddOffsetsToTxnRequest:
    return transactions_pb2.AddOffsetsToTxnRequest(transactional_id=transactional_id, producer_id=producer_id,
                                                   producer_epoch=producer_epoch, group_id=group_id)


def add_offsets_args(r: transactions_pb2.AddOffsetsToTxnRequest) -> dict:
    return {**_producer_args(r), "group_id": r.group_id}


def end_txn_request(*, transactional_id: str, producer_id: int, producer_epoch: int,
                    commit: bool, transaction_version: int = 0) -> transactions_pb2.EndTxnRequest:
    return transactions_pb2.EndTxnRequest(transactional_id=transactional_id, producer_id=producer_id,
                                          producer_epoch=producer_epoch, commit=commit,
                                          transaction_version=transaction_version)


def end_txn_args(r: transactions_pb2.EndTxnRequest) -> dict:
    return {**_producer_args(r), "commit": r.commit, "transaction_version": r.transaction_version}


def end_txn_response(answer: tuple[int, int] | LowtideError) -> transactions_pb2.EndTxnResponse:
    if isinstance(answer, LowtideError):
        return transactions_pb2.EndTxnResponse(error_code=answer.code, error_message=answer.message)
    return transactions_pb2.EndTxnResponse(producer_id=answer[0], producer_epoch=answer[1])


def end_txn_answer(r: transactions_pb2.EndTxnResponse) -> tuple[int, int] | LowtideError:
    error = error_or_none(r.error_code, r.error_message)
    return error if error is not None else (r.producer_id, r.producer_epoch)


# -- TxnOffsetCommit ------------------------------------------------------------------------------
def txn_offset_commit_request(*, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str,
                              commits: Sequence[OffsetCommit], generation_id: int = -1, member_id: str = "",
                              group_instance_id: str = "", transaction_version: int = 0
                              ) -> transactions_pb2.TxnOffsetCommitRequest:
    return transactions_pb2.TxnOffsetCommitRequest(
        transactional_id=transactional_id, group_id=group_id, producer_id=producer_id,
        producer_epoch=producer_epoch, member_id=member_id, group_instance_id=group_instance_id,
        transaction_version=transaction_version,
        generation_id=generation_id if generation_id >= 0 else None, partitions=[
            transactions_pb2.TxnOffsetCommitPartition(topic=c.topic, partition=c.partition, offset=c.offset,
                                                      metadata=c.metadata,
                                                      leader_epoch=c.leader_epoch if c.leader_epoch >= 0 else None)
            for c in commits])


def txn_offset_commit_args(r: transactions_pb2.TxnOffsetCommitRequest) -> dict:
    """``TransactionCoordinator.commit_offsets``' keyword arguments (all but principal and groups)."""
    return {"transactional_id": r.transactional_id, "producer_id": r.producer_id,
            "producer_epoch": r.producer_epoch, "group_id": r.group_id,
            "commits": [commit_from_proto(p) for p in r.partitions],
            "generation_id": r.generation_id if r.HasField("generation_id") else -1,
            "member_id": r.member_id, "group_instance_id": r.group_instance_id,
            "transaction_version": r.transaction_version}


def commit_results_to_proto(results: Sequence[tuple[OffsetCommit, LowtideError | None]]
                            ) -> transactions_pb2.TxnOffsetCommitResponse:
    return transactions_pb2.TxnOffsetCommitResponse(partitions=partition_results_to_proto(
        [(c.topic, c.partition, e) for c, e in results]))


def commit_results_from_proto(commits: Sequence[OffsetCommit], response: transactions_pb2.TxnOffsetCommitResponse
                              ) -> list[tuple[OffsetCommit, LowtideError | None]]:
    """The answer to ``commits``, in their order (as OffsetCommit's: ``groups.commit_results_from_proto``)."""
    return groups_commit_results_from_proto(commits, response.partitions)


# -- ListTransactions, DescribeTransactions (KIP-664) ---------------------------------------------
def list_request(*, states: Sequence[str] = (), producer_ids: Sequence[int] = (),
                 running_longer_than_ms: int = 0) -> transactions_pb2.ListTransactionsRequest:
    return transactions_pb2.ListTransactionsRequest(state_filters=list(states), producer_id_filters=list(producer_ids),
                                                    duration_filter_ms=running_longer_than_ms)


def list_args(r: transactions_pb2.ListTransactionsRequest) -> dict:
    return {"states": list(r.state_filters), "producer_ids": list(r.producer_id_filters),
            "running_longer_than_ms": r.duration_filter_ms}


def listings_to_proto(states: Sequence[TxnState]) -> transactions_pb2.ListTransactionsResponse:
    return transactions_pb2.ListTransactionsResponse(transactions=[
        transactions_pb2.TransactionListing(transactional_id=st.transactional_id, producer_id=st.producer_id,
                                            state=st.state) for st in states])


def listings_from_proto(r: transactions_pb2.ListTransactionsResponse) -> list[TxnState]:
    """Listed states: id, producer and state; the epoch is -1 (not listed), the rest defaults."""
    return [TxnState(transactional_id=t.transactional_id, producer_id=t.producer_id, producer_epoch=-1,
                     state=t.state) for t in r.transactions]


def description_to_proto(described: Described) -> transactions_pb2.TransactionDescription:
    transactional_id, st, err = described
    code, message = error_fields(err)
    d = transactions_pb2.TransactionDescription(transactional_id=transactional_id, error_code=code,
                                                error_message=message, producer_id=-1, producer_epoch=-1,
                                                start_ms=-1)
    if st is not None:
        d.state, d.timeout_ms, d.start_ms = st.state, st.timeout_ms, st.start_ms
        d.producer_id, d.producer_epoch = st.producer_id, st.producer_epoch
        d.partitions.extend(_partitions_to_proto(sorted(st.partitions)))
    return d


def description_from_proto(d: transactions_pb2.TransactionDescription) -> Described:
    """An id's state, or None with the error (the servicer sends no state with an error)."""
    error = error_or_none(d.error_code, d.error_message)
    if error is not None:
        return d.transactional_id, None, error
    return d.transactional_id, TxnState(
        transactional_id=d.transactional_id, producer_id=d.producer_id, producer_epoch=d.producer_epoch,
        state=d.state, partitions=frozenset(_partitions_from_proto(d.partitions)), start_ms=d.start_ms,
        timeout_ms=d.timeout_ms), None


# -- the replica's WriteTxnMarkers and DescribeProducers ------------------------------------------
def markers_from_proto(r: transactions_pb2.WriteTxnMarkersRequest) -> list[TxnMarkerRequest]:
    return [TxnMarkerRequest(producer_id=m.producer_id, producer_epoch=m.producer_epoch, commit=m.commit,
                             coordinator_epoch=m.coordinator_epoch,
                             partitions=tuple(_partitions_from_proto(m.partitions))) for m in r.markers]


def markers_to_proto(markers: Sequence[TxnMarkerRequest], *, timeout_ms: int = 0
                     ) -> transactions_pb2.WriteTxnMarkersRequest:
    return transactions_pb2.WriteTxnMarkersRequest(timeout_ms=timeout_ms, markers=[
        transactions_pb2.TxnMarker(producer_id=m.producer_id, producer_epoch=m.producer_epoch, commit=m.commit,
                                   coordinator_epoch=m.coordinator_epoch,
                                   partitions=_partitions_to_proto(m.partitions)) for m in markers])


def marker_results_to_proto(markers: Sequence[TxnMarkerRequest], results: Sequence[Sequence[TxnMarkerResult]]
                            ) -> transactions_pb2.WriteTxnMarkersResponse:
    """Per marker (its producer id from the request), its partitions' results."""
    return transactions_pb2.WriteTxnMarkersResponse(markers=[
        transactions_pb2.TxnMarkerResult(producer_id=m.producer_id, partitions=partition_results_to_proto(
            [(r.topic, r.partition, r.error) for r in rs])) for m, rs in zip(markers, results, strict=True)])


def marker_results_from_proto(r: transactions_pb2.WriteTxnMarkersResponse) -> list[list[TxnMarkerResult]]:
    return [[TxnMarkerResult(topic=p.topic, partition=p.partition, producer_id=m.producer_id,
                             error=error_or_none(p.error_code, p.error_message)) for p in m.partitions]
            for m in r.markers]


def producers_to_proto(results: Sequence[PartitionProducers]) -> transactions_pb2.DescribeProducersResponse:
    out = []
    for r in results:
        p = transactions_pb2.PartitionProducers(topic=r.topic, partition=r.partition)
        if r.error is not None:
            p.error_code, p.error_message = r.error.code, r.error.message
        p.producers.extend(transactions_pb2.ProducerDescription(
            producer_id=d.producer_id, producer_epoch=d.producer_epoch, last_sequence=d.last_sequence,
            last_timestamp=d.last_timestamp, coordinator_epoch=d.coordinator_epoch,
            current_txn_start_offset=d.current_txn_start_offset) for d in r.producers)
        out.append(p)
    return transactions_pb2.DescribeProducersResponse(partitions=out)


def producers_from_proto(r: transactions_pb2.DescribeProducersResponse) -> list[PartitionProducers]:
    return [PartitionProducers(topic=p.topic, partition=p.partition, error=error_or_none(p.error_code, p.error_message),
                               producers=tuple(ProducerDescription(
                                   producer_id=d.producer_id, producer_epoch=d.producer_epoch,
                                   last_sequence=d.last_sequence, last_timestamp=d.last_timestamp,
                                   coordinator_epoch=d.coordinator_epoch,
                                   current_txn_start_offset=d.current_txn_start_offset) for d in p.producers))
            for p in r.partitions]


def producers_request_from_proto(r: transactions_pb2.DescribeProducersRequest) -> list[TopicPartition]:
    return _partitions_from_proto(r.partitions)
