"""The purgatory: delayed operations watched by key locally, with their deadlines kept in Redis.

Kafka's ``DelayedOperationPurgatory`` keeps a hierarchical timing wheel in each broker. lowtide keeps
the timers in Redis instead, so deadlines are visible to every process (front door, tools, tests,
dashboards), survive a restart for clean-up, and expiry is driven from one shared, ordered structure.
The operations themselves (callbacks, waiting gRPC handler threads) stay in the owning process.

Redis key layout::

    lowtide:purgatory:{name}:deadlines        ZSET, one per operation kind ("DeleteRecords", "Produce")
      ├─ member "replica-0|3f2a9c..."         "{owner}|{op_id}"  (owner and op_id never contain '|')
      │  score  1732200000123                  deadline, wall-clock epoch milliseconds
      ├─ member "replica-1|b71e04..."
      │  score  1732200000480
      └─ ...
    lowtide:purgatory:owner:{owner}           STRING, value = owner, PX = max(3 x reaper interval, 1 s)
                                              liveness of a process; refreshed by its reaper thread

Life of an operation (``try_complete_else_watch``)::

    try_complete() ── True ──► done (nothing ever written to Redis)
         │ False
         ▼
    watch locally under every key ──► ZADD deadlines {owner}|{op_id} deadline_ms ──► wake reaper
         │                                                       if it sleeps past the deadline
         ▼
    try_complete() again (closes the race with a check_and_complete that ran before we watched)

    completed (check_and_complete / force_complete / fail)  ──► unwatch, ZREM member
    deadline reached (reaper: ZRANGEBYSCORE -inf now)        ──► ZREM member; only if ZREM == 1:
                                                                 on_expiration + on_complete

Reaper thread, per purgatory:

* sleeps on a local Condition until the earliest score in the zset (capped at the reaper interval),
  woken early when an operation with an earlier deadline is watched, or by ``wake_reaper()``;
* own due members: ZREM, and expire the local operation only if ZREM returned 1;
* foreign due members whose owner's liveness key is gone (a dead process): ZREM (leak clean-up; they
  are never "completed": the process that could answer their request is gone);
* own members with no local operation (a completion whose ZREM hit a Redis outage): ZREM;
* refreshes the owner liveness key.

``start()`` removes the members with this owner's prefix left by a previous incarnation that crashed:
a restart neither leaks entries nor completes anything early. A Redis outage never crashes the reaper
(it logs and retries) and never makes a completion fail; while Redis is unreachable, operations whose
deadline passed more than one reaper interval ago are expired from their local deadline so that no
handler waits forever.

Time: every reading (deadlines due, the reaper's next wake-up, liveness refresh, the local-expiry
fallback) comes from the injected ``clock`` (wall-clock epoch ms by default; Redis scores are its
values). The reaper's sleep itself is a real-time wait of at most one interval, so a test that moves
a manual clock calls ``wake_reaper()`` to have the move looked at without waiting for that sleep.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import redis as redis_lib
from prometheus_client import Counter, Gauge

from lowtide.clock import Clock, now_ms
from lowtide.errors import BrokerNotAvailable, LowtideError, UnknownServerError
from lowtide.purgatory.delayed import DelayedOperation

logger = logging.getLogger(__name__)

PURGATORY_PENDING = Gauge(
    "lowtide_purgatory_pending",
    "Delayed operations watched in this process and not yet completed.",
    ["operation"],
)
PURGATORY_EXPIRED = Counter(
    "lowtide_purgatory_expired_total",
    "Delayed operations that reached their deadline before their condition held.",
    ["operation"],
)

KEY_PREFIX = "lowtide:purgatory"
# Members processed per reaper round; bounds the work (and the Redis reply) of one wake-up.
_REAP_BATCH = 1000
_REDIS_ERRORS = (redis_lib.exceptions.RedisError, OSError)


def build_deadlines_key(name: str) -> str:
    """The sorted set of deadlines of one operation kind."""
    return f"{KEY_PREFIX}:{name}:deadlines"


def build_owner_key(owner: str) -> str:
    """The liveness key of one process."""
    return f"{KEY_PREFIX}:owner:{owner}"


def build_member(owner: str, op_id: str) -> str:
    return f"{owner}|{op_id}"


def parse_member(member: bytes | str) -> tuple[str, str]:
    """Split ``{owner}|{op_id}`` into (owner, op_id)."""
    text = member.decode() if isinstance(member, bytes) else member
    owner, _, op_id = text.partition("|")
    return owner, op_id


def _escape_glob(text: str) -> str:
    # SCAN MATCH uses glob syntax; an owner such as "replica[0]" must match literally.
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


@dataclass(slots=True)
class _Watched:
    op: DelayedOperation
    keys: tuple[Hashable, ...]


class Purgatory:
    """Delayed operations of one kind, watched under keys, with Redis-driven expiry.

    Contract:

    * ``start()`` before ``try_complete_else_watch``; ``close()`` fails every still-pending operation
      with BROKER_NOT_AVAILABLE (so blocked handler threads return) and stops the reaper.
    * ``try_complete_else_watch(op, keys)`` follows Kafka: try, else watch under every key and
      record the deadline, then try again. Returns True if the operation was completed by it.
    * ``check_and_complete(key)`` re-checks the operations watched under ``key``; call it whenever
      their condition may have changed (the partition's low watermark or high watermark moved).
    * An operation is completed exactly once: by its condition, by ``fail``/``cancel_all_for_key``
      or by expiry, whichever comes first. Operations that complete normally never expire.
    * ``clock`` (epoch milliseconds, default ``now_ms``) is the only source of time: deadlines are
      compared with it and written to Redis as its values, so it must agree with the clock that
      computed the operations' ``deadline_ms``. Redis expires the liveness key in real time, so a
      clock that stands still longer than the liveness TTL lets other processes think this one dead.
    * ``wake_reaper()`` makes the reaper run a round at once (re-reading the clock), optionally
      waiting for that round to finish.

    Thread-safety: all public methods are safe to call from any thread concurrently (gRPC handler
    threads, follower-fetch threads, the reaper), and ``clock`` is called from all of them, so it
    must be thread-safe too. The purgatory's lock is never held while calling into an operation, so
    operation callbacks may call back into the purgatory.

    Give the Redis client a ``socket_timeout``: a Redis that hangs (rather than refuses) would
    otherwise block completing threads in their best-effort ZREM.
    """

    def __init__(self, *, name: str, redis: redis_lib.Redis, owner: str,
                 reaper_interval_ms: int = 1000, clock: Clock = now_ms) -> None:
        if not name or "|" in owner or not owner:
            raise ValueError(f"invalid purgatory name/owner: {name!r}/{owner!r} (owner must not contain '|')")
        if reaper_interval_ms <= 0:
            raise ValueError(f"reaper_interval_ms must be positive, got {reaper_interval_ms}")
        self.name = name
        self.owner = owner
        self._redis = redis
        self._clock = clock
        self._interval_ms = int(reaper_interval_ms)
        self._liveness_ttl_ms = max(3 * self._interval_ms, 1000)
        self._deadlines_key = build_deadlines_key(name)
        self._owner_key = build_owner_key(owner)

        self._lock = threading.Lock()
        self._ops: dict[str, _Watched] = {}
        self._watchers: dict[Hashable, dict[str, DelayedOperation]] = {}

        # Reaper wake-up: _next_wake_ms is when the sleeping reaper will next look at Redis; +inf
        # while it is processing, so every op watched meanwhile requests another round.
        self._wake_cond = threading.Condition()
        self._next_wake_ms = math.inf
        self._wake_requested = False
        # Reaper rounds begun and finished (under _wake_cond): wake_reaper(wait_s=...) waits for a
        # round that began after its call, i.e. one that read the clock after the caller moved it.
        self._rounds_begun = 0
        self._rounds_finished = 0

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._needs_leftover_cleanup = False
        self._last_liveness_ms = 0
        self._last_local_sweep_ms = 0
        self._redis_healthy = True
        self._pending_gauge = PURGATORY_PENDING.labels(operation=name)
        self._expired_counter = PURGATORY_EXPIRED.labels(operation=name)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Announce liveness, remove a crashed predecessor's members, start the reaper thread."""
        if self._started:
            return
        self._started = True
        try:
            self._refresh_liveness()
            self._remove_leftover_members()
        except _REDIS_ERRORS as exc:
            # Not fatal: the reaper retries the clean-up once Redis answers.
            self._needs_leftover_cleanup = True
            self._mark_redis_unhealthy(exc, "start")
        self._thread = threading.Thread(target=self._run_reaper, name=f"purgatory-reaper-{self.name}",
                                        daemon=True)
        self._thread.start()
        logger.info("purgatory started", extra={"operation": self.name, "owner": self.owner,
                                                 "reaper_interval_ms": self._interval_ms})

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Stop the reaper and fail every pending operation with BROKER_NOT_AVAILABLE."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self.wake_reaper()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            leftover = [w.op for w in self._ops.values()]
        for op in leftover:
            op.fail(BrokerNotAvailable(f"purgatory {self.name} on {self.owner} is shutting down"))
        try:
            self._redis.delete(self._owner_key)
        except _REDIS_ERRORS as exc:
            logger.warning("could not delete purgatory liveness key: %s", exc,
                           extra={"operation": self.name, "owner": self.owner})
        logger.info("purgatory closed", extra={"operation": self.name, "owner": self.owner,
                                                "failed_pending": len(leftover)})

    def __enter__(self) -> Purgatory:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- operations --------------------------------------------------------------------------------

    def try_complete_else_watch(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Complete ``op`` now if its condition holds, else watch it under ``keys`` until it does.

        Returns True if this call completed the operation; otherwise the caller waits with
        ``op.wait(...)`` (which also returns at once if a concurrent thread completed it).
        """
        watch_keys = tuple(dict.fromkeys(keys))
        if not watch_keys:
            raise ValueError("a delayed operation must be watched under at least one key")
        if not self._started or self._closed:
            raise RuntimeError(f"purgatory {self.name} is not running (start() it; not after close())")
        if op.run_try_complete():
            return True

        with self._lock:
            if op.op_id in self._ops:
                raise ValueError(f"operation {op.op_id} is already watched in purgatory {self.name}")
            self._ops[op.op_id] = _Watched(op=op, keys=watch_keys)
            for key in watch_keys:
                self._watchers.setdefault(key, {})[op.op_id] = op
        self._pending_gauge.inc()
        # Registered before the listener is attached, so a completion from now on always finds it.
        if not op.attach_listener(self._handle_completed):
            self._forget(op)  # completed by another thread between the first try and now
            return False

        self._record_deadline(op)
        self._wake_reaper_if_sleeping_past(op.deadline_ms)
        # Second try: the condition may have become true after the first check but before the op
        # was watched, and the check_and_complete that saw it found nothing to complete.
        return op.run_try_complete()

    def check_and_complete(self, key: Hashable) -> int:
        """Re-check the operations watched under ``key``; returns how many this call completed."""
        with self._lock:
            watched = self._watchers.get(key)
            ops = list(watched.values()) if watched else []
        completed = 0
        for op in ops:
            if op.is_completed:
                continue
            try:
                if op.run_try_complete():
                    completed += 1
            except Exception as exc:
                # A broken condition check must not break the caller (e.g. the follower fetch path),
                # nor leave the waiter blocked: fail this operation and go on with the others.
                logger.exception("try_complete failed", extra={"operation": self.name, "op_id": op.op_id})
                if op.fail(UnknownServerError(f"{type(exc).__name__}: {exc}")):
                    completed += 1
        return completed

    def cancel_all_for_key(self, key: Hashable, *, reason_exc: LowtideError | BaseException) -> int:
        """Fail every operation watched under ``key`` (e.g. NotLeaderOrFollower); returns how many."""
        with self._lock:
            watched = self._watchers.get(key)
            ops = list(watched.values()) if watched else []
        return sum(1 for op in ops if op.fail(reason_exc))

    def wake_reaper(self, *, wait_s: float | None = None) -> bool:
        """Have the reaper run a round now, reading the clock afresh, instead of at its next wake-up.

        For a caller that moved an injected clock: the reaper otherwise notices only after its
        current real-time sleep (up to one interval). With ``wait_s``, block until a round that began
        after this call has finished (expired what was due, reaped dead owners, ran the local-expiry
        fallback); returns False if that did not happen within ``wait_s`` (reaper not running or
        stopped). Without ``wait_s``, returns True at once.
        """
        with self._wake_cond:
            target = self._rounds_begun + 1
            self._wake_requested = True
            self._wake_cond.notify_all()
            if wait_s is None:
                return True
            return self._wake_cond.wait_for(
                lambda: self._rounds_finished >= target or self._stop.is_set(), wait_s,
            ) and self._rounds_finished >= target

    @property
    def is_running(self) -> bool:
        """Started, not closed, and the reaper thread alive."""
        return self._started and not self._closed and self._thread is not None and self._thread.is_alive()

    def pending(self) -> int:
        """Operations watched in this purgatory and not yet completed."""
        with self._lock:
            return len(self._ops)

    def count_watched(self, key: Hashable) -> int:
        """Operations watched under ``key`` and not yet completed."""
        with self._lock:
            return len(self._watchers.get(key, ()))

    # -- completion bookkeeping --------------------------------------------------------------------

    def _handle_completed(self, op: DelayedOperation) -> None:
        """Completion listener: unwatch the op and drop its Redis timer (best effort)."""
        if not self._forget(op):
            return
        if op.expired:
            return  # the reaper already removed (or failed to reach) the member
        try:
            self._redis.zrem(self._deadlines_key, build_member(self.owner, op.op_id))
        except _REDIS_ERRORS as exc:
            # The op is complete regardless; the reaper removes the orphaned member at its deadline.
            logger.warning("could not remove purgatory timer: %s", exc,
                           extra={"operation": self.name, "op_id": op.op_id})

    def _forget(self, op: DelayedOperation) -> bool:
        with self._lock:
            watched = self._ops.pop(op.op_id, None)
            if watched is None or watched.op is not op:
                if watched is not None:  # a different op with the same id: put it back
                    self._ops[op.op_id] = watched
                return False
            for key in watched.keys:
                ops = self._watchers.get(key)
                if ops is not None:
                    ops.pop(op.op_id, None)
                    if not ops:
                        del self._watchers[key]
        self._pending_gauge.dec()
        return True

    def _record_deadline(self, op: DelayedOperation) -> None:
        member = build_member(self.owner, op.op_id)
        try:
            self._redis.zadd(self._deadlines_key, {member: op.deadline_ms})
            # If the op completed concurrently, its listener's ZREM may have run before this ZADD.
            if op.is_completed:
                self._redis.zrem(self._deadlines_key, member)
        except _REDIS_ERRORS as exc:
            # Not fatal: while Redis is away the reaper expires the op from its local deadline.
            self._mark_redis_unhealthy(exc, "zadd")

    def _wake_reaper_if_sleeping_past(self, deadline_ms: int) -> None:
        with self._wake_cond:
            if deadline_ms < self._next_wake_ms:
                self._wake_requested = True
                self._wake_cond.notify()

    # -- reaper ------------------------------------------------------------------------------------

    def _run_reaper(self) -> None:
        while not self._stop.is_set():
            with self._wake_cond:
                self._rounds_begun += 1
            wait_ms: float = self._interval_ms
            try:
                self._refresh_liveness_if_due()
                if self._needs_leftover_cleanup:
                    self._remove_leftover_members()
                    self._needs_leftover_cleanup = False
                wait_ms = self._reap_due_members()
                if not self._redis_healthy:
                    self._redis_healthy = True
                    logger.info("purgatory reaches Redis again", extra={"operation": self.name})
            except _REDIS_ERRORS as exc:
                self._mark_redis_unhealthy(exc, "reaper")
            except Exception:
                # Never let the thread die: a dead reaper means no operation ever expires again.
                logger.exception("purgatory reaper round failed", extra={"operation": self.name})
            try:
                self._expire_overdue_locally()
            except Exception:
                logger.exception("purgatory local expiry failed", extra={"operation": self.name})
            self._sleep_until_woken(wait_ms)

    def _sleep_until_woken(self, wait_ms: float) -> None:
        wait_ms = max(0.0, min(wait_ms, self._interval_ms))
        with self._wake_cond:
            self._rounds_finished = self._rounds_begun
            self._wake_cond.notify_all()  # wake_reaper(wait_s=...) callers waiting for this round
            self._next_wake_ms = self._clock() + wait_ms
            if not self._wake_requested and not self._stop.is_set() and wait_ms > 0:
                self._wake_cond.wait(wait_ms / 1000.0)
            self._wake_requested = False
            self._next_wake_ms = math.inf

    def _reap_due_members(self) -> float:
        """One round over the due members; returns milliseconds until the next deadline."""
        now = self._clock()
        due = self._redis.zrangebyscore(self._deadlines_key, "-inf", now, start=0, num=_REAP_BATCH)
        own: list[tuple[str, str]] = []
        foreign: dict[str, list[str]] = {}
        for raw in due:
            owner, op_id = parse_member(raw)
            member = build_member(owner, op_id)
            if owner == self.owner:
                own.append((member, op_id))
            else:
                foreign.setdefault(owner, []).append(member)
        if own:
            self._expire_own(own)
        if foreign:
            self._remove_members_of_dead_owners(foreign)
        if len(due) >= _REAP_BATCH:
            return 0  # more due members than one batch: go again at once
        # Strictly after now: due members of live foreign owners are theirs to expire; waiting for
        # them here would spin.
        upcoming = self._redis.zrangebyscore(self._deadlines_key, f"({now}", "+inf", start=0, num=1,
                                             withscores=True)
        if not upcoming:
            return self._interval_ms
        return max(0.0, float(upcoming[0][1]) - self._clock())

    def _expire_own(self, members: list[tuple[str, str]]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for member, _ in members:
            pipe.zrem(self._deadlines_key, member)
        removed = pipe.execute()
        for (_, op_id), n in zip(members, removed, strict=True):
            if int(n) != 1:
                continue  # someone else removed it first (a completion): it is not ours to expire
            with self._lock:
                watched = self._ops.get(op_id)
            # No local op: its completion's ZREM failed earlier, or it belonged to a previous
            # incarnation; removing the member was all there was to do.
            if watched is not None and watched.op.expire():
                self._expired_counter.inc()
                logger.debug("delayed operation expired",
                             extra={"operation": self.name, "op_id": op_id})

    def _remove_members_of_dead_owners(self, foreign: dict[str, list[str]]) -> None:
        owners = list(foreign)
        pipe = self._redis.pipeline(transaction=False)
        for owner in owners:
            pipe.exists(build_owner_key(owner))
        alive = pipe.execute()
        dead_members = [m for owner, is_alive in zip(owners, alive, strict=True) if not is_alive
                        for m in foreign[owner]]
        if not dead_members:
            return
        removed = self._redis.zrem(self._deadlines_key, *dead_members)
        logger.info("removed purgatory timers of dead owners",
                    extra={"operation": self.name, "removed": int(removed),
                           "owners": [o for o, a in zip(owners, alive, strict=True) if not a]})

    def _remove_leftover_members(self) -> None:
        """Remove this owner's members that no local operation backs (a crashed predecessor's)."""
        pattern = _escape_glob(self.owner) + "|*"
        stale: list[str] = []
        for raw, _score in self._redis.zscan_iter(self._deadlines_key, match=pattern, count=500):
            owner, op_id = parse_member(raw)
            if owner != self.owner:
                continue
            with self._lock:
                known = op_id in self._ops
            if not known:
                stale.append(build_member(owner, op_id))
        removed = 0
        for start in range(0, len(stale), 500):
            removed += int(self._redis.zrem(self._deadlines_key, *stale[start:start + 500]))
        if removed:
            logger.info("removed purgatory timers left by a previous incarnation",
                        extra={"operation": self.name, "owner": self.owner, "removed": removed})

    def _refresh_liveness(self) -> None:
        self._redis.set(self._owner_key, self.owner, px=self._liveness_ttl_ms)
        self._last_liveness_ms = self._clock()

    def _refresh_liveness_if_due(self) -> None:
        # Three refreshes per TTL: one missed round does not make this process look dead.
        if self._clock() - self._last_liveness_ms >= self._liveness_ttl_ms // 3:
            self._refresh_liveness()

    def _expire_overdue_locally(self) -> None:
        """Expire ops whose deadline passed over one interval ago and that Redis did not expire.

        Normally expiry comes from Redis and nothing is left here. This covers a Redis outage and a
        member removed by a foreign reaper that believed this process dead, so that no waiter blocks
        past its deadline plus one interval.
        """
        now = self._clock()
        if now - self._last_local_sweep_ms < self._interval_ms:
            return
        self._last_local_sweep_ms = now
        with self._lock:
            overdue = [w.op for w in self._ops.values() if w.op.deadline_ms + self._interval_ms < now]
        for op in overdue:
            if op.expire():
                self._expired_counter.inc()
                logger.warning("delayed operation expired from its local deadline (Redis did not)",
                               extra={"operation": self.name, "op_id": op.op_id})
                try:
                    self._redis.zrem(self._deadlines_key, build_member(self.owner, op.op_id))
                except _REDIS_ERRORS:
                    pass  # removed by a later reaper round once Redis is back

    def _mark_redis_unhealthy(self, exc: BaseException, where: str) -> None:
        # Log the first failure of an outage as a warning, the rest at debug: no log flood.
        if self._redis_healthy:
            self._redis_healthy = False
            logger.warning("purgatory cannot reach Redis (%s): %s", where, exc,
                           extra={"operation": self.name, "owner": self.owner})
        else:
            logger.debug("purgatory still cannot reach Redis (%s): %s", where, exc,
                         extra={"operation": self.name})
