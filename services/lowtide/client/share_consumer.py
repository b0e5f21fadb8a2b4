"""``ShareConsumer``: a KIP-932 share group member over lowtide's gRPC (Kafka's ``KafkaShareConsumer``).

    with ShareConsumer("127.0.0.1:9092", group_id="workers") as consumer:
        consumer.subscribe(["jobs"])
        while True:
            for record in consumer.poll():
                handle(record)          # implicit mode: accepted by the next poll (or close)

Membership is the front door's share group coordinator (``ShareGroupHeartbeat``): the member
joins with epoch 0 and its own member id, heartbeats on the interval the coordinator answers,
on a thread of its own, and fetches from the partitions the coordinator assigns it (a partition
may be assigned to several members: the share-partition hands each its own records). Records come
from each partition's leader (``Replica.ShareFetch``), in a share session per leader: epoch 0
opens it with the partitions led there, each later request carries the next epoch and lists only
the partitions added or carrying acknowledgements (``forgotten`` the ones gone), -1 closes it and
releases what the member still holds there. Design: docs/design/kip-932-share-groups.md.

Records arrive as whole record batches plus the offset ranges acquired; only the acquired offsets
are decoded (``record.columns.columnize``, in C, one call per run of adjacent ranges), so a batch
another member holds part of is never delivered twice. ``poll_columns`` hands the columns
themselves (no Python object per record).

Errors: NOT_LEADER_OR_FOLLOWER and other stale-metadata errors refresh the metadata and the
partition is fetched from its new leader; a share session error (SHARE_SESSION_NOT_FOUND,
INVALID_SHARE_SESSION_EPOCH) or a leader gone reopens the session (epoch 0); an acknowledgement
refused with a retriable error is sent again, one refused for good (INVALID_RECORD_STATE: the lock
ran out, the records go to someone else) is reported to ``on_acknowledged`` and ``commit``'s
answer; anything else (authorization) is raised by ``poll``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lowtide.client.admin import Admin, open_connections
from lowtide.client.consumer import ConsumerRecord, records_from_columns
from lowtide.client.share_acks import HeldRecords, merge_ranges
from lowtide.errors import (
    FencedMemberEpoch,
    InvalidRequest,
    LeaderNotAvailable,
    LowtideError,
    ShareSessionNotFound,
    UnknownMemberId,
    UnknownTopicOrPartition,
)
from lowtide.messages import TopicPartition
from lowtide.messages.consumer_groups import ConsumerHeartbeat, ConsumerHeartbeatResult
from lowtide.messages.group_configs import SHARE_AUTO_OFFSET_RESET
from lowtide.messages.share import (
    ACCEPT,
    AcquiredRange,
    ShareAckBatch,
    ShareFetchAnswer,
    ShareFetchAsk,
    SharePartitionAsk,
    next_session_epoch,
)
from lowtide.record.columns import Columns, columnize
from lowtide.tls.config import ClientTls

log = logging.getLogger(__name__)

IMPLICIT, EXPLICIT = "implicit", "explicit"
# A leader parks a ShareFetch with nothing to acquire at most this long (replica/share_handler.py).
SERVER_MAX_WAIT_MS = 500
LEAVE_EPOCH = -1

AckCallback = Callable[[TopicPartition, Sequence[ShareAckBatch], LowtideError | None], None]
# A run of acquired records: its partition, its records as columns, the ranges (delivery counts).
Got = tuple[TopicPartition, Columns, tuple[AcquiredRange, ...]]


@dataclass(frozen=True, slots=True)
class ShareRecord(ConsumerRecord):
    """A record delivered to a share group member: a ``ConsumerRecord`` (as Kafka's share consumer
    returns one) and ``delivery_count``, how often it was delivered (1 the first time; more after a
    release or a lock that ran out)."""

    delivery_count: int = 1


@dataclass(slots=True)
class _Session:
    """This member's share session at one leader, as the leader has it after our last answer."""

    epoch: int = 0  # the epoch our next request carries (0: none open)
    partitions: frozenset[TopicPartition] = frozenset()


class _Membership:
    """The member's heartbeats at the front door's share group coordinator, and the assignment
    they answer. Thread-safety: its lock guards every field; the heartbeat thread and the
    consumer's thread both call it."""

    def __init__(self, heartbeat: Callable[[ConsumerHeartbeat], ConsumerHeartbeatResult], *, group_id: str,
                 member_id: str, client_id: str) -> None:
        self._send = heartbeat
        self.group_id, self.member_id, self.client_id = group_id, member_id, client_id
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._topics: tuple[str, ...] = ()
        self._send_topics = True
        self._epoch = 0
        self._interval_s = 5.0
        self._assignment: dict[TopicPartition, str] = {}  # (topic, partition) -> topic id
        self._error: LowtideError | None = None
        self._thread: threading.Thread | None = None

    def join(self, topics: Sequence[str]) -> None:
        """(Re)subscribe and heartbeat once now, so a refusal surfaces here; heartbeats go on on
        their own thread."""
        with self._lock:
            self._topics, self._send_topics = tuple(topics), True
        self.beat()
        self.raise_error()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"share-heartbeat-{self.group_id}", daemon=True)
            self._thread.start()

    def beat(self) -> None:
        with self._lock:
            epoch, topics = self._epoch, (self._topics if self._send_topics or self._epoch == 0 else None)
        result = self._send(ConsumerHeartbeat(group_id=self.group_id, member_id=self.member_id, member_epoch=epoch,
                                              subscribed_topic_names=topics, client_id=self.client_id))
        with self._lock:
            error = result.error
            if isinstance(error, (UnknownMemberId, FencedMemberEpoch)):
                # The coordinator forgot us (expired, restarted) or moved on: join again at once.
                log.info("share group %s: member %s rejoins (%s)", self.group_id, self.member_id, error.name)
                self._epoch, self._assignment, self._send_topics = 0, {}, True
                return
            if error is not None:
                if not error.retriable:
                    self._error = error
                return
            self._epoch = result.member_epoch
            self._send_topics = False
            self._interval_s = max(0.05, result.heartbeat_interval_ms / 1000)
            if result.assignment is not None:
                self._assignment = {(t.topic, p): t.topic_id for t in result.assignment for p in t.partitions}

    def _run(self) -> None:
        while True:
            with self._lock:
                wait = self._interval_s if self._epoch > 0 else 0.1
            if self._stop.wait(wait):
                return
            try:
                self.beat()
            except LowtideError as err:  # the front door unreachable: keep the assignment, try again
                log.debug("share group heartbeat failed: %s", err)

    def assignment(self) -> dict[TopicPartition, str]:
        with self._lock:
            return dict(self._assignment)

    def raise_error(self) -> None:
        with self._lock:
            error = self._error
        if error is not None:
            raise error

    def leave(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            joined = self._epoch > 0
        if joined:
            try:
                self._send(ConsumerHeartbeat(group_id=self.group_id, member_id=self.member_id,
                                             member_epoch=LEAVE_EPOCH, client_id=self.client_id))
            except LowtideError as err:  # its session times out instead
                log.debug("share group leave failed: %s", err)


class ShareConsumer:
    """A share group member (module doc): subscribe, poll, acknowledge, close.

    Contract:

    * ``subscribe(topics)`` joins the group (with ``auto_offset_reset``: first sets the group's
      ``share.auto.offset.reset`` config, see ``subscribe``).
    * ``poll`` returns records acquired for this member, each delivered to no other member while
      its acquisition lock (the replicas' ``group.share.record.lock.duration.ms``) runs.
    * ``acknowledgement_mode="implicit"`` (Kafka's default): every record a poll returned is
      accepted by the next ``poll``, ``commit`` or ``close``, its acknowledgement piggy-backed on
      the next ShareFetch to its leader. ``"explicit"``: the caller gives each record a type
      (``acknowledge``: accept, release, reject; ``acknowledge_all`` for every record held), sent
      with the next poll or by ``commit``; records without one stay held until their lock runs out
      or ``close`` releases them. Released records are delivered again (to any member), rejected
      ones never; in both modes ``acknowledge_all`` may override what was not sent yet.
    * ``close`` sends what is acknowledged, closes the share sessions (the leaders release what
      this member still holds) and leaves the group.

    Thread-safety: not thread-safe, as Kafka's: one thread calls everything but ``close`` may come
    from another once that thread stopped polling. Heartbeats run on a thread of their own, so a
    member that takes long between polls stays in the group (its records' locks still run out).
    """

    def __init__(self, bootstrap: str, *, group_id: str, metadata: Sequence[tuple[str, str]] = (),
                 tls: ClientTls | None = None, acknowledgement_mode: str = IMPLICIT, member_id: str | None = None,
                 client_id: str = "lowtide-share-consumer", max_records: int = 500, max_wait_ms: int = 500,
                 max_bytes: int = 50 << 20, request_timeout_s: float = 30.0,
                 auto_offset_reset: str | None = None, on_acknowledged: AckCallback | None = None) -> None:
        if acknowledgement_mode not in (IMPLICIT, EXPLICIT):
            raise InvalidRequest(f"acknowledgement_mode must be implicit or explicit, got {acknowledgement_mode!r}")
        if auto_offset_reset not in (None, "earliest", "latest"):
            raise InvalidRequest(f"auto_offset_reset must be earliest or latest, got {auto_offset_reset!r}")
        self.group_id = group_id
        self.member_id = member_id or str(uuid.uuid4())
        self.acknowledgement_mode = acknowledgement_mode
        self.max_records, self.max_wait_ms, self.max_bytes = max_records, max_wait_ms, max_bytes
        self.request_timeout_s = request_timeout_s
        self.auto_offset_reset = auto_offset_reset
        self.on_acknowledged = on_acknowledged
        self._channels, self.admin, self.replicas, self.cluster = open_connections(bootstrap, metadata=metadata,
                                                                                   tls=tls)
        self._membership = _Membership(self.admin.share_group_heartbeat, group_id=group_id,
                                       member_id=self.member_id, client_id=client_id)
        self._topics: tuple[str, ...] = ()
        self._held = HeldRecords()
        self._unsent: dict[TopicPartition, list[ShareAckBatch]] = {}  # acknowledgements to send again
        self._sessions: dict[str, _Session] = {}  # leader address -> our share session there
        self._topic_ids: dict[str, str] = {}  # topic name -> id
        self._assigned: dict[TopicPartition, str] | None = None  # ``assign``'s partitions
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        # While ``commit`` runs: each partition's acknowledgement answer.
        self._results: dict[TopicPartition, LowtideError | None] | None = None

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- membership --------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str]) -> None:
        """Join the group subscribed to ``topics`` (replacing an earlier subscription).

        ``auto_offset_reset`` ("earliest" or "latest") is set as the group's
        ``share.auto.offset.reset`` config before it joins, as Kafka's share consumer tools set it
        (``kafka-console-share-consumer``'s callers, VerifiableShareConsumer): where the group
        starts on a partition it has no state for. None leaves the group's config (else the
        replicas' ``--group-share-auto-offset-reset``) as it is.
        """
        names = tuple(dict.fromkeys(topics))
        if not names:
            raise InvalidRequest("subscribe needs at least one topic")
        self.cluster.add_topics(list(names))
        snapshot = self.cluster.refresh()
        for name in names:
            self._topic_ids[name] = snapshot.topic(name).topic_id  # an unknown topic fails here
        if self.auto_offset_reset is not None:
            set_auto_offset_reset(self.admin, self.group_id, self.auto_offset_reset)
        self._topics = names
        self._membership.join(names)

    def subscription(self) -> list[str]:
        return list(self._topics)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Fetch from ``partitions`` (of the subscribed topics) whatever the coordinator assigns.

        For a caller that plans its own parallelism (a Spark task reads the partition the driver
        planned for it): the member still joins the group (describe shows it, a reset is refused
        while it reads), and a share-partition hands each member its own records whoever fetches,
        so the assignment only spreads load; the caller spreads it instead."""
        wanted = list(dict.fromkeys(partitions))
        for topic, _ in wanted:
            if topic not in self._topic_ids:
                raise InvalidRequest(f"topic {topic!r} is not subscribed")
        self._assigned = {tp: self._topic_ids[tp[0]] for tp in wanted}

    def assignment(self) -> list[TopicPartition]:
        """The partitions this member fetches: the coordinator's assignment as of its last
        heartbeat (or what ``assign`` chose)."""
        return sorted(self._assignment())

    def _assignment(self) -> dict[TopicPartition, str]:
        return dict(self._assigned) if self._assigned is not None else self._membership.assignment()

    # -- polling -----------------------------------------------------------------------------
    def poll(self, *, max_wait_ms: int | None = None) -> list[ShareRecord]:
        """Records acquired for this member ([] when none came within ``max_wait_ms``)."""
        out: list[ShareRecord] = []
        for (topic, partition), columns, ranges in self._gather(max_wait_ms, with_headers=True):
            records = records_from_columns(columns, topic=topic, partition=partition)
            if len(ranges) == 1:
                count = ranges[0].delivery_count
                out.extend(ShareRecord(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers, count)
                           for r in records)
            else:
                out.extend(ShareRecord(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers,
                                       _count_at(ranges, r.offset)) for r in records)
        return out

    def poll_columns(self, *, max_wait_ms: int | None = None,
                     with_headers: bool = False) -> list[tuple[TopicPartition, Columns]]:
        """The batch-level poll for bulk readers (Spark, the CLI): per run of acquired records, its
        records as columns (``record.columns.Columns``), no Python object per record. The records
        are held and acknowledged as ``poll``'s."""
        return [(tp, columns) for tp, columns, _ in self._gather(max_wait_ms, with_headers=with_headers)]

    def _gather(self, max_wait_ms: int | None, *, with_headers: bool) -> list[Got]:
        self._check_open()
        self._membership.raise_error()
        if self.acknowledgement_mode == IMPLICIT:
            self._held.acknowledge_all(ACCEPT)
        wait_ms = self.max_wait_ms if max_wait_ms is None else max_wait_ms
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            started = time.monotonic()
            left_ms = max(0, int((deadline - started) * 1000))
            got = self._exchange(fetch=True, wait_ms=min(left_ms, SERVER_MAX_WAIT_MS), with_headers=with_headers)
            if got or time.monotonic() >= deadline:
                return got
            if time.monotonic() - started < 0.01:
                # Nobody parked the fetch: nothing assigned yet (the coordinator answers on the next
                # heartbeat) or no leader known. Not a busy loop meanwhile.
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    # -- acknowledging -----------------------------------------------------------------------
    def acknowledge(self, record: ShareRecord | tuple[str, int, int], kind: int = ACCEPT) -> None:
        """Give one delivered record a type: ``ACCEPT`` (1), ``RELEASE`` (2, delivered again) or
        ``REJECT`` (3, never again) from ``lowtide.messages.share``; ``record`` is a ShareRecord or
        (topic, partition, offset). Sent with the next poll or by ``commit``."""
        self._check_open()
        topic, partition, offset = (record.topic, record.partition, record.offset) \
            if isinstance(record, ShareRecord) else record
        self._held.acknowledge((topic, partition), offset, kind)

    def acknowledge_all(self, kind: int = ACCEPT) -> None:
        """Every delivered record without a type yet gets ``kind`` (Spark's end of a task)."""
        self._check_open()
        self._held.acknowledge_all(kind)

    def held(self) -> int:
        """Records delivered to this member and not acknowledged yet."""
        return self._held.count()

    def commit(self) -> dict[TopicPartition, LowtideError | None]:
        """Send every acknowledgement now (ShareAcknowledge at each leader; implicit mode accepts
        what the last poll returned); per partition its answer (None: applied)."""
        self._check_open()
        if self.acknowledgement_mode == IMPLICIT:
            self._held.acknowledge_all(ACCEPT)
        self._results = {}
        try:
            self._exchange(fetch=False, wait_ms=0, with_headers=False)
            return self._results
        finally:
            self._results = None

    def close(self) -> None:
        """Acknowledge what is (implicit mode: accept the last poll's records), close the share
        sessions, which releases the rest at the leaders, and leave the group."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.acknowledgement_mode == IMPLICIT:
                self._held.acknowledge_all(ACCEPT)
            self._exchange(fetch=False, wait_ms=0, with_headers=False, closing=True)
        except LowtideError as err:  # the leaders release on their own (session timeout, locks)
            log.warning("share consumer close: %s", err)
        finally:
            self._membership.leave()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._channels.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequest("this share consumer is closed")

    # -- one exchange with every leader ------------------------------------------------------
    def _exchange(self, *, fetch: bool, wait_ms: int, with_headers: bool, closing: bool = False) -> list[Got]:
        """One request to each leader concerned: ShareFetch (``fetch``) to the leaders of the
        assignment, carrying the acknowledgements due there; else ShareAcknowledge to the leaders
        with acknowledgements (``closing``: to every leader with a session, epoch -1)."""
        acks = self._held.take()
        for tp, batches in self._unsent.items():
            acks.setdefault(tp, [])[:0] = batches
        self._unsent = {}
        assignment = self._assignment() if fetch else {}
        self._topic_ids.update({t: i for (t, _), i in assignment.items()})
        snapshot = self.cluster.snapshot()
        refresh = False
        wanted: dict[str, set[TopicPartition]] = {}
        for tp in assignment:
            try:
                wanted.setdefault(snapshot.leader_address(*tp), set()).add(tp)
            except (LeaderNotAvailable, UnknownTopicOrPartition):
                refresh = True
        due: dict[str, dict[TopicPartition, list[ShareAckBatch]]] = {}
        for tp, batches in acks.items():
            try:
                due.setdefault(snapshot.leader_address(*tp), {})[tp] = batches
            except (LeaderNotAvailable, UnknownTopicOrPartition):
                self._unsent[tp] = batches
                refresh = True
        addresses = set(wanted) | set(due) | (set(self._sessions) if closing else set())
        calls: dict[str, tuple[ShareFetchAsk, frozenset[TopicPartition], frozenset[TopicPartition]]] = {}
        for address in addresses:
            built = self._build(address, wanted.get(address, set()), due.get(address, {}), fetch=fetch,
                                wait_ms=wait_ms, closing=closing)
            if built is not None:
                calls[address] = built
        answers = self._call_all({a: c[0] for a, c in calls.items()}, wait_ms)
        out = []
        for address, (ask, listed, forgotten) in calls.items():
            got, stale = self._absorb(address, ask, listed, forgotten, answers[address], due.get(address, {}),
                                      with_headers=with_headers)
            out.extend(got)
            refresh |= stale
        if refresh:
            try:
                self.cluster.refresh()
            except LowtideError as err:
                if not err.retriable:
                    raise
        return out

    def _build(self, address: str, wanted: set[TopicPartition], acks: dict[TopicPartition, list[ShareAckBatch]], *,
               fetch: bool, wait_ms: int, closing: bool,
               ) -> tuple[ShareFetchAsk, frozenset[TopicPartition], frozenset[TopicPartition]] | None:
        """The request to one leader, the partitions it lists and the ones it forgets; None when
        there is nothing to ask there."""
        session = self._sessions.setdefault(address, _Session())
        if session.epoch == 0 and (not fetch or not wanted):
            # No session there: acknowledgements need one, and only a fetch opens one. They cannot be
            # applied any more (the records went back with the session): reported, not retried.
            for tp, batches in acks.items():
                self._report(tp, batches, ShareSessionNotFound(f"no share session at {address} any more"))
            return None
        if closing:
            listed = frozenset(acks)
            return self._ask(LEAVE_EPOCH, listed, acks, fetch=False), listed, frozenset()
        if not fetch:
            if not acks:
                return None
            listed = frozenset(acks)
            return self._ask(session.epoch, listed, acks, fetch=False), listed, frozenset()
        if session.epoch == 0:
            # Opening: every partition led there; acknowledgements of others wait for the next round,
            # listed with them they would join the session (epoch 0 forgets nothing).
            for tp in set(acks) - wanted:
                self._unsent[tp] = acks.pop(tp)
            listed = frozenset(wanted)
            forgotten: frozenset[TopicPartition] = frozenset()
        else:
            forgotten = frozenset(session.partitions - wanted)
            # Partitions listed only for their acknowledgements are forgotten too, so nothing is
            # acquired from them (a forget wins over an add at the leader).
            forgotten |= frozenset(set(acks) - wanted - session.partitions)
            listed = frozenset((wanted - session.partitions) | set(acks))
        ask = self._ask(session.epoch, listed, acks, fetch=True, forgotten=forgotten, wait_ms=wait_ms)
        return ask, listed, forgotten

    def _ask(self, epoch: int, listed: Iterable[TopicPartition], acks: dict[TopicPartition, list[ShareAckBatch]], *,
             fetch: bool, forgotten: Iterable[TopicPartition] = (), wait_ms: int = 0) -> ShareFetchAsk:
        return ShareFetchAsk(
            group_id=self.group_id, member_id=self.member_id, session_epoch=epoch, fetch=fetch,
            partitions=tuple(SharePartitionAsk(topic_id=self._topic_ids[t], partition=p,
                                               acknowledgements=tuple(acks.get((t, p), ())))
                             for t, p in sorted(listed)),
            forgotten=tuple((self._topic_ids[t], p) for t, p in sorted(forgotten)),
            max_wait_ms=wait_ms, max_bytes=self.max_bytes, max_records=self.max_records)

    def _call_all(self, asks: dict[str, ShareFetchAsk], wait_ms: int) -> dict[str, ShareFetchAnswer | LowtideError]:
        def one(address: str) -> ShareFetchAnswer | LowtideError:
            try:
                return self.replicas.share_fetch(address, asks[address],
                                                 deadline_s=wait_ms / 1000 + self.request_timeout_s)
            except LowtideError as err:
                return err

        if len(asks) <= 1:
            return {a: one(a) for a in asks}
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="share-fetch")
        futures = {a: self._pool.submit(one, a) for a in asks}
        return {a: f.result() for a, f in futures.items()}

    def _absorb(self, address: str, ask: ShareFetchAsk, listed: frozenset[TopicPartition],
                forgotten: frozenset[TopicPartition], answer: ShareFetchAnswer | LowtideError,
                acks: dict[TopicPartition, list[ShareAckBatch]], *, with_headers: bool,
                ) -> tuple[list[Got], bool]:
        """One leader's answer: the records it gave, whether the metadata needs a refresh."""
        session = self._sessions[address]
        error = answer if isinstance(answer, LowtideError) else answer.error
        if error is not None:
            # The whole request failed (the leader is gone, the session is not what we think): the
            # next fetch opens a new session; the acknowledgements are sent again with it.
            self._sessions.pop(address, None)
            if not error.retriable:
                raise error
            for tp, batches in acks.items():
                if ask.session_epoch != LEAVE_EPOCH:
                    self._unsent.setdefault(tp, []).extend(batches)
                if self._results is not None:
                    self._results[tp] = error
            return [], isinstance(answer, LowtideError) or error.invalid_metadata
        if ask.session_epoch == LEAVE_EPOCH:
            self._sessions.pop(address, None)
        else:
            session.epoch = next_session_epoch(session.epoch)
            if ask.fetch:
                session.partitions = (session.partitions | listed) - forgotten
        names = {i: t for t, i in self._topic_ids.items()}
        out = []
        stale = False
        for p in answer.partitions:
            topic = names.get(p.topic_id)
            if topic is None:
                continue
            tp = (topic, p.partition)
            if tp in acks:
                # A partition error (not its leader any more) means its acknowledgements were not
                # applied either; sent again to the new leader, which answers for them.
                ack_error = p.acknowledge_error or p.error
                if ack_error is not None and ack_error.retriable and ask.session_epoch != LEAVE_EPOCH:
                    self._unsent.setdefault(tp, []).extend(acks[tp])
                    if self._results is not None:
                        self._results[tp] = ack_error
                else:
                    self._report(tp, acks[tp], ack_error)
            if p.error is not None:
                if not p.error.retriable:
                    raise type(p.error)(f"share fetch of {tp[0]}-{tp[1]}: {p.error.message}")
                stale = True
                continue
            for first, last, ranges in merge_ranges(p.acquired):
                columns = columnize(p.records, min_offset=first, max_offset=last + 1, with_headers=with_headers)
                offsets = None if columns.count == last - first + 1 else \
                    tuple(memoryview(columns.offsets).cast("q").tolist())
                self._held.add(tp, first, last, offsets, ranges)
                if columns.count:
                    out.append((tp, columns, ranges))
        return out, stale

    def _report(self, tp: TopicPartition, batches: Sequence[ShareAckBatch], error: LowtideError | None) -> None:
        if self._results is not None:
            self._results[tp] = error
        if error is not None:
            log.info("acknowledgement of %s-%d refused: %s", tp[0], tp[1], error)
        if self.on_acknowledged is not None:
            self.on_acknowledged(tp, batches, error)


def set_auto_offset_reset(admin: Admin, group_id: str, value: str) -> None:
    """Set ``group_id``'s ``share.auto.offset.reset`` group config (unless it is that already)."""
    if admin.group_config(group_id).get(SHARE_AUTO_OFFSET_RESET) != value:
        admin.alter_group_config(group_id, set_config={SHARE_AUTO_OFFSET_RESET: value})


def _count_at(ranges: tuple[AcquiredRange, ...], offset: int) -> int:
    for r in ranges:
        if r.first <= offset <= r.last:
            return r.delivery_count
    return 1
