"""The transaction coordinator (Kafka's ``TransactionCoordinator``, KIP-98), in the front door.

Any front door serves any transactional id. The states live in the internal compacted topic
``__transaction_state`` (``txn_log.py``: Kafka's record format, replicated with acks=all), and
every transition is a compare-and-set on the state's version, so two front doors never both move
one transaction. ``TxnStateStore`` below keeps states in the cluster metadata instead (etcd, the
section ``transactions`` of ``lowtide.metadata.sections``): not the front door's store, but the
one whose states the front door that creates the topic copies into it (``migrate_from``), and a
store tests run the coordinator on::

    transactions/{transactional id}   JSON  producer_id, producer_epoch, state, partitions
                                            ([[topic, partition], ...]), start_ms, timeout_ms,
                                            updated_ms; ``version`` is the record's revision

Producer ids come from blocks claimed in the metadata store (``producer_ids.py``, Kafka's
AllocateProducerIds), never from Redis: a Redis that forgot its counter gave an id twice.

States (Kafka's): Empty -> Ongoing (AddPartitionsToTxn) -> PrepareCommit | PrepareAbort (EndTxn,
persisted before any marker) -> CompleteCommit | CompleteAbort (every partition holds its marker).
InitProducerId on an existing id bumps the epoch (fencing the previous producer), aborting an
ongoing transaction first with markers of the bumped epoch. A transaction Ongoing for longer than
its ``transaction_timeout_ms`` is aborted the same way by ``expire`` (a background thread, every
front door); a Prepare* state left behind by a front door that died mid-way is completed there.

Transactions version 2 (KIP-890, ``txn_v2.py`` has the rules): partitions are added by the leaders
of a transactional Produce v12 and by TxnOffsetCommit v5 (``transaction_version=2``), and EndTxn v5
bumps the epoch of every transaction and answers it; ``lowtide_transactions_ended_total`` counts
completed transactions by the version their client spoke.

Errors (Kafka's): PRODUCER_FENCED (an older epoch), INVALID_PRODUCER_EPOCH (a newer one),
INVALID_PRODUCER_ID_MAPPING (another producer id), INVALID_TXN_STATE, CONCURRENT_TRANSACTIONS
(being completed, or another front door moved the state: retry), TRANSACTIONAL_ID_AUTHORIZATION_FAILED
(WRITE on the TRANSACTIONAL_ID), TOPIC_AUTHORIZATION_FAILED (WRITE on a topic of AddPartitionsToTxn).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from prometheus_client import Counter

from lowtide.auth.acl import AclOperation, Authorizer, ResourceType
from lowtide.client.replica import ReplicaClient
from lowtide.clock import now_ms
from lowtide.errors import (
    BrokerNotAvailable,
    ConcurrentTransactions,
    GroupAuthorizationFailed,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidRequest,
    InvalidTxnState,
    LowtideError,
    OperationNotAttempted,
    ProducerFenced,
    RequestTimedOut,
    TopicAuthorizationFailed,
    TransactionAbortable,
    TransactionalIdAuthorizationFailed,
    TransactionalIdNotFound,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.routing import Routes, route_partitions
from lowtide.frontdoor.transactions.producer_ids import ProducerIdBlocks
from lowtide.frontdoor.transactions.txn_v2 import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    MAX_EPOCH,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    answer_of,
    completed,
    decide_end_txn,
    fenced_epoch,
    is_version_2,
)
from lowtide.groups import OFFSETS_TOPIC
from lowtide.messages import TopicPartition
from lowtide.messages.admin import TRANSACTION_VERSION_1, TRANSACTION_VERSION_2, Described, OffsetCommit, TxnState
from lowtide.messages.replica import TxnMarkerRequest
from lowtide.metadata.sections import Entry, section
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)

__all__ = ["COMPLETE_ABORT", "COMPLETE_COMMIT", "EMPTY", "MAX_EPOCH", "ONGOING", "PREPARE_ABORT", "PREPARE_COMMIT",
           "TransactionCoordinator", "TxnState", "TxnStateStore", "TxnStates"]

# The proof, from the broker's side, of which protocol a client ran: every transaction this front
# door completes (writes its Complete* state), by the transaction version its client spoke (1:
# KIP-98, with AddPartitionsToTxn and one epoch per producer; 2: KIP-890, an epoch per transaction).
TRANSACTIONS_ENDED = Counter(
    "lowtide_transactions_ended", "Transactions this coordinator completed, by transaction version and result",
    ["transaction_version", "result"])

DEFAULT_TIMEOUT_MS = 60_000
MAX_TIMEOUT_MS = 15 * 60_000  # Kafka's transaction.max.timeout.ms
MARKER_DEADLINE_S = 30.0
# A Prepare* state this old is taken over by the expiry scan (its front door is presumed gone).
ABANDONED_PREPARE_MS = 5_000

# Kafka's transactional.id.expiration.ms: a decided (or never used) transactional id untouched for
# this long is forgotten; its producer's next InitProducerId starts over with a new producer id.
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3_600_000

# TxnState (one transactional id's state) is lowtide.messages.admin's: the front door's remote twin
# answers ListTransactions / DescribeTransactions with it too.


class TxnStates(Protocol):
    """Where the coordinator keeps states: ``save`` and ``delete`` are compare-and-set on
    ``version`` (None / False: another writer moved the state first, nothing changed)."""

    def load(self, transactional_id: str) -> TxnState | None: ...

    def save(self, state: TxnState) -> TxnState | None: ...

    def delete(self, state: TxnState) -> bool: ...

    def next_producer_id(self) -> int: ...

    def states(self) -> list[TxnState]: ...


class OffsetCommitter(Protocol):
    """Where TxnOffsetCommit stores its offsets (``lowtide.frontdoor.groups.groups.GroupCoordinator``)."""

    def commit_offsets(self, *, principal: str, group_id: str, commits: Sequence[OffsetCommit],
                       generation_id: int = -1, member_id: str = "", group_instance_id: str = "",
                       txn_producer: tuple[int, int] | None = None
                       ) -> list[tuple[OffsetCommit, LowtideError | None]]: ...


class TxnStateStore:
    """Transaction states in the metadata store's ``transactions`` section (module docstring):
    ``version`` is the record's etcd revision (0: no record), ``save`` and ``delete`` a
    compare-and-set on it. ``load`` reads the record from etcd (one linearizable round trip; ``states``
    catches the image up first), so a front door never decides on a state older than one another
    front door acknowledged (as ``TxnStateLog`` reads to the high watermark); with etcd away they
    answer from the image, and writes fail. Thread-safe (as ``MetadataStore``)."""

    def __init__(self, *, metadata: MetadataStore, producer_ids: ProducerIdBlocks | None = None) -> None:
        self._metadata = metadata
        self._records = section(metadata, "transactions")
        self._producer_ids = producer_ids or ProducerIdBlocks(store=metadata)

    def load(self, transactional_id: str) -> TxnState | None:
        # Read through to etcd rather than wait for the watch: a loaded machine's watch can lag
        # past any wait we would give it, and a stale state only fails the next save anyway.
        entry = self._records.read(transactional_id)
        return None if entry is None else _decode_state(transactional_id, entry)

    def save(self, state: TxnState) -> TxnState | None:
        """Write ``state`` if the stored version is still ``state.version``; the stored state, or
        None when another writer got there first."""
        new = replace(state, updated_ms=now_ms())
        value = _encode_state(new)
        if not self._records.put(state.transactional_id, value, expect=_expected(state)):
            return None
        # The write is in the image now; its revision is the new version, unless another writer
        # already moved the state again (then no version of ours matches: the next save fails).
        entry = self._records.get(state.transactional_id)
        return replace(new, version=entry.revision if entry is not None and entry.value == value else -1)

    def delete(self, state: TxnState) -> bool:
        """Remove the state if it is still at ``state.version``; whether it did."""
        return self._records.delete([state.transactional_id],
                                    expect={state.transactional_id: _expected(state)})

    def next_producer_id(self) -> int:
        return self._producer_ids.next_id()

    def states(self) -> list[TxnState]:
        self._metadata.sync()
        return [_decode_state(tid, entry) for tid, entry in sorted(self._records.items().items())]

    def transactional_ids(self) -> list[str]:
        return [st.transactional_id for st in self.states()]


def _expected(state: TxnState) -> Entry | None:
    """The compare of a write at ``state.version`` (0: the record must not exist)."""
    return None if state.version == 0 else Entry(b"", state.version)


# KIP-890's fields, written only when not at their default (a version-1 state's JSON is unchanged).
_TV2_DEFAULTS = {"transaction_version": 0, "previous_producer_id": -1, "next_producer_id": -1}


def _encode_state(st: TxnState) -> bytes:
    raw = {"producer_id": st.producer_id, "producer_epoch": st.producer_epoch, "state": st.state,
           "partitions": sorted(st.partitions), "start_ms": st.start_ms,
           "timeout_ms": st.timeout_ms, "updated_ms": st.updated_ms}
    raw.update({k: getattr(st, k) for k, default in _TV2_DEFAULTS.items() if getattr(st, k) != default})
    return json.dumps(raw, sort_keys=True).encode()


def _decode_state(transactional_id: str, entry: Entry) -> TxnState:
    raw = json.loads(entry.value)
    return TxnState(transactional_id=transactional_id, producer_id=int(raw["producer_id"]),
                    producer_epoch=int(raw["producer_epoch"]), state=raw["state"],
                    partitions=frozenset((t, int(p)) for t, p in raw["partitions"]),
                    start_ms=int(raw["start_ms"]), timeout_ms=int(raw["timeout_ms"]),
                    updated_ms=int(raw["updated_ms"]), version=entry.revision,
                    **{k: int(raw.get(k, default)) for k, default in _TV2_DEFAULTS.items()})


class TransactionCoordinator:
    """InitProducerId, AddPartitionsToTxn, EndTxn and the expiry of transactions (module docstring).

    Thread-safe: per-call state lives on the stack; the store, authorizer and clients are shared.
    """

    def __init__(self, *, store: TxnStates, metadata: MetadataStore, authorizer: Authorizer,
                 replicas: ReplicaClient, expire_interval_s: float = 1.0,
                 offsets_partition: Callable[[str], int] | None = None,
                 offsets_written: Callable[[], None] | None = None,
                 transactional_id_expiration_ms: int = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS) -> None:
        self._store = store
        self._id_expiration_ms = transactional_id_expiration_ms
        # group id -> its __consumer_offsets partition (AddOffsetsToTxn); None: not served.
        self._offsets_partition = offsets_partition
        # Told once markers went to __consumer_offsets (the offsets tail reads at once, so the
        # transaction's offsets are served when EndTxn returns, not after the tail's idle wait).
        self._offsets_written = offsets_written
        self._metadata = metadata
        self._authorizer = authorizer
        self._replicas = replicas
        self._interval = expire_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- requests ----------------------------------------------------------------------------------

    def init_producer_id(self, *, principal: str, transactional_id: str, timeout_ms: int = 0) -> tuple[int, int]:
        """(producer id, epoch) for ``transactional_id`` (module docstring); an empty id gets a
        fresh producer id (an idempotent producer)."""
        if not transactional_id:
            # An idempotent producer has no transaction to time out: Kafka ignores the timeout
            # (librdkafka sends INT32_MAX).
            return self._store.next_producer_id(), 0
        timeout_ms = timeout_ms or DEFAULT_TIMEOUT_MS
        if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
            raise InvalidRequest(f"transaction timeout {timeout_ms} ms is outside (0, {MAX_TIMEOUT_MS}]")
        self._require_id(principal, transactional_id)
        for _ in range(10):
            st = self._store.load(transactional_id)
            if st is None:
                new = TxnState(transactional_id=transactional_id, producer_id=self._store.next_producer_id(),
                               producer_epoch=0, timeout_ms=timeout_ms)
            elif st.state in (PREPARE_COMMIT, PREPARE_ABORT):
                self._complete(st)
                continue
            elif st.state == ONGOING:
                self._abort_fencing(st)  # the next round bumps from CompleteAbort
                continue
            elif st.producer_epoch >= MAX_EPOCH - 1:
                # The producer never holds MAX_EPOCH (then it could not be fenced): a new id.
                new = replace(st, producer_id=self._store.next_producer_id(), producer_epoch=0, state=EMPTY,
                              partitions=frozenset(), start_ms=-1, timeout_ms=timeout_ms)
            else:
                new = replace(st, producer_epoch=st.producer_epoch + 1, state=EMPTY, partitions=frozenset(),
                              start_ms=-1, timeout_ms=timeout_ms)
            if st is not None:
                # A new producer instance: whichever transaction version it speaks shows at its first
                # transaction; the id change of an overflow is behind it.
                new = replace(new, transaction_version=TRANSACTION_VERSION_1, previous_producer_id=-1,
                              next_producer_id=-1)
            saved = self._store.save(new)
            if saved is not None:
                return saved.producer_id, saved.producer_epoch
        raise ConcurrentTransactions(f"transactional id {transactional_id!r} keeps changing; retry")

    def add_partitions(self, *, principal: str, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Sequence[TopicPartition], transaction_version: int = TRANSACTION_VERSION_1,
                       verify_only: bool = False) -> list[tuple[str, int, LowtideError | None]]:
        """Add ``partitions`` to the ongoing transaction (starting one): all or nothing, as Kafka:
        when one partition fails the others get OPERATION_NOT_ATTEMPTED. A failure of the whole
        request (fencing, state) is the error of every partition. ``transaction_version`` 2: the
        implicit add of a transactional Produce v12 (KIP-890), which makes the transaction one of
        version 2. ``verify_only`` (AddPartitionsToTxn v4+ from a broker, KIP-890 part 1): nothing
        is added; a partition outside the ongoing transaction is TRANSACTION_ABORTABLE."""
        wanted = list(dict.fromkeys(partitions))
        try:
            self._require_id(principal, transactional_id)
            if verify_only:
                return self._verify(transactional_id, producer_id, producer_epoch, wanted)
            failed = self._check_partitions(principal, wanted)
            if failed:
                return [(t, p, failed.get((t, p)) or OperationNotAttempted(
                    "another partition of the request failed")) for t, p in wanted]
            self._join(transactional_id, producer_id, producer_epoch, wanted, transaction_version=transaction_version)
            return [(t, p, None) for t, p in wanted]
        except LowtideError as err:
            return [(t, p, err) for t, p in wanted]

    def _verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                wanted: Sequence[TopicPartition]) -> list[tuple[str, int, LowtideError | None]]:
        st = self._checked(transactional_id, producer_id, producer_epoch)
        ongoing = st.partitions if st.state == ONGOING else frozenset()
        return [(t, p, None if (t, p) in ongoing else TransactionAbortable(
            f"{t}-{p} is not in the ongoing transaction of {transactional_id!r} ({st.state})")) for t, p in wanted]

    def add_offsets(self, *, principal: str, transactional_id: str, producer_id: int, producer_epoch: int,
                    group_id: str, transaction_version: int = TRANSACTION_VERSION_1) -> None:
        """Kafka's AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins the
        transaction, so EndTxn decides the offsets TxnOffsetCommit writes there. READ on the GROUP.
        (Version 2 producers send no AddOffsetsToTxn: TxnOffsetCommit v5 adds it, through here.)"""
        self._require_id(principal, transactional_id)
        if not self._authorizer.authorize(principal=principal, operation=AclOperation.READ,
                                          resource_type=ResourceType.GROUP, resource_name=group_id):
            raise GroupAuthorizationFailed(f"{principal} is not authorized to READ on GROUP {group_id!r}")
        if self._offsets_partition is None:
            raise InvalidRequest("this coordinator does not serve transactional offset commits")
        self._join(transactional_id, producer_id, producer_epoch,
                   [(OFFSETS_TOPIC, self._offsets_partition(group_id))], transaction_version=transaction_version)

    def check_offsets_in_txn(self, *, principal: str, transactional_id: str, producer_id: int,
                             producer_epoch: int, group_id: str) -> None:
        """Before TxnOffsetCommit writes: the producer is the current one of an ongoing transaction
        that holds the group's partition (AddOffsetsToTxn came first), else the offsets would wait
        for a marker no EndTxn writes (KIP-890's verification, for this one case)."""
        self._require_id(principal, transactional_id)
        st = self._checked(transactional_id, producer_id, producer_epoch)
        partition = (OFFSETS_TOPIC, self._offsets_partition(group_id)) if self._offsets_partition else None
        if st.state != ONGOING or partition not in st.partitions:
            raise InvalidTxnState(f"the transaction of {transactional_id!r} ({st.state}) has not added the offsets "
                                  f"of group {group_id!r} (AddOffsetsToTxn first)")

    def commit_offsets(self, *, principal: str, groups: OffsetCommitter, transactional_id: str, producer_id: int,
                       producer_epoch: int, group_id: str, commits: Sequence[OffsetCommit], generation_id: int = -1,
                       member_id: str = "", group_instance_id: str = "",
                       transaction_version: int = TRANSACTION_VERSION_1
                       ) -> list[tuple[OffsetCommit, LowtideError | None]]:
        """Kafka's TxnOffsetCommit, for both doors (the Admin servicer and the Kafka listener):
        ``check_offsets_in_txn``, then ``groups`` (the front door's GroupCoordinator) stores the
        commits as records of this producer's transaction. A refusal of the whole request, by
        either, is every commit's error. ``transaction_version`` 2 (TxnOffsetCommit v5, KIP-890):
        the group's partition is added to the transaction here (``add_offsets``), as the group
        coordinator of a Kafka broker adds it, instead of checked."""
        try:
            if transaction_version >= TRANSACTION_VERSION_2:
                self.add_offsets(principal=principal, transactional_id=transactional_id, producer_id=producer_id,
                                 producer_epoch=producer_epoch, group_id=group_id,
                                 transaction_version=transaction_version)
            else:
                self.check_offsets_in_txn(principal=principal, transactional_id=transactional_id,
                                          producer_id=producer_id, producer_epoch=producer_epoch, group_id=group_id)
            return groups.commit_offsets(principal=principal, group_id=group_id, commits=commits,
                                         generation_id=generation_id, member_id=member_id,
                                         group_instance_id=group_instance_id,
                                         txn_producer=(producer_id, producer_epoch))
        except LowtideError as err:
            return [(c, err) for c in commits]

    # -- descriptions (kafka-transactions list / describe, KIP-664) ------------------------------

    def list_transactions(self, *, principal: str, states: Sequence[str] = (), producer_ids: Sequence[int] = (),
                          running_longer_than_ms: int = 0) -> list[TxnState]:
        """Every transactional id's state the principal may DESCRIBE, filtered as Kafka filters."""
        now = now_ms()
        out = []
        for st in sorted(self._store.states(), key=lambda st: st.transactional_id):
            if not self._may_describe(principal, st.transactional_id):
                continue
            if states and st.state not in states:
                continue
            if producer_ids and st.producer_id not in producer_ids:
                continue
            if running_longer_than_ms > 0 and (st.state != ONGOING or now - st.start_ms < running_longer_than_ms):
                continue
            out.append(st)
        return out

    def describe_transactions(self, *, principal: str, transactional_ids: Sequence[str]) -> list[Described]:
        """Each id's state, or why there is none (not authorized, not found)."""
        out: list[Described] = []
        for transactional_id in transactional_ids:
            if not self._may_describe(principal, transactional_id):
                out.append((transactional_id, None, TransactionalIdAuthorizationFailed(
                    f"{principal} is not authorized to DESCRIBE on TRANSACTIONAL_ID {transactional_id!r}")))
                continue
            st = self._store.load(transactional_id)
            error = None if st is not None else TransactionalIdNotFound(
                f"no transaction state for {transactional_id!r}")
            out.append((transactional_id, st, error))
        return out

    def end_txn(self, *, principal: str, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool, transaction_version: int = TRANSACTION_VERSION_1) -> tuple[int, int]:
        """Commit or abort: returns, once every partition of the transaction holds its marker, the
        (producer id, epoch) the producer goes on with: its own in version 1; in version 2
        (EndTxn v5, ``txn_v2.py``) the bumped epoch, or a new id when the epoch ran out."""
        self._require_id(principal, transactional_id)
        if transaction_version >= TRANSACTION_VERSION_2:
            return self._end_txn_v2(transactional_id, producer_id, producer_epoch, commit=commit)
        st = self._checked(transactional_id, producer_id, producer_epoch)
        prepare, complete = (PREPARE_COMMIT, COMPLETE_COMMIT) if commit else (PREPARE_ABORT, COMPLETE_ABORT)
        if st.state == complete:
            return st.producer_id, st.producer_epoch  # a retried EndTxn whose first attempt finished
        if st.state == prepare:
            self._complete(st)  # a retried EndTxn whose first attempt did not finish
            return st.producer_id, st.producer_epoch
        if st.state != ONGOING:
            raise InvalidTxnState(f"cannot {'commit' if commit else 'abort'} the transaction of "
                                  f"{transactional_id!r}: it is {st.state}")
        saved = self._store.save(replace(st, state=prepare))
        if saved is None:
            raise ConcurrentTransactions(f"the state of {transactional_id!r} changed meanwhile; retry")
        self._complete(saved)
        return saved.producer_id, saved.producer_epoch

    def _end_txn_v2(self, transactional_id: str, producer_id: int, producer_epoch: int, *,
                    commit: bool) -> tuple[int, int]:
        for _ in range(10):
            st = self._store.load(transactional_id)
            target = decide_end_txn(st, producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                                    new_producer_id=self._store.next_producer_id, now_ms=now_ms())
            if target.state in (COMPLETE_COMMIT, COMPLETE_ABORT):
                return answer_of(target)  # a retried EndTxn whose first attempt finished
            if target is not st:
                saved = self._store.save(target)  # the Prepare* state, epoch bumped, before any marker
                if saved is None:
                    continue  # another front door moved the state: decide again on the new one
                target = saved
            self._complete(target)
            return answer_of(target)
        raise ConcurrentTransactions(f"the state of {transactional_id!r} keeps changing; retry")

    # -- expiry ------------------------------------------------------------------------------------

    def expire(self, *, now: int | None = None) -> int:
        """Abort (with an epoch bump) every transaction past its timeout, complete abandoned
        Prepare* states, and forget transactional ids idle past ``transactional.id.expiration.ms``
        (Empty or decided ones only, as Kafka); returns how many transactions it ended."""
        now = now_ms() if now is None else now
        ended = 0
        for st in self._store.states():
            transactional_id = st.transactional_id
            try:
                if st.state == ONGOING and now - st.start_ms > st.timeout_ms:
                    log.info("transaction of %r timed out after %d ms: aborting it", transactional_id, st.timeout_ms)
                    ended += self._abort_fencing(st)
                elif st.state in (PREPARE_COMMIT, PREPARE_ABORT) and now - st.updated_ms > ABANDONED_PREPARE_MS:
                    ended += self._complete(st)
                elif st.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and \
                        now - st.updated_ms >= self._id_expiration_ms and self._store.delete(st):
                    log.info("transactional id %r expired after %d ms without use", transactional_id,
                             now - st.updated_ms)
            except LowtideError as err:
                log.warning("transaction of %r not ended yet: %s", transactional_id, err)
        return ended

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="txn-expiry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.expire()
            except (LowtideError, OSError) as err:
                log.warning("transaction expiry scan failed: %s", err)

    # -- internals ---------------------------------------------------------------------------------

    def _join(self, transactional_id: str, producer_id: int, producer_epoch: int,
              wanted: Sequence[TopicPartition], *, transaction_version: int) -> None:
        """Add ``wanted`` to the producer's transaction, starting one if none is ongoing, of
        ``transaction_version`` (the add that starts it says which protocol its client speaks;
        a client of version 1 whose Produce is v12 adds its partitions before, so its transaction
        stays version 1)."""
        st = self._checked(transactional_id, producer_id, producer_epoch)
        if st.state in (PREPARE_COMMIT, PREPARE_ABORT):
            raise ConcurrentTransactions(f"the transaction of {transactional_id!r} is being completed")
        if st.state == ONGOING and set(wanted) <= st.partitions:
            return  # a retry, or a partition already in: nothing to write
        new = replace(st, partitions=st.partitions | set(wanted))
        if st.state != ONGOING:
            new = replace(new, state=ONGOING, start_ms=now_ms(), transaction_version=transaction_version)
        if self._store.save(new) is None:
            raise ConcurrentTransactions(f"the state of {transactional_id!r} changed meanwhile; retry")

    def _may_describe(self, principal: str, transactional_id: str) -> bool:
        return self._authorizer.authorize(principal=principal, operation=AclOperation.DESCRIBE,
                                          resource_type=ResourceType.TRANSACTIONAL_ID, resource_name=transactional_id)

    def _require_id(self, principal: str, transactional_id: str) -> None:
        if not transactional_id:
            raise InvalidRequest("a transactional id is required")
        if not self._authorizer.authorize(principal=principal, operation=AclOperation.WRITE,
                                          resource_type=ResourceType.TRANSACTIONAL_ID,
                                          resource_name=transactional_id):
            raise TransactionalIdAuthorizationFailed(
                f"{principal} is not authorized to WRITE on TRANSACTIONAL_ID {transactional_id!r}")

    def _check_partitions(self, principal: str, wanted: list[TopicPartition]) -> dict[TopicPartition, LowtideError]:
        topics = self._metadata.topics()
        failed: dict[TopicPartition, LowtideError] = {}
        for topic, partition in wanted:
            if not self._authorizer.authorize(principal=principal, operation=AclOperation.WRITE,
                                              resource_type=ResourceType.TOPIC, resource_name=topic):
                failed[(topic, partition)] = TopicAuthorizationFailed(
                    f"{principal} is not authorized to WRITE on TOPIC {topic!r}")
            elif topic not in topics or not 0 <= partition < topics[topic].partitions:
                failed[(topic, partition)] = UnknownTopicOrPartition(f"partition {topic}-{partition} does not exist")
        return failed

    def _checked(self, transactional_id: str, producer_id: int, producer_epoch: int) -> TxnState:
        st = self._store.load(transactional_id)
        if st is None or st.producer_id != producer_id:
            raise InvalidProducerIdMapping(f"producer id {producer_id} is not the one of {transactional_id!r}")
        if producer_epoch < st.producer_epoch:
            raise ProducerFenced(f"producer epoch {producer_epoch} of {transactional_id!r} is fenced by epoch "
                                 f"{st.producer_epoch}")
        if producer_epoch > st.producer_epoch:
            raise InvalidProducerEpoch(f"producer epoch {producer_epoch} of {transactional_id!r} is newer than "
                                       f"{st.producer_epoch}")
        return st

    def _abort_fencing(self, st: TxnState) -> int:
        """Abort ``st``'s ongoing transaction with the epoch bumped (fencing its producer; by 2 in
        version 2, ``txn_v2.fenced_epoch``)."""
        saved = self._store.save(replace(st, producer_epoch=fenced_epoch(st), state=PREPARE_ABORT))
        return self._complete(saved) if saved is not None else 0

    def _complete(self, st: TxnState) -> int:
        """Write the markers of a Prepare* state, then move it to Complete* (``txn_v2.completed``:
        the new producer id of an epoch overflow becomes the producer's); 1 if this call did."""
        commit = st.state == PREPARE_COMMIT
        if st.partitions:
            self._write_markers(st, commit=commit)
            if self._offsets_written is not None and any(t == OFFSETS_TOPIC for t, _ in st.partitions):
                self._offsets_written()
        if self._store.save(completed(st)) is None:
            return 0
        TRANSACTIONS_ENDED.labels("2" if is_version_2(st) else "1", "commit" if commit else "abort").inc()
        return 1

    def _route_diskless(self, routes: Routes, *, attempt: int) -> None:
        """Send the markers of diskless partitions (no replica hosts them: the routing knows no
        leader and calls them unknown) to a live broker, another on each attempt: any replica
        commits a diskless partition's marker through its coordinator shard, as it commits its
        produced batches (docs/design/diskless.md#transactions)."""
        if not routes.unknown:
            return
        topics = self._metadata.topics()
        keys = [k for k in routes.unknown if k[0] in topics and topics[k[0]].diskless
                and 0 <= k[1] < topics[k[0]].partitions]
        if not keys:
            return
        brokers = self._metadata.brokers()
        live = sorted(i for i in self._metadata.live_broker_ids(brokers) if brokers[i].address)
        for key in keys:
            del routes.unknown[key]
            if not live:
                routes.unroutable[key] = BrokerNotAvailable(f"{key[0]}-{key[1]}: no live broker for its marker")
                continue
            routes.by_address.setdefault(brokers[live[attempt % len(live)]].address, []).append(key)

    def _write_markers(self, st: TxnState, *, commit: bool) -> None:
        """One WriteTxnMarkers per leader, leaders in turn; partitions whose leader moved or is
        unreachable are retried after a metadata read until MARKER_DEADLINE_S. A deleted topic
        needs no marker; a leader that refuses one for good (a newer epoch wrote there) is logged."""
        pending = set(st.partitions)
        deadline = time.monotonic() + MARKER_DEADLINE_S
        backoff = 0.02
        attempt = 0
        while pending:
            routes = route_partitions(self._metadata, sorted(pending))
            self._route_diskless(routes, attempt=attempt)
            attempt += 1
            for key in routes.unknown:
                pending.discard(key)
            for address, keys in routes.by_address.items():
                marker = TxnMarkerRequest(producer_id=st.producer_id, producer_epoch=st.producer_epoch,
                                          commit=commit, partitions=tuple(keys))
                try:
                    results = self._replicas.write_txn_markers(address, [marker], timeout_ms=10_000,
                                                               deadline_s=12.0)
                except LowtideError as err:
                    if not err.retriable:
                        raise
                    continue
                for r in results:
                    if r.error is None or isinstance(r.error, UnknownTopicOrPartition):
                        pending.discard((r.topic, r.partition))
                    elif not r.error.retriable:
                        log.warning("marker of %r on %s-%d refused: %s", st.transactional_id, r.topic,
                                    r.partition, r.error)
                        pending.discard((r.topic, r.partition))
            if pending:
                if time.monotonic() > deadline:
                    raise RequestTimedOut(f"markers of {st.transactional_id!r} not written to {sorted(pending)} "
                                          f"within {MARKER_DEADLINE_S:.0f} s; the coordinator keeps trying")
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.5)
