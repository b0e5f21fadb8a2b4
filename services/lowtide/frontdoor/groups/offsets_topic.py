"""Committed offsets kept in the internal compacted topic ``__consumer_offsets`` (Kafka's home for
them), written by the front door and read back into memory.

Records are Kafka's OffsetCommitKey v1 / OffsetCommitValue v3 (``lowtide.groups.codec`` draws
them); a group's records all go to partition ``abs(hashCode(group)) % N``. The topic is created on
first need (a commit, or a migration from Redis): ``cleanup.policy=compact``, RF = min(3, live
brokers), N = ``--offsets-topic-partitions`` (default 8; Kafka's ``offsets.topic.num.partitions``).

Why a topic and not Redis: offsets then live on the replicas' disks, replicated with acks=all
like any data, and survive a redis-server that loses its last second of writes on kill -9; group
deletion writes tombstones, so the log cleaner's KIP-534 delete horizon runs on real data; and the
replicas read the same records directly for broker-side consumed retention (no front door hop).

Reads: a background thread reads every partition from its log start offset to its high watermark
once (``loaded``; group reads wait for it, up to ``load_timeout_s``, else
COORDINATOR_LOAD_IN_PROGRESS), then keeps tailing, so commits made through another front door
show up within ``tail_interval_s`` while records come, within ``idle_tail_interval_s`` after a
quiet spell: each round that finds nothing new doubles the wait up to the latter (an idle front
door fetched from every leader five times a second, about a tenth of an idle cluster's CPU), and
one that finds something brings it back down. ``catch_up`` (OffsetFetch with require_stable)
reads a group's partition at once in any case, and ``nudge`` (the transaction coordinator, once it
wrote markers here) makes the tail read at once. Writes: one batch per call to the partition's leader with
acks=all; only an acknowledged write is applied to the in-memory state, at the log offsets the
leader assigned (``groups.state`` explains why that makes own writes and the tail agree).

Creating the topic, routing, the append and its retries, and the reading loop are the internal
topics' runtime's (``lowtide.internal_topics``, bound for the front door in
``frontdoor/internal_topics.py``); this module keeps the records, the tail thread and the API.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lowtide.client.replica import ReplicaClient
from lowtide.clock import now_ms
from lowtide.errors import CoordinatorLoadInProgress, InvalidProducerEpoch, ProducerFenced
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.internal_topics import FrontDoorRouter, create_with_admin, new_appender
from lowtide.groups import (
    OFFSETS_TOPIC,
    CommittedEntry,
    OffsetKey,
    OffsetRecord,
    OffsetValue,
    encode_offset_key,
    encode_offset_value,
    partition_for_group,
)
from lowtide.groups.consumer_codec import ConsumerKey, ConsumerValue, encode_consumer_key, encode_consumer_value
from lowtide.groups.state import ConsumerRecord
from lowtide.groups.tail import OffsetsTail
from lowtide.internal_topics import InternalTopic, InternalTopicSpec, grpc_fetch, grpc_settled
from lowtide.metadata.store import MetadataStore
from lowtide.record import encode_batch

log = logging.getLogger(__name__)

DEFAULT_OFFSETS_TOPIC_PARTITIONS = 8
# Kafka's offsets.topic.segment.bytes: small enough for the cleaner to get at old segments.
OFFSETS_TOPIC_SEGMENT_BYTES = 100 * 1024 * 1024
FETCH_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class OffsetsTopicConfig:
    partitions: int = DEFAULT_OFFSETS_TOPIC_PARTITIONS
    tail_interval_s: float = 0.2
    idle_tail_interval_s: float = 1.0
    load_timeout_s: float = 15.0
    write_timeout_ms: int = 10_000
    fetch_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class OffsetWrite:
    """One key to write: a commit, or a tombstone (``value`` None)."""

    key: OffsetKey
    value: OffsetValue | None


class OffsetsTopic:
    """Writes to and materializes ``__consumer_offsets`` (module doc).

    Contract: ``write`` returns only after the leader acknowledged the batch with acks=all, and
    only then changes what ``entries``/``group_ids`` return; it raises COORDINATOR_NOT_AVAILABLE
    (or the leader's non-retriable error) otherwise, having changed nothing here. Readers
    (``entries``, ``group_ids``) wait for the first full load.

    Thread-safety: thread-safe; one lock guards the per-partition folds, the tail thread and
    request threads take it for short, I/O-free sections.
    """

    def __init__(self, *, store: MetadataStore, replicas: ReplicaClient, topics: TopicAdmin,
                 config: OffsetsTopicConfig = OffsetsTopicConfig(), clock: Callable[[], int] = now_ms) -> None:
        self._store = store
        self._topics = topics
        self.config = config
        self._clock = clock
        self._cond = threading.Condition()
        self._tail = OffsetsTail()
        self._topic = InternalTopic(
            spec=InternalTopicSpec(name=OFFSETS_TOPIC, partitions=config.partitions, config={
                "cleanup.policy": "compact", "segment.bytes": str(OFFSETS_TOPIC_SEGMENT_BYTES)}),
            store=store, create=create_with_admin(topics))
        self._router = FrontDoorRouter(store=store, topic=OFFSETS_TOPIC)
        self._appender = new_appender(store=store, replicas=replicas, topic=OFFSETS_TOPIC)
        self._fetch = grpc_fetch(replicas, OFFSETS_TOPIC, max_bytes=FETCH_MAX_BYTES, deadline_s=config.fetch_timeout_s)
        self._settled = grpc_settled(replicas, OFFSETS_TOPIC, timeout_s=config.fetch_timeout_s)
        self._loaded = False
        self._load_problem = "not started"
        self._stop = threading.Event()
        # Set by ``nudge``: the tail reads at once and goes back to its short interval.
        self._nudged = threading.Event()
        self._thread: threading.Thread | None = None
        self._after_load: list[Callable[[], bool]] = []

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="offsets-tail", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._nudged.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def nudge(self) -> None:
        """Read at once, not after an idle wait: this front door's transaction coordinator wrote
        markers to ``__consumer_offsets``, and the offsets they commit should be served (by
        OffsetFetch without require_stable too) as soon as EndTxn returns, as Kafka serves them."""
        self._nudged.set()

    def run_after_load(self, task: Callable[[], bool]) -> None:
        """Run ``task`` on the tail thread once loaded, again each round until it returns True
        (the Redis migration uses this)."""
        self._after_load.append(task)

    @property
    def loaded(self) -> bool:
        with self._cond:
            return self._loaded

    def wait_loaded(self, timeout_s: float | None = None) -> None:
        """Block until the first full read of the topic is done; COORDINATOR_LOAD_IN_PROGRESS if not
        within ``timeout_s`` (default ``config.load_timeout_s``)."""
        deadline = time.monotonic() + (self.config.load_timeout_s if timeout_s is None else timeout_s)
        with self._cond:
            while not self._loaded:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CoordinatorLoadInProgress(
                        f"{OFFSETS_TOPIC} is still being loaded ({self._load_problem}); retry shortly")
                self._cond.wait(left)

    # -- reads ---------------------------------------------------------------------------------
    def entries(self, group: str) -> list[CommittedEntry]:
        """The latest commit of every (topic, partition) of ``group``."""
        self.wait_loaded()
        return self._tail.entries(group=group)

    def group_ids(self) -> list[str]:
        self.wait_loaded()
        return sorted({e.key.group for e in self._tail.entries()})

    # -- writes --------------------------------------------------------------------------------
    def pending(self, group: str) -> set[tuple[str, int]]:
        """(topic, partition) of ``group`` holding offsets of an undecided transaction."""
        self.wait_loaded()
        return self._tail.pending_keys(group=group)

    def partition_of(self, group: str) -> int:
        """The ``__consumer_offsets`` partition of ``group`` (creating the topic if missing)."""
        count = self._topic.partition_count(create=True)
        assert count is not None
        return partition_for_group(group, partitions=count)

    def catch_up(self, group: str) -> None:
        """Read ``group``'s partition up to its leader's high watermark now (not at the next tail
        round): what any front door had acknowledged before this call is then folded in.
        COORDINATOR_LOAD_IN_PROGRESS when the leader cannot be read."""
        self.wait_loaded()
        failures = self._tail.read_to_high_watermark([self.partition_of(group)], route=self._router.route,
                                                     fetch=self._fetch)
        if failures:
            raise CoordinatorLoadInProgress(f"{OFFSETS_TOPIC}: {next(iter(failures.values()))}")

    def write(self, group: str, writes: Sequence[OffsetWrite], *, producer: tuple[int, int] | None = None) -> None:
        """Append ``writes`` (all of one group) as one batch with acks=all, then fold them in.

        ``producer`` (producer id, epoch): the batch belongs to that producer's transaction
        (Kafka's TxnOffsetCommit): the tail folds it, as pending until its marker; an older epoch
        than the partition has seen is refused by the leader (PRODUCER_FENCED here)."""
        if not writes:
            return
        partition = self.partition_of(group)
        now = self._clock()
        pid, epoch = producer if producer is not None else (-1, -1)
        batch = encode_batch([None if w.value is None else encode_offset_value(w.value) for w in writes],
                             keys=[encode_offset_key(w.key) for w in writes], timestamp_ms=now,
                             producer_id=pid, producer_epoch=epoch, is_transactional=producer is not None)
        try:
            base_offset = self._appender.append(partition, batch, timeout_ms=self.config.write_timeout_ms)
        except InvalidProducerEpoch as err:
            raise ProducerFenced(err.message) from None
        if producer is not None:
            # Left to the tail (and to ``catch_up``, which OffsetFetch with require_stable calls):
            # applied here, the records could arrive after the tail had already read them and the
            # marker deciding them (a transaction aborted by its timeout meanwhile), and would then
            # wait as pending for a marker that is behind them.
            return
        self._tail.apply(partition, [OffsetRecord(key=w.key, value=w.value, log_offset=base_offset + i)
                                     for i, w in enumerate(writes)])

    def write_consumer(self, group: str, records: Sequence[tuple[ConsumerKey, ConsumerValue | None]]) -> None:
        """Append KIP-848 consumer group records (``None`` value: a tombstone) of ``group`` as one
        batch with acks=all, then fold them in; the same contract as ``write``."""
        if not records:
            return
        partition = self.partition_of(group)
        encoded = [(encode_consumer_key(k), None if v is None else encode_consumer_value(v)) for k, v in records]
        batch = encode_batch([v for _, v in encoded], keys=[k for k, _ in encoded], timestamp_ms=self._clock())
        base_offset = self._appender.append(partition, batch, timeout_ms=self.config.write_timeout_ms)
        self._tail.apply(partition, [ConsumerRecord(key=k, value=v, log_offset=base_offset + i)
                                     for i, (k, (_, v)) in enumerate(zip((k for k, _ in records), encoded,
                                                                          strict=True))])

    def consumer_records(self, group: str | None = None) -> list[ConsumerRecord]:
        """The live KIP-848 records of ``group`` (or of every group), in log order."""
        self.wait_loaded()
        return self._tail.consumer_records(group=group)

    # -- the tail ------------------------------------------------------------------------------
    def _run(self) -> None:
        wait_s = self.config.tail_interval_s
        while not self._stop.is_set():
            before = self._tail.positions()
            try:
                caught_up = self.poll_once()
            except Exception as exc:  # noqa: BLE001 - Redis or replica hiccups must not end the tail
                caught_up = False
                self._note_problem(f"{type(exc).__name__}: {exc}")
            if caught_up:
                with self._cond:
                    if not self._loaded:
                        self._loaded = True
                        log.info("loaded %s", OFFSETS_TOPIC, extra={"fields": {
                            "groups": len({e.key.group for e in self._tail.entries()})}})
                    self._cond.notify_all()
                self._after_load = [task for task in self._after_load if not self._run_task(task)]
            quiet = caught_up and self._loaded and not self._after_load and self._tail.positions() == before
            wait_s = min(wait_s * 2, self.config.idle_tail_interval_s) if quiet else self.config.tail_interval_s
            if self._nudged.wait(wait_s):
                self._nudged.clear()
                wait_s = self.config.tail_interval_s

    def _note_problem(self, problem: str) -> None:
        with self._cond:
            if problem != self._load_problem:
                log.warning("cannot read %s: %s", OFFSETS_TOPIC, problem)
            self._load_problem = problem

    @staticmethod
    def _run_task(task: Callable[[], bool]) -> bool:
        try:
            return task()
        except Exception:  # noqa: BLE001 - retried next round
            log.exception("post-load task failed; retrying")
            return False

    def poll_once(self) -> bool:
        """Read every partition up to the high watermark its leader reports; True when all are
        caught up (a topic that does not exist yet is: there is nothing to read)."""
        info = self._store.topics().get(OFFSETS_TOPIC)
        if info is None:
            return True
        self._topic.note_partitions(info.partitions)
        # Before the first load counts, every leader's HW must be settled (``grpc_settled``): a
        # front door started on a load read to a lagging HW would serve older committed offsets
        # and consumer group states than it had acknowledged.
        failures = self._tail.read_to_high_watermark(range(info.partitions), route=self._router.route,
                                                     fetch=self._fetch,
                                                     settled=None if self.loaded else self._settled)
        if failures:
            partition, why = min(failures.items())
            self._note_problem(f"{OFFSETS_TOPIC}-{partition}: {why}")
        return not failures
