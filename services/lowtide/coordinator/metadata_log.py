"""The metadata log of a diskless coordinator shard: partition K of the internal topic
``__diskless_metadata`` on the replicas (KIP-1164: the metadata partitions are the coordinators).

Layout on the replicas: one topic, ``__diskless_metadata``, with one partition per shard (the
KIP's ``diskless.metadata.topic.num.partitions``), so shard K's log is the partition directory
``__diskless_metadata-K`` of every replica holding it. Why one topic and not one per shard: it is
the KIP's layout and name, the partition is what the issue and the operators' tools call
``__diskless_metadata-k``, and one topic config (delete policy, infinite retention) covers every
shard. The cost: adding shards later means adding partitions, which lowtide's topic admin cannot do
yet, so a shard K beyond the topic's partition count refuses to start (it says so in its log).

Each mutating request becomes one record batch (Kafka RecordBatch v2, ``lowtide.record``) whose
record values are ``coordinator.records`` values, keys null; concurrent requests' batches go to
the leader in one Produce, consecutive in the log. Appends are acks=all, so an acknowledged batch
is below the high watermark and survives any single replica's loss.

Fencing (docs/design/diskless.md#fencing-by-epoch): the batches' producer id and epoch are the
shard's writer id for its coordinator epoch (``writer_id``): one producer id, whose Kafka producer
epoch is the coordinator epoch. The replica's producer state refuses a batch whose producer epoch
is below the id's current one (INVALID_PRODUCER_EPOCH, Kafka's producer fencing, checked for a
coordinator's appends too), so once a successor's EpochStarted is in the log no append of a lower
epoch lands, whatever the deposed process believes about its lease. An epoch has 15 bits in the
batch: every 32,768 epochs the producer id moves on, and across that one boundary the conditional
append on the log end (below) is what fences. The topic's ``producer.id.expiration.ms`` is set
past any pause, so the replicas never forget the id's epoch.

Creating the topic, the append loop with its retry policy and the leader calls' back-off are the
internal topics' runtime's (``lowtide.internal_topics``); what is the coordinator's stays here: the
topic's own replica assignment (the coordinator may not use the front door's topic admin), the
cached leader and its replication listener, and the transport (``_produce_steps``: the framed
listener on the shard's event loop, gRPC as the fallback), which the runtime's ``Appender`` takes
as a parameter.

Thread-safety: ``MetadataLog`` is used by the shard's appender, loader and snapshot threads at
once; it holds no per-call state besides a cached leader address (a plain attribute swap).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from lowtide.client.replica import ReplicaClient
from lowtide.errors import (
    LeaderNotAvailable,
    LowtideError,
    NotEnoughReplicas,
    NotLeaderOrFollower,
    UnknownTopicOrPartition,
)
from lowtide.internal_topics import Appender, AppendPolicy, InternalTopicSpec, call_leader, ensure_topic, grpc_produce
from lowtide.messages.replica import FetchPosition, ProducedPartition
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore, assign_replicas
from lowtide.record import decode_batches
from lowtide.rpc.framed.callers import ListenerProducer, ListenerUnreachable
from lowtide.rpc.steps import Steps, run_blocking

log = logging.getLogger(__name__)
T = TypeVar("T")

METADATA_TOPIC = "__diskless_metadata"
# Replicated like Kafka's internal topics; never deleted by time or size: only DeleteRecords below
# a snapshot removes entries.
# The writer id's epoch must outlive any pause of a deposed shard: 100 years, not Kafka's 1 day.
METADATA_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1",
                         "producer.id.expiration.ms": str(100 * 365 * 86_400_000)}
# The shards' writer ids: a range of producer ids no idempotent Kafka producer is given (the front
# door hands those out from 0 up), one per 32,768 coordinator epochs.
WRITER_ID_BASE = 1 << 61
EPOCHS_PER_WRITER_ID = 1 << 15
MAX_REPLICATION_FACTOR = 3
FETCH_MAX_BYTES = 8 << 20
# After the leader's replication listener could not be reached, how long appends use gRPC.
LISTENER_RETRY_S = 30.0
# Produce answers that mean "nothing was appended": safe to send the same batches again.
NOT_WRITTEN = (LeaderNotAvailable, NotLeaderOrFollower, UnknownTopicOrPartition, NotEnoughReplicas)


def _not_written(error: LowtideError) -> bool:
    return isinstance(error, NOT_WRITTEN)


# ``append`` explains each: only answers that say nothing was written are retried, a failed call is
# raised as it is (the caller reloads from the log), and each attempt waits the whole timeout.
METADATA_APPENDS = AppendPolicy(retry_on=_not_written, call_errors_final=True, whole_timeout_each_attempt=True)


def writer_id(epoch: int) -> tuple[int, int]:
    """(producer id, producer epoch) of the batches a shard appends in coordinator ``epoch``."""
    return WRITER_ID_BASE + epoch // EPOCHS_PER_WRITER_ID, epoch % EPOCHS_PER_WRITER_ID


@dataclass(frozen=True, slots=True)
class LogEntry:
    offset: int
    value: bytes


@dataclass(frozen=True, slots=True)
class LogRead:
    """One fetch of the metadata partition: the entries from the asked offset up to the HW."""

    entries: list[LogEntry]
    high_watermark: int
    log_end_offset: int
    log_start_offset: int


class MetadataLog:
    """Shard ``shard``'s partition of ``__diskless_metadata``: create, append, read, truncate.

    Contract: as each method says; appends are acks=all (``append``), reads return only committed
    entries. It is also the ``LeaderRouter`` of its ``Appender`` (the cached leader) and, through
    ``_produce_steps``, its transport.

    Thread-safety: module doc (a cached leader address, swapped as a plain attribute).
    """

    def __init__(self, *, shard: int, shards: int, store: MetadataStore, replicas: ReplicaClient,
                 request_timeout_ms: int = 10_000, listener: ListenerProducer | None = None) -> None:
        self.shard = shard
        self.shards = shards
        self.store = store
        self.replicas = replicas
        self.request_timeout_ms = request_timeout_ms
        # Appends go to the leader's replication listener when it advertises one (a unary gRPC
        # Produce per append costs both ends ~0.5 ms of CPU: docs/design/diskless.md#cost-per-commit).
        self.listener = listener
        self._leader: str | None = None
        self._leader_listener: str | None = None
        self._listener_retry_at = 0.0
        self._grpc_produce = grpc_produce(replicas, METADATA_TOPIC)
        self._appender = Appender(topic=METADATA_TOPIC, router=self, produce=self._produce_steps,
                                  policy=METADATA_APPENDS)

    # ---- topic ---------------------------------------------------------------------------------
    def topic_exists(self) -> bool:
        """Whether ``__diskless_metadata`` exists; if it does, it must have a partition for us."""
        try:
            info = self.store.topic(METADATA_TOPIC)
        except UnknownTopicOrPartition:
            return False
        self._check_partition(info.partitions)
        return True

    def _check_partition(self, partitions: int) -> None:
        if self.shard >= partitions:
            raise UnknownTopicOrPartition(
                f"{METADATA_TOPIC} has {partitions} partitions: shard {self.shard} has no metadata log "
                f"(adding partitions is not supported; recreate the cluster with more shards)")

    def ensure_topic(self) -> None:
        """Create ``__diskless_metadata`` with ``shards`` partitions if missing (whoever starts
        first wins; the store's create is atomic). Raises while no replica is live."""
        spec = InternalTopicSpec(name=METADATA_TOPIC, partitions=self.shards, config=METADATA_TOPIC_CONFIG)
        info, _ = ensure_topic(self.store, spec, self._create_topic)
        assert info is not None
        self._check_partition(info.partitions)

    def _create_topic(self, spec: InternalTopicSpec) -> TopicInfo:
        """Create the topic with RF = min(3, live replicas), its leaders spread from this shard's."""
        live = sorted(self.store.live_broker_ids())
        if not live:
            raise LeaderNotAvailable(f"no live replica to host {spec.name}")
        rf = min(MAX_REPLICATION_FACTOR, len(live))
        assignment = assign_replicas(broker_ids=live, partitions=spec.partitions, replication_factor=rf,
                                     start=self.shard % len(live), racks=self.store.broker_racks())
        return self.store.create_topic(name=spec.name, partitions=spec.partitions, replication_factor=rf,
                                       config=dict(spec.config), assignment=assignment)

    # ---- routing (the appender's LeaderRouter) -------------------------------------------------
    def cached_leader(self, partition: int) -> str | None:
        return self._leader

    def find_leader(self, partition: int, *, refresh: bool) -> str:
        return self.leader_address(refresh=refresh)

    def forget_leader(self, partition: int) -> None:
        self._leader = None

    def leader_address(self, *, refresh: bool = False) -> str:
        if self._leader is not None and not refresh:
            return self._leader
        state = self.store.partition_state(METADATA_TOPIC, self.shard)
        if state.leader < 0:
            raise LeaderNotAvailable(f"{METADATA_TOPIC}-{self.shard} has no leader")
        broker = self.store.brokers().get(state.leader)
        if broker is None:
            raise LeaderNotAvailable(f"{METADATA_TOPIC}-{self.shard}: leader {state.leader} is not registered")
        self._leader = broker.address
        self._leader_listener = (f"{broker.host}:{broker.replication_port}" if self.listener is not None and
                                 broker.replication_port and time.monotonic() >= self._listener_retry_at else None)
        return self._leader

    def _produce_steps(self, address: str, partition: int, batches: bytes, *, timeout_ms: int,
                       expected_end_offset: int | None,
                       loop: asyncio.AbstractEventLoop | None) -> Steps[ProducedPartition]:
        """The appender's transport (``ProduceSteps``): one acks=all Produce of ``batches`` to the
        leader at ``address``: on its replication listener if it has one (on ``loop``'s
        connections when given), else (or while the listener is unreachable) over gRPC."""
        partitions = [(METADATA_TOPIC, partition, batches)]
        kwargs: dict[str, Any] = dict(
            acks=-1, timeout_ms=timeout_ms, deadline_s=timeout_ms / 1000 + 5, coordinator_append=True,
            expected_end_offsets=None if expected_end_offset is None else
            {(METADATA_TOPIC, partition): expected_end_offset})
        listener = self._leader_listener
        if listener is not None and self.listener is not None:
            try:
                if loop is not None:
                    got = yield from self.listener.produce_steps(listener, partitions, loop=loop, **kwargs)
                else:
                    got = self.listener.produce(listener, partitions, **kwargs)
                return got[0]
            except ListenerUnreachable as exc:  # nothing was sent: gRPC for a while
                log.warning("%s-%d: the leader's replication listener at %s is unreachable (%s); appending over "
                            "gRPC for %.0f s", METADATA_TOPIC, self.shard, listener, exc, LISTENER_RETRY_S)
                self._listener_retry_at = time.monotonic() + LISTENER_RETRY_S
                self._leader_listener = None
        return (yield from self._grpc_produce(address, partition, batches, timeout_ms=timeout_ms,
                                              expected_end_offset=expected_end_offset, loop=loop))

    def _with_leader(self, action: Callable[[str], T], *, deadline: float) -> T:
        """Run ``action(address)`` against the leader, re-resolving it while leadership moves."""
        return call_leader(action, router=self, partition=self.shard, deadline=deadline)

    # ---- append / read / truncate ------------------------------------------------------------
    def append(self, batches: bytes, *, timeout_ms: int | None = None, expected_end_offset: int | None = None) -> int:
        """Append encoded batches with acks=all; the base offset of the first.

        ``expected_end_offset``: a conditional append (replica.proto ``expected_log_end_offset``):
        OUT_OF_ORDER_SEQUENCE_NUMBER, nothing appended, unless the log ends there and the batches'
        producer id wrote its last batch.

        Retried only on answers that say the batches were not written (no leader yet, not the
        leader, not enough in-sync replicas: all refused before the append, as in Kafka). Any other
        failure (a timeout, a lost connection) may or may not have left them in the log, so it is
        raised and the caller reloads from the log. One exception: NOT_LEADER_OR_FOLLOWER also
        answers an append whose leadership moved while it waited for the ISR, which may have
        survived on the new leader; with ``expected_end_offset`` the retry is then refused
        (OUT_OF_ORDER_SEQUENCE_NUMBER) instead of adding the batches a second time."""
        return run_blocking(self.append_steps(batches, timeout_ms=timeout_ms, expected_end_offset=expected_end_offset))

    def append_steps(self, batches: bytes, *, timeout_ms: int | None = None, expected_end_offset: int | None = None,
                     loop: asyncio.AbstractEventLoop | None = None) -> Steps[int]:
        """``append`` as steps (rpc/steps.py). With ``loop`` (driven on that loop's thread) the
        Produce goes on the loop's own connections to the leader's replication listener, so its
        answer lands on the loop that answers the shard's brokers (coordinator/service.py); what
        may block (a leader lookup in the metadata store, a Produce over gRPC) is a ``Blocking``."""
        # Not a generator itself: the appender's steps are handed out as they are (no extra frame
        # per step on the hot path).
        return self._appender.append_steps(self.shard, batches, timeout_ms=timeout_ms or self.request_timeout_ms,
                                           expected_end_offset=expected_end_offset, loop=loop)

    def read(self, offset: int, *, max_wait_ms: int = 0) -> LogRead:
        """The committed entries (below the HW) from ``offset`` on, as far as one fetch reaches.
        OFFSET_OUT_OF_RANGE when ``offset`` is below the log start (a snapshot must cover it)."""
        deadline = time.monotonic() + self.request_timeout_ms / 1000

        def fetch(address: str):
            got = self.replicas.fetch(address, [FetchPosition(topic=METADATA_TOPIC, partition=self.shard,
                                                              fetch_offset=offset, max_bytes=FETCH_MAX_BYTES)],
                                      max_wait_ms=max_wait_ms, max_bytes=FETCH_MAX_BYTES,
                                      deadline_s=max_wait_ms / 1000 + 10)[0]
            if got.error is not None:
                raise got.error
            return got

        got = self._with_leader(fetch, deadline=deadline)
        entries = []
        for _header, records in decode_batches(got.records):
            entries.extend(LogEntry(r.offset, r.value or b"") for r in records
                           if offset <= r.offset < got.high_watermark)
        return LogRead(entries=entries, high_watermark=got.high_watermark, log_end_offset=got.log_end_offset,
                       log_start_offset=got.log_start_offset)

    def read_to_end(self, offset: int, *, settle_timeout_s: float = 30.0) -> Iterator[LogEntry]:
        """Every committed entry from ``offset`` on, until nothing more can come: the reader is
        at the HW and the HW equals the log end (no append of an earlier leader is still in flight
        to be committed or truncated). Raises REQUEST_TIMED_OUT-like errors of the fetch."""
        settle_until = time.monotonic() + settle_timeout_s
        while True:
            got = self.read(offset)
            for entry in got.entries:
                yield entry
                offset = entry.offset + 1
            if not got.entries and offset >= got.high_watermark:
                offset = max(offset, got.high_watermark)
                if got.high_watermark >= got.log_end_offset or time.monotonic() > settle_until:
                    return
                time.sleep(0.05)

    def delete_below(self, offset: int) -> int:
        """KIP-107 DeleteRecords on the metadata partition itself; the new low watermark."""
        deadline = time.monotonic() + self.request_timeout_ms / 1000

        def delete(address: str) -> int:
            got = self.replicas.delete_records(address, [(METADATA_TOPIC, self.shard, offset)],
                                               timeout_ms=self.request_timeout_ms,
                                               deadline_s=self.request_timeout_ms / 1000 + 5)[0]
            if got.error is not None:
                raise got.error
            return got.low_watermark

        return self._with_leader(delete, deadline=deadline)
