"""One diskless coordinator shard as a running service: leadership, the metadata-log pipeline,
loading, snapshots and the file lifetime worker around ``CoordinatorCore``
(docs/design/diskless.md#the-coordinator-shard).

Request path of a mutation (CommitFile, CreatePartitions, DeleteTopics, DeleteRecords, HandOverFile)::

    request thread: queue (check, waiter) in the inbox; wait for the waiter
    writer thread:  take every queued request; shard lock: run each check -> Decision (its
                    records become pending); while fewer than ``appends_in_flight`` (2) Produces
                    are under way, send the next group (every decision checked meanwhile, one batch
                    each) in one acks=all Produce, conditional on the log end it expects; the
                    second in flight, and a busy shard's first, only after ``append_linger_ms``
                    (pipeline.seconds_until_send)
    pipeline loop:  the Produces in flight (coordinator.pipeline, as steps on the shard's event
                    loop: retries and leader moves); as they succeed, hand the groups to the
                    applier in log order and answer them (a framed CommitFile on the same loop)
    applier thread: apply every replicated group in one SQLite transaction at the offsets the
                    leader gave, through the applier process (coordinator.applier), outside the
                    shard lock; then, under it, mirror the applier's cached rows, drop the
                    records from the pending overlay and wake the readers waiting for them

Checks run on one thread under the shard lock, which request threads never take: they only queue;
applies run in another process, which writes the SQLite file the shard reads. Requests that queue
while a Produce is in flight are checked (against SQLite plus the pending records) and appended
together in the next one: the KIP's pipelining, and the queue order is the log order. Groups are
applied while the next Produce is in flight, so the acks=all round trip and the SQLite commit (one
index page per partition a 100-batch file touches: about as long as the round trip) overlap instead
of adding up, and groups replicated while one is applied go in one transaction. A decision without
records (a duplicate commit, a request every part of which failed) and ListOffsets also queue, as
barriers: they are answered only once everything before them is applied, so a duplicate's original
offsets are durable before anyone hears of them.

Answered when replicated, read after applied: a request with records is answered as soon as its
Produce is acknowledged, not after the SQLite apply (its response was decided by the check, and
the records are in the log: a failed apply reloads them). So the apply is off the request's path,
yet no read can miss an answered mutation: the appender raises ``_acked_through`` to the group's
last metadata offset before it answers, and every read (FindBatches, DescribeFiles, the shard's own
workers) first waits, under the shard lock, until the applied offset reaches the acked offset it
saw on entry — at most one apply, usually none. An acknowledged DeleteRecords therefore never lets
a later FindBatches serve a batch below the new log start offset, and an acknowledged CommitFile is
visible to the next FindBatches and DescribeFiles (the orphan scanner's question) that starts.

Failure of an append: it may or may not be in the log, so nothing checked against it can stand.
It and the requests checked after it fail with a retriable error (REQUEST_TIMED_OUT /
NOT_COORDINATOR), as does every queued request; the pending records are dropped, and the shard goes
back to loading: it reads the log from its applied offset to the end before it takes requests again
(what KRaft's controller does on a failed write). Failure of an apply (the SQLite transaction rolls
back) does the same; a replicated group behind it is failed too, as applying it would leave a gap in
the applied offsets, and the reload applies it from the log. Groups replicated before a failure
are still applied and answered: they are in the log.

Fencing (docs/design/diskless.md#fencing-by-epoch): one writer per shard is the shard lease in
the metadata store (``coordinator.leadership``: a record under an etcd lease); the appender checks
the lease is still valid (renewed within lease - margin) before each Produce. That is a time
assumption, so the log itself fences too. Each load is a new leadership with a new **coordinator
epoch** (``leadership.take_epoch``: a compare-and-set in etcd while holding the lease, above any
epoch in the log), which every record and batch carries; before it
answers anything the load appends an EpochStarted record, conditional on the log ending where its
state does. From then on a deposed writer cannot append: its batches' producer epoch is below the
writer id's current one (INVALID_PRODUCER_EPOCH at the replica, Kafka's producer fencing), and every
append is also conditional (replica.proto ``expected_log_end_offset``) on the log ending where this
shard's state plus its appends in flight end, after a batch of its writer id. A deposed writer's
refused append answers NOT_COORDINATOR and the process steps down; a successor's marker or append
that a deposed one overtook is refused in turn, so it reloads and checks against what was really
appended; and should a stale-epoch record be in the log anyway, every applier skips it
(``CoordinatorState.apply_all``). The same condition keeps two appends in flight in order: the
second lands only right after the first. Refused because the replica took them in the other order,
it is sent again once the first landed. Reads are fenced by the lease's clock (CLOCK_MONOTONIC,
which runs on through a SIGSTOP) and, from the first refused append, by the epoch. Answers too:
an acknowledged append is answered only if its term still leads when the acknowledgment is
handled (``ShardPipeline._deposed``), not when it was sent, since a process paused in between and
resumed after a successor took over would otherwise answer offsets as a zombie; and a lease that
lapsed ends the term even when it is granted again (``_lease_loop``).

Warm standby (``ShardConfig.standby``/``follow``: following the log while not leading, standby
reads, when a standby contends for the lease): coordinator.standby. Snapshots (when, and the object
store before the log below one is deleted): coordinator.snapshot_publisher.

States: ``follower`` (no lease: NOT_COORDINATOR), ``loading`` (lease held, reading the log:
COORDINATOR_LOAD_IN_PROGRESS), ``leader`` (serving). Threads: the lease thread (acquire/renew),
the shard thread (loading, snapshots, file lifetime), the writer, the pipeline loop (the appends
in flight and the framed listener's connections), the applier thread (which waits for the applier
process); request threads come from gRPC. The applier process checkpoints the WAL.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowtide.clock import now_ms
from lowtide.coordinator.applier import PROCESS, Applier, open_applier
from lowtide.coordinator.core import CoordinatorCore, Decision
from lowtide.coordinator.leadership import ShardAddress, ShardLease, register_shard, take_epoch
from lowtide.coordinator.lifetime import FileLifetime
from lowtide.coordinator.metadata_log import METADATA_TOPIC, MetadataLog, writer_id
from lowtide.coordinator.pipeline import Group, LogAppender, Waiter
from lowtide.coordinator.records import EpochStarted, encode_record
from lowtide.coordinator.shard_pipeline import FOLLOWER, LEADER, LOADING, ShardPipeline
from lowtide.coordinator.snapshot_publisher import SnapshotPublisher
from lowtide.coordinator.snapshot_store import SnapshotStore
from lowtide.coordinator.snapshots import SnapshotPolicy, latest_snapshot, restore_snapshot, run_at_low_priority
from lowtide.coordinator.standby import StandbyFollower
from lowtide.coordinator.state import CoordinatorState, snapshot_offset
from lowtide.errors import (
    CoordinatorLoadInProgress,
    InvalidConfig,
    InvalidProducerEpoch,
    KafkaStorageError,
    NotCoordinator,
    OffsetOutOfRange,
    RequestTimedOut,
)
from lowtide.leases import Lease
from lowtide.metadata.store import MetadataStore
from lowtide.record import encode_batch
from lowtide.rpc.steps import LoopWake

log = logging.getLogger(__name__)

DB_FILE = "state.sqlite"
SNAPSHOT_DIR = "snapshots"
# Metadata log appends in flight at once at most (``ShardConfig.appends_in_flight``). Each is
# conditional on the log's end (the one before must have landed), so they land in order or not at
# all; a second one in flight takes the wait for the previous round trip off a request's path.
MAX_APPENDS_IN_FLIGHT = 5
# Records per apply while loading (one transaction each).
LOAD_CHUNK = 1000


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    shard: int
    shards: int
    data_dir: Path
    owner: str                       # this process's id in the lease
    advertised_grpc: str
    advertised_framed: str = ""       # the framed listener brokers send CommitFile to ("": none)
    metrics_url: str = ""
    lease_ms: int = 6_000
    lease_margin_ms: int = 1_000
    append_timeout_ms: int = 10_000
    appends_in_flight: int = 2
    append_linger_ms: int = 5         # a request's wait for company before a second append (seconds_until_send)
    apply_linger_ms: int = 40         # replicated groups wait this long for others to share their apply
    request_timeout_ms: int = 30_000
    snapshot: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    file_delete_grace_ms: int = 60_000
    lifetime_interval_ms: int = 1_000
    applier: str = PROCESS             # where records are applied: coordinator.applier
    applier_nice: int = 10             # the applier process's niceness (os.nice): below the request path
    standby: bool = False              # a warm standby: follows, serves standby reads, defers to the shard's own
    follow: bool = False               # follow the log while not leading (a standby always does)
    follow_wait_ms: int = 100          # a standby's long-poll fetch of the log tail


class ShardService(ShardPipeline):
    """Shard ``config.shard``: serves the core's operations while it holds the shard's lease.

    Contract: ``mutate(check)`` runs ``check(core)`` under the shard lock and returns the decision's
    response once its records are replicated and applied; ``read(fn)`` runs ``fn(core)`` on the
    committed state; ``read_after_barrier(fn)`` first waits for every earlier mutation (ListOffsets).
    Each raises NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS / REQUEST_TIMED_OUT (all retriable)
    when the shard cannot answer. Thread-safety: every public method may be called from any thread.
    """

    def __init__(self, *, config: ShardConfig, metadata_log: MetadataLog, lease: Lease,
                 lifetime: FileLifetime | None = None, metadata: MetadataStore | None = None, retention=None,
                 snapshot_store: SnapshotStore | None = None) -> None:
        if not 0 <= config.append_linger_ms <= 1000:
            raise InvalidConfig(f"append linger must be 0 to 1000 ms, got {config.append_linger_ms}")
        # A long apply linger is harmless (reads and barriers end it, and so do APPLY_MAX_RECORDS
        # waiting); the tests use one far longer than any commit takes on a loaded machine.
        if not 0 <= config.apply_linger_ms <= 60_000:
            raise InvalidConfig(f"apply linger must be 0 to 60000 ms, got {config.apply_linger_ms}")
        if not 0 <= config.applier_nice <= 19:
            raise InvalidConfig(f"applier niceness must be 0 to 19, got {config.applier_nice}")
        if not 1 <= config.appends_in_flight <= MAX_APPENDS_IN_FLIGHT:
            raise InvalidConfig(f"appends in flight must be 1 to {MAX_APPENDS_IN_FLIGHT}, "
                                f"got {config.appends_in_flight}")
        self.config = config
        self.retention = retention  # coordinator.retention.RetentionPass: time/size retention
        # Snapshots also in the object store (coordinator.snapshot_store): the log below a snapshot
        # is deleted only once it is there, and an empty disk restores from it.
        self.snapshot_store = snapshot_store
        self.log = metadata_log
        self.lease = lease
        self.log_appender = LogAppender(shard=config.shard, metadata_log=metadata_log, lease=lease,
                                        append_timeout_ms=config.append_timeout_ms)
        self.lifetime = lifetime
        # Where the shard takes its epochs and registers its address (coordinator.leadership);
        # None (tests): epochs are the log's + 1, nothing registered.
        self.metadata = metadata
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.db_path = config.data_dir / DB_FILE
        self.snapshot_dir = config.data_dir / SNAPSHOT_DIR
        # The shard's reading copy (the applier writes): checks, FindBatches, snapshots.
        self.state = CoordinatorState(self.db_path, coordinator_id=config.shard, background_checkpoints=True)
        self.core = CoordinatorCore(self.state)
        self.applier: Applier | None = None  # started by each load (coordinator.applier)
        # Held across an apply and the mirroring of its cache changes, and while the applier is
        # replaced: a reload's catch-up may run beside the applier thread's last groups, and a
        # transaction's changes mirrored after a later one's would leave an older row cached.
        # Lock order: ``_apply_lock`` before ``_lock``.
        self._apply_lock = threading.Lock()
        self.status = FOLLOWER
        self.status_detail = "starting"
        # Bumped whenever the shard must (re)load: a load promotes to leader only if no newer
        # reason to reload came up while it read the log.
        self._generation = 0
        self._lock = threading.Condition(threading.RLock())
        # The writer's inbox: guards ``_queue`` and wakes the writer. Not the shard lock, which the
        # writer holds through checks and applies: a request thread only queues, never waits on it.
        # Lock order: ``_lock`` before ``_inbox``.
        self._inbox = threading.Condition(threading.Lock())
        # Replicated groups in log order, for the applier thread; and the groups whose Produce was
        # sent, in log order, until they are handed to it (both guarded by ``_replicated_ready``).
        self._replicated: deque[Group] = deque()
        self._flights: deque[Group] = deque()
        # The apply linger (``_apply_loop``): when the oldest group in ``_replicated`` was handed
        # over, how many records they hold, and whether someone waits for their apply (a read, a
        # barrier), which ends the linger at once. Guarded by ``_replicated_ready``.
        self._replicated_since = 0.0
        self._replicated_records = 0
        self._apply_now = False
        # The log end offset the next append expects, and this term's writer id in the batches
        # (set by each load, under the shard lock): see ``LogAppender.append``.
        self._next_offset = 0
        self._producer_id = -1
        self._epoch = 0  # this leadership's coordinator epoch (set by each load)
        # Until when this term's lease holds (``time.monotonic()``; 0: no term): extended by the lease
        # thread's renewals only while they come without a gap (``_lease_loop``), so a process
        # resumed after its lease ran out fails this check (``_term_valid``) for the rest of the term.
        self._term_until = 0.0
        self._replicated_ready = threading.Condition(threading.Lock())
        # Bumped whenever the pending records are dropped: a group checked before must not be sent.
        self._pipeline_epoch = 0
        # Metadata offsets: the last record of an answered request (raised by the appender before it
        # answers) and the last applied (under the shard lock). A read waits until applied >= acked.
        self._acked_through = -1
        self._applied_through = -1
        self._queue: deque[Waiter] = deque()
        # The writer's state (``_pump``, on the pipeline loop only): requests checked (records
        # pending) and not sent yet, the pipeline epoch they were checked in, the groups sent
        # (their Produce under way or not yet taken back), whether the oldest checked request came
        # with others (seconds_until_send), when the newest request taken was queued.
        self._checked: list[Waiter] = []
        self._checked_epoch = 0
        self._in_flight: deque[Group] = deque()
        self._busy = False
        self._last_queued_at = -1e9
        self._busy_gap_s = 2 * config.append_linger_ms / 1000
        self._linger_timer: asyncio.TimerHandle | None = None
        self._kicker: LoopWake | None = None  # runs ``_pump`` on the loop (``_kick``), once the loop runs
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        # The pipeline loop (``loop``): the appends in flight run on it as steps, answered by the
        # replica leader on the same loop that serves the framed listener's CommitFile calls
        # (coordinator/server.py), so an append's answer reaches the brokers waiting for it with no
        # hand-off between threads. Its pool runs what may block (a leader lookup, a gRPC append).
        self.loop = asyncio.new_event_loop()
        self._blocking = ThreadPoolExecutor(max_workers=config.appends_in_flight + 1,
                                            thread_name_prefix=f"coordinator-{config.shard}-blocking")
        self.snapshots = SnapshotPublisher(
            snapshot_dir=self.snapshot_dir, policy=config.snapshot, metadata_log=metadata_log,
            snapshot_store=snapshot_store, applied_offset=lambda: self.state.applied_offset,
            write_snapshot=self._write_snapshot)
        # While not leading: following the log (a standby, or ``follow``), standby reads.
        self.standby = StandbyFollower(
            shard=config.shard, metadata_log=metadata_log, lease=lease, standby=config.standby,
            follow_wait_ms=config.follow_wait_ms, ready=self._ready_to_follow,
            applied_offset=lambda: self.state.applied_offset, apply=self._apply_loaded,
            restore=self._restore_newest_snapshot)

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background threads; returns at once (loading happens in the background, so a
        cluster's start is not held up by the metadata topic or the log)."""
        for name, target in (("pipeline", self._run_loop), ("lease", self._lease_loop),
                             ("shard", self._shard_loop), ("applier", self._apply_loop)):
            thread = threading.Thread(target=target, name=f"coordinator-{self.config.shard}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._inbox:
            self._inbox.notify_all()
        with self._replicated_ready:
            self._replicated_ready.notify_all()
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self._stop_loop)
        for thread in self._threads:
            thread.join(timeout=5)
        self._blocking.shutdown(wait=False, cancel_futures=True)
        if not self.loop.is_running():
            self.loop.close()
        with self._lock:
            self._drop_pipeline(NotCoordinator(f"coordinator {self.config.shard} is shutting down"))
            self.status = FOLLOWER
        try:
            self.lease.release()
        except Exception:  # noqa: BLE001 - the store may be away at shutdown; the lease then expires
            log.debug("could not release the lease", exc_info=True)
        self._close_applier()
        self.state.close()

    def _run_loop(self) -> None:
        # Made on the loop's thread, so that a kick from the loop itself (an append ended)
        # schedules the writer without a wake-up through the loop's self-pipe.
        self._kicker = LoopWake(self.loop, self._pump)
        self.loop.call_soon(self._pump)  # anything queued before the loop ran
        self.loop.run_forever()

    def _stop_loop(self) -> None:
        """On the pipeline loop: fail what the writer holds, close the loop's connections to the
        replica leader, then stop."""
        self._pump()
        if self.log.listener is not None:
            self.log.listener.close_loop_connections()
        self.loop.stop()

    def _close_applier(self) -> None:
        with self._apply_lock:
            applier, self.applier = self.applier, None
            if applier is not None:
                applier.close()

    def _open_applier(self) -> None:
        with self._apply_lock:
            if self.applier is not None and not self.applier.alive():
                self.applier.close()
                self.applier = None
            if self.applier is None:
                self.applier = open_applier(self.config.applier, db_path=self.db_path, shard=self.config.shard,
                                            nice=self.config.applier_nice)

    # ---- requests ------------------------------------------------------------------------------
    def _term_valid(self) -> bool:
        """Whether this term's lease holds: renewed without a gap since the term's epoch was taken,
        the last renewal within lease - margin (``_lease_loop``)."""
        return time.monotonic() < self._term_until

    def _check_serving(self) -> None:
        if self.status == LEADER and self._term_valid():
            return
        if self.status == LOADING:
            raise CoordinatorLoadInProgress(f"coordinator {self.config.shard} is loading its metadata log "
                                            f"({self.status_detail})")
        raise NotCoordinator(f"this process does not lead diskless coordinator shard {self.config.shard}")

    def mutate(self, check: Callable[[CoordinatorCore], Decision], *, timeout_ms: int | None = None) -> Any:
        """``check(core)`` runs on the writer thread, under the shard lock."""
        return self._enqueue(Waiter(check), timeout_ms)

    def read_after_barrier(self, fn: Callable[[CoordinatorCore], Any], *, timeout_ms: int | None = None) -> Any:
        self._enqueue(Waiter(None), timeout_ms)
        return self.read(fn)

    def submit(self, check: Callable[[CoordinatorCore], Decision]) -> Waiter:
        """Queue ``check`` as ``mutate`` does, without waiting: its outcome is ``outcome(waiter)``
        once ``waiter.done`` is set (a framed call waits on the loop: pipeline.WaiterWait)."""
        waiter = Waiter(check)
        self._queue_waiter(waiter)
        return waiter

    def outcome(self, waiter: Waiter, timeout_ms: int | None = None) -> Any:
        """A submitted request's response; its error; REQUEST_TIMED_OUT while it has none."""
        return self._await(waiter, timeout_ms, block=False)

    def _enqueue(self, waiter: Waiter, timeout_ms: int | None) -> Any:
        self._queue_waiter(waiter)
        return self._await(waiter, timeout_ms)

    def _queue_waiter(self, waiter: Waiter) -> None:
        self._check_serving()  # fail fast; the writer checks again under the shard lock
        with self._inbox:
            self._queue.append(waiter)
        self._kick()

    def read(self, fn: Callable[[CoordinatorCore], Any]) -> Any:
        """``fn(core)`` on the applied state, once every mutation answered so far is applied."""
        with self._lock:
            self._check_serving()
            if self._applied_through < self._acked_through:
                self._hurry_apply()
                self._await_applied(self._acked_through)
            return fn(self.core)

    def _await_applied(self, offset: int) -> None:
        """Under the shard lock: wait (releasing it) until metadata ``offset`` is applied."""
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while self._applied_through < offset:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOut(f"coordinator {self.config.shard}: metadata offset {offset} was answered "
                                      f"but is not applied yet (applied {self._applied_through})")
            self._lock.wait(min(remaining, 0.5))
            self._check_serving()  # a failed apply reloads the shard: the read is then retried

    def _await(self, waiter: Waiter, timeout_ms: int | None, *, block: bool = True) -> Any:
        limit = min(timeout_ms or self.config.request_timeout_ms, self.config.request_timeout_ms) / 1000
        if not (waiter.done.wait(limit) if block else waiter.done.is_set()):
            # Still in the pipeline: it may yet be applied. A retry is safe (CommitFile is
            # idempotent for idempotent producers; DeleteRecords to an offset is).
            raise RequestTimedOut(f"coordinator {self.config.shard}: not replicated within {limit:.1f}s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.response

    # ---- leadership ----------------------------------------------------------------------------
    def _lease_loop(self) -> None:
        renew_every = self.config.lease_ms / 3 / 1000
        # Not holding it: ask often, so a killed leader's lease is taken soon after it expires.
        contend_every = min(renew_every, 0.1)
        validity_s = (self.config.lease_ms - self.config.lease_margin_ms) / 1000
        while not self._stop.is_set():
            began = time.monotonic()
            renewed = False
            try:
                if self.standby.may_contend():
                    held = renewed = self.lease.acquire_or_renew()
                else:
                    held = False
            except Exception as exc:  # noqa: BLE001 - the store away: the lease lapses on its own
                log.warning("lease renewal failed", extra={"fields": {"error": str(exc)}})
                held = self.lease.valid()
            ended = False
            with self._lock:
                # A renewal that returns after the term's lease could have run out (the process
                # was stopped, or this thread starved, before or during the call) may have been
                # granted anew, the lease having been another's meanwhile and a newer epoch taken:
                # that ends the term although the lease is held (a new term loads), and it never
                # extends the term's lease (``_term_until``), which thus lasts only while the
                # lease has been held without a gap since the term's epoch was taken.
                gap = renewed and self.status != FOLLOWER and time.monotonic() >= self._term_until
                if renewed and not gap:
                    self._term_until = began + validity_s
                if held and self.status == FOLLOWER:
                    self.status, self.status_detail = LOADING, "lease acquired"
                    self._generation += 1
                    log.info("acquired the shard lease", extra={"fields": {"shard": self.config.shard}})
                    self._wake.set()
                elif (not held or gap) and self.status != FOLLOWER:
                    what = "lost" if not held else "lapsed before its renewal"
                    log.warning("lost the shard lease" if not held else "the shard lease lapsed; ending the term",
                                extra={"fields": {"shard": self.config.shard}})
                    self.status, self.status_detail = FOLLOWER, f"lease {what}"
                    self._term_until = 0.0
                    self._drop_pipeline(NotCoordinator(f"coordinator {self.config.shard}: its lease {what}"))
                    ended = True
            self._stop.wait(renew_every if held and not ended else contend_every)

    def _shard_loop(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                if self.status == LOADING:
                    self._load()
                    backoff = 0.1
                elif self.status == LEADER:
                    self.snapshots.maybe_snapshot()
                    if self.lifetime is not None:
                        self.lifetime.run_due(self)
                    if self.retention is not None:
                        self.retention.run_due(self)
                    backoff = 0.1
                elif (self.config.standby or self.config.follow) and self.standby.follow():
                    backoff = 0.1
                    continue  # the fetch waited (long poll): fetch again at once
            except Exception as exc:  # noqa: BLE001 - retried forever with backoff
                self.status_detail = f"{type(exc).__name__}: {exc}"
                log.warning("shard task failed; retrying", extra={"fields": {"error": self.status_detail,
                                                                             "retry_in_s": backoff}})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            self._wake.wait(0.2 if self.status == LEADER else 0.1)
            self._wake.clear()

    def _load(self) -> None:
        """Read the metadata log from the applied offset to its end; then serve."""
        generation = self._generation
        self.status_detail = "reading the metadata log"
        started = time.monotonic()
        applied = 0
        with self._lock:
            # A failed apply dropped the applier's cached rows; ours may be as stale.
            self.state.drop_caches()
        self._open_applier()  # a new one if it died
        if self.log.topic_exists():
            self.log_appender.topic_ready = True
            try:
                applied = self._catch_up()
            except OffsetOutOfRange:
                self._restore_newest_snapshot()
                applied = self._catch_up()
        elif self.state.applied_offset >= 0:
            raise KafkaStorageError(f"{METADATA_TOPIC} does not exist but the state of shard {self.config.shard} "
                                    f"has applied it up to offset {self.state.applied_offset}: refusing to serve")
        if self.status != LOADING or self._generation != generation:
            return
        epoch = self._open_epoch()
        with self._lock:
            if self.status != LOADING or self._generation != generation:
                return
            # Everything in the log up to its end is applied now; an answered record that is not
            # there is not coming back, so no read may wait for it.
            self._applied_through = self.state.applied_offset
            self._acked_through = min(self._acked_through, self._applied_through)
            # The log ends where the state does (read to its settled end above, our EpochStarted
            # last); an append must follow one of this term's batches.
            self._next_offset = self.state.applied_offset + 1
            self._epoch = epoch
            self._producer_id = writer_id(epoch)[0]
            self.status, self.status_detail = LEADER, "serving"
        if self.metadata is not None and not register_shard(
                self.metadata, ShardAddress(shard=self.config.shard, grpc=self.config.advertised_grpc,
                                            metrics=self.config.metrics_url, owner=self.config.owner,
                                            framed=self.config.advertised_framed),
                check_lease=isinstance(self.lease, ShardLease)):
            # Deposed since the epoch was taken: the lease thread ends the term in a moment.
            log.warning("not registering the shard: its lease is another's now",
                        extra={"fields": {"shard": self.config.shard}})
        log.info("leading the shard", extra={"fields": {
            "shard": self.config.shard, "epoch": epoch, "applied_offset": self.state.applied_offset,
            "records_read": applied,
            "load_seconds": round(time.monotonic() - started, 3)}})

    def _open_epoch(self) -> int:
        """Take this leadership's coordinator epoch and open it in the log (an EpochStarted record,
        conditional on the log ending where our state does), then apply it: from here on no append
        of an older epoch lands, and none that landed before is missing from our state. Without
        the metadata topic yet (nothing was ever written) the term's first append, conditional on
        the log's end, opens it. Raises NOT_COORDINATOR if the lease is no longer ours or a newer
        epoch is in the log, OUT_OF_ORDER_SEQUENCE_NUMBER if another append came first (the shard
        loop then loads again)."""
        floor = self.state.coordinator_epoch
        if self.metadata is not None:
            epoch = take_epoch(self.metadata, shard=self.config.shard, owner=self.config.owner, floor=floor,
                               check_lease=isinstance(self.lease, ShardLease))
        else:
            epoch = floor + 1  # no metadata store (tests): the conditional append below still arbitrates
        if epoch < 0 or not self.lease.valid():
            with self._lock:
                if self.status == LOADING:
                    self.status, self.status_detail = FOLLOWER, "lost the lease while loading"
                    self._generation += 1
            raise NotCoordinator(f"coordinator {self.config.shard} lost its lease while loading")
        if not self.log_appender.topic_ready:
            return epoch
        producer_id, producer_epoch = writer_id(epoch)
        marker = encode_batch([encode_record(EpochStarted(self.config.owner, now_ms()), epoch=epoch)],
                              timestamp_ms=now_ms(), producer_id=producer_id, producer_epoch=producer_epoch)
        try:
            self.log.append(marker, timeout_ms=self.config.append_timeout_ms,
                            expected_end_offset=self.state.applied_offset + 1)
        except InvalidProducerEpoch as exc:
            raise self.log_appender.fenced(epoch, exc) from None
        self._catch_up()
        if self.state.coordinator_epoch != epoch:
            raise NotCoordinator(f"coordinator {self.config.shard}: epoch {epoch} was not the newest in the log "
                                 f"after opening it ({self.state.coordinator_epoch})")
        return epoch

    def _ready_to_follow(self) -> bool:
        """Before a standby's fetch (``StandbyFollower.follow``): False while the metadata topic
        does not exist; else an applier is open (a new one if it died)."""
        if not self.log_appender.topic_ready:
            if not self.log.topic_exists():
                return False
            self.log_appender.topic_ready = True
        self._open_applier()
        return True

    def read_standby(self, fn: Callable[[CoordinatorCore], Any]) -> tuple[Any, dict[str, int]]:
        """A warm standby's answer and how fresh it is (``StandbyFollower.read``)."""
        with self._lock:
            return self.standby.read(fn, core=self.core, following=self.status == FOLLOWER)

    def _catch_up(self) -> int:
        count = 0
        chunk: list[tuple[bytes, int]] = []
        for entry in self.log.read_to_end(self.state.applied_offset + 1):
            chunk.append((entry.value, entry.offset))
            if len(chunk) >= LOAD_CHUNK:
                count += self._apply_loaded(chunk)
                chunk = []
        if chunk:
            count += self._apply_loaded(chunk)
        return count

    def _apply_loaded(self, chunk: list[tuple[bytes, int]]) -> int:
        with self._apply_lock:
            if self.applier is None:
                raise NotCoordinator(f"coordinator {self.config.shard} is shutting down")
            result = self.applier.apply(chunk)
            with self._lock:
                self.state.mirror_cache_changes(result.changes)
        return result.applied

    def _restore_newest_snapshot(self) -> None:
        """The log starts past our applied offset (truncated below a snapshot): the newest local
        snapshot (or, newer, the object store's: an empty disk) must cover the gap, or this shard
        cannot be rebuilt here."""
        newest = latest_snapshot(self.snapshot_dir)
        if self.snapshot_store is not None:
            newest = self.snapshot_store.fetch_newer(
                directory=self.snapshot_dir, than=max(snapshot_offset(newest) if newest else -1,
                                                      self.state.applied_offset)) or newest
        if newest is None or snapshot_offset(newest) <= self.state.applied_offset:
            raise OffsetOutOfRange(f"the metadata log of shard {self.config.shard} starts past applied offset "
                                   f"{self.state.applied_offset} and no newer snapshot is in {self.snapshot_dir}")
        self._close_applier()  # the writer of the file being replaced
        with self._lock:
            self.state.close()
            self.state = restore_snapshot(newest, self.db_path, coordinator_id=self.config.shard,
                                          background_checkpoints=True)
            self.core = CoordinatorCore(self.state)
        self.snapshots.restored(newest)
        self._open_applier()
        log.info("restored a snapshot", extra={"fields": {"snapshot": str(newest),
                                                          "applied_offset": self.state.applied_offset}})

    # ---- snapshots -------------------------------------------------------------------------------
    def _write_snapshot(self, directory: Path) -> Path:
        """A local snapshot of the state, for ``self.snapshots`` (coordinator.snapshot_publisher).
        Not under the shard lock: the copy reads through a connection of its own, and commits go
        on; at a lower CPU priority (snapshots.run_at_low_priority)."""
        return run_at_low_priority(lambda: self.state.snapshot(directory),
                                   name=f"coordinator-{self.config.shard}-snapshot")

    # ---- numbers for metrics ---------------------------------------------------------------------
    def gauges(self) -> dict[str, Any]:
        """Point-in-time numbers for the metrics collector (a few indexed queries)."""
        with self._lock:
            return {"status": self.status, "applied_offset": self.state.applied_offset,
                    "pending_records": self.core.pending.pending_count, "batches": self.state.count_batches(),
                    "files": self.state.count_files_by_state(), "snapshot_time": self.snapshots.last_time}
