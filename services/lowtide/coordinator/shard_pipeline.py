"""The mutation pipeline of a coordinator shard as it runs: the writer on the shard's pipeline
loop, the appends in flight, their hand-over in log order, and the applier thread
(coordinator.service draws the request path; docs/design/diskless.md#cost-per-commit says why the
writer, the appends and the framed listener share one loop).

``ShardPipeline`` is a base of ``ShardService`` and works on its state: the shard lock ``_lock``
and ``_apply_lock``, the inbox ``_inbox``/``_queue``, the writer's ``_checked``/``_in_flight``/
``_busy``/``_last_queued_at``, the hand-over's ``_replicated_ready``/``_flights``/``_replicated``,
the offsets ``_acked_through``/``_applied_through``/``_next_offset``, the term's ``_epoch``/
``_producer_id`` and its lease check ``_term_valid``, ``_pipeline_epoch``, ``loop`` and
``_blocking``, ``log_appender``, ``applier``, ``core``, ``status`` (set up by
``ShardService.__init__``). Thread-safety: the writer methods
(``_pump`` and what it calls, ``_start_append``, ``_appended``) run on the pipeline loop only;
``_kick`` from any thread; ``_apply_loop`` on the applier thread; ``_fail_pipeline`` and
``_drop_pipeline`` from any thread (under the shard lock, which they take).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from concurrent.futures import Future
from functools import partial

from prometheus_client import Histogram

from lowtide.coordinator.pipeline import Group, Waiter, seconds_until_send
from lowtide.coordinator.records import MetadataRecord
from lowtide.errors import LowtideError, NotCoordinator, RequestTimedOut
from lowtide.rpc.steps import drive_to_future

# The service's logger: these are the shard's lines, named as before the module was split.
log = logging.getLogger("lowtide.coordinator.service")

FOLLOWER, LOADING, LEADER = "follower", "loading", "leader"
# Decisions sent in one Produce at most: bounds the batch a slow replica must take at once.
MAX_DECISIONS_PER_APPEND = 512
# Records (100-batch files, mostly) that end the apply linger: bounds one transaction's length.
APPLY_MAX_RECORDS = 64
APPLY_DURATION = Histogram(
    "lowtide_coordinator_apply_duration_seconds", "One SQLite transaction applying one appended group", ["shard"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0))


class ShardPipeline:
    """The writer, the appends in flight and the applier thread of a ``ShardService`` (module
    docstring: the state they share and where each runs)."""

    # ---- the writer ----------------------------------------------------------------------------
    def _linger_left(self, checked: list[Waiter], in_flight: deque[Group], busy: bool) -> float:
        return seconds_until_send(oldest_queued_at=checked[0].queued_at if checked else None,
                                  in_flight=len(in_flight), max_in_flight=self.config.appends_in_flight,
                                  linger_s=self.config.append_linger_ms / 1000, now=time.monotonic(), busy=busy)

    def _kick(self) -> None:
        """From any thread: have the pipeline loop run the writer (``_pump``) soon; at most one
        run pending (rpc.steps.LoopWake: the flag is cleared before ``_pump`` takes the queue, so
        a request queued meanwhile is either taken by that run or schedules the next one)."""
        kicker = self._kicker
        if kicker is not None:  # None until the loop runs: ``_run_loop`` pumps once at its start
            kicker.set()

    def _pump(self) -> None:
        """The writer, on the pipeline loop: take the queued requests, check them, and send what
        may be sent (seconds_until_send) as the next append; again while there is more to do
        now, else a timer for the linger. Run by ``_kick`` (a request queued, an append ended)."""
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        while True:
            try:
                if not self._write_step():
                    return
            except Exception as exc:  # noqa: BLE001 - a bug: fail what the writer holds and reload, never stall
                log.exception("the shard's writer failed")
                failed = [*self._in_flight, Group(waiters=self._checked)]
                self._checked, self._in_flight = [], deque()
                self._fail_pipeline(exc, failed, "the writer failed")
                return
            with self._inbox:
                queued = bool(self._queue)
            in_flight = self._in_flight
            if queued or (in_flight and in_flight[0].finished):
                continue
            linger = self._linger_left(self._checked, in_flight, self._busy)
            if linger > 0:
                self._linger_timer = self.loop.call_later(linger, self._kick)
                return

    def _write_step(self) -> bool:
        """One round of the writer (``_pump``); False once the service stopped."""
        with self._inbox:
            taken = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_DECISIONS_PER_APPEND))]
        send: Group | None = None
        to_apply: list[Group] = []
        checked, in_flight = self._checked, self._in_flight
        with self._lock:
            if self._stop.is_set():
                stopping = NotCoordinator(f"coordinator {self.config.shard} is shutting down")
                for group in (Group(waiters=checked), *in_flight, Group(waiters=taken)):
                    group.fail(stopping)
                self._checked, self._in_flight = [], deque()
                return False
            fresh = bool(taken) and not checked
            came_close = bool(taken) and taken[0].queued_at - self._last_queued_at < self._busy_gap_s
            if taken:
                self._last_queued_at = taken[-1].queued_at
                if not checked:
                    self._checked_epoch = self._pipeline_epoch
                self._check(taken)
                checked.extend(taken)
            try:
                while in_flight and in_flight[0].finished:
                    in_flight[0].appended.result()  # raises what the append raised; else handed over
                    in_flight.popleft()
                if fresh:
                    # Came while an append was under way, or close behind the request before:
                    # more are likely to come while it lingers (seconds_until_send).
                    self._busy = came_close or bool(in_flight)
            except Exception as exc:  # noqa: BLE001 - any failure: fail the pipeline, reload
                failed = [*in_flight, Group(waiters=checked)]
                self._checked, self._in_flight = [], deque()
                self._fail_pipeline(exc, failed, "metadata log append failed")
                return True
            if checked and self._checked_epoch != self._pipeline_epoch:
                # Checked against pending records that were dropped since (a failed append
                # or apply, a lost lease): they must not reach the log.
                Group(waiters=checked).fail(RequestTimedOut(
                    f"coordinator {self.config.shard}: the pipeline was reset after this request was checked"))
                checked = self._checked = []
            if checked and self._linger_left(checked, in_flight, self._busy) <= 0:
                group = Group(waiters=checked[:MAX_DECISIONS_PER_APPEND])
                checked = self._checked = checked[MAX_DECISIONS_PER_APPEND:]
                records = sum(len(w.records) for w in group.waiters)
                # The term it was checked in: its answers go out only while that term leads
                # (``_deposed``), barriers' too.
                group.epoch = self._epoch
                if records:
                    # Taken with the epoch check, under the lock: a load resets both.
                    group.expected, group.producer_id = self._next_offset, self._producer_id
                    self._next_offset += records
                    send = group
                else:
                    group.finished = True   # nothing to send: handed over in its turn
                    to_apply.append(group)  # barriers, refusals: answered after what is before them
        if send is not None:
            try:
                send.data = self.log_appender.encode(send)
                previous = in_flight[-1].appended if in_flight else None
                with self._replicated_ready:
                    self._flights.append(send)
                send.appended = Future()
                # A weak reference: the group holds the future and the future its callbacks,
                # so a strong one is a cycle that only the cyclic GC frees, and with it every
                # object of the group's requests (~350 per 100-batch file): under load that
                # was gen-1/gen-2 collections of 5-40 ms, holding the GIL, every few seconds.
                send.appended.add_done_callback(partial(self._appended, weakref.ref(send)))
                in_flight.append(send)
                self._start_append(send, previous)
            except Exception as exc:  # noqa: BLE001 - any failure: fail the pipeline, reload
                failed = list(in_flight) if in_flight and in_flight[-1] is send else [*in_flight, send]
                self._in_flight = deque()
                self._fail_pipeline(exc, failed, "metadata log append failed")
                return True
        if to_apply:
            with self._replicated_ready:
                if self._flights:
                    # Behind appends still in flight: the hand-over keeps log order.
                    self._flights.extend(to_apply)
                else:
                    self._hand_over(to_apply)
        return True

    # ---- the applier ---------------------------------------------------------------------------
    def _apply_loop(self) -> None:
        """Apply what was replicated (handed over by the appender, or barriers by the writer),
        everything since the last apply in one transaction: the writer goes on meanwhile.

        The apply linger: the first group handed over waits up to ``apply_linger_ms`` for others
        to share its transaction, unless someone waits for it (a read, ``_hurry_apply``; a barrier
        in a group) or ``APPLY_MAX_RECORDS`` are waiting. Why: the requests were answered when
        replicated, so no one is waiting for the apply; and one transaction for several files
        writes a partition's index page once instead of once per file (SQLite's WAL), with one
        round trip to the applier process instead of several."""
        linger_s = self.config.apply_linger_ms / 1000
        while not self._stop.is_set():
            with self._replicated_ready:
                while not self._replicated and not self._stop.is_set():
                    self._replicated_ready.wait(0.5)
                while (linger_s and not self._apply_now and not self._stop.is_set()
                       and self._replicated_records < APPLY_MAX_RECORDS):
                    left = self._replicated_since + linger_s - time.monotonic()
                    if left <= 0:
                        break
                    self._replicated_ready.wait(left)
                groups = list(self._replicated)
                self._replicated.clear()
                self._replicated_records = 0
                self._apply_now = False
            if self._stop.is_set():
                Group(waiters=[w for g in groups for w in g.waiters]).fail(
                    NotCoordinator(f"coordinator {self.config.shard} is shutting down"))
                return
            self._apply(groups)

    def _hand_over(self, groups: list[Group]) -> None:
        """Under ``_replicated_ready``: queue groups for the applier, in log order; wake it only
        if it waits for a first group or must end its linger (``_apply_loop``)."""
        if not self._replicated:
            self._replicated_since = time.monotonic()
            wake = True
        else:
            wake = False
        self._replicated.extend(groups)
        for group in groups:
            self._replicated_records += len(group.values)
            for waiter in group.waiters:
                if not waiter.records:  # a barrier: answered only once applied
                    self._apply_now = wake = True
        if wake or self._replicated_records >= APPLY_MAX_RECORDS:
            self._replicated_ready.notify()

    def _hurry_apply(self) -> None:
        """From any thread (a read about to wait for the apply): end the apply linger now."""
        with self._replicated_ready:
            self._apply_now = True
            self._replicated_ready.notify()

    def _start_append(self, group: Group, previous: Future | None) -> None:
        """On the pipeline loop: drive the group's append (``LogAppender.append_steps``); its
        outcome settles ``group.appended``, whose callback (``_appended``) hands it over."""
        assert group.appended is not None
        drive_to_future(self.log_appender.append_steps(group, previous, loop=self.loop), loop=self.loop,
                        executor=self._blocking, future=group.appended)

    def _appended(self, group_ref: weakref.ref[Group], future: Future) -> None:
        """On the pipeline loop, as a Produce ends: hand every group at the head of the flights whose
        Produce succeeded (or that had nothing to send) to the applier, in log order, and answer
        their requests; stop at one still under way or failed (the writer fails the pipeline).
        Either way the writer learns the slot is free: ``finished`` is set before the hand-over
        under the same lock, and a group is answered only after everything before it."""
        # The flights hold the group until this callback has handed it over, so the reference is
        # alive here; were it not, no one would be waiting for the group.
        group = group_ref()
        with self._replicated_ready:
            if group is not None:
                group.finished = True
            handed: list[Group] = []
            flights = self._flights
            while flights and flights[0].finished:
                head = flights[0]
                if head.appended is not None and (head.appended.cancelled() or head.appended.exception() is not None):
                    break
                handed.append(flights.popleft())
            if handed:
                sent = [g for g in handed if g.appended is not None]
                if sent:
                    # Raised before the first answer: a read that starts after it waits for this apply.
                    last = sent[-1]
                    self._acked_through = max(self._acked_through, last.appended.result() + sum(
                        len(w.records) for w in last.waiters) - 1)
                self._hand_over(handed)
        for g in handed:
            if g.appended is not None:
                # The replicas acknowledged the records, but this process may have stopped leading
                # since it sent them (paused past its lease, then resumed): the answer with offsets
                # is the leader's alone, so it is checked now, not when the append was sent.
                deposed = self._deposed(g.epoch)
                for waiter in g.waiters:
                    if waiter.records:  # barriers wait for the apply of everything before them
                        if deposed is None:
                            waiter.finish()
                        elif not waiter.done.is_set():
                            waiter.fail(deposed)
        self._kick()  # a slot is free, and the writer takes back what ended

    def _deposed(self, epoch: int) -> NotCoordinator | None:
        """Why requests checked in coordinator ``epoch`` must not be answered now (None: they may).

        An answer with offsets (or a barrier's answer) goes out only while the leadership that
        checked the request still holds its epoch: this process leads, in that same epoch, and
        the term's lease check passes (``_term_valid``: the lease held without a gap since the
        epoch was taken, so no other process can have taken one since). Checked when the
        acknowledgment is handled, not when the append was sent: a process stopped in between
        (SIGSTOP past its lease) and resumed after a successor took over would otherwise answer as
        a zombie. That the new leader has the records the log itself guarantees: the conditional
        append under this epoch's writer id succeeded, so they lie before any successor's
        EpochStarted (the replica refuses this epoch after one), and a successor reads the log to
        its end before it opens its epoch. A deposed process answers NOT_COORDINATOR, never
        offsets, even for records that reached the log: the broker keeps the file after a
        retriable error, for the new leader, which has the records."""
        if self.status == LEADER and self._epoch == epoch and self._term_valid():
            return None
        return NotCoordinator(f"coordinator {self.config.shard}: epoch {epoch} no longer leads the shard "
                              f"({self.status}, {self.status_detail}): its requests are not answered")

    def _check(self, taken: list[Waiter]) -> None:
        """Under the lock: check each request in queue order (its records become pending)."""
        serving = None
        try:
            self._check_serving()
        except LowtideError as exc:
            serving = exc
        for waiter in taken:
            if waiter.check is None:
                continue
            if serving is not None:
                waiter.fail(serving)
                continue
            try:
                decision = waiter.check(self.core)
            except Exception as exc:  # noqa: BLE001 - the caller's error (a typed one, or a bug)
                waiter.fail(exc)
                continue
            waiter.records = list(decision.records)
            waiter.response = decision.response

    def _apply(self, groups: list[Group]) -> bool:
        """Apply replicated groups in one transaction, then answer their requests; False if the
        apply failed (the shard then reloads). The applier works outside the shard lock, so the
        writer checks and sends the next groups meanwhile; the pending overlay still holds these
        groups' records until the lock is taken again, and until then it is what checks read."""
        entries: list[tuple[bytes, int]] = []
        records: list[MetadataRecord] = []
        epochs: list[int] = []
        for group in groups:
            if group.appended is not None:
                offset = group.appended.result()
                for waiter in group.waiters:  # exactly what LogAppender.encode wrote, in order
                    records.extend(waiter.records)
                epochs.extend([group.epoch] * len(group.values))
                entries.extend(zip(group.values, range(offset, offset + len(group.values)), strict=True))
        with self._apply_lock:
            result = None
            try:
                if entries:
                    applier = self.applier
                    if applier is None:
                        raise NotCoordinator(f"coordinator {self.config.shard} has no applier (reloading)")
                    began = time.perf_counter()
                    result = applier.apply(entries, records=records, epochs=epochs, contiguous=True)
                    APPLY_DURATION.labels(str(self.config.shard)).observe(time.perf_counter() - began)
            except Exception as exc:  # noqa: BLE001 - any failure: fail the pipeline, reload
                self._fail_pipeline(exc, groups, "applying metadata records failed")
                return False
            with self._lock:
                if result is not None:
                    self.core.applied_elsewhere(records, result.changes)
                    self._applied_through = max(self._applied_through, entries[-1][1])
                    self._lock.notify_all()  # readers waiting for an answered mutation
                for group in groups:
                    deposed = self._deposed(group.epoch)
                    for waiter in group.waiters:
                        # Barriers; requests with records were answered (or refused) when replicated.
                        if deposed is None or waiter.done.is_set():
                            waiter.finish()
                        else:
                            waiter.fail(deposed)
        return True

    def _fail_pipeline(self, exc: BaseException, groups: list[Group | None], what: str) -> None:
        error = exc if isinstance(exc, LowtideError) and exc.retriable else RequestTimedOut(
            f"coordinator {self.config.shard}: {what}: {type(exc).__name__}: {exc}")
        log.warning(f"{what}; reloading", extra={"fields": {"error": str(exc)}})
        with self._lock:
            # The status first: a request failed below may look at it as soon as it is answered.
            if getattr(exc, "fenced", False):
                # A newer leadership is in the log: ours is over whatever the lease thread last
                # saw. It loads again only if it really holds the lease (a renewal that succeeds).
                if self.status != FOLLOWER:
                    log.warning("fenced by a newer coordinator epoch; stepping down",
                                extra={"fields": {"shard": self.config.shard, "epoch": self._epoch}})
                    self.status, self.status_detail = FOLLOWER, f"fenced: {exc}"
                    self._generation += 1
            elif self.status == LEADER:
                self.status, self.status_detail = LOADING, f"reloading: {what}"
                self._generation += 1
            for group in groups:
                if group is not None:
                    group.fail(error)
            self._drop_pipeline(error)
        self._wake.set()

    def _drop_pipeline(self, error: LowtideError) -> None:
        """Under the lock: nothing checked against pending records may stand any more."""
        self._pipeline_epoch += 1
        with self._inbox:
            queued = list(self._queue)
            self._queue.clear()
        for waiter in queued:
            waiter.fail(error)
        with self._replicated_ready:
            # Sent, not handed over (behind an append still under way or failed): never answered.
            unhanded = list(self._flights)
            self._flights.clear()
        for group in unhanded:
            group.fail(error)
        self.core.reset_pending()
