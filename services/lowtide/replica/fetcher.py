"""Follower fetchers: one per leader broker, fetching every partition this replica follows from
that leader in one long-polled Fetch (Kafka's ReplicaFetcherThread). Each runs on the replica's
Kafka listener loop when it has one (``Fetcher`` says why), else on a thread of its own.

Transport: by default (``transport="socket"``) every round travels on one long-lived connection
to the leader's replication listener (lowtide.rpc.framed.listener: the same request and
answer as a Fetch, framed on a TCP or TLS socket, no gRPC), or, when the leader advertises no
replication port, on one long-lived ``Replicate`` stream per follower-leader pair (``"stream"``
always uses the stream); ``transport="fetch"`` uses a unary Fetch per round. A stream has no deadline of its own, so a
watchdog cancels a round that outlives the leader's long poll by ``CALL_DEADLINE_MARGIN_S`` (a
hung leader), exactly as the unary call's deadline would.

Each request carries, per partition, the fetch offset (our LEO) and our log start offset
(KIP-107); each response carries records, the leader's HW and the leader's LSO. We append, adopt
the HW and LSO (a log makes a new LSO durable in its log start offset file before taking it, so
an acknowledged low watermark survives a crash of this replica), and fetch again at once — the
next request is what tells the leader our new LSO.

Replication throttle (KIP-73, ``quota.py``): a partition whose follower list names this broker,
while this broker is outside its ISR, asks for at most what the follower bucket holds and is
charged what came back; with the bucket empty it is left out of the round (and the round's long
poll is cut to the refill, or with nothing else to fetch the fetcher pauses until then).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lowtide.client.replica import ReplicaClient, ReplicationStream
from lowtide.errors import (
    FetchSessionIdNotFound,
    InvalidFetchSessionEpoch,
    LowtideError,
    NetworkException,
    OffsetOutOfRange,
)
from lowtide.log.partition_log import LogStartOffsetCommit
from lowtide.messages import TopicPartition
from lowtide.messages.replica import EpochQuery, FetchedPartition, FetchPosition, FetchSessionRound
from lowtide.metadata.model import BrokerInfo
from lowtide.replica.fetch_session import FollowerSession
from lowtide.replica.partition import FOLLOWER, Partition
from lowtide.replica.quota import FOLLOWER as FOLLOWER_DIRECTION
from lowtide.replica.quota import MIN_WAIT_S, ReplicationQuotas
from lowtide.replica.registry import PartitionRegistry
from lowtide.rpc.channels import ChannelPool
from lowtide.rpc.framed.callers import SocketReplicationStream
from lowtide.rpc.framed.connection import LoopFramedConnection
from lowtide.rpc.steps import Blocking, Steps, drive_on_loop, run_blocking

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.2
ADDRESS_TTL_S = 5.0
# The call's own deadline beyond the leader's long poll: room for a slow leader under load.
CALL_DEADLINE_MARGIN_S = 10.0
WATCHDOG_TICK_S = 0.5
# After a leader's replication listener could not be reached, how long its Replicate stream is used.
SOCKET_RETRY_S = 30.0
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class FetcherConfig:
    """What a follower fetch asks for: ``replica_id`` (this broker), the leader's long-poll wait
    and the byte limits (per partition and per response)."""

    replica_id: int
    max_wait_ms: int
    max_bytes: int
    transport: str = "socket"  # socket | stream | fetch (see module doc)
    sessions: bool = True  # KIP-227 incremental fetch sessions (fetch_session.py)


class _Pause:
    """A steps ``Wait`` (lowtide.rpc.steps): ``seconds``, or less if the fetcher stops."""

    __slots__ = ("fetcher", "deadline", "event")

    def __init__(self, fetcher: Fetcher, seconds: float) -> None:
        self.fetcher, self.deadline, self.event = fetcher, time.monotonic() + seconds, None

    def arm(self, event: Any) -> None:
        self.event = event
        self.fetcher._wakers.add(event)

    def check(self) -> bool:
        return self.fetcher.stopping

    def expire(self) -> None:
        return None

    def disarm(self) -> None:
        self.fetcher._wakers.discard(self.event)
        self.event = None


class Fetcher:
    """Fetches every partition this replica follows from one leader, until stopped.

    Contract: each round sends one Fetch with every partition following ``leader_id``; applies
    records, HW and LSO; truncates on OFFSET_OUT_OF_RANGE; on any other per-partition error (stale
    leadership or otherwise) asks for a forced reconcile and backs off. A whole-call failure (the
    leader unreachable, a deadline passed) marks the leader's address stale and backs off. The
    leader's address is looked up again after a failure or every ``ADDRESS_TTL_S``.

    Where it runs: the rounds are written once, as steps (lowtide.rpc.steps). With a ``loop`` (the
    replica's Kafka listener loop, which also serves this broker's Produce requests and its own
    followers' rounds) they run there and a round over the leader's replication listener waits on
    the loop, not on a thread: what may block (the leader's address from Redis, an
    OffsetForLeaderEpoch call, an LSO flush, a round on the gRPC fallback) runs on ``executor``.
    Without a loop they run on a thread of their own, which blocks in each of those.

    Thread-safety: owned by FetcherManager; ``stop()`` and ``join()`` from any thread. Partitions
    are changed only through their own (locked) methods.
    """

    def __init__(self, *, registry: PartitionRegistry, client: ReplicaClient, config: FetcherConfig,
                 leader_id: int, lookup_brokers: Callable[[], Mapping[int, BrokerInfo]],
                 request_reconcile: Callable[[], None], quotas: ReplicationQuotas | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, executor: Executor | None = None) -> None:
        self.registry, self.client, self.config, self.leader_id = registry, client, config, leader_id
        self.quotas = quotas if quotas is not None else ReplicationQuotas(broker_id=config.replica_id)
        self._lookup_brokers, self._request_reconcile = lookup_brokers, request_reconcile
        self._loop, self._executor = (loop, executor) if loop is not None and executor is not None else (None, None)
        self.stopping = False
        self._wakers: set[Any] = set()  # the wake-ups of pauses in progress (stop sets them)
        self._finished = threading.Event()
        self._address = ""
        self._stale = True
        self._resolved_at = 0.0
        self._stream: ReplicationStream | SocketReplicationStream | LoopFramedConnection | None = None
        self._stream_address = ""
        self._replication_address = ""  # the leader's replication listener, if it advertises one
        self._socket_retry_at = 0.0
        self._round_deadline = 0.0
        # The followed partitions, listed again only when the registry's version moves.
        self._version = -1
        self._parts: dict[TopicPartition, Partition] = {}
        self._truncating: set[TopicPartition] = set()  # pending truncation: not fetched meanwhile
        self._truncated: set[TopicPartition] = set()  # settled since the last round: listed again
        self._session = FollowerSession()

    @property
    def on_loop(self) -> bool:
        return self._loop is not None

    def start(self) -> None:
        if self._loop is None:
            threading.Thread(target=self._run_on_thread, name=f"fetcher-{self.leader_id}", daemon=True).start()
        else:
            self._loop.call_soon_threadsafe(self._start_on_loop)

    def stop(self) -> None:
        self.stopping = True
        for event in list(self._wakers):
            event.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()  # a round parked at the leader ends now, not after its long poll

    def join(self, timeout_s: float) -> None:
        """Wait for the rounds to end (not when their loop already stopped: they never will)."""
        loop = self._loop
        if loop is not None and (loop.is_closed() or not loop.is_running()):
            return
        self._finished.wait(timeout_s)

    @property
    def finished(self) -> bool:
        """The rounds ended: stopped, or failed (a bug, logged)."""
        return self._finished.is_set()

    def _run_on_thread(self) -> None:
        try:
            run_blocking(self._rounds())
        except Exception as exc:  # noqa: BLE001 - a bug: logged, and replaced (_failed)
            if not self.stopping:
                self._failed(exc)
        finally:
            self._finished.set()

    def _failed(self, error: BaseException) -> None:
        """The rounds raised (a bug): log it and ask for a reconcile, whose ``sync`` starts a new
        fetcher for this leader; until then this one's partitions do not replicate."""
        log.error("fetcher for leader %s failed; a new one starts after the next reconcile", self.leader_id,
                  exc_info=error)
        self._finished.set()
        self._request_reconcile()

    def _start_on_loop(self) -> None:
        assert self._loop is not None and self._executor is not None
        drive_on_loop(self._rounds(), loop=self._loop, executor=self._executor, done=self._ended_on_loop)

    def _ended_on_loop(self, _value: object, error: BaseException | None) -> None:
        if error is not None and not self.stopping:
            self._failed(error)
        self._finished.set()

    def check_deadline(self, now: float) -> None:
        """Watchdog: cancel a blocking stream round that outlived its deadline (a hung leader).
        A round on the loop has its own deadline."""
        stream, deadline = self._stream, self._round_deadline
        if stream is not None and deadline and now > deadline:
            log.debug("replication round to leader %s passed its deadline; cancelling", self.leader_id)
            stream.cancel()

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    # -- the rounds, as steps ---------------------------------------------------------------------------
    def _rounds(self) -> Steps[None]:
        try:
            while not self.stopping:
                yield from self._one_round()
        finally:
            self._close_stream()

    def _one_round(self) -> Steps[None]:
        cfg = self.config
        parts, changed = self._following()
        if not parts:
            self._session.reset()
            yield _Pause(self, 0.2)
            return
        address = self._fresh_address()
        if address is None:
            try:
                address = yield Blocking(self._resolve_leader_address)
            except Exception as exc:  # noqa: BLE001 - redis hiccup: retry
                log.warning("cannot resolve leader %s: %s", self.leader_id, exc)
                address = None
        if address is None:
            yield _Pause(self, RETRY_BACKOFF_S)
            return
        if self._truncating:
            truncating = [parts[k] for k in self._truncating if k in parts]
            yield Blocking(lambda: self._truncate_by_epoch(address, truncating))
            settled = {p.key for p in truncating if not p.truncation_pending}
            self._truncating = {p.key for p in truncating} - settled
            self._truncated |= settled
        if cfg.sessions and self.quotas.follower.rate is None:
            positions, session = self._session_positions(parts, changed)
            throttled: set[TopicPartition] = set()
            refill_s = 0.0
        else:
            # A replication throttle shares a bucket out per round: every partition is listed.
            self._session.reset()
            session = None
            plain = [p for k, p in parts.items() if k not in self._truncating]
            if not plain:
                yield _Pause(self, RETRY_BACKOFF_S)
                return
            positions, throttled, refill_s = self._positions(plain)
            if not positions:  # everything is held back by the throttle
                yield _Pause(self, refill_s)
                return
        wait_ms = min(cfg.max_wait_ms, max(1, int(refill_s * 1000))) if refill_s else cfg.max_wait_ms
        try:
            if self._loop is not None and cfg.transport == "socket" and self._replication_address:
                fetched = yield from self._round_on_loop(positions, wait_ms, session)
            else:
                fetched = yield Blocking(lambda: self._fetch_round(address, positions, max_wait_ms=wait_ms,
                                                                   session=session))
        except (FetchSessionIdNotFound, InvalidFetchSessionEpoch) as exc:
            # The leader restarted or lost our session: open a new one at once.
            log.info("fetch session with leader %s ended (%s); opening a new one", self.leader_id, exc.name)
            self._session.reset()
            return
        except LowtideError as exc:
            self._session.reset()
            self._stale = True
            self._close_stream()
            if not self.stopping:
                log.debug("fetch from leader %s failed: %s", self.leader_id, exc.name)
                yield _Pause(self, RETRY_BACKOFF_S)
            return
        if session is not None:
            self._session.answered(fetched)
        yield from self._apply(fetched, throttled=throttled)

    def _following(self) -> tuple[dict[TopicPartition, Partition], bool]:
        """The partitions followed from this leader, and whether they (or their roles, leaders or
        epochs) may have changed since the last round: listed again only then."""
        version = self.registry.version  # before the listing: a change after it is seen next round
        if version == self._version:
            return self._parts, False
        self._version = version
        self._parts = {p.key: p for p in self.registry.following(self.leader_id)}
        self._truncating = {k for k, p in self._parts.items() if p.truncation_pending}
        return self._parts, True

    def _session_positions(self, parts: dict[TopicPartition, Partition],
                           changed: bool) -> tuple[list[FetchPosition], FetchSessionRound]:
        """This round of the fetch session: every followed partition when the session is new or
        the followed set changed, else the last answer's and those whose truncation settled."""
        session = self._session
        check: Iterable[TopicPartition] = parts if changed or not session.open else session.recheck() | self._truncated
        self._truncated = set()
        if self._truncating:
            session.leave(self._truncating)
        max_bytes = self.config.max_bytes
        positions = {}
        for k in check:
            p = parts.get(k)
            if p is not None and k not in self._truncating:
                plog = p.log
                positions[k] = FetchPosition(topic=p.topic, partition=p.partition, fetch_offset=plog.log_end_offset,
                                             log_start_offset=plog.log_start_offset, max_bytes=max_bytes,
                                             current_leader_epoch=p.leader_epoch)
        return session.plan(positions, following=parts if changed else None)

    def _round_on_loop(self, positions: list[FetchPosition], wait_ms: int,
                       session: FetchSessionRound | None = None) -> Steps[list[FetchedPartition]]:
        assert self._loop is not None
        cfg, address, stream = self.config, self._replication_address, self._stream
        if not isinstance(stream, LoopFramedConnection) or stream.finished or self._stream_address != address:
            self._close_stream()
            try:
                stream = yield from LoopFramedConnection.open_steps(
                    address, loop=self._loop, tls=self.client.channels.tls, metadata=self.client.metadata,
                    connect_timeout_s=CONNECT_TIMEOUT_S)
            except NetworkException:
                self._listener_unreachable(address)
                raise
            self._stream, self._stream_address = stream, address
            if self.stopping:  # stop() ran before this connection existed
                stream.cancel()
        return (yield from stream.fetch_steps(positions, replica_id=cfg.replica_id, max_wait_ms=wait_ms,
                                              min_bytes=1, max_bytes=cfg.max_bytes,
                                              timeout_s=wait_ms / 1000 + CALL_DEADLINE_MARGIN_S, session=session))

    def _listener_unreachable(self, address: str) -> None:
        # Unreachable (a firewall, a port not exposed): the gRPC stream for a while.
        log.warning("replication listener of leader %s at %s unreachable; using the Replicate stream "
                    "for %.0f s", self.leader_id, address, SOCKET_RETRY_S)
        self._socket_retry_at = time.monotonic() + SOCKET_RETRY_S
        self._replication_address = ""

    def _fetch_round(self, address: str, positions: list[FetchPosition], *, max_wait_ms: int | None = None,
                     session: FetchSessionRound | None = None) -> list[FetchedPartition]:
        """One round on a blocking transport (may block: a thread, or the executor)."""
        cfg = self.config
        wait_ms = cfg.max_wait_ms if max_wait_ms is None else max_wait_ms
        if cfg.transport == "fetch":
            return self.client.fetch(address, positions, replica_id=cfg.replica_id, max_wait_ms=wait_ms,
                                     min_bytes=1, max_bytes=cfg.max_bytes,
                                     deadline_s=wait_ms / 1000 + CALL_DEADLINE_MARGIN_S, session=session)
        stream = self._stream
        if cfg.transport == "socket" and self._replication_address:
            address = self._replication_address  # the leader's replication listener
        if stream is None or stream.finished or self._stream_address != address \
                or isinstance(stream, LoopFramedConnection):
            self._close_stream()
            if address == self._replication_address:
                try:
                    stream = self._stream = SocketReplicationStream(
                        address, tls=self.client.channels.tls, metadata=self.client.metadata,
                        connect_timeout_s=CONNECT_TIMEOUT_S)
                except NetworkException:
                    self._listener_unreachable(address)
                    raise
            else:
                stream = self._stream = self.client.open_replication(address)
            self._stream_address = address
            if self.stopping:  # stop() ran before this stream existed
                stream.cancel()
        self._round_deadline = time.monotonic() + wait_ms / 1000 + CALL_DEADLINE_MARGIN_S
        try:
            return stream.fetch(positions, replica_id=cfg.replica_id, max_wait_ms=wait_ms, min_bytes=1,
                                max_bytes=cfg.max_bytes, session=session)
        finally:
            self._round_deadline = 0.0

    def _fresh_address(self) -> str | None:
        # The address is looked up again only after a failed call or every few seconds: a Redis
        # round trip per fetch cost ~8% of a replica's CPU.
        if self._address and not self._stale and time.monotonic() - self._resolved_at < ADDRESS_TTL_S:
            return self._address
        return None

    def _resolve_leader_address(self) -> str | None:
        """The leader's address from the broker registry (may block: Redis)."""
        now = time.monotonic()
        self._stale, self._resolved_at = False, now
        broker = self._lookup_brokers().get(self.leader_id)
        if broker is None:
            return None
        if broker.address != self._address:
            if self._address:
                # The leader moved: its old channel would only ever fail (or reach someone else).
                self.client.channels.forget(self._address)
            self._address = broker.address
        self._replication_address = (f"{broker.host}:{broker.replication_port}"
                                     if broker.replication_port and now >= self._socket_retry_at else "")
        return self._address

    def _positions(self, parts: list[Partition]) -> tuple[list[FetchPosition], set[TopicPartition], float]:
        """This round's requests: (positions, the throttled partitions among them, seconds until
        the follower bucket refills when it held a partition back, else 0)."""
        cfg, quotas = self.config, self.quotas
        positions: list[FetchPosition] = []
        throttled: set[TopicPartition] = set()
        allowed: int | None = None  # the bucket is read once per round, then shared out
        refill_s = 0.0
        for p in parts:
            max_bytes = cfg.max_bytes
            if quotas.follower_throttled(p):
                if allowed is None:
                    allowed = quotas.follower.available()
                if allowed <= 0:
                    refill_s = max(quotas.follower.wait_s(), MIN_WAIT_S)
                    continue
                max_bytes = min(max_bytes, allowed)
                allowed -= max_bytes
                throttled.add(p.key)
            positions.append(FetchPosition(topic=p.topic, partition=p.partition, fetch_offset=p.log.log_end_offset,
                                           log_start_offset=p.log.log_start_offset, max_bytes=max_bytes,
                                           current_leader_epoch=p.leader_epoch))
        return positions, throttled, refill_s

    def _truncate_by_epoch(self, address: str, parts: list[Partition]) -> None:
        """KIP-101/KIP-279: ask the leader where our latest epoch ends and truncate there (never
        to our own HW). A partition whose question fails stays pending: no fetch until settled."""
        asked: dict[TopicPartition, tuple[Partition, EpochQuery]] = {}
        for p in parts:
            epoch = p.epoch_to_query()
            if epoch is not None:
                asked[p.key] = (p, EpochQuery(topic=p.topic, partition=p.partition, leader_epoch=epoch,
                                              current_leader_epoch=p.leader_epoch))
        if not asked:
            return
        try:
            answers = self.client.offset_for_leader_epoch(address, [q for _, q in asked.values()],
                                                          replica_id=self.config.replica_id,
                                                          timeout_s=CALL_DEADLINE_MARGIN_S)
        except LowtideError as exc:
            self._stale = True
            log.debug("OffsetForLeaderEpoch to leader %s failed: %s", self.leader_id, exc.name)
            return
        refresh = False
        for a in answers:
            p, q = asked.get((a.topic, a.partition), (None, None))
            if p is None or q is None:
                continue
            if a.error is not None:
                refresh = True
                continue
            before = p.log.log_end_offset
            if p.truncate_to_epoch_end(leader_epoch=a.leader_epoch, asked_epoch=q.leader_epoch,
                                       end_offset=a.end_offset, leader_epoch_now=q.current_leader_epoch):
                log.info("truncated by leader epoch", extra={"fields": {
                    "topic": p.topic, "partition": p.partition, "epoch": q.leader_epoch,
                    "leader_epoch_end": a.end_offset, "from": before, "to": p.log.log_end_offset}})
            else:
                refresh = True
        if refresh:
            self._request_reconcile()

    def _apply(self, fetched: list[FetchedPartition], *,
               throttled: set[TopicPartition] | None = None) -> Steps[None]:
        """Append what came, adopt HW and LSO. On a loop, an answer with an error (its handling may
        truncate, which flushes) is applied on the executor, and so is the flush of the LSOs it
        raised; the appends of a plain answer run here, as a Produce's do on the leader."""
        lso_commit = LogStartOffsetCommit()
        try:
            if any(r.error is not None for r in fetched):
                appended, lso_changed, refresh = yield Blocking(lambda: self._apply_answer(
                    fetched, throttled=throttled, lso_commit=lso_commit))
            else:
                appended, lso_changed, refresh = self._apply_answer(fetched, throttled=throttled,
                                                                    lso_commit=lso_commit)
            if len(lso_commit):
                try:
                    yield Blocking(lso_commit.commit)
                except LowtideError as commit_err:  # none of these LSOs moved; the next answer brings them again
                    log.warning("cannot make the fetched log start offsets durable", extra={"fields": {
                        "leader": self.leader_id, "error": commit_err.name, "detail": commit_err.message}})
                    refresh = True
            else:
                lso_commit.commit()  # nothing to flush: releases it
        finally:
            lso_commit.close()
        if refresh:
            self._stale = True
            self._request_reconcile()
            yield _Pause(self, RETRY_BACKOFF_S)
        if appended or lso_changed:
            self.registry.notify([(r.topic, r.partition) for r in fetched])

    def _apply_answer(self, fetched: list[FetchedPartition], *, throttled: set[TopicPartition] | None,
                      lso_commit: LogStartOffsetCommit) -> tuple[bool, bool, bool]:
        """Each partition's part of an answer: (appended, lso_changed, refresh). The LSOs it raises
        wait in ``lso_commit``, flushed once, together, and taken before the next fetch reports
        them to the leader (one flush per answer, not one per partition)."""
        lso_changed = appended = refresh = False
        for r in fetched:
            p = self.registry.find(r.topic, r.partition)
            if p is None:
                continue
            err = r.error
            if throttled and err is None and (r.topic, r.partition) in throttled:
                self.quotas.charge(FOLLOWER_DIRECTION, len(r.records))  # what came, possibly into debt
            try:
                if err is None:
                    a, l_changed = p.apply_fetched(records=r.records, leader_hw=r.high_watermark,
                                                   leader_lso=r.log_start_offset, leader_epoch=r.leader_epoch,
                                                   lso_commit=lso_commit)
                    appended |= a
                    lso_changed |= l_changed
                elif isinstance(err, OffsetOutOfRange):
                    p.handle_out_of_range(leader_lso=r.log_start_offset, leader_leo=r.log_end_offset)
                    lso_changed = True
                else:
                    # NOT_LEADER / FENCED / UNKNOWN_... (invalid_metadata): our view of leadership is
                    # stale. Any other error: our state for this partition may still be what is
                    # wrong. Either way re-read the metadata and back off rather than spin.
                    if not err.invalid_metadata:
                        log.debug("leader %s answered %s for %s-%s: %s", self.leader_id, err.name,
                                  r.topic, r.partition, err.message)
                    refresh = True
            except LowtideError as apply_err:
                log.warning("cannot apply fetched data", extra={"fields": {
                    "topic": r.topic, "partition": r.partition, "error": apply_err.name,
                    "detail": apply_err.message}})
                refresh = True
        return appended, lso_changed, refresh


class FetcherManager:
    """Keeps one Fetcher per leader this replica follows.

    Contract: ``sync()`` starts a fetcher for every leader of a followed partition and stops the
    fetchers of leaders no longer followed; every fetcher shares one ``ReplicaClient`` over one
    ``ChannelPool`` (one channel per leader address). After ``run_on(loop)`` (before the first
    ``sync``) new fetchers of the socket transport run on that loop, their blocking work on a small
    pool of this manager's. ``stop()`` stops and joins every fetcher, then closes the channels.

    Thread-safety: thread-safe (``sync`` runs on the reconcile thread, ``stop`` on shutdown).
    """

    def __init__(self, *, registry: PartitionRegistry, config: FetcherConfig,
                 lookup_brokers: Callable[[], Mapping[int, BrokerInfo]],
                 request_reconcile: Callable[[], None], call_metadata: tuple[tuple[str, str], ...] = (),
                 quotas: ReplicationQuotas | None = None) -> None:
        self.registry = registry
        self.config = config
        # One follower bucket for every fetcher of this broker (KIP-73: per broker, not per leader).
        self.quotas = quotas if quotas is not None else ReplicationQuotas(broker_id=config.replica_id)
        self._lookup_brokers = lookup_brokers
        self._request_reconcile = request_reconcile
        self._channels = ChannelPool()
        # call_metadata: this broker's own token (User:broker-<id>); leaders with auth on refuse
        # a follower fetch that does not prove it comes from the replica it names.
        self.client = ReplicaClient(channels=self._channels, metadata=call_metadata)
        self._threads: dict[int, Fetcher] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="fetcher-watchdog", daemon=True)
        self._watchdog.start()

    def run_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the fetchers started from now on ``loop`` (the Kafka listener's): see ``Fetcher``."""
        if self.config.transport != "socket":
            return  # the gRPC transports block in every round: a thread each
        with self._lock:
            self._loop = loop
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fetcher-blocking")

    def _watch(self) -> None:
        while not self._stopped.wait(WATCHDOG_TICK_S):
            now = time.monotonic()
            with self._lock:
                threads = list(self._threads.values())
            for t in threads:
                t.check_deadline(now)

    def sync(self) -> None:
        leaders = {p.leader_id for p in self.registry.all() if p.role == FOLLOWER and p.leader_id >= 0}
        with self._lock:
            for lid in leaders & set(self._threads):
                if self._threads[lid].finished:  # it failed (Fetcher._failed): replaced below
                    del self._threads[lid]
            for lid in leaders - set(self._threads):
                t = Fetcher(registry=self.registry, client=self.client, config=self.config, leader_id=lid,
                            lookup_brokers=self._lookup_brokers, request_reconcile=self._request_reconcile,
                            quotas=self.quotas, loop=self._loop, executor=self._executor)
                self._threads[lid] = t
                t.start()
            for lid in set(self._threads) - leaders:
                self._threads.pop(lid).stop()

    def running(self) -> dict[int, Fetcher]:
        """The fetcher of each followed leader."""
        with self._lock:
            return dict(self._threads)

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            for t in self._threads.values():
                t.stop()
            threads = list(self._threads.values())
            self._threads.clear()
        for t in threads:
            t.join(timeout_s=2)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._channels.close()
