"""lowtide.v1.Replica servicer: unpack, authorize, call the ReplicaManager, build the reply.

Every call is authenticated and its partitions screened by ``AccessControl`` (Kafka's checks per
API, see ``ReplicaServicer``) before the manager sees them: a refused partition is answered here
with TOPIC_AUTHORIZATION_FAILED and never reaches the request paths, so it changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from lowtide.auth.access import AccessControl
from lowtide.auth.acl import AclOperation
from lowtide.diskless.broker import DisklessBroker
from lowtide.errors import InvalidRequest, NotLeaderOrFollower
from lowtide.messages.admin import DeleteRequestItem
from lowtide.messages.replica import (
    EpochQuery,
    FetchPosition,
    FetchSessionRound,
    OffsetQuery,
    ProduceItem,
)
from lowtide.messages.share import ShareFetchAnswer, ShareFetchAsk, SharePartitionAnswer
from lowtide.replica.delete_records_handler import DeleteRecordsRequestHandler
from lowtide.replica.describe_producers_handler import DescribeProducersHandler
from lowtide.replica.fetch_handler import FetchHandler
from lowtide.replica.leader_epoch_handler import OffsetForLeaderEpochHandler
from lowtide.replica.list_offsets_handler import ListOffsetsHandler
from lowtide.replica.manager import ReplicaManager
from lowtide.replica.metrics import (
    REPLICATION_ROUNDS,
    REPLICATION_STREAMS,
)
from lowtide.replica.partition import LEADER
from lowtide.replica.produce_handler import ProduceHandler
from lowtide.replica.registration import parse_produce_request
from lowtide.replica.share_handler import ShareHandler
from lowtide.replica.txn_markers_handler import TxnMarkersHandler
from lowtide.rpc.convert import error_kwargs
from lowtide.rpc.convert import share as convert_share
from lowtide.rpc.convert import transactions as convert_txn
from lowtide.rpc.framed.codec import PRODUCE, REQUEST
from lowtide.rpc.framed.session import FrameDispatcher, parse_request
from lowtide.rpc.messages import delete_results_to_proto
from lowtide.rpc.steps import Steps, run_blocking
from lowtide.share.partitions import SharePartitions
from lowtide_pb import common_pb2, replica_pb2, replica_pb2_grpc, transactions_pb2

DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
FRAMED_TRANSPORT = "socket"  # lowtide_replication_rounds_total{transport} of the replication listener


def _epoch(message) -> int:
    """A request's ``optional current_leader_epoch``; -1 (unchecked) when unset."""
    return message.current_leader_epoch if message.HasField("current_leader_epoch") else -1


class _StreamCancelHook:
    """One cancellation callback per stream, handed to each round in turn: gRPC's
    ``add_callback`` registers for the whole call, so registering per round would pile up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: Callable[[], None] | None = None
        self.fired = False

    def register(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._current = callback
            fired = self.fired
        if fired:
            callback()

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            callback = self._current
        if callback is not None:
            callback()


class ReplicaServicer(replica_pb2_grpc.ReplicaServicer):
    """The ``lowtide.v1.Replica`` gRPC service over a ReplicaManager: protobuf in and out only.

    Authorization (auth on; every call needs a valid token first), per partition as Kafka does:
    Produce WRITE on the topic; consumer Fetch READ; ListOffsets DESCRIBE; DeleteRecords DELETE;
    OffsetForLeaderEpoch DESCRIBE; DescribeProducers READ (topic ACLs only, as Kafka). ListOffsets,
    DeleteRecords and OffsetForLeaderEpoch also accept CLUSTER_ACTION on the CLUSTER (brokers, and
    the front door acting for a caller it authorized).
    A follower Fetch (``replica_id`` >= 0), and every request of a Replicate stream, needs
    CLUSTER_ACTION and must come from ``User:broker-<replica_id>``, else the whole call fails;
    DescribeLogs needs DESCRIBE on the CLUSTER. ShareFetch/ShareAcknowledge (KIP-932): the share
    handler's checks, as for the Kafka listener (READ on the GROUP, READ on each topic).

    Thread-safety: stateless; gRPC calls it from many threads and the manager is thread-safe.
    """

    def __init__(self, manager: ReplicaManager, *, access: AccessControl | None = None,
                 diskless: DisklessBroker | None = None, share_partitions: SharePartitions | None = None) -> None:
        self.manager = manager
        self.access = access or AccessControl.allow_all()
        self.diskless = diskless  # KIP-1164: Produce/consumer Fetch of diskless partitions go there
        # Produce's policy, shared with the Kafka listener (which calls it with no protobuf).
        self.producer = ProduceHandler(manager=manager, access=self.access, diskless=diskless)
        self.fetcher = FetchHandler(manager=manager, access=self.access, diskless=diskless)
        self.offsets = ListOffsetsHandler(manager=manager, access=self.access, diskless=diskless)
        self.deleter = DeleteRecordsRequestHandler(manager=manager, access=self.access, diskless=diskless)
        self.epochs = OffsetForLeaderEpochHandler(manager=manager, access=self.access, diskless=diskless)
        self.txn_markers = TxnMarkersHandler(manager=manager, access=self.access, diskless=diskless)
        self.producer_states = DescribeProducersHandler(manager=manager, access=self.access, diskless=diskless)
        # KIP-932's ShareFetch/ShareAcknowledge, shared with the Kafka listener: one request path.
        self.shares = None if share_partitions is None else ShareHandler(
            shares=share_partitions, manager=manager, access=self.access, diskless=diskless)
        self._draining = threading.Event()

    def _principal(self, context) -> str:
        return self.access.authenticate_call(context)

    def _diskless_kinds(self, partitions) -> list:
        """Per partition, its diskless topic's TopicInfo, or None for a classic topic."""
        if self.diskless is None:
            return [None] * len(partitions)
        return [self.diskless.topic(p.topic) for p in partitions]

    def Produce(self, request, context):
        return self.produce(request, self._principal(context))

    def produce(self, request, principal: str) -> replica_pb2.ProduceResponse:
        """``Produce`` for an authenticated ``principal`` (the gRPC method, the replication listener)."""
        return run_blocking(self.produce_steps(request, principal))

    def produce_steps(self, request, principal: str) -> Steps[replica_pb2.ProduceResponse]:
        """``produce`` as steps: the handler's (replica/produce_handler.py), protobuf in and out."""
        produced = yield from self.producer.produce_steps(principal, [ProduceItem(
            topic=p.topic, partition=p.partition, records=p.records,
            current_leader_epoch=p.current_leader_epoch if p.HasField("current_leader_epoch") else None,
            expected_log_end_offset=p.expected_log_end_offset if p.HasField("expected_log_end_offset") else None)
            for p in request.partitions], acks=request.acks, timeout_ms=request.timeout_ms,
            coordinator_append=request.coordinator_append)
        return replica_pb2.ProduceResponse(partitions=[replica_pb2.ProduceResult(
            topic=r.topic, partition=r.partition, error_code=r.error.code if r.error else 0,
            error_message=r.error.message if r.error else "", base_offset=r.base_offset,
            log_start_offset=r.log_start_offset, log_append_time_ms=r.log_append_time_ms) for r in produced])

    def Fetch(self, request, context):
        response = self._fetch(request, self._principal(context), peer=context.peer(),
                               on_cancel=context.add_callback)
        if request.replica_id >= 0:
            REPLICATION_ROUNDS.labels(str(request.replica_id), "fetch").inc()
        return response

    def Replicate(self, request_iterator, context):
        """A follower's replication stream: each request is a follower Fetch, answered in order
        (see replica.proto). Authenticated once when the stream opens; every request is still
        checked (CLUSTER_ACTION, ``replica_id`` = the authenticated broker) before it is read or
        recorded. Ends when the caller goes away or this server drains."""
        principal = self._principal(context)
        hook = _StreamCancelHook()
        context.add_callback(hook.fire)
        peer = context.peer()
        follower = -1
        try:
            for request in request_iterator:
                if request.replica_id < 0:
                    raise InvalidRequest("Replicate carries follower fetches: replica_id must be >= 0, "
                                         f"got {request.replica_id}; consumers use Fetch")
                if self._draining.is_set() or hook.fired:
                    return
                if request.replica_id != follower:
                    if follower >= 0:
                        REPLICATION_STREAMS.labels(str(follower)).dec()
                    follower = request.replica_id
                    REPLICATION_STREAMS.labels(str(follower)).inc()
                    rounds = REPLICATION_ROUNDS.labels(str(follower), "stream")
                response = self._fetch(request, principal, peer=peer, on_cancel=hook.register)
                rounds.inc()
                yield response
                if self._draining.is_set():
                    return
        finally:
            if follower >= 0:
                REPLICATION_STREAMS.labels(str(follower)).dec()

    def open_framed_session(self, principal: str, peer: str) -> _FramedSession:
        """The requests of one replication listener connection (lowtide.rpc.framed.listener)."""
        return _FramedSession(self, principal, peer)

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        """Shutting down: replication streams end after their current round (followers
        reconnect to whoever leads next) instead of holding the server's grace period."""
        self._draining.set()

    def _fetch(self, request, principal: str, *, peer: str, on_cancel) -> replica_pb2.FetchResponse:
        return run_blocking(self._fetch_steps(request, principal, peer=peer, on_cancel=on_cancel))

    def _fetch_steps(self, request, principal: str, *, peer: str, on_cancel) -> Steps[replica_pb2.FetchResponse]:
        """``Fetch`` as steps: the handler's (replica/fetch_handler.py), protobuf in and out."""
        outcomes = yield from self.fetcher.fetch_steps(principal, [FetchPosition(
            topic=p.topic, partition=p.partition, fetch_offset=p.fetch_offset, log_start_offset=p.log_start_offset,
            max_bytes=p.partition_max_bytes or DEFAULT_PARTITION_MAX_BYTES, current_leader_epoch=_epoch(p))
            for p in request.partitions], replica_id=request.replica_id, max_wait_ms=request.max_wait_ms,
            min_bytes=request.min_bytes, max_bytes=request.max_bytes, isolation_level=request.isolation_level,
            peer=peer, on_cancel=on_cancel, session=FetchSessionRound(
                session_id=request.session_id, epoch=request.session_epoch,
                forgotten=tuple((t.topic, t.partition) for t in request.forgotten))
            if request.session_epoch else None)
        return replica_pb2.FetchResponse(partitions=[
            replica_pb2.FetchResult(topic=o.topic, partition=o.partition,
                                    error_code=o.error.code if o.error else 0,
                                    error_message=o.error.message if o.error else "",
                                    high_watermark=o.high_watermark, log_start_offset=o.log_start_offset,
                                    log_end_offset=o.log_end_offset, leader_epoch=o.leader_epoch,
                                    records=o.records, last_stable_offset=o.last_stable_offset,
                                    aborted_transactions=[
                                        transactions_pb2.AbortedTransaction(producer_id=pid, first_offset=first)
                                        for pid, first in o.aborted_transactions])
            for o in outcomes])

    def ListOffsets(self, request, context):
        answers = self.offsets.list_offsets(self._principal(context), [OffsetQuery(
            topic=q.topic, partition=q.partition, timestamp=q.timestamp,
            current_leader_epoch=q.current_leader_epoch if q.HasField("current_leader_epoch") else None)
            for q in request.partitions], isolation_level=request.isolation_level)
        return common_pb2.ListOffsetsResponse(partitions=[common_pb2.ListOffsetsResult(
            topic=a.topic, partition=a.partition, offset=a.offset, timestamp=a.timestamp, leader_epoch=a.leader_epoch,
            **error_kwargs(a.error)) for a in answers])

    def DeleteRecords(self, request, context):
        return common_pb2.DeleteRecordsResponse(partitions=delete_results_to_proto(self.deleter.delete_records(
            self._principal(context), [DeleteRequestItem(topic=p.topic, partition=p.partition, offset=p.offset)
                                       for p in request.partitions], timeout_ms=request.timeout_ms)))

    def OffsetForLeaderEpoch(self, request, context):
        answers = self.epochs.offset_for_leader_epoch(self._principal(context), [EpochQuery(
            topic=q.topic, partition=q.partition, leader_epoch=q.leader_epoch, current_leader_epoch=_epoch(q))
            for q in request.partitions])
        return replica_pb2.OffsetForLeaderEpochResponse(partitions=[replica_pb2.EpochEndOffset(
            topic=a.topic, partition=a.partition, leader_epoch=a.leader_epoch, end_offset=a.end_offset,
            **error_kwargs(a.error)) for a in answers])

    def DescribeProducers(self, request, context):
        """KIP-664: the replica's DescribeProducersHandler (replica/describe_producers_handler.py)."""
        return convert_txn.producers_to_proto(self.producer_states.describe_producers(
            self._principal(context), convert_txn.producers_request_from_proto(request)))

    def WriteTxnMarkers(self, request, context):
        """KIP-98 markers: the replica's TxnMarkersHandler (replica/txn_markers_handler.py)."""
        markers = convert_txn.markers_from_proto(request)
        return convert_txn.marker_results_to_proto(markers, self.txn_markers.write_txn_markers(
            self._principal(context), markers, timeout_ms=request.timeout_ms))

    def ShareFetch(self, request, context):
        """KIP-932: the share handler's ShareFetch (replica/share_handler.py), as the Kafka listener's."""
        return convert_share.answer_to_proto(self._share(convert_share.fetch_from_proto(request), context))

    def ShareAcknowledge(self, request, context):
        return convert_share.answer_to_proto(self._share(convert_share.acknowledge_from_proto(request), context))

    def _share(self, ask: ShareFetchAsk, context) -> ShareFetchAnswer:
        principal = self._principal(context)
        if self.shares is None:
            error = NotLeaderOrFollower("this replica serves no share groups")
            return ShareFetchAnswer(partitions=tuple(SharePartitionAnswer(topic_id=p.topic_id, partition=p.partition,
                                                                          error=error) for p in ask.partitions))
        return self.shares.share_fetch(principal, ask)

    def DescribeLogs(self, request, context):
        self.access.require_cluster(self._principal(context), AclOperation.DESCRIBE)
        wanted = {(p.topic, p.partition) for p in request.partitions}
        live = self.manager.live_brokers
        logs = []
        for p in sorted(self.manager.partitions(), key=lambda p: p.key):
            if wanted and p.key not in wanted:
                continue
            plog = p.log
            logs.append(replica_pb2.LogInfo(
                topic=p.topic, partition=p.partition, role=p.role, leader_epoch=p.leader_epoch,
                leader=p.leader_id, log_start_offset=plog.log_start_offset, high_watermark=plog.high_watermark,
                log_end_offset=plog.log_end_offset,
                low_watermark=p.low_watermark(live) if p.role == LEADER else -1,
                size_bytes=plog.size_bytes, segments=plog.num_segments, isr=sorted(p.isr), dir=str(plog.dir)))
        return replica_pb2.DescribeLogsResponse(replica_id=self.manager.broker_id, logs=logs)


class _FramedSession(FrameDispatcher):
    """A replication listener connection's requests (lowtide.rpc.framed.listener), each checked
    and answered exactly as its gRPC method: REQUEST a round of ``Replicate`` (follower fetches
    only), PRODUCE a ``Produce``; the listener and ``FrameDispatcher`` do the rest. Thread-safety:
    the listener's loop only."""

    UNSERVED_KIND = "a replica's replication listener serves no frame of kind {kind} (a CALL is a coordinator shard's)"

    def __init__(self, servicer: ReplicaServicer, principal: str, peer: str) -> None:
        super().__init__(principal, peer)
        self.servicer = servicer
        self.follower = -1
        self._rounds = None  # the rounds counter's child for this follower
        self._gone = _StreamCancelHook()  # fired by the listener when the follower goes away

    def _produce_steps(self, payload: bytes) -> Steps[bytes]:
        request = parse_request(parse_produce_request, payload, "ProduceRequest")
        return (yield from self.servicer.produce_steps(request, self.principal)).SerializeToString()

    def _fetch_steps(self, payload: bytes) -> Steps[bytes]:
        fetch = parse_request(replica_pb2.FetchRequest.FromString, payload, "FetchRequest")
        if fetch.replica_id < 0:
            raise InvalidRequest("the replication listener carries follower fetches: replica_id must be >= 0, "
                                 f"got {fetch.replica_id}; consumers use Fetch")
        if fetch.replica_id != self.follower:
            self.close()
            self.follower = fetch.replica_id
            REPLICATION_STREAMS.labels(str(self.follower)).inc()
            self._rounds = REPLICATION_ROUNDS.labels(str(self.follower), FRAMED_TRANSPORT)
        # A parked round is released at once when its follower goes away (``cancel``).
        response = yield from self.servicer._fetch_steps(fetch, self.principal, peer=self.peer,
                                                         on_cancel=self._gone.register)
        self._rounds.inc()
        return response.SerializeToString()

    FRAMES = {PRODUCE: _produce_steps, REQUEST: _fetch_steps}

    def cancel(self) -> None:
        self._gone.fire()

    def close(self) -> None:
        if self.follower >= 0:
            REPLICATION_STREAMS.labels(str(self.follower)).dec()
            self.follower = -1
