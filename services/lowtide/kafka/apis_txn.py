"""Transactions over the Kafka protocol (KIP-98, KIP-447, KIP-664): the front door's transaction
coordinator (``lowtide.frontdoor.transactions``, ``Call.front.transactions``: in process in a front
door, over its Admin gRPC service from a replica) answers, as every group request does;
DescribeProducers and WriteTxnMarkers are answered by the replica of this process, in process
(``KafkaServices.producer_states`` and ``txn_markers``, the handlers its Replica servicer calls:
DescribeProducers by any replica of the partition, from its own log, as Kafka's brokers answer it;
WriteTxnMarkers by the partition's leader). Every call takes and answers ``lowtide.messages`` types.

What a Kafka transactional producer sends, and where it goes here::

    FindCoordinator(TRANSACTION)  any broker (apis_admin.find_coordinator): each forwards to the front door
    InitProducerId                -> init_producer_id               (also idempotent producers: no id)
    AddPartitionsToTxn v0-3       -> add_partitions                 (transactions version 1 only)
    Produce (transactional)       the leaders, as any produce; v12 adds its partition first
                                  (apis_data.produce -> add_partitions, version 2)
    AddOffsetsToTxn               -> add_offsets                    (the group's __consumer_offsets partition;
                                                                     version 1 only)
    TxnOffsetCommit v0-4          -> commit_offsets                 (offsets pending until the marker)
    TxnOffsetCommit v5            -> commit_offsets, version 2      (adds the group's partition first)
    EndTxn v0-4                   -> end_txn                        (the producer keeps its epoch)
    EndTxn v5                     -> end_txn, version 2             (the epoch bumped, answered: KIP-890)

Transactions version 2 (KIP-890 part 2) is what a Kafka 4 producer speaks once ApiVersions
finalizes the feature ``transaction.version`` at 2 (``kafka/features.py``; the listener's
``--kafka-transaction-version``): no AddPartitionsToTxn nor AddOffsetsToTxn, EndTxn v5, Produce
v12, TxnOffsetCommit v5. The coordinator's rules are ``frontdoor/transactions/txn_v2.py``'s.

AddPartitionsToTxn v4-5 is Kafka's broker-to-broker form (KIP-890 part 1: a batch of
transactions, each ``verify_only`` or not), answered per transaction by the same coordinator
calls; a verify-only partition outside the ongoing transaction is TRANSACTION_ABORTABLE at v5,
INVALID_TXN_STATE at v4 (which predates that error). Kafka asks CLUSTER_ACTION for it; here
each transaction's WRITE on its TRANSACTIONAL_ID is checked, as at v0-3.

``kafka-transactions`` (KIP-664) uses ListTransactions, DescribeTransactions (the coordinator's
states) and DescribeProducers (a replica's producer state). ``kafka-transactions abort``
(Kafka's ``Admin.abortTransaction``) sends WriteTxnMarkers v1-2 with one ABORT marker to the
partition's leader, which answers it as the coordinator's markers are answered::

    DescribeProducers             -> replica's describe_producers   (READ on the topic, per partition;
                                                                     leader or follower)
    WriteTxnMarkers v1-2          -> replica's write_txn_markers    (CLUSTER_ACTION on the cluster)

A WriteTxnMarkers the replica refuses as a whole (CLUSTER_AUTHORIZATION_FAILED) answers every
partition of every marker with that error, as Kafka's ``getErrorResponse`` does, so the client
can tell which abort failed. The marker's ``transaction_version`` (v2, KIP-890) is not used: the
replica takes any marker whose epoch is not below the producer's.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from lowtide.errors import (
    BrokerNotAvailable,
    ConcurrentTransactions,
    CoordinatorLoadInProgress,
    CoordinatorNotAvailable,
    InvalidTxnState,
    LowtideError,
    NetworkException,
    NotCoordinator,
    NotEnoughReplicas,
    NotLeaderOrFollower,
    RequestTimedOut,
    TransactionAbortable,
    UnknownServerError,
)
from lowtide.kafka.apis_admin import coordinator_among, live_kafka_brokers
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code, millis
from lowtide.messages import TopicPartition
from lowtide.messages.admin import TRANSACTION_VERSION_1, TRANSACTION_VERSION_2, OffsetCommit
from lowtide.messages.replica import ProducedPartition, ProduceItem, TxnMarkerRequest, TxnMarkerResult
from lowtide.record.batch import BATCH_HEADER_SIZE, BatchHeader, read_header
from lowtide.rpc.steps import Blocking, Steps

INIT_PRODUCER_ID_KEY = 22
ADD_PARTITIONS_TO_TXN_KEY, ADD_OFFSETS_TO_TXN_KEY, END_TXN_KEY, TXN_OFFSET_COMMIT_KEY = 24, 25, 26, 28
WRITE_TXN_MARKERS_KEY = 27
DESCRIBE_PRODUCERS_KEY, DESCRIBE_TRANSACTIONS_KEY, LIST_TRANSACTIONS_KEY = 61, 65, 66


def _code(error: LowtideError | None) -> int:
    return 0 if error is None else error.code


@contextmanager
def _reachable() -> Iterator[None]:
    """A coordinator that cannot be reached right now is, to a Kafka client, COORDINATOR_NOT_AVAILABLE:
    the one answer every transactional request handles by finding the coordinator again and
    retrying (a NETWORK_EXCEPTION from EndTxn is fatal to the Java producer). The remote coordinator
    (``lowtide.client.frontdoor.transactions``) answers a failed call so; this does the same for
    what escapes a call in process (a store that timed out) where the coordinator's answer has no
    error of its own to carry it (add, commit, list and describe)."""
    try:
        yield
    except (NetworkException, RequestTimedOut, BrokerNotAvailable) as err:
        raise CoordinatorNotAvailable(
            f"the transaction coordinator is unreachable: {err.name}: {err.message}") from None


def _every_partition(partitions: Sequence[tuple[str, int]], error: LowtideError) -> dict[tuple[str, int], int]:
    """A whole-call failure as every asked partition's error, not the broker's generic answer: that
    one has empty lists, and the Java producer fails on an AddPartitionsToTxn answer without its
    partitions (a NullPointerException in its I/O thread)."""
    return dict.fromkeys(partitions, error.code)


def _v3(body: Any, name: str) -> Any:
    """AddPartitionsToTxn v0-3 fields are named ``v3_and_below_*`` by kio."""
    return getattr(body, f"v3_and_below_{name}")


# -- the producer's calls ----------------------------------------------------------------------
# InitProducerId, AddOffsetsToTxn and EndTxn answer any error of the coordinator (or of the call)
# as the response's error code, as the front door's servicer answers them.
def init_producer_id(call: Call, body: Any) -> Any:
    try:
        producer_id, epoch = call.front.transactions.init_producer_id(
            principal=call.principal(), transactional_id=body.transactional_id or "",
            timeout_ms=millis(body.transaction_timeout))
        code = 0
    except LowtideError as err:
        producer_id, epoch, code = -1, -1, err.code
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(code),
                     producer_id=producer_id, producer_epoch=epoch)


def add_partitions_to_txn(call: Call, body: Any) -> Any:
    if call.version >= 4:
        return _add_partitions_batched(call, body)
    partitions = [TopicPartition(t.name, p) for t in _v3(body, "topics") for p in t.partitions]
    try:
        with _reachable():
            results = {(t, p): _code(e) for t, p, e in call.front.transactions.add_partitions(
                principal=call.principal(), transactional_id=_v3(body, "transactional_id"),
                producer_id=_v3(body, "producer_id"), producer_epoch=_v3(body, "producer_epoch"),
                partitions=partitions)}
    except LowtideError as err:
        results = _every_partition(partitions, err)
    return call.make(call.response, throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=tuple(
        call.make("AddPartitionsToTxnTopicResult", name=t.name, results_by_partition=tuple(
            call.make("AddPartitionsToTxnPartitionResult", partition_index=p,
                      partition_error_code=error_code(results.get((t.name, p), -1)))
            for p in t.partitions)) for t in _v3(body, "topics")))


def _add_partitions_batched(call: Call, body: Any) -> Any:
    """AddPartitionsToTxn v4-5 (module docstring): one coordinator call per transaction."""
    answers = []
    for txn in body.transactions:
        partitions = [TopicPartition(t.name, p) for t in txn.topics for p in t.partitions]
        verify_only = bool(txn.verify_only)
        try:
            with _reachable():
                codes = {(t, p): _code(e) for t, p, e in call.front.transactions.add_partitions(
                    principal=call.principal(), transactional_id=txn.transactional_id, producer_id=txn.producer_id,
                    producer_epoch=txn.producer_epoch, partitions=partitions, verify_only=verify_only,
                    transaction_version=TRANSACTION_VERSION_2 if call.version >= 5 and not verify_only
                    else TRANSACTION_VERSION_1)}
        except LowtideError as err:
            codes = _every_partition(partitions, err)
        if call.version < 5:
            codes = {k: InvalidTxnState.code if c == TransactionAbortable.code else c for k, c in codes.items()}
        answers.append(call.make("AddPartitionsToTxnResult", transactional_id=txn.transactional_id, topic_results=tuple(
            call.make("AddPartitionsToTxnTopicResult", name=t.name, results_by_partition=tuple(
                call.make("AddPartitionsToTxnPartitionResult", partition_index=p,
                          partition_error_code=error_code(codes.get((t.name, p), -1)))
                for p in t.partitions)) for t in txn.topics)))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0),
                     results_by_transaction=tuple(answers))


# -- Produce v12: the implicit add (KIP-890 part 2) ----------------------------------------------
# Version-2 producers send no AddPartitionsToTxn: the leader adds the partition of a transactional
# Produce v12 to the transaction before appending it, as a Kafka broker does (it sends
# AddPartitionsToTxn to the coordinator itself). So a produce the coordinator would not accept (an
# epoch a later EndTxn or InitProducerId bumped past) is never appended, and every partition
# holding the transaction's data gets its marker. Retriable coordinator errors become
# NOT_ENOUGH_REPLICAS, Kafka's choice: retriable, and no metadata refresh.
PRODUCE_IMPLICIT_ADD_VERSION = 12
_RETRY_AS_NOT_ENOUGH_REPLICAS = (ConcurrentTransactions, CoordinatorNotAvailable, CoordinatorLoadInProgress,
                                 NotCoordinator, NetworkException, RequestTimedOut)


def add_produced_partitions(call: Call, transactional_id: str, items: Sequence[ProduceItem]
                            ) -> Steps[tuple[list[ProduceItem], list[ProducedPartition]]]:
    """Steps: the items to append, and the answers of those refused, after the implicit add of
    every partition whose batch is transactional (its header, read as bytes: one per partition)
    and not already in the producer's ongoing transaction as this leader's log shows it (the
    first batch of a transaction at a partition asks the coordinator, the next ones do not)."""
    wanted: dict[tuple[int, int], list[TopicPartition]] = {}
    producer = call.services.producer
    for item in items:
        head = _transactional_header(item.records)
        if head is not None and not producer.in_transaction(item.topic, item.partition, head.producer_id,
                                                            head.producer_epoch):
            wanted.setdefault((head.producer_id, head.producer_epoch), []).append(
                TopicPartition(item.topic, item.partition))
    refused: dict[tuple[str, int], LowtideError] = {}
    for (producer_id, epoch), partitions in wanted.items():
        refused.update((yield Blocking(functools.partial(
            _add_for_produce, call, transactional_id, producer_id, epoch, partitions))))
    if not refused:
        return list(items), []
    return ([i for i in items if (i.topic, i.partition) not in refused],
            [ProducedPartition(topic=t, partition=p, error=e) for (t, p), e in refused.items()])


def _transactional_header(records: bytes) -> BatchHeader | None:
    if len(records) < BATCH_HEADER_SIZE:
        return None  # nothing to add: the replica refuses what is not a batch
    try:
        head = read_header(records)
    except LowtideError:
        return None
    return head if head.is_transactional and head.producer_id >= 0 else None


def _add_for_produce(call: Call, transactional_id: str, producer_id: int, epoch: int,
                     partitions: Sequence[TopicPartition]) -> dict[tuple[str, int], LowtideError]:
    """The partitions the coordinator refused to add, with the error the producer gets."""
    try:
        with _reachable():
            results = call.front.transactions.add_partitions(
                principal=call.principal(), transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=epoch, partitions=partitions, transaction_version=TRANSACTION_VERSION_2)
    except LowtideError as err:
        results = [(t, p, err) for t, p in partitions]
    out: dict[tuple[str, int], LowtideError] = {}
    for t, p, err in results:
        if err is None:
            continue
        if isinstance(err, _RETRY_AS_NOT_ENOUGH_REPLICAS):
            err = NotEnoughReplicas(f"{t}-{p} could not be added to the transaction of {transactional_id!r} "
                                    f"yet: {err.name}: {err.message}")
        out[(t, p)] = err
    return out


def add_offsets_to_txn(call: Call, body: Any) -> Any:
    try:
        call.front.transactions.add_offsets(principal=call.principal(), transactional_id=body.transactional_id,
                                            producer_id=body.producer_id, producer_epoch=body.producer_epoch,
                                            group_id=body.group_id)
        code = 0
    except LowtideError as err:
        code = err.code
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(code))


def txn_offset_commit(call: Call, body: Any) -> Any:
    commits = [OffsetCommit(topic=t.name, partition=p.partition_index, offset=p.committed_offset,
                            metadata=p.committed_metadata or "", leader_epoch=getattr(p, "committed_leader_epoch", -1))
               for t in body.topics for p in t.partitions]
    generation = getattr(body, "generation_id", -1)
    try:
        with _reachable():
            front = call.front
            # The coordinator checks the transaction, then commits to the groups (one place, both doors).
            results = {(c.topic, c.partition): _code(e) for c, e in front.transactions.commit_offsets(
                principal=call.principal(), groups=front.groups, transactional_id=body.transactional_id,
                producer_id=body.producer_id, producer_epoch=body.producer_epoch, group_id=body.group_id,
                commits=commits, generation_id=generation if generation >= 0 else -1,
                member_id=getattr(body, "member_id", "") or "",
                group_instance_id=getattr(body, "group_instance_id", None) or "",
                transaction_version=TRANSACTION_VERSION_2 if call.version >= 5 else TRANSACTION_VERSION_1)}
    except LowtideError as err:
        results = _every_partition([(c.topic, c.partition) for c in commits], err)
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(
        call.make("TxnOffsetCommitResponseTopic", name=t.name, partitions=tuple(
            call.make("TxnOffsetCommitResponsePartition", partition_index=p.partition_index,
                      error_code=error_code(results.get((t.name, p.partition_index), -1)))
            for p in t.partitions)) for t in body.topics))


def end_txn(call: Call, body: Any) -> Any:
    """EndTxn; v5 (transactions version 2) answers the producer id and epoch the producer goes on
    with (the bumped epoch), -1 on error as Kafka."""
    try:
        producer_id, epoch = call.front.transactions.end_txn(
            principal=call.principal(), transactional_id=body.transactional_id, producer_id=body.producer_id,
            producer_epoch=body.producer_epoch, commit=bool(body.committed),
            transaction_version=TRANSACTION_VERSION_2 if call.version >= 5 else TRANSACTION_VERSION_1)
        code = 0
    except LowtideError as err:
        producer_id, epoch, code = -1, -1, err.code
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(code),
                     producer_id=producer_id, producer_epoch=epoch)


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
    with _reachable():
        found = call.front.transactions.list_transactions(
            principal=call.principal(), states=[s for s in states if s in _STATES],
            producer_ids=list(body.producer_id_filters),
            running_longer_than_ms=max(0, int(getattr(body, "duration_filter", -1))))
    listed = coordinated_here(call, found)
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
    with _reachable():
        described = call.front.transactions.describe_transactions(
            principal=call.principal(), transactional_ids=list(body.transactional_ids))
    states = []
    for transactional_id, st, err in described:
        topics: dict[str, list[int]] = {}
        for t, p in sorted(st.partitions) if st is not None else ():
            topics.setdefault(t, []).append(p)
        states.append(call.make(
            "TransactionState", error_code=error_code(_code(err)), transactional_id=transactional_id,
            transaction_state=st.state if st is not None else "",
            transaction_timeout=datetime.timedelta(milliseconds=st.timeout_ms if st is not None else 0),
            transaction_start_time=_time(st.start_ms if st is not None else -1),
            producer_id=st.producer_id if st is not None else -1,
            producer_epoch=st.producer_epoch if st is not None else -1,
            topics=tuple(call.make("TopicData", topic=t, partitions=tuple(ps)) for t, ps in topics.items())))
    return call.make(call.response, throttle_time=NO_THROTTLE, transaction_states=tuple(states))


def describe_producers(call: Call, body: Any) -> Any:
    handler = call.services.producer_states
    if handler is None:  # a front door's listener: no partition here
        results = {}
    else:
        results = {(r.topic, r.partition): r for r in handler.describe_producers(call.principal(), [
            TopicPartition(t.name, p) for t in body.topics for p in t.partition_indexes])}
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
                "PartitionResponse", partition_index=p, error_code=error_code(_code(r.error)),
                error_message=r.error.message if r.error is not None else None, active_producers=tuple(
                    call.make("ProducerState", producer_id=s.producer_id, producer_epoch=s.producer_epoch,
                              last_sequence=s.last_sequence, last_timestamp=s.last_timestamp,
                              coordinator_epoch=s.coordinator_epoch,
                              current_txn_start_offset=s.current_txn_start_offset)
                    for s in r.producers)))
        topics.append(call.make("TopicResponse", name=t.name, partitions=tuple(parts)))
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(topics))


def txn_markers_request(body: Any) -> list[TxnMarkerRequest]:
    """A Kafka WriteTxnMarkers request as the replica's markers, in order (``transaction_result``
    true is COMMIT)."""
    return [TxnMarkerRequest(producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                             commit=bool(m.transaction_result), coordinator_epoch=m.coordinator_epoch,
                             partitions=tuple(TopicPartition(t.name, p) for t in m.topics for p in t.partition_indexes))
            for m in body.markers]


def txn_marker_codes(body: Any, answer: Sequence[Sequence[TxnMarkerResult]] | LowtideError
                     ) -> list[dict[tuple[str, int], int]]:
    """Per marker of ``body`` (in order), (topic, partition) -> error code: the replica's answer
    for that marker, or ``answer``'s code everywhere when the whole call failed. A partition the
    answer lacks is UNKNOWN_SERVER_ERROR."""
    asked = [[(t.name, p) for t in m.topics for p in t.partition_indexes] for m in body.markers]
    if isinstance(answer, LowtideError):
        return [dict.fromkeys(keys, answer.code) for keys in asked]
    if len(answer) != len(asked):
        return [dict.fromkeys(keys, UnknownServerError.code) for keys in asked]
    out = []
    for keys, results in zip(asked, answer, strict=True):
        found = {(r.topic, r.partition): _code(r.error) for r in results}
        out.append({k: found.get(k, UnknownServerError.code) for k in keys})
    return out


def write_txn_markers(call: Call, body: Any) -> Any:
    answer: Sequence[Sequence[TxnMarkerResult]] | LowtideError
    handler = call.services.txn_markers
    if handler is None:
        answer = NotLeaderOrFollower("this listener leads no partition (a front door)")
    else:
        try:
            answer = handler.write_txn_markers(call.principal(), txn_markers_request(body))
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
    Api(ADD_PARTITIONS_TO_TXN_KEY, "AddPartitionsToTxn", 0, 5, add_partitions_to_txn),
    Api(ADD_OFFSETS_TO_TXN_KEY, "AddOffsetsToTxn", 0, 4, add_offsets_to_txn),
    Api(END_TXN_KEY, "EndTxn", 0, 5, end_txn),
    Api(WRITE_TXN_MARKERS_KEY, "WriteTxnMarkers", 1, 2, write_txn_markers),
    Api(TXN_OFFSET_COMMIT_KEY, "TxnOffsetCommit", 0, 5, txn_offset_commit),
    Api(DESCRIBE_PRODUCERS_KEY, "DescribeProducers", 0, 0, describe_producers),
    Api(DESCRIBE_TRANSACTIONS_KEY, "DescribeTransactions", 0, 0, describe_transactions),
    Api(LIST_TRANSACTIONS_KEY, "ListTransactions", 0, 1, list_transactions),
]
