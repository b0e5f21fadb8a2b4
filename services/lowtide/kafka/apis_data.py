"""Produce, Fetch and ListOffsets over the Kafka protocol: the replica's own gRPC servicer answers.

Record batches pass through as the bytes the client sent or the log holds: kio hands ``records``
over as one ``bytes`` object per partition and writes it back the same way, and the replica
validates produced batches in C (``lowtide.record.validate``). Nothing here looks at a record.

Fetch sessions (KIP-227): this broker creates none. A request with ``session_id`` 0 is a full fetch
answered with ``session_id`` 0, which tells the client no session exists, so it keeps sending full
fetches; a request naming a session gets FETCH_SESSION_ID_NOT_FOUND and the client starts over,
as from a broker that evicted its session.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

from lowtide.errors import NotLeaderOrFollower
from lowtide.kafka import apis_txn, produce_codec
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, EncodedBody, error_code, millis
from lowtide.messages.admin import OffsetQuery as AdminOffsetQuery
from lowtide.messages.replica import FetchPosition, OffsetQuery, ProducedPartition, ProduceItem
from lowtide.rpc.steps import Steps

FETCH_SESSION_ID_NOT_FOUND = 70
# A partition's Fetch budget when the request names none (Kafka's clients always name one).
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
PRODUCE_KEY, FETCH_KEY, LIST_OFFSETS_KEY = 0, 1, 2


def _time(ms: int) -> datetime.datetime | None:
    return None if ms < 0 else datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def _not_here(call: Call, topics: list[tuple[str, list[int]]], build) -> tuple:
    """Every partition answered NOT_LEADER_OR_FOLLOWER (a listener without replicas)."""
    code = error_code(NotLeaderOrFollower.code)
    return tuple(build(name, parts, code) for name, parts in topics)


# -- Produce ---------------------------------------------------------------------------------
def produce(call: Call, body: Any) -> Steps[Any]:
    """Steps (rpc/steps.py): the listener runs a Produce on its event loop; the acks=all wait
    for the followers is yielded, not slept on a thread. The replica's Produce handler is called
    in process with ``ProduceItem``s: no protobuf between the Kafka message and the log."""
    acks = int(body.acks)
    services = call.services
    # Never coordinator_append: a Kafka client's produce to an internal topic is refused by the
    # replica (INVALID_TOPIC_EXCEPTION) whoever it is; lowtide's coordinators write over gRPC.
    items = [ProduceItem(topic=t.name, partition=p.index, records=p.records or b"")
             for t in body.topic_data for p in t.partition_data]
    refused: list[ProducedPartition] = []
    if services.producer is None:
        produced = [ProducedPartition(topic=i.topic, partition=i.partition,
                                      error=NotLeaderOrFollower("no partitions are hosted here")) for i in items]
    else:
        principal = call.principal()
        if call.version >= apis_txn.PRODUCE_IMPLICIT_ADD_VERSION and body.transactional_id:
            # Transactions version 2: the transaction's coordinator adds the partitions first.
            items, refused = yield from apis_txn.add_produced_partitions(call, body.transactional_id, items)
        produced = []
        if items:
            produced = yield from services.producer.produce_steps(principal, items, acks=acks,
                                                                  timeout_ms=millis(body.timeout))
        produced = [*produced, *refused]
    if acks == 0:
        return None  # Kafka sends no response at all for acks=0
    results = {(r.topic, r.partition): r for r in produced}
    if produce_codec.MIN_VERSION <= call.version <= produce_codec.MAX_VERSION:
        return EncodedBody(produce_codec.encode_produce_response(call.version, [
            (t.name, [_answer(p.index, results.get((t.name, p.index))) for p in t.partition_data])
            for t in body.topic_data]), flexible=call.version >= produce_codec.FIRST_FLEXIBLE)
    responses = []
    for t in body.topic_data:
        parts = []
        for p in t.partition_data:
            a = _answer(p.index, results.get((t.name, p.index)))
            parts.append(call.make(
                "PartitionProduceResponse", index=p.index, error_code=error_code(a.error_code),
                base_offset=a.base_offset, log_append_time=_time(a.log_append_time_ms),
                log_start_offset=a.log_start_offset, record_errors=(), error_message=a.error_message))
        responses.append(call.make("TopicProduceResponse", name=t.name, partition_responses=tuple(parts)))
    return call.make(call.response, responses=tuple(responses), throttle_time=NO_THROTTLE, node_endpoints=())


def _answer(index: int, r: ProducedPartition | None) -> produce_codec.PartitionAnswer:
    if r is None:
        return produce_codec.PartitionAnswer(index, int(error_code(-1)), -1, -1, -1, None)
    if r.error is not None:
        return produce_codec.PartitionAnswer(index, int(error_code(r.error.code)), -1, -1, -1,
                                             r.error.message or None)
    return produce_codec.PartitionAnswer(index, 0, r.base_offset, r.log_append_time_ms, r.log_start_offset, None)


# -- Fetch -----------------------------------------------------------------------------------
def fetch(call: Call, body: Any) -> Steps[Any]:
    """Steps (rpc/steps.py), driven on one of the listener's worker threads (only Produce runs on
    its event loop), where the long poll parks. The replica's Fetch handler is called in process
    with ``FetchPosition``s: no protobuf, and the records answered are the bytes the log read."""
    session_id = getattr(body, "session_id", 0)
    if session_id:
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(FETCH_SESSION_ID_NOT_FOUND),
                         session_id=0, responses=())
    if int(body.replica_id) >= 0:
        # Followers replicate over gRPC (Replicate); a Kafka follower fetch is not served.
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(42), session_id=0,
                         responses=())
    isolation = int(getattr(body, "isolation_level", 0))
    items = []
    for t in body.topics:
        for p in t.partitions:
            epoch = getattr(p, "current_leader_epoch", -1)
            items.append(FetchPosition(topic=t.topic, partition=p.partition, fetch_offset=p.fetch_offset,
                                       max_bytes=p.partition_max_bytes or DEFAULT_PARTITION_MAX_BYTES,
                                       current_leader_epoch=epoch if epoch is not None and epoch >= 0 else -1))
    services = call.services
    if services.fetcher is None:
        results: dict = {}
    else:
        conn = call.conn
        principal = call.principal()
        fetched = yield from services.fetcher.fetch_steps(
            principal, items, max_wait_ms=millis(body.max_wait), min_bytes=int(body.min_bytes),
            max_bytes=int(getattr(body, "max_bytes", 0) or 0), isolation_level=isolation, peer=conn.peer,
            on_cancel=functools.partial(conn.on_close_slot, "fetch"))
        results = {(r.topic, r.partition): r for r in fetched}
    responses = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            r = results.get((t.topic, p.partition))
            if r is None:
                parts.append(call.make("PartitionData", partition_index=p.partition,
                                       error_code=error_code(NotLeaderOrFollower.code), high_watermark=-1,
                                       last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                                       preferred_read_replica=-1, records=b""))
                continue
            ok = r.error is None
            aborted = tuple(call.make("AbortedTransaction", producer_id=pid, first_offset=first)
                            for pid, first in r.aborted_transactions) if isolation else None
            parts.append(call.make(
                "PartitionData", partition_index=p.partition, error_code=error_code(0 if ok else r.error.code),
                high_watermark=r.high_watermark if ok else -1,
                last_stable_offset=(r.last_stable_offset if isolation else r.high_watermark) if ok else -1,
                log_start_offset=r.log_start_offset if ok else -1,
                aborted_transactions=aborted, preferred_read_replica=-1, records=bytes(r.records)))
        responses.append(call.make("FetchableTopicResponse", topic=t.topic, partitions=tuple(parts)))
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), session_id=0,
                     responses=tuple(responses))


# -- ListOffsets -----------------------------------------------------------------------------
def _epoch_or_none(p: Any) -> int | None:
    """The partition's ``current_leader_epoch`` (v4+; -1 or absent: unchecked) as the optional field
    takes it. Java clients send it, and a leader that restarted or was deposed must not answer from
    its stale state to a client that already knows the newer epoch (Kafka fences ListOffsets too)."""
    epoch = getattr(p, "current_leader_epoch", -1)
    return epoch if epoch is not None and epoch >= 0 else None


def _epoch_or_minus_one(p: Any) -> int:
    """The same epoch as the front door's ``OffsetQuery`` takes it (-1: unchecked)."""
    epoch = _epoch_or_none(p)
    return -1 if epoch is None else epoch


def list_offsets(call: Call, body: Any) -> Any:
    isolation = int(getattr(body, "isolation_level", 0))
    services = call.services
    if services.offsets is not None:
        # This replica answers in process, with no protobuf.
        principal = call.principal()
        answers = services.offsets.list_offsets(principal, [
            OffsetQuery(topic=t.name, partition=p.partition_index, timestamp=p.timestamp,
                        current_leader_epoch=_epoch_or_none(p)) for t in body.topics for p in t.partitions],
            isolation_level=isolation)
    else:
        # A front door's listener (no replica here): the front door asks the leaders itself.
        answers = call.front.topics.list_offsets(principal=call.principal(), queries=[
            AdminOffsetQuery(topic=t.name, partition=p.partition_index, timestamp=p.timestamp,
                             current_leader_epoch=_epoch_or_minus_one(p)) for t in body.topics for p in t.partitions],
            isolation_level=isolation)
    results = {(a.topic, a.partition): (a.error.code if a.error else 0, a) for a in answers}
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            code, r = results.get((t.name, p.partition_index), (-1, None))
            parts.append(call.make(
                "ListOffsetsPartitionResponse", partition_index=p.partition_index, error_code=error_code(code),
                timestamp=r.timestamp if r and not code else -1, offset=r.offset if r and not code else -1,
                leader_epoch=r.leader_epoch if r and not code and r.leader_epoch >= 0 else -1,
                old_style_offsets=()))
        topics.append(call.make("ListOffsetsTopicResponse", name=t.name, partitions=tuple(parts)))
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(topics))


APIS = [
    Api(PRODUCE_KEY, "Produce", 3, 12, produce),
    Api(FETCH_KEY, "Fetch", 4, 12, fetch),
    Api(LIST_OFFSETS_KEY, "ListOffsets", 1, 9, list_offsets),
]
