"""Transaction states kept in the internal compacted topic ``__transaction_state`` (Kafka's home for
them), replicated like any data.

Records are Kafka's TransactionLogKey / TransactionLogValue (``txn_records.py`` draws them); a
transactional id's records all go to partition ``abs(hashCode(id)) % N``. The topic is created on
first need: ``cleanup.policy=compact``, RF = min(3, live brokers), N = ``--transaction-state-partitions``
(default 8; Kafka's ``transaction.state.log.num.partitions`` is 50). When this front door creates it,
the states kept in the metadata store's ``transactions`` section (``TxnStateStore``: where a
migration from an older lowtide puts them) are copied in first (``migrate_from``).

Why a topic: a state the coordinator acknowledged (a PrepareCommit, say) is then on the disks of
min.insync.replicas replicas before the client hears of it, so a transaction that was mid-commit
completes after any single process dies, redis-server included, and the cleaner keeps only each
id's latest state.

Compare-and-set across front doors: any front door may serve any transactional id (Kafka has one
coordinator per partition; lowtide's front doors are peers). Each front door keeps a fold of every
partition it touched: the latest state per id, each stamped with ``version`` = its record's log
offset + 1, and the offset up to which it has read. ``save(state)`` appends the new state with a
conditional append (replica.proto ``expected_log_end_offset``) on the log ending where this fold
ends, after checking that ``state.version`` is still the fold's; if another front door appended
meanwhile the leader refuses it, nothing is written, and ``save`` returns None (the caller reads
again and retries, as with ``TxnStateStore``'s compare-and-set on an etcd revision). Every
``load`` and ``save`` first reads the partition up to its leader's high watermark, so a front door never acts on a state
older than what another one had acknowledged, and a write whose answer was lost (a timeout) is
read back before the next decision. Records above the high watermark are waited for (a new leader's
high watermark lags what the old one acknowledged until its followers fetch again): a state read
there could be older than one the old leader acknowledged.

Creating the topic, routing, the conditional append and its retries, and the back-off of reads
are the internal topics' runtime's (``lowtide.internal_topics``, bound for the front door in
``frontdoor/internal_topics.py``); this module keeps the records, the fold and the compare-and-set.

Producer ids come from blocks claimed in the metadata store (``producer_ids.py``, Kafka's
AllocateProducerIds): never handed out twice, by two front doors or across their restarts.
Nothing of transactions is kept in Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from lowtide.client.replica import ReplicaClient
from lowtide.clock import now_ms
from lowtide.errors import (
    CoordinatorLoadInProgress,
    CoordinatorNotAvailable,
    LowtideError,
    OffsetOutOfRange,
    OutOfOrderSequenceNumber,
)
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.internal_topics import FrontDoorRouter, create_with_admin, new_appender
from lowtide.frontdoor.transactions.producer_ids import ProducerIdBlocks
from lowtide.frontdoor.transactions.transactions import TxnState, TxnStates
from lowtide.frontdoor.transactions.txn_records import (
    TXN_STATE_TOPIC,
    TxnLogValue,
    decode_txn_key,
    decode_txn_value,
    encode_txn_key,
    encode_txn_value,
    partition_for_transactional_id,
)
from lowtide.internal_topics import InternalTopic, InternalTopicSpec, RetryPolicy, call_leader
from lowtide.messages.replica import FetchedPartition, FetchPosition
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore
from lowtide.record import decode_batches, encode_batch

log = logging.getLogger(__name__)

DEFAULT_TXN_STATE_PARTITIONS = 8
# Kafka's transaction.state.log.segment.bytes: small, so the cleaner gets at old states soon.
TXN_STATE_SEGMENT_BYTES = 100 * 1024 * 1024
FETCH_MAX_BYTES = 1 << 20
# Waiting for records above the high watermark to be decided (``_catch_up``): shorter steps than a
# leader's move, since a follower's next fetch usually decides them within milliseconds.
SETTLE_RETRY = RetryPolicy(step_s=0.02, max_backoff_s=0.2)


@dataclass(frozen=True)
class TxnLogConfig:
    partitions: int = DEFAULT_TXN_STATE_PARTITIONS
    write_timeout_ms: int = 10_000
    fetch_timeout_s: float = 5.0


@dataclass
class _Fold:
    """What this front door knows of one partition: guarded by ``lock``, held across its I/O."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    position: int = 0  # next offset to read: everything below is folded into ``states``
    states: dict[str, TxnState] = field(default_factory=dict)


class TxnStateLog:
    """Transaction states in ``__transaction_state`` (module doc); the store
    ``TransactionCoordinator`` works with, as ``TxnStateStore`` is for the metadata store.

    Contract: ``save`` returns the stored state (its ``version`` the record's offset + 1) only
    after the leader acknowledged it with acks=all; None when the version was not the latest
    (nothing written). Errors reaching the leader are COORDINATOR_NOT_AVAILABLE (retriable).

    Thread-safety: thread-safe; one lock per partition, held while that partition is read or
    written (two requests for ids of one partition take turns).
    """

    def __init__(self, *, store: MetadataStore, replicas: ReplicaClient, topics: TopicAdmin,
                 config: TxnLogConfig = TxnLogConfig(), migrate_from: TxnStates | None = None,
                 producer_ids: ProducerIdBlocks | None = None, clock: Callable[[], int] = now_ms) -> None:
        self._store = store
        self._replicas = replicas
        self._topics = topics
        self._producer_ids = producer_ids or ProducerIdBlocks(store=store)
        self.config = config
        self._migrate_from = migrate_from
        self._clock = clock
        self._lock = threading.Lock()
        self._folds: dict[int, _Fold] = {}
        self._topic = InternalTopic(
            spec=InternalTopicSpec(name=TXN_STATE_TOPIC, partitions=config.partitions, config={
                "cleanup.policy": "compact", "segment.bytes": str(TXN_STATE_SEGMENT_BYTES)}),
            store=store, create=create_with_admin(topics, extra_config=self._min_isr), on_created=self._created)
        self._router = FrontDoorRouter(store=store, topic=TXN_STATE_TOPIC)
        self._appender = new_appender(store=store, replicas=replicas, topic=TXN_STATE_TOPIC)

    # -- the store interface (frontdoor/transactions/transactions.py) --------------------------
    def load(self, transactional_id: str) -> TxnState | None:
        partition = self._partition(transactional_id, create=False)
        if partition is None:
            return None
        fold = self._fold(partition)
        with fold.lock:
            self._catch_up(partition, fold)
            return fold.states.get(transactional_id)

    def save(self, state: TxnState) -> TxnState | None:
        return self._write(state, tombstone=False)

    def delete(self, state: TxnState) -> bool:
        return self._write(state, tombstone=True) is not None

    def next_producer_id(self) -> int:
        return self._producer_ids.next_id()

    def transactional_ids(self) -> list[str]:
        return sorted(st.transactional_id for st in self.states())

    def states(self) -> list[TxnState]:
        """Every id's latest state, each partition read up to its high watermark first."""
        count = self._partition_count(create=False)
        out: list[TxnState] = []
        for partition in range(count or 0):
            fold = self._fold(partition)
            with fold.lock:
                self._catch_up(partition, fold)
                out.extend(fold.states.values())
        return out

    # -- internals -----------------------------------------------------------------------------
    def _write(self, state: TxnState, *, tombstone: bool) -> TxnState | None:
        partition = self._partition(state.transactional_id, create=True)
        assert partition is not None
        fold = self._fold(partition)
        with fold.lock:
            self._catch_up(partition, fold)
            current = fold.states.get(state.transactional_id)
            if (current.version if current else 0) != state.version:
                return None
            now = self._clock()
            new = replace(state, updated_ms=now)
            value = None if tombstone else encode_txn_value(TxnLogValue(
                producer_id=new.producer_id, producer_epoch=new.producer_epoch, timeout_ms=new.timeout_ms,
                state=new.state, partitions=new.partitions, last_update_ms=now, start_ms=new.start_ms,
                transaction_version=new.transaction_version, previous_producer_id=new.previous_producer_id,
                next_producer_id=new.next_producer_id))
            batch = encode_batch([value], keys=[encode_txn_key(state.transactional_id)], timestamp_ms=now)
            try:
                base_offset = self._appender.append(partition, batch, timeout_ms=self.config.write_timeout_ms,
                                                    expected_end_offset=fold.position)
            except OutOfOrderSequenceNumber:
                # Another front door appended first (or an earlier attempt of ours did, its answer
                # lost): nothing was written now; the caller reads again, which reads that record.
                return None
            fold.position = base_offset + 1
            if tombstone:
                fold.states.pop(state.transactional_id, None)
                return new
            new = replace(new, version=base_offset + 1)
            fold.states[state.transactional_id] = new
            return new

    def _fold(self, partition: int) -> _Fold:
        with self._lock:
            fold = self._folds.get(partition)
            if fold is None:
                fold = self._folds[partition] = _Fold()
            return fold

    def _partition(self, transactional_id: str, *, create: bool) -> int | None:
        count = self._partition_count(create=create)
        return None if count is None else partition_for_transactional_id(transactional_id, partitions=count)

    def _partition_count(self, *, create: bool) -> int | None:
        """The topic's partition count; None when it does not exist and ``create`` is False."""
        return self._topic.partition_count(create=create)

    def _min_isr(self) -> dict[str, str]:
        if len(self._store.live_broker_ids()) >= 2:
            # Kafka's transaction.state.log.min.isr (2): an acknowledged state is on two disks, so
            # losing one broker loses no decided transaction.
            return {"min.insync.replicas": "2"}
        return {}

    def _created(self, info: TopicInfo) -> None:
        if self._migrate_from is not None:
            self._migrate(self._migrate_from)

    def _migrate(self, source: TxnStates) -> None:
        """Copy the states of ``source`` (the metadata store's, module doc; only the front door that
        created the topic does, so nothing is copied twice)."""
        moved = 0
        for st in source.states():
            if self.save(replace(st, version=0)) is not None:
                moved += 1
        if moved:
            log.info("moved %d transaction states from the metadata store into %s", moved, TXN_STATE_TOPIC)

    def _catch_up(self, partition: int, fold: _Fold) -> None:
        """Fold the partition's records up to its leader's high watermark (caller holds fold.lock)."""
        deadline = time.monotonic() + self.config.fetch_timeout_s
        settle_attempt = 0
        while True:
            got = self._fetch(partition, fold.position, deadline=deadline)
            if isinstance(got.error, OffsetOutOfRange):
                fold.position, fold.states = max(0, got.log_start_offset), {}
                continue
            start = fold.position
            for header, records in decode_batches(bytes(got.records)):
                for r in records:
                    if r.offset < start or r.key is None:
                        continue
                    transactional_id = decode_txn_key(r.key)
                    if transactional_id is None:
                        continue
                    if r.value is None:
                        fold.states.pop(transactional_id, None)
                    else:
                        fold.states[transactional_id] = _state(transactional_id, decode_txn_value(r.value),
                                                               version=r.offset + 1)
                fold.position = max(fold.position, header.next_offset)
            if fold.position >= got.high_watermark:
                if got.high_watermark >= got.log_end_offset:
                    return
                # Records above the high watermark: a write in flight, or a new leader whose high
                # watermark has not caught up with what the old one acknowledged yet. Deciding on
                # the older state could undo an acknowledged one: wait until they are decided.
                settle_attempt += 1
                if not SETTLE_RETRY.has_time(settle_attempt, deadline):
                    raise CoordinatorLoadInProgress(
                        f"{TXN_STATE_TOPIC}-{partition}: records above the high watermark {got.high_watermark} "
                        f"(log end {got.log_end_offset}) are not decided yet")
                SETTLE_RETRY.sleep(settle_attempt)
                continue
            if fold.position == start:
                raise CoordinatorLoadInProgress(f"{TXN_STATE_TOPIC}-{partition}: no progress at offset {start} "
                                                f"below the high watermark {got.high_watermark}")

    def _fetch(self, partition: int, offset: int, *, deadline: float) -> FetchedPartition:
        """One fetch at ``offset`` from the partition's leader, retried while leadership settles (a
        leader moving, or a partition just created and not hosted yet); OFFSET_OUT_OF_RANGE is
        answered, not raised. COORDINATOR_NOT_AVAILABLE when the leader cannot be read."""

        def fetch(address: str) -> FetchedPartition:
            got = self._replicas.fetch(address, [FetchPosition(
                topic=TXN_STATE_TOPIC, partition=partition, fetch_offset=offset, max_bytes=FETCH_MAX_BYTES)],
                max_wait_ms=0, deadline_s=self.config.fetch_timeout_s)[0]
            if got.error is not None and not isinstance(got.error, OffsetOutOfRange):
                raise got.error
            return got

        try:
            return call_leader(fetch, router=self._router, partition=partition, deadline=deadline)
        except LowtideError as problem:
            raise CoordinatorNotAvailable(f"{TXN_STATE_TOPIC}-{partition} unreadable: {problem.name}: "
                                          f"{problem.message}") from None


def _state(transactional_id: str, value: TxnLogValue, *, version: int) -> TxnState:
    return TxnState(transactional_id=transactional_id, producer_id=value.producer_id,
                    producer_epoch=value.producer_epoch, state=value.state, partitions=value.partitions,
                    start_ms=value.start_ms, timeout_ms=value.timeout_ms, updated_ms=value.last_update_ms,
                    version=version, transaction_version=value.transaction_version,
                    previous_producer_id=value.previous_producer_id, next_producer_id=value.next_producer_id)
