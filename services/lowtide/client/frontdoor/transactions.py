"""The front door's transaction coordinator over the Admin gRPC service: the remote twin of
``lowtide.frontdoor.transactions.transactions.TransactionCoordinator`` (package doc).

Same methods, same answers, same raised errors as the domain object: an error the servicer
answers for the whole call (InitProducerId, EndTxn, AddOffsetsToTxn refused) is raised here, as
the domain raises it. One difference a Kafka client relies on: a front door that cannot be reached
right now (the call failed with NETWORK_EXCEPTION, REQUEST_TIMED_OUT or BROKER_NOT_AVAILABLE) is
COORDINATOR_NOT_AVAILABLE, the one answer every transactional request handles by finding the
coordinator again and retrying (a NETWORK_EXCEPTION from EndTxn is fatal to the Java producer).
An error the front door put in its answer is not renamed. ``principal`` and ``groups`` are
ignored: the front door authenticates the call's metadata and commits to its own groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from lowtide.client.frontdoor.part import RemotePart
from lowtide.errors import (
    BrokerNotAvailable,
    CoordinatorNotAvailable,
    LowtideError,
    NetworkException,
    RequestTimedOut,
    error_or_none,
)
from lowtide.messages import TopicPartition
from lowtide.messages.admin import Described, OffsetCommit, TxnState
from lowtide.rpc.convert import transactions as convert
from lowtide_pb import transactions_pb2

T = TypeVar("T")
UNREACHABLE = (NetworkException, RequestTimedOut, BrokerNotAvailable)


class RemoteTransactions(RemotePart):
    """``TransactionCoordinator`` at the front door (module doc)."""

    def _call(self, rpc: Callable[..., T], request: Any, *, timeout_s: float | None = None) -> T:
        try:
            return super()._call(rpc, request, timeout_s=timeout_s)
        except UNREACHABLE as err:
            raise CoordinatorNotAvailable(
                f"the transaction coordinator is unreachable: {err.name}: {err.message}") from None

    def init_producer_id(self, *, principal: str, transactional_id: str, timeout_ms: int = 0) -> tuple[int, int]:
        answer = convert.init_producer_id_answer(self._call(self._stub.InitProducerId, convert.init_producer_id_request(
            transactional_id=transactional_id, timeout_ms=timeout_ms)))
        if isinstance(answer, LowtideError):
            raise answer
        return answer

    def add_partitions(self, *, principal: str, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Sequence[TopicPartition], transaction_version: int = 0,
                       verify_only: bool = False) -> list[tuple[str, int, LowtideError | None]]:
        response = self._call(self._stub.AddPartitionsToTxn, convert.add_partitions_request(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            partitions=partitions, transaction_version=transaction_version, verify_only=verify_only))
        return convert.partition_results_from_proto(response.partitions)

    def add_offsets(self, *, principal: str, transactional_id: str, producer_id: int, producer_epoch: int,
                    group_id: str, transaction_version: int = 0) -> None:
        # transaction_version: version 2 adds offsets through TxnOffsetCommit v5, never through here.
        _raise_error_of(self._call(self._stub.AddOffsetsToTxn, convert.add_offsets_request(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            group_id=group_id)))

    def end_txn(self, *, principal: str, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool, transaction_version: int = 0) -> tuple[int, int]:
        answer = convert.end_txn_answer(self._call(self._stub.EndTxn, convert.end_txn_request(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            commit=commit, transaction_version=transaction_version)))
        if isinstance(answer, LowtideError):
            raise answer
        return answer

    def commit_offsets(self, *, principal: str, groups: Any, transactional_id: str, producer_id: int,
                       producer_epoch: int, group_id: str, commits: Sequence[OffsetCommit], generation_id: int = -1,
                       member_id: str = "", group_instance_id: str = "", transaction_version: int = 0
                       ) -> list[tuple[OffsetCommit, LowtideError | None]]:
        """TxnOffsetCommit: the front door checks the transaction (version 2: adds the group's
        partition to it) and commits to its own groups."""
        response = self._call(self._stub.TxnOffsetCommit, convert.txn_offset_commit_request(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            group_id=group_id, commits=commits, generation_id=generation_id, member_id=member_id,
            group_instance_id=group_instance_id, transaction_version=transaction_version))
        return convert.commit_results_from_proto(commits, response)

    def list_transactions(self, *, principal: str, states: Sequence[str] = (), producer_ids: Sequence[int] = (),
                          running_longer_than_ms: int = 0) -> list[TxnState]:
        return convert.listings_from_proto(self._call(self._stub.ListTransactions, convert.list_request(
            states=states, producer_ids=producer_ids, running_longer_than_ms=running_longer_than_ms)))

    def describe_transactions(self, *, principal: str, transactional_ids: Sequence[str]) -> list[Described]:
        response = self._call(self._stub.DescribeTransactions, transactions_pb2.DescribeTransactionsRequest(
            transactional_ids=list(transactional_ids)))
        return [convert.description_from_proto(d) for d in response.transactions]


def _raise_error_of(response: Any) -> None:
    """An answer's whole-call error (error_code, error_message), raised as the domain raises it."""
    error = error_or_none(response.error_code, response.error_message)
    if error is not None:
        raise error
