"""The client side of transactions (Kafka's ``TransactionManager``): the producer id and epoch of a
transactional id, the partitions of the ongoing transaction, and the sequence numbers per partition.

Used by ``Producer(transactional_id=...)``. Calls the front door (the transaction coordinator):
InitProducerId, AddPartitionsToTxn, EndTxn. States::

    uninitialized --init--> ready --begin--> in_transaction --commit/abort--> ready
    any --PRODUCER_FENCED / INVALID_PRODUCER_EPOCH / INVALID_PRODUCER_ID_MAPPING--> fatal

A fatal producer can do nothing but close (a newer producer with the same transactional id took
over, as Kafka's ``ProducerFencedException``). CONCURRENT_TRANSACTIONS (the coordinator is still
completing the previous transaction) is retried until ``timeout_s``.

Not thread-safe: one per producer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from lowtide.client.admin import Admin
from lowtide.errors import (
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidTxnState,
    LowtideError,
    ProducerFenced,
    error_or_none,
)
from lowtide.messages import TopicPartition
from lowtide_pb import common_pb2, transactions_pb2

T = TypeVar("T")
_FATAL = (ProducerFenced, InvalidProducerEpoch, InvalidProducerIdMapping)
UNINITIALIZED, READY, IN_TRANSACTION, FATAL = "uninitialized", "ready", "in_transaction", "fatal"


class TransactionManager:
    """Producer id, epoch, transaction partitions and sequences of one transactional producer."""

    def __init__(self, admin: Admin, *, transactional_id: str, transaction_timeout_ms: int = 60_000,
                 timeout_s: float = 60.0) -> None:
        self.admin = admin
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.timeout_s = timeout_s
        self.producer_id = -1
        self.producer_epoch = -1
        self.state = UNINITIALIZED
        self.partitions: set[TopicPartition] = set()
        self._sequences: dict[TopicPartition, int] = {}

    def init(self) -> None:
        """InitProducerId: a new epoch (fencing any older producer of the id; its ongoing
        transaction is aborted by the coordinator)."""
        def ask() -> None:
            response = self.admin.call("InitProducerId", transactions_pb2.InitProducerIdRequest(
                transactional_id=self.transactional_id, transaction_timeout_ms=self.transaction_timeout_ms))
            error = error_or_none(response.error_code, response.error_message)
            if error is not None:
                raise error
            self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch

        self._retrying(ask)
        self._sequences.clear()
        self.partitions.clear()
        self.state = READY

    def begin(self) -> None:
        self._require(READY, "begin a transaction")
        self.partitions.clear()
        self.state = IN_TRANSACTION

    def add_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """AddPartitionsToTxn for those not in the transaction yet (before anything is sent to them)."""
        self._require(IN_TRANSACTION, "produce")
        new = sorted(set(partitions) - self.partitions)
        if not new:
            return

        def ask() -> None:
            response = self.admin.call("AddPartitionsToTxn", transactions_pb2.AddPartitionsToTxnRequest(
                transactional_id=self.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in new]))
            errors = [error_or_none(r.error_code, r.error_message) for r in response.partitions]
            first = next((e for e in errors if e is not None and e.code != 55), None)  # 55: not attempted
            if first is not None:
                raise first

        self._retrying(ask)
        self.partitions.update(new)

    def next_sequence(self, tp: TopicPartition, count: int) -> int:
        """The base sequence of the next batch of ``count`` records to ``tp`` (int32, wrapping)."""
        base = self._sequences.get(tp, 0)
        self._sequences[tp] = (base + count) & 0x7FFFFFFF
        return base

    def end(self, *, commit: bool) -> None:
        """EndTxn; a transaction that wrote nothing ends here without a call (as Kafka's)."""
        self._require(IN_TRANSACTION, "commit" if commit else "abort")
        if self.partitions:
            def ask() -> None:
                response = self.admin.call("EndTxn", transactions_pb2.EndTxnRequest(
                    transactional_id=self.transactional_id, producer_id=self.producer_id,
                    producer_epoch=self.producer_epoch, commit=commit))
                error = error_or_none(response.error_code, response.error_message)
                if error is not None:
                    raise error

            self._retrying(ask)
        self.partitions.clear()
        self.state = READY

    def fail(self, error: LowtideError) -> None:
        """A produce answer that fences this producer makes it fatal."""
        if isinstance(error, _FATAL):
            self.state = FATAL

    def _require(self, state: str, what: str) -> None:
        if self.state == FATAL:
            raise ProducerFenced(f"producer of transactional id {self.transactional_id!r} was fenced: cannot {what}")
        if self.state != state:
            raise InvalidTxnState(f"cannot {what}: the producer is {self.state.replace('_', ' ')}"
                                  + (" (call init_transactions first)" if self.state == UNINITIALIZED else ""))

    def _retrying(self, attempt: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.timeout_s
        backoff = 0.02
        while True:
            try:
                return attempt()
            except LowtideError as err:
                if isinstance(err, _FATAL):
                    self.state = FATAL
                    raise
                if not err.retriable or time.monotonic() + backoff > deadline:
                    raise
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
