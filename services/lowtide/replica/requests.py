"""The request paths of a replica: Produce (acks 0/1/all), Fetch (consumers up to the HW,
followers up to the LEO, long-polled) and ListOffsets, plus the leader's bookkeeping of follower
fetches (follower LEO/LSO, HW, ISR expansion, low watermark).

A parked fetch wakes on new data, on an HW change *and* on an LSO change: the LSO wake-up is what
lets DeleteRecords finish in a few round trips on an idle partition (KIP-107; Kafka only tells a
parked follower when its long poll ends). Which wake-ups reach whom is narrowed where a wake-up
could only end in parking again: an append that leaves the HW where it is wakes the follower
fetches only (they read up to the LEO), and an HW move made by a follower's fetch wakes the
consumer fetches and the acks=all requests whose last offset it passed, nothing else (a follower
needs new records to return, an acks=all request a higher HW); each woken thread cost a switch
per append or round when a producer pipelines small requests (issue 32).

Replication linger (issue 32): a follower fetch that parked and was woken by an append holding
less than ``LINGER_BYTES`` waits up to ``replication_linger_ms`` (flag ``--replication-linger-ms``)
for more, but only while another Produce is on its way: read by the Kafka listener and not yet
appended, or due within the linger at the pace Produce requests have been arriving
(``ordering.ARRIVALS``); it answers once none is (an expected one 1 ms late ends it). A producer
pipelining small requests (Kafka's defaults: 16 KiB batches, 5 in flight) then gets one round for
several requests instead of one each, where a round costs both ends more CPU than the append it
carries; an idle partition, a lone request or a coordinator's metadata append (over gRPC, not
counted) is answered at once, as before. What an acks=all answer waits for is unchanged; it can
wait up to the linger longer.

Replication throttle (KIP-73, ``quota.py``): a follower fetch of a partition whose leader list names
this broker, by a replica outside the ISR, reads at most what the leader bucket holds and is
charged what it got; with the bucket empty that partition gets no records this round, and a
parked fetch waits at most until the bucket refills.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from lowtide.clock import now_ms
from lowtide.common import ordering
from lowtide.errors import (
    InvalidRequest,
    InvalidRequiredAcks,
    LowtideError,
    NotLeaderOrFollower,
    RequestTimedOut,
)
from lowtide.log.partition_log import AppendInfo
from lowtide.log.producer_state import ProducerDescription
from lowtide.messages import TopicPartition

# Fetch requests and answers are the Replica service's messages: the servicer converts them, the
# follower fetcher sends them through ReplicaClient, so both ends of a Fetch agree on one shape.
from lowtide.messages.replica import (
    READ_COMMITTED,
    EpochEndOffset,
    EpochQuery,
    FetchedPartition,
    FetchPosition,
    FetchSessionRound,
    TxnMarkerRequest,
)
from lowtide.record import iter_batches
from lowtide.record.control import build_marker_batch
from lowtide.replica.delete_records import DeleteRecordsHandler
from lowtide.replica.fetch_session import FetchSession, FetchSessions
from lowtide.replica.isr import IsrUpdater
from lowtide.replica.parking import FetchLimits, ParkingLot
from lowtide.replica.partition import LEADER, Partition
from lowtide.replica.quota import LEADER as LEADER_DIRECTION
from lowtide.replica.quota import MIN_WAIT_S, ReplicationQuotas
from lowtide.replica.registry import OffsetWaiters, PartitionRegistry
from lowtide.rpc.steps import Blocking, Steps, run_blocking, wait_until_done

# One produced partition: where its records landed, or why they did not.
ProduceResult = tuple[str, int, AppendInfo | LowtideError]
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
# A woken follower fetch holding at least this much answers at once, linger or not: the round is
# already worth its cost (a 1 MiB produce never waits for the next one).
LINGER_BYTES = 64 * 1024
# How late an expected Produce may be before a lingering follower fetch stops waiting for it.
LINGER_SLACK_S = 0.001
# One described partition: its active producers, or why it has none to tell (not hosted, not led).
ProducersResult = tuple[str, int, list[ProducerDescription] | LowtideError]
# Response budget when the request sets no max_bytes.
DEFAULT_RESPONSE_MAX_BYTES = 50 * 1024 * 1024


def _appended(key: TopicPartition) -> tuple[str, int, str]:
    """The wake-up key of appends to ``key`` (follower fetches wait on it besides ``key``)."""
    return (key[0], key[1], "appended")


def hw_moved_key(key: TopicPartition) -> tuple[str, int, str]:
    """The wake-up key of HW moves made by follower fetches (consumer fetches wait on it besides
    ``key``; acks=all requests wait in ``OffsetWaiters`` for the HW to pass their offset)."""
    return (key[0], key[1], "hw")


def _watch_cancel(wake: WakeRelay, on_cancel: Callable[[Callable[[], None]], object] | None) -> list[bool]:
    """A fetch's cancelled flag, ``[False]`` until on_cancel's callback (from any thread) sets it
    and wakes the fetch. A plain one-item list, read by the fetch's loop: a threading.Event per
    fetch cost a Condition and a lock each time."""
    cancelled = [False]
    if on_cancel is not None:
        def cancel() -> None:
            cancelled[0] = True
            wake.set()

        on_cancel(cancel)
    return cancelled


class ReplicaRequests:
    """Produce, Fetch and ListOffsets against the hosted partitions.

    Contract:

    * ``produce`` returns one (topic, partition, AppendInfo | LowtideError) per item; with
      acks=all it returns once the HW passed each append, or with REQUEST_TIMED_OUT /
      NOT_LEADER_OR_FOLLOWER for the partitions that did not get there.
    * ``fetch`` returns one ``FetchedPartition`` per item, parking up to ``max_wait_ms`` (capped,
      see parking.py) until ``min_bytes`` are available, a partition errs, (follower) the leader's
      LSO is ahead of the follower's, or the caller goes away; consumer fetches park only while
      the parking bounds allow; a follower fetch (``replica_id`` >= 0) first records the follower's LEO and
      LSO, which may move the HW, expand the ISR and move the low watermark.
    * ``list_offset``: -1 latest (HW), -2 earliest (LSO), -3 max timestamp, >= 0 by time.
    * ``describe_producers`` answers from this replica's log (leader or follower), one result per
      key, changing nothing.
    * After ``stop()`` parked fetches return at their next wake-up (the caller notifies all).

    Thread-safety: thread-safe; called concurrently from gRPC handler threads. State lives in the
    partitions (each with its lock) and the registry.
    """

    def __init__(self, *, registry: PartitionRegistry, isr: IsrUpdater, deletes: DeleteRecordsHandler,
                 min_insync_replicas: int, fetch_limits: FetchLimits = FetchLimits(),
                 quotas: ReplicationQuotas | None = None, replication_linger_ms: int = 0,
                 arrivals: ordering.ProduceArrivals = ordering.ARRIVALS,
                 sessions: FetchSessions | None = None) -> None:
        self.registry, self.isr, self.deletes = registry, isr, deletes
        # Followers' fetch sessions on this leader (shared with the ISR check: IsrUpdater).
        self.sessions = sessions if sessions is not None else FetchSessions(registry=registry)
        self.arrivals = arrivals
        self.linger_s = max(0, replication_linger_ms) / 1000
        self.min_insync_replicas = min_insync_replicas
        # Shared with the follower fetchers (one pair of buckets per broker); none given: unlimited.
        self.quotas = quotas if quotas is not None else ReplicationQuotas(broker_id=registry.broker_id)
        self.parking = ParkingLot(fetch_limits)
        self._hw_waiters = OffsetWaiters()
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        self.sessions.close()

    # -- produce ---------------------------------------------------------------------------------
    def produce(self, items: list[tuple[str, int, bytes]], *, acks: int, timeout_ms: int,
                leader_epochs: Mapping[TopicPartition, int] | None = None,
                expected_end_offsets: Mapping[TopicPartition, int] | None = None) -> list[ProduceResult]:
        """Returns one (topic, partition, AppendInfo | LowtideError) per item; ``leader_epochs``
        are the producer's views of each partition's leader epoch (fenced when stale);
        ``expected_end_offsets`` make those partitions' appends conditional (replica.proto)."""
        return run_blocking(self.produce_steps(items, acks=acks, timeout_ms=timeout_ms, leader_epochs=leader_epochs,
                                               expected_end_offsets=expected_end_offsets))

    def produce_steps(self, items: list[tuple[str, int, bytes]], *, acks: int, timeout_ms: int,
                      leader_epochs: Mapping[TopicPartition, int] | None = None,
                      expected_end_offsets: Mapping[TopicPartition, int] | None = None) -> Steps[list[ProduceResult]]:
        """``produce`` as steps (rpc/steps.py): appends, then yields the wait for the HW (acks=all)."""
        epochs = leader_epochs or {}
        expected = expected_end_offsets or {}
        if acks not in (0, 1, -1):
            raise InvalidRequiredAcks(f"acks must be 0, 1 or -1 (all), got {acks}")
        results: list[ProduceResult] = []
        appended: list[TopicPartition] = []
        hw_moved: list[TopicPartition] = []
        for topic, partition, records in items:
            try:
                p = self.registry.get(topic, partition)
                min_isr = int(p.topic_info.config.get("min.insync.replicas", self.min_insync_replicas))
                hw = p.log.high_watermark
                info = p.append_as_leader(records, acks=acks, min_insync_replicas=min_isr,
                                          current_leader_epoch=epochs.get((topic, partition), -1),
                                          expected_end_offset=expected.get((topic, partition), -1))
                results.append((topic, partition, info))
                appended.append((topic, partition))
                if p.log.high_watermark != hw:  # an ISR of one: the append itself moved the HW
                    hw_moved.append((topic, partition))
            except LowtideError as err:
                results.append((topic, partition, err))
        self._notify_appended(appended, hw_moved)
        # The appends are what a connection's requests must do in order: the next Produce of the
        # same Kafka connection may append while this one waits for the HW (ordering.py).
        ordering.release()
        if acks == -1:
            yield HighWatermarkWait(self, results, timeout_ms)
        return results

    def write_txn_markers(self, markers: list[TxnMarkerRequest], *,
                          timeout_ms: int) -> list[tuple[int, list[ProduceResult]]]:
        """Append each marker's control batch (KIP-98) to the partitions it names that this replica
        leads, acks=all; per marker (producer id, one (topic, partition, AppendInfo | error) per
        partition). The log's producer state completes the transaction (abort: into the aborted
        index); a stale producer epoch is INVALID_PRODUCER_EPOCH and appends nothing."""
        out: list[tuple[int, list[ProduceResult]]] = []
        everything: list[ProduceResult] = []
        keys: list[TopicPartition] = []
        for marker in markers:
            batch = build_marker_batch(producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
                                       commit=marker.commit, coordinator_epoch=marker.coordinator_epoch,
                                       timestamp_ms=now_ms())
            results: list[ProduceResult] = []
            for topic, partition in marker.partitions:
                keys.append((topic, partition))
                try:
                    p = self.registry.get(topic, partition)
                    min_isr = int(p.topic_info.config.get("min.insync.replicas", self.min_insync_replicas))
                    info = p.append_as_leader(batch, acks=-1, min_insync_replicas=min_isr, from_coordinator=True)
                    results.append((topic, partition, info))
                except LowtideError as err:
                    results.append((topic, partition, err))
            out.append((marker.producer_id, results))
            everything.extend(results)
        self.registry.notify(keys)
        self.registry.notify([_appended(k) for k in keys])
        self._await_high_watermark(everything, timeout_ms)
        # _await_high_watermark replaced entries of ``everything`` in place: copy them back.
        position = 0
        for _, results in out:
            results[:] = everything[position:position + len(results)]
            position += len(results)
        return out

    def _notify_appended(self, appended: list[TopicPartition], hw_moved: list[TopicPartition]) -> None:
        """Wake what an append concerns: the follower fetches parked on those partitions (they
        read up to the LEO), and everything parked on a partition whose HW the append moved.
        The acks=all requests waiting on the partition wait for its HW, which an append into an
        ISR of several does not move: waking each of them on every append of a pipelining
        producer cost a thread wake-up per waiting request per append."""
        if appended:
            self.registry.notify([_appended(k) for k in appended])
        if hw_moved:
            self.registry.notify(hw_moved)

    def _await_high_watermark(self, results: list[ProduceResult], timeout_ms: int) -> None:
        wait_until_done(HighWatermarkWait(self, results, timeout_ms))

    # -- fetch -----------------------------------------------------------------------------------
    def fetch(self, items: list[FetchPosition], *, replica_id: int, max_wait_ms: int, min_bytes: int,
              max_bytes: int, peer: str = "", isolation_level: int = 0,
              on_cancel: Callable[[Callable[[], None]], object] | None = None) -> list[FetchedPartition]:
        """One long-polled fetch; ``replica_id`` >= 0 marks a follower's. A consumer with
        ``isolation_level`` READ_COMMITTED reads up to the last stable offset and gets the aborted
        transactions overlapping what it read.

        ``peer`` names the caller's connection (parking bounds, see parking.py); ``on_cancel``
        registers a callback run when the caller cancels or disconnects (gRPC's
        ``context.add_callback``): a parked fetch then returns at once.
        """
        return run_blocking(self.fetch_steps(items, replica_id=replica_id, max_wait_ms=max_wait_ms,
                                             min_bytes=min_bytes, max_bytes=max_bytes, peer=peer,
                                             isolation_level=isolation_level, on_cancel=on_cancel))

    def fetch_steps(self, items: list[FetchPosition], *, replica_id: int, max_wait_ms: int, min_bytes: int,
                    max_bytes: int, peer: str = "", isolation_level: int = 0,
                    on_cancel: Callable[[Callable[[], None]], object] | None = None,
                    session: FetchSessionRound | None = None) -> Steps[list[FetchedPartition]]:
        """``fetch`` as steps (rpc/steps.py): each park is a yielded wait (the replication
        listener runs follower rounds on its event loop). A follower round of a fetch ``session``
        (epoch > 0) answers only what changed (fetch_session.py)."""
        follower = replica_id >= 0
        if follower and session is not None and session.epoch > 0:
            return (yield from self._session_fetch_steps(items, session, replica_id=replica_id,
                                                         max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                                         on_cancel=on_cancel))
        if follower:
            yield from self._record_follower_fetch(replica_id, items)
        limits = self.parking.limits
        max_wait_ms = min(max(0, max_wait_ms), limits.max_wait_ms)
        if not follower:
            max_bytes = min(max_bytes or limits.max_bytes, limits.max_bytes)
        deadline = time.monotonic() + max_wait_ms / 1000
        parked = woken = False
        linger_until = 0.0
        try:
            keys: list = [(it.topic, it.partition) for it in items]
            # A follower fetch also wakes on appends, which move the LEO but not the HW
            # (_notify_appended); a consumer's on HW moves made by follower fetches
            # (_record_follower_fetch), which a follower fetch would only wake for to park again.
            keys += [_appended(k) if follower else hw_moved_key(k) for k in keys]
            wake = WakeRelay()
            self.registry.register_waiter(keys, wake)
            try:
                cancelled = _watch_cancel(wake, on_cancel)
                while True:
                    wake.clear()  # before reading: a change during the read makes the wait return at once
                    outcomes, size, now, refill_s = self._read(
                        items, follower=follower, max_bytes=max_bytes, replica_id=replica_id,
                        committed=not follower and isolation_level == READ_COMMITTED)
                    if (size >= max(min_bytes, 1) or now or time.monotonic() >= deadline or self._stop.is_set()
                            or cancelled[0]):
                        if woken and follower and not now and not (self._stop.is_set() or cancelled[0]):
                            # Parked, then woken by an append: the replication linger (module doc).
                            linger_until = linger_until or time.monotonic() + self.linger_s
                            pause_s = self._linger_s(size, linger_until)
                            if pause_s > 0:
                                yield wake.until(pause_s)  # woken by the next append, or look again after it
                                continue
                        return outcomes
                    if not follower and not parked:
                        # No free parking slot: answer now with what there is (never refuse).
                        if not self.parking.try_park(peer):
                            return outcomes
                        parked = True
                    # A partition held back by the throttle is read again once the bucket refilled,
                    # not after the whole long poll (that would cut the rate below the configured one).
                    wait_s = max(0.0, deadline - time.monotonic())
                    yield wake.until(min(wait_s, refill_s) if refill_s else wait_s)
                    woken = True
            finally:
                self.registry.unregister_waiter(keys, wake)
        finally:
            if parked:
                self.parking.leave(peer)

    def _session_fetch_steps(self, items: list[FetchPosition], round_: FetchSessionRound, *, replica_id: int,
                             max_wait_ms: int, max_bytes: int,
                             on_cancel: Callable[[Callable[[], None]], object] | None) -> Steps[list[FetchedPartition]]:
        """One round of a follower's fetch session: records the positions listed, reads those
        partitions and the ones changed here since the last round (the session's dirty set, kept
        by its registry watcher), parks on the session's wake-up, answers what changed."""
        session = self.sessions.begin(replica_id, round_, items)
        wake = WakeRelay()
        session.wake = wake
        try:
            cancelled = _watch_cancel(wake, on_cancel)
            pending = session.take_dirty()
            # The partitions where the follower was outside the ISR at its last recording are
            # recorded again every round until it is in: an ISR expansion the store refused (an
            # etcd hiccup, a partition epoch that moved) is tried again, as a sessionless round,
            # which lists every partition, tries it again.
            again = self._unlisted_moves(session, list(dict.fromkeys([*pending, *session.outside_isr()])), items)
            yield from self._record_follower_fetch(replica_id, items + again)
            session.note_isr(self.registry, [*items, *again])
            max_wait_ms = min(max(0, max_wait_ms), self.parking.limits.max_wait_ms)
            deadline = time.monotonic() + max_wait_ms / 1000
            woken = False
            linger_until = 0.0
            while True:
                wake.clear()  # before reading: a change during the read makes the wait return at once
                if self.quotas.leader.rate is not None:
                    # A partition the leader bucket held back is read again once it refilled.
                    pending = list(session.positions)
                else:
                    pending = list(dict.fromkeys([*pending, *session.take_dirty()]))
                positions = [pos for k in pending if (pos := session.position(k)) is not None]
                outcomes, size, now, refill_s = self._read(positions, follower=True, max_bytes=max_bytes,
                                                           replica_id=replica_id)
                answer = [o for o in outcomes if session.worth_answering(o)]
                if size > 0 or now or time.monotonic() >= deadline or self._stop.is_set() or cancelled[0]:
                    if woken and not now and not (self._stop.is_set() or cancelled[0]):
                        linger_until = linger_until or time.monotonic() + self.linger_s
                        pause_s = self._linger_s(size, linger_until)
                        if pause_s > 0:
                            pending = [(o.topic, o.partition) for o in answer]
                            yield wake.until(pause_s)
                            continue
                    session.answered(answer)
                    return answer
                pending = [(o.topic, o.partition) for o in answer]
                wait_s = max(0.0, deadline - time.monotonic())
                yield wake.until(min(wait_s, refill_s) if refill_s else wait_s)
                woken = True
        finally:
            if session.wake is wake:
                session.wake = None

    def _unlisted_moves(self, session: FetchSession, dirty: list[TopicPartition],
                        listed: list[FetchPosition]) -> list[FetchPosition]:
        """Positions to record again although the follower did not list them: partitions that
        changed here, led under the epoch the follower last told, whose ISR lacks it (an HW
        that caught up with it makes it an ISR candidate, as a sessionless round would find)."""
        if not dirty:
            return []
        named = {(it.topic, it.partition) for it in listed}
        again = []
        for k in dirty:
            if k in named:
                continue
            p = self.registry.find(*k)
            pos = session.position(k)
            if (p is not None and pos is not None and p.role == LEADER and session.replica_id not in p.isr
                    and pos.current_leader_epoch == p.leader_epoch):
                again.append(pos)
        return again

    def _linger_s(self, size: int, until: float) -> float:
        """How long a woken follower fetch holding ``size`` bytes waits for the next append
        (module doc, replication linger); 0: answer now. Past the due time of an expected
        Produce by more than ``LINGER_SLACK_S``, or past ``until``, it answers."""
        if not 0 < size < LINGER_BYTES or self.linger_s <= 0:
            return 0.0
        at = time.monotonic()
        due = self.arrivals.next_append_due()
        if due is None or not at - LINGER_SLACK_S <= due < until:
            return 0.0
        return min(until, max(due, at) + LINGER_SLACK_S) - at

    def _read(self, items: list[FetchPosition], *, follower: bool, max_bytes: int, replica_id: int = -1,
              committed: bool = False) -> tuple[list[FetchedPartition], int, bool, float]:
        """Read every item once: (outcomes, bytes read, whether to answer without waiting, seconds
        until the throttle lets a partition it held back be read; 0 = none held back)."""
        outcomes: list[FetchedPartition] = []
        size = 0
        wake = False
        refill_s = 0.0
        quotas = self.quotas
        budget = max_bytes if max_bytes > 0 else DEFAULT_RESPONSE_MAX_BYTES
        for it in items:
            # The offsets go with an error too: a follower told OFFSET_OUT_OF_RANGE truncates or
            # restarts from the leader's LSO and LEO in the same answer.
            hw = lso = leo = epoch = -1
            try:
                p = self.registry.get(it.topic, it.partition)
                p.check_leader(it.current_leader_epoch)
                plog = p.log
                hw, lso, leo, epoch = plog.high_watermark, plog.log_start_offset, plog.log_end_offset, p.leader_epoch
                if follower and it.log_start_offset < lso:
                    wake = True  # the follower must learn the new LSO now (KIP-107, fast path)
                partition_max = it.max_bytes or DEFAULT_PARTITION_MAX_BYTES
                # Until something was read the response budget does not apply (as in Kafka), so a
                # batch larger than max_bytes still makes progress.
                limit = min(partition_max, budget) if size else partition_max
                throttled = follower and quotas.leader_throttled(p, replica_id)
                if throttled:
                    allowed = quotas.leader.available()
                    if allowed <= 0:
                        refill_s = max(quotas.leader.wait_s(), MIN_WAIT_S)
                    limit = min(limit, allowed)
                stable = plog.last_stable_offset if committed else -1
                bound = leo if follower else (stable if committed else hw)
                records = plog.read(it.fetch_offset, max_bytes=limit, max_offset=bound) if limit > 0 else b""
                if throttled:
                    quotas.charge(LEADER_DIRECTION, len(records))  # at least one batch: may go into debt
                size += len(records)
                budget -= len(records)
                aborted: tuple[tuple[int, int], ...] = ()
                if committed and records:
                    end = it.fetch_offset
                    for header, _ in iter_batches(records):  # per batch: where the answer ends
                        end = header.next_offset
                    aborted = tuple((a.producer_id, a.first_offset)
                                    for a in plog.aborted_transactions(it.fetch_offset, end))
                outcomes.append(FetchedPartition(topic=it.topic, partition=it.partition, high_watermark=hw,
                                                 log_start_offset=lso, log_end_offset=leo, leader_epoch=epoch,
                                                 records=records, last_stable_offset=stable,
                                                 aborted_transactions=aborted))
            except LowtideError as err:
                outcomes.append(FetchedPartition(topic=it.topic, partition=it.partition, error=err, high_watermark=hw,
                                                 log_start_offset=lso, log_end_offset=leo, leader_epoch=epoch))
                wake = True
        return outcomes, size, wake, refill_s

    def _record_follower_fetch(self, replica_id: int, items: list[FetchPosition]) -> Steps[None]:
        """Steps: what talks to Redis (an ISR expansion's compare-and-set, the low-watermark
        events and DeleteRecords completions after an LSO move) is a ``Blocking`` step, so a
        round served on the event loop never waits for Redis there."""
        changed: list[Partition] = []
        lso_moved: list[Partition] = []
        expanding: list[tuple[Partition, frozenset[int]]] = []
        for it in items:
            p = self.registry.find(it.topic, it.partition)
            if p is None or p.role != LEADER:
                continue
            hw_changed, lso_changed = p.update_follower(replica_id, fetch_offset=it.fetch_offset,
                                                       log_start_offset=it.log_start_offset)
            new_isr = p.isr_expansion_candidate(replica_id)
            if new_isr is not None:
                expanding.append((p, new_isr))
            if lso_changed:
                lso_moved.append(p)
            if hw_changed:
                changed.append(p)
        if expanding:
            # One AlterPartition for the round: a follower that caught up on 1,000 partitions at
            # once (after a restart) joins their ISRs in a few etcd writes, not 1,000.
            try:
                moved = yield Blocking(lambda: self.isr.change_many(expanding))
            except BaseException:
                # Closed or failed before change_many answered: it may still be running or never
                # run; its followers stay counted in the HW until the store shows the outcome.
                for p, new_isr in expanding:
                    p.end_isr_expansion(new_isr - p.isr, known=False)
                raise
            already = {id(p) for p in changed}
            changed += [p for p in moved if id(p) not in already]
        if changed:
            # The HW moved: what waits for it (acks=all requests it passed, consumer fetches)
            # wakes; the followers' parked fetches do not (without new records they would park
            # again), nor acks=all requests it has not passed yet.
            self.registry.notify([hw_moved_key(p.key) for p in changed])
            for p in changed:
                self._hw_waiters.passed(p.key, p.log.high_watermark)
        if lso_moved:
            yield Blocking(lambda: self.deletes.recheck_low_watermarks(lso_moved))

    # -- offset for leader epoch -----------------------------------------------------------------
    def offset_for_leader_epoch(self, queries: list[EpochQuery]) -> list[EpochEndOffset]:
        """KIP-101/KIP-279 on the leader: where each asked epoch ends here."""
        out: list[EpochEndOffset] = []
        for q in queries:
            try:
                p = self.registry.get(q.topic, q.partition)
                epoch, end = p.end_offset_for_epoch(q.leader_epoch, current_leader_epoch=q.current_leader_epoch)
                out.append(EpochEndOffset(topic=q.topic, partition=q.partition, leader_epoch=epoch, end_offset=end))
            except LowtideError as err:
                out.append(EpochEndOffset(topic=q.topic, partition=q.partition, error=err))
        return out

    # -- describe producers ----------------------------------------------------------------------
    def describe_producers(self, keys: list[TopicPartition]) -> list[ProducersResult]:
        """Kafka's DescribeProducers (KIP-664): per key, the active producers of this replica's
        log of the partition, leader or follower (Kafka's ``Partition.activeProducerState`` reads
        the local log whatever the role, which ``kafka-transactions find-hanging --broker-id``
        relies on; a client without a broker id asks the leader); UNKNOWN_TOPIC_OR_PARTITION
        where it is not hosted here."""
        out: list[ProducersResult] = []
        for topic, partition in keys:
            try:
                out.append((topic, partition, self.registry.get(topic, partition).log.describe_producers()))
            except LowtideError as err:
                out.append((topic, partition, err))
        return out

    # -- list offsets ----------------------------------------------------------------------------
    def list_offset(self, topic: str, partition: int, timestamp: int, *,
                    isolation_level: int = 0, current_leader_epoch: int = -1) -> tuple[int, int, int]:
        """(offset, timestamp, leader epoch): -1 latest (HW; the last stable offset for
        READ_COMMITTED), -2 earliest (LSO), -3 max timestamp, >= 0 the first offset whose timestamp
        is >= it (-1 when none). A ``current_leader_epoch`` other than ours is refused as in Fetch
        (FENCED_LEADER_EPOCH below it, UNKNOWN_LEADER_EPOCH above: this leader has not learnt of
        its own deposition yet, and would answer from a high watermark the new leader is past)."""
        p = self.registry.get(topic, partition)
        p.check_leader(current_leader_epoch)
        plog = p.log
        # As Kafka: until the HW reaches where this leadership started, what it would answer could
        # be below offsets already acknowledged (Partition.check_high_watermark_settled). The
        # client retries.
        p.check_high_watermark_settled()
        if timestamp == -1:
            latest = plog.last_stable_offset if isolation_level == READ_COMMITTED else plog.high_watermark
            return latest, -1, p.leader_epoch
        if timestamp == -2:
            return plog.log_start_offset, -1, p.leader_epoch
        if timestamp == -3:
            found = plog.max_timestamp_offset()
        elif timestamp >= 0:
            found = plog.offset_for_timestamp(timestamp)
        else:
            raise InvalidRequest(f"invalid ListOffsets timestamp {timestamp}")
        if found is None or found[0] >= plog.high_watermark:
            return -1, -1, p.leader_epoch
        return max(found[0], plog.log_start_offset), found[1], p.leader_epoch


class HighWatermarkWait:
    """An acks=all request waiting until the HW passes each of its appends (a ``Wait``, see
    rpc/steps.py). It settles ``results`` in place: an entry whose partition stopped being led
    here becomes NOT_LEADER_OR_FOLLOWER; at the deadline, one still not replicated becomes
    REQUEST_TIMED_OUT.

    Woken by what changes the partition (leadership, the ISR, stopping) and by an HW move made by a
    follower fetch only once it passed this request's last offset (``OffsetWaiters``).
    Thread-safety: one driver at a time; ``arm``/``disarm`` once each."""

    def __init__(self, requests: ReplicaRequests, results: list[ProduceResult], timeout_ms: int) -> None:
        self._requests, self.results, self._timeout_ms = requests, results, timeout_ms
        self.deadline = time.monotonic() + max(timeout_ms, 1) / 1000
        self._armed: tuple | None = None  # (keys, event, offset entries) while armed

    def arm(self, event) -> None:
        # register/unregister rather than context managers: one wait per acks=all request.
        keys = [(t, p) for t, p, _ in self.results]
        offsets = [((t, p), info.last_offset) for t, p, info in self.results if not isinstance(info, LowtideError)]
        self._requests.registry.register_waiter(keys, event)
        try:
            entries = self._requests._hw_waiters.register(offsets, event)
        except BaseException:
            self._requests.registry.unregister_waiter(keys, event)
            raise
        self._armed = (keys, event, entries)

    def disarm(self) -> None:
        armed, self._armed = self._armed, None
        if armed is not None:
            keys, event, entries = armed
            try:
                self._requests._hw_waiters.unregister(entries)
            finally:
                self._requests.registry.unregister_waiter(keys, event)

    def check(self) -> bool:
        registry, results = self._requests.registry, self.results
        pending = False
        for i, (topic, partition, info) in enumerate(results):
            if isinstance(info, LowtideError):
                continue
            p = registry.find(topic, partition)
            if p is None or p.role != LEADER:
                results[i] = (topic, partition, NotLeaderOrFollower(f"leadership of {topic}-{partition} moved"))
            elif p.log.high_watermark <= info.last_offset:
                pending = True
        return not pending

    def expire(self) -> None:
        registry, results = self._requests.registry, self.results
        for i, (topic, partition, info) in enumerate(results):
            if not isinstance(info, LowtideError):
                p = registry.find(topic, partition)
                if p is None or p.log.high_watermark <= info.last_offset:
                    results[i] = (topic, partition, RequestTimedOut(
                        f"{topic}-{partition}: not replicated to the ISR within {self._timeout_ms} ms"))


class WakeRelay:
    """A parked fetch's wake-up, registered for the whole fetch (``Waiters.waiting``) so that a
    change landing while the fetch reads is not lost: ``set()`` marks it fired and passes it on
    to whoever waits now; ``clear()`` before each read; ``until(seconds)`` is the ``Wait`` for
    one park, done once fired or after ``seconds``. Thread-safety: ``set`` from any thread."""

    def __init__(self) -> None:
        self.fired = False
        self._target = None

    def set(self) -> None:
        self.fired = True
        target = self._target
        if target is not None:
            target.set()

    def clear(self) -> None:
        self.fired = False

    def until(self, seconds: float) -> _Park:
        return _Park(self, time.monotonic() + seconds)


class _Park:
    """One park of a fetch (a ``Wait``): done when its relay fires; its deadline ends it quietly
    (the fetch reads again and decides)."""

    def __init__(self, relay: WakeRelay, deadline: float) -> None:
        self.relay, self.deadline = relay, deadline

    def arm(self, event) -> None:
        self.relay._target = event

    def check(self) -> bool:
        return self.relay.fired

    def expire(self) -> None:
        pass

    def disarm(self) -> None:
        self.relay._target = None
