"""Incremental fetch sessions between a follower and a leader (Kafka's KIP-227), both halves.

Why: without a session every follower round lists every partition it follows from that leader,
and the leader reads, records and answers every one of them, twice a second per follower even
when nothing moves. At 10,000 partitions RF 3 that was 149 % of a core summed over an idle
cluster (docs/operations.md#scaling). With a session a round costs what changed since the last.

The protocol, in FetchRequest fields 8-10 (protos/lowtide/v1/replica.proto)::

    session_epoch 0            no session: every partition listed is read and answered
                               (consumers, tools, a follower under a replication throttle)
    session_id S, epoch 1      open session S (the follower picks S, non-zero, at random): S
                               holds the partitions listed; any earlier session of the same
                               follower on this leader ends
    session_id S, epoch n > 1  the next round of S, sent only after round n - 1 was answered;
                               lists the partitions whose position (fetch offset, log start
                               offset, leader epoch, max bytes) changed, those new to S, and
                               every partition round n - 1's answer carried; ``forgotten``
                               names those leaving S
    answer                     only the partitions with records, with an error, or whose HW,
                               log start offset or leader epoch differs from what S last
                               answered for them; a partition left out is unchanged

    FETCH_SESSION_ID_NOT_FOUND (70)   S is not this leader's session of that follower (the
                                      leader restarted, or a newer session replaced it)
    INVALID_FETCH_SESSION_EPOCH (71)  n is not the epoch after the last one accepted
    → the follower opens a new session (epoch 1, listing everything).

How the leader knows what changed without looking at every partition: a session is a watcher of
the registry's wake-ups (``Waiters.watch``) for as long as it lives; an append, an HW or LSO move,
a leadership change notified for one of its partitions marks that partition dirty and wakes the
round parked on the session. A round reads only the partitions listed and the dirty ones.

Two things a sessionless round did on every partition now happen otherwise:

* the follower's progress is recorded (``Partition.update_follower``) for the partitions listed,
  and again, every round, for one whose ISR lacks the follower (an HW that moved may have made it
  a candidate, and an expansion the store refused is tried again), including a partition this
  leader's ISR shrink just dropped it from, though that partition is in no round (``left_isr``);
* an ISR member whose partition did not move is still caught up: the ISR check asks ``seen_ms``,
  the time of the last round of a session holding that partition, for a follower whose position
  there equals the leader's LEO (``Partition.isr_shrink_candidate``).

Why the follower lists again every partition of the last answer: what it did with the answer is
then always told, so a partition whose append failed, or that answered an error, is read again on
the next round instead of waiting for a change that may never come.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from lowtide.clock import now_ms
from lowtide.errors import FetchSessionIdNotFound, InvalidFetchSessionEpoch
from lowtide.messages import TopicPartition
from lowtide.messages.replica import FetchedPartition, FetchPosition, FetchSessionRound
from lowtide.replica.partition import LEADER

# A session without a round for this long is dropped when another session begins.
SESSION_IDLE_MS = 120_000


class FetchSession:
    """The leader's half of one follower's session: the follower's last told position of each
    partition, what was last answered for each, and the partitions changed since.

    Contract: ``changed`` (a registry watcher) marks partitions dirty and wakes ``wake``, the
    parked round's wake-up; ``take_dirty`` hands them to the round; ``worth_answering`` and
    ``answered`` decide and remember what an answer carries.

    Thread-safety: ``changed`` from any thread; everything else from the one round in progress
    (the epoch check in ``FetchSessions.begin`` lets only one in). One lock covers the dirty set
    and the positions.
    """

    def __init__(self, *, session_id: int, replica_id: int) -> None:
        self.session_id, self.replica_id = session_id, replica_id
        self.epoch = 1
        self.positions: dict[TopicPartition, FetchPosition] = {}
        self.last_round_ms = now_ms()
        self.wake: Any = None
        self._answered: dict[TopicPartition, tuple[int, int, int]] = {}
        # Partitions led here whose ISR lacks this follower: recorded again every round until
        # it joins. Learnt when a round records one, and from the ISR shrinks of this leader
        # (``left_isr``): a partition that does not move is in no round, and without that the
        # follower dropped from an idle partition's ISR was never offered it again.
        self._outside_isr: set[TopicPartition] = set()
        self._dirty: set[TopicPartition] = set()
        self._all_dirty = False
        self._lock = threading.Lock()

    def changed(self, keys: list[Any] | None) -> None:
        """Registry watcher: ``keys`` are partition keys, or ``(topic, partition, kind)`` wake-up
        keys (appended, HW moved); None = every partition."""
        with self._lock:
            if keys is None:
                hit = self._all_dirty = bool(self.positions)
            else:
                positions, dirty, hit = self.positions, self._dirty, False
                for k in keys:
                    key = k if len(k) == 2 else (k[0], k[1])
                    if key in positions:
                        dirty.add(key)
                        hit = True
            wake = self.wake
        if hit and wake is not None:
            wake.set()

    def update(self, items: Iterable[FetchPosition], forgotten: Iterable[TopicPartition]) -> None:
        """Adopt one request: its listed positions (dirty: they are read this round), and the
        partitions leaving the session."""
        with self._lock:
            for key in forgotten:
                self.positions.pop(key, None)
                self._answered.pop(key, None)
                self._dirty.discard(key)
            for it in items:
                key = (it.topic, it.partition)
                self.positions[key] = it
                self._dirty.add(key)
            self.last_round_ms = now_ms()

    def note_isr(self, registry: Any, recorded: Iterable[FetchPosition]) -> None:
        """After recording ``recorded``: remember which of them are led here with an ISR lacking
        this follower (``outside_isr``), forget those where it joined or that left."""
        with self._lock:  # check and forget under the lock ``left_isr`` adds under
            outside = self._outside_isr
            for pos in recorded:
                key = (pos.topic, pos.partition)
                p = registry.find(pos.topic, pos.partition)
                if p is not None and key in self.positions and p.role == LEADER and self.replica_id not in p.isr:
                    outside.add(key)
                else:
                    outside.discard(key)

    def left_isr(self, key: TopicPartition) -> None:
        """This leader adopted an ISR of ``key`` without this follower."""
        with self._lock:
            if key in self.positions:
                self._outside_isr.add(key)

    def outside_isr(self) -> list[TopicPartition]:
        with self._lock:
            return list(self._outside_isr)

    def take_dirty(self) -> list[TopicPartition]:
        """The partitions changed since the last call (all of them after a ``changed(None)``)."""
        with self._lock:
            if self._all_dirty:
                self._all_dirty = False
                self._dirty.clear()
                return list(self.positions)
            if not self._dirty:
                return []
            keys, self._dirty = list(self._dirty), set()
            return keys

    def position(self, key: TopicPartition) -> FetchPosition | None:
        return self.positions.get(key)

    def worth_answering(self, o: FetchedPartition) -> bool:
        return bool(o.records) or o.error is not None or self._answered.get((o.topic, o.partition)) != (
            o.high_watermark, o.log_start_offset, o.leader_epoch)

    def answered(self, outcomes: Iterable[FetchedPartition]) -> None:
        answered = self._answered
        for o in outcomes:
            if o.error is None:
                answered[(o.topic, o.partition)] = (o.high_watermark, o.log_start_offset, o.leader_epoch)
            else:
                answered.pop((o.topic, o.partition), None)


class FetchSessions:
    """The leader's sessions, at most one per follower replica.

    Thread-safety: thread-safe.
    """

    def __init__(self, *, registry: Any, idle_ms: int = SESSION_IDLE_MS) -> None:
        self._registry, self._idle_ms = registry, idle_ms
        self._by_replica: dict[int, FetchSession] = {}
        self._lock = threading.Lock()

    def begin(self, replica_id: int, round_: FetchSessionRound, items: list[FetchPosition]) -> FetchSession:
        """Open or continue ``replica_id``'s session for one round, or raise
        FETCH_SESSION_ID_NOT_FOUND / INVALID_FETCH_SESSION_EPOCH (nothing changes then)."""
        ended: list[FetchSession] = []
        with self._lock:
            current = self._by_replica.get(replica_id)
            if round_.epoch == 1 and round_.session_id != 0:
                if current is not None:
                    ended.append(current)
                session = self._by_replica[replica_id] = FetchSession(session_id=round_.session_id,
                                                                      replica_id=replica_id)
                ended += self._drop_idle()
            else:
                if current is None or current.session_id != round_.session_id:
                    raise FetchSessionIdNotFound(
                        f"replica {replica_id} has no fetch session {round_.session_id} on this leader")
                if round_.epoch != current.epoch + 1:
                    raise InvalidFetchSessionEpoch(
                        f"fetch session {round_.session_id} of replica {replica_id} is at epoch {current.epoch}; "
                        f"got {round_.epoch}")
                session = current
                session.epoch = round_.epoch
        for old in ended:
            self._registry.unwatch(old)
        if session.epoch == 1:
            self._registry.watch(session)
        session.update(items, round_.forgotten)
        return session

    def _drop_idle(self) -> list[FetchSession]:
        limit = now_ms() - self._idle_ms
        idle = [r for r, s in self._by_replica.items() if s.last_round_ms < limit]
        return [self._by_replica.pop(r) for r in idle]

    def seen_ms(self, replica_id: int, key: TopicPartition) -> int:
        """When ``replica_id``'s session holding ``key`` last had a round; 0 = no such session."""
        session = self._by_replica.get(replica_id)
        if session is None or key not in session.positions:
            return 0
        return session.last_round_ms

    def left_isr(self, replica_ids: Iterable[int], key: TopicPartition) -> None:
        """An ISR of ``key`` without ``replica_ids`` was adopted here: their sessions offer it
        to them again every round until they are back (``FetchSession.left_isr``)."""
        for r in replica_ids:
            session = self._by_replica.get(r)
            if session is not None:
                session.left_isr(key)

    def position(self, replica_id: int, key: TopicPartition) -> FetchPosition | None:
        """The position ``replica_id`` last told for ``key`` in its session, if any."""
        session = self._by_replica.get(replica_id)
        return session.position(key) if session is not None else None

    def close(self) -> None:
        with self._lock:
            sessions, self._by_replica = list(self._by_replica.values()), {}
        for s in sessions:
            self._registry.unwatch(s)


Told = tuple[int, int, int, int]  # fetch offset, log start offset, leader epoch, max bytes


def _told(p: FetchPosition) -> Told:
    return p.fetch_offset, p.log_start_offset, p.current_leader_epoch, p.max_bytes


class FollowerSession:
    """The follower's half: which partitions a round lists, and the session fields it sends.

    Contract: ``plan`` returns a round's listed positions and its ``FetchSessionRound``, given
    the positions of the partitions that may have changed: every followed one when the followed
    set changed or the session is new, else ``recheck()`` (the last answer's). After the answer
    ``answered(fetched)``; after any failure ``reset()`` (the next round opens a new session).

    Thread-safety: one fetcher's rounds only.
    """

    def __init__(self) -> None:
        self.session_id = 0
        self.epoch = 0
        self._told: dict[TopicPartition, Told] = {}
        self._relist: set[TopicPartition] = set()
        self._leaving: set[TopicPartition] = set()
        self._planned: tuple[list[FetchPosition], tuple[TopicPartition, ...]] | None = None

    @property
    def open(self) -> bool:
        return self.session_id != 0

    def reset(self) -> None:
        self.session_id, self.epoch = 0, 0
        self._told, self._relist, self._leaving, self._planned = {}, set(), set(), None

    def recheck(self) -> set[TopicPartition]:
        """The partitions a round must look at when nothing else changed: the last answer's."""
        return self._relist

    def plan(self, positions: Mapping[TopicPartition, FetchPosition], *,
             following: Mapping[TopicPartition, Any] | None) -> tuple[list[FetchPosition], FetchSessionRound]:
        """One round: ``positions`` is the current position of every partition that may have
        changed (every followed one when the session is new); ``following`` the whole followed
        set when it may have changed (what the session holds outside it is forgotten), else None."""
        told, relist = self._told, self._relist
        if not self.open:
            self.session_id = random.randint(1, 2**31 - 1)
            self.epoch = 0
            listed = list(positions.values())
            forgotten: tuple[TopicPartition, ...] = ()
        else:
            listed = [p for k, p in positions.items() if k in relist or told.get(k) != _told(p)]
            gone = self._leaving & told.keys()
            if following is not None:
                gone |= {k for k in told if k not in following}
            forgotten = tuple(gone)
        self._leaving = set()
        self._planned = (listed, forgotten)
        return listed, FetchSessionRound(session_id=self.session_id, epoch=self.epoch + 1, forgotten=forgotten)

    def leave(self, keys: Iterable[TopicPartition]) -> None:
        """Take partitions out of the session on the next round (one pending truncation: nothing
        is fetched for it until it is settled, then it is listed as new)."""
        self._leaving.update(keys)

    def answered(self, fetched: list[FetchedPartition]) -> None:
        """The planned round was answered with ``fetched``."""
        planned, self._planned = self._planned, None
        if planned is None:
            return
        listed, forgotten = planned
        self.epoch += 1
        for k in forgotten:
            self._told.pop(k, None)
        for p in listed:
            self._told[(p.topic, p.partition)] = _told(p)
        self._relist = {(r.topic, r.partition) for r in fetched}
