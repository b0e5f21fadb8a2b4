"""The share-partitions a replica leads, and the share sessions of the members fetching from it.

A share-partition (group, topic, partition) lives in the memory of the partition's leader
(``SharePartition``: the pure ``state.SharePartitionState`` under a lock, the leader epoch it was
loaded under, its snapshot epoch). It is loaded from ``__share_group_state`` the first time it is
used in a leader epoch, and every acknowledgement is written there (acks=all) before it is
answered; a failed write puts the state back as it was. Lock timeouts are applied whenever the
share-partition is touched, so a dead member's records go to the next member that fetches.

Group configs (``messages.group_configs``: ``share.auto.offset.reset``, ``share.record.lock.duration.ms``)
override the replica's flags for their group: read when a share-partition is loaded and again when a
member opens a share session of its group, so a change applies from the group's next session.

Share sessions (KIP-932's, like KIP-227's fetch sessions): per (group, member) at this broker, the
partitions the member fetches and the epoch its next request must carry.

Design: docs/design/kip-932-share-groups.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from lowtide.clock import now_ms as wall_ms
from lowtide.errors import InvalidShareSessionEpoch, LowtideError, ShareSessionLimitReached, ShareSessionNotFound
from lowtide.messages.group_configs import (
    READ_COMMITTED,
    SHARE_AUTO_OFFSET_RESET,
    SHARE_ISOLATION_LEVEL,
    SHARE_RECORD_LOCK_DURATION_MS,
)
from lowtide.messages.share import AcquiredRange, ShareAckBatch, next_session_epoch
from lowtide.record import iter_batches
from lowtide.share.codec import ShareSnapshot, ShareStateKey, reset_snapshot
from lowtide.share.state import REJECT, SharePartitionConfig, SharePartitionState

log = logging.getLogger(__name__)

EARLIEST, LATEST = "earliest", "latest"
# A share session not used for this long is forgotten (its member died without closing it: a
# killed consumer's session would otherwise stay forever). Its records' locks ran out long before.
SESSION_IDLE_MS = 120_000


class StateLog(Protocol):
    """Where share-partition state is kept (``persist.ShareStateLog``)."""

    def write(self, key: ShareStateKey, value: ShareSnapshot) -> None: ...

    def read(self, key: ShareStateKey) -> ShareSnapshot | None: ...

    def read_group(self, group_id: str) -> dict[tuple[str, int], ShareSnapshot]: ...


@dataclass(frozen=True)
class LeaderLog:
    """The leader's log as a share-partition sees it at one moment: its leader epoch, start offset
    and high watermark, and ``read(offset, max_bytes)``: whole batches from the one holding
    ``offset``, below the high watermark (bytes, never decoded here).

    For a read_committed share group, ``high_watermark`` is the last stable offset (nothing of an
    open transaction is acquired) and ``aborted(start, end)`` lists the aborted transactions
    overlapping [start, end) as (producer id, first offset, ABORT marker offset); None for
    read_uncommitted."""

    leader_epoch: int
    log_start_offset: int
    high_watermark: int
    read: Callable[[int, int], bytes]
    aborted: Callable[[int, int], Sequence[tuple[int, int, int]]] | None = None


@dataclass(frozen=True)
class ShareConfig:
    """The replica's share settings (its ``--group-share-*`` flags)."""

    partition: SharePartitionConfig = field(default_factory=SharePartitionConfig)
    auto_offset_reset: str = LATEST  # share.auto.offset.reset's default for every group
    max_sessions: int = 2000  # group.share.max.share.sessions: share sessions this replica holds at most


class SharePartition:
    """One share-partition at its leader. Thread-safety: ``lock`` guards every field."""

    def __init__(self, *, key: ShareStateKey, state: SharePartitionState, leader_epoch: int,
                 snapshot_epoch: int, created_ms: int, state_epoch: int = 0) -> None:
        self.key = key
        self.state = state
        self.leader_epoch = leader_epoch
        self.snapshot_epoch = snapshot_epoch
        # Raised by an admin's reset (AlterShareGroupOffsets): a state of an older state epoch is stale.
        self.state_epoch = state_epoch
        self.created_ms = created_ms
        # Set when a member opens a share session of the group: the next use compares the state
        # epoch with the durable one first (an admin may have reset the group while it was empty).
        self.recheck = False
        self.lock = threading.Lock()

    def snapshot(self, now_ms: int) -> ShareSnapshot:
        return ShareSnapshot(snapshot_epoch=self.snapshot_epoch + 1, state_epoch=self.state_epoch,
                             leader_epoch=self.leader_epoch,
                             start_offset=self.state.start_offset, create_timestamp_ms=self.created_ms,
                             write_timestamp_ms=now_ms, batches=tuple(self.state.to_state_batches()))


@dataclass
class ShareSession:
    """One member's share session at this broker: the epoch its next request must carry and the
    partitions it fetches. Guarded by ``SharePartitions``' registry lock."""

    next_epoch: int
    partitions: set[tuple[str, int]]
    last_used_ms: int = 0


class SharePartitions:
    """The share-partitions and share sessions of one replica (module doc).

    Contract: ``acknowledge`` returns only once the new state is durable (with a state log), or
    raises and changes nothing; ``acquire`` never writes (a lost acquisition is a redelivery).

    Thread-safety: thread-safe: a registry lock (find or load a share-partition, sessions) and one
    lock per share-partition, never the registry's while loading or writing.
    """

    def __init__(self, *, config: ShareConfig = ShareConfig(), state_log: StateLog | None = None,
                 clock: Callable[[], int] = wall_ms,
                 group_configs: Callable[[str], Mapping[str, str]] | None = None) -> None:
        self.config = config
        # A group's configs ({} when it sets none): metadata.group_configs.GroupConfigs.of in a replica.
        self._group_configs = group_configs or (lambda group_id: {})
        self._state_log = state_log
        self._clock = clock
        self._registry = threading.Lock()
        self._partitions: dict[tuple[str, str, int], SharePartition] = {}
        self._loading: dict[tuple[str, str, int], threading.Lock] = {}
        self._sessions: dict[tuple[str, str], ShareSession] = {}
        # Called (outside any lock) after a durable write moved a share-partition's start offset:
        # the replica wakes its retention pass, so consumed retention follows within a second.
        self.on_start_offset_moved: Callable[[ShareStateKey, int], None] | None = None

    # -- sessions --------------------------------------------------------------------------------
    def open_session(self, *, group_id: str, member_id: str, epoch: int, add: Iterable[tuple[str, int]],
                     forget: Iterable[tuple[str, int]] = ()) -> set[tuple[str, int]]:
        """Open (epoch 0) or continue a share session; returns its partitions now. Raises
        SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH or, for a new session at a replica that
        holds ``max_sessions`` already, SHARE_SESSION_LIMIT_REACHED (nothing changed): the memory a
        replica gives share sessions is bounded, as Kafka's share session cache is."""
        now = self._clock()
        with self._registry:
            self._forget_idle_sessions(now)
            key = (group_id, member_id)
            if epoch == 0:
                if key not in self._sessions and len(self._sessions) >= self.config.max_sessions:
                    raise ShareSessionLimitReached(f"this replica holds {len(self._sessions)} share sessions, its "
                                                   f"limit (group.share.max.share.sessions)")
                session = self._sessions[key] = ShareSession(next_epoch=1, partitions=set(add), last_used_ms=now)
                for (group, _, _), sp in self._partitions.items():
                    if group == group_id:
                        sp.recheck = True
                return set(session.partitions)
            session = self._sessions.get(key)
            if session is None:
                raise ShareSessionNotFound(f"no share session of member {member_id} of group {group_id!r} here")
            if epoch != session.next_epoch:
                raise InvalidShareSessionEpoch(f"share session epoch {epoch}, expected {session.next_epoch}")
            session.next_epoch = next_session_epoch(epoch)
            session.last_used_ms = now
            session.partitions |= set(add)
            session.partitions -= set(forget)
            return set(session.partitions)

    def _forget_idle_sessions(self, now: int) -> None:
        """Drop sessions idle for SESSION_IDLE_MS (caller holds the registry lock)."""
        idle = [k for k, v in self._sessions.items() if now - v.last_used_ms > SESSION_IDLE_MS]
        for k in idle:
            del self._sessions[k]

    def count_sessions(self) -> int:
        with self._registry:
            return len(self._sessions)

    def close_session(self, *, group_id: str, member_id: str) -> set[tuple[str, int]]:
        """End a share session (epoch -1); returns the partitions it had (to release)."""
        with self._registry:
            session = self._sessions.pop((group_id, member_id), None)
            return set() if session is None else set(session.partitions)

    # -- group configs ---------------------------------------------------------------------------
    def partition_config(self, group_id: str) -> SharePartitionConfig:
        """The share-partition settings of ``group_id``: its ``share.record.lock.duration.ms`` if
        it sets one, else the replica's flags."""
        own = self._group_configs(group_id).get(SHARE_RECORD_LOCK_DURATION_MS)
        if own is None:
            return self.config.partition
        return replace(self.config.partition, lock_duration_ms=int(own))

    def read_committed(self, group_id: str) -> bool:
        """Whether ``group_id`` reads committed records only (its share.isolation.level)."""
        return self._group_configs(group_id).get(SHARE_ISOLATION_LEVEL) == READ_COMMITTED

    def auto_offset_reset(self, group_id: str) -> str:
        """Where ``group_id`` starts on a partition it has no state for (share.auto.offset.reset)."""
        return self._group_configs(group_id).get(SHARE_AUTO_OFFSET_RESET, self.config.auto_offset_reset)

    # -- share-partitions ------------------------------------------------------------------------
    def _get(self, key: ShareStateKey, leader: LeaderLog) -> SharePartition:
        k = (key.group_id, key.topic_id, key.partition)
        with self._registry:
            sp = self._partitions.get(k)
            if sp is not None and sp.leader_epoch == leader.leader_epoch and not sp.recheck:
                return sp
            loading = self._loading.setdefault(k, threading.Lock())
        with loading:  # one load per share-partition at a time; others wait and take its result
            with self._registry:
                sp = self._partitions.get(k)
                if sp is not None and sp.leader_epoch == leader.leader_epoch and not sp.recheck:
                    return sp
            if sp is not None and sp.leader_epoch == leader.leader_epoch and not self._check_reset(sp):
                with sp.lock:
                    sp.state.config = self.partition_config(key.group_id)
                sp.recheck = False
                return sp
            sp = self._load(key, leader)
            with self._registry:
                self._partitions[k] = sp
            return sp

    def _check_reset(self, sp: SharePartition) -> bool:
        """Whether the durable state of ``sp`` has a newer state epoch (an admin reset it) or is
        gone after having been written (the group was deleted)."""
        if self._state_log is None:
            return False
        durable = self._state_log.read(sp.key)
        if durable is None:
            return sp.snapshot_epoch >= 0
        return durable.state_epoch > sp.state_epoch

    def _load(self, key: ShareStateKey, leader: LeaderLog) -> SharePartition:
        snapshot = self._state_log.read(key) if self._state_log is not None else None
        now = self._clock()
        if snapshot is None:
            reset = self.auto_offset_reset(key.group_id)
            start = leader.log_start_offset if reset == EARLIEST else leader.high_watermark
            state = SharePartitionState(start_offset=start, config=self.partition_config(key.group_id))
            sp = SharePartition(key=key, state=state, leader_epoch=leader.leader_epoch, snapshot_epoch=-1,
                                created_ms=now)
            # Written at once (Kafka's InitializeShareGroupState): a leader elected next starts from
            # this start offset, not from its own high watermark (which may be past records
            # nobody has been given), and the group's start offsets can be described.
            self._persist(sp, now)
            return sp
        state = SharePartitionState(start_offset=snapshot.start_offset, config=self.partition_config(key.group_id),
                                    batches=snapshot.batches)
        log.info("share-partition loaded", extra={"fields": {
            "group": key.group_id, "topic_id": key.topic_id, "partition": key.partition,
            "start_offset": state.start_offset, "end_offset": state.end_offset,
            "snapshot_epoch": snapshot.snapshot_epoch}})
        return SharePartition(key=key, state=state, leader_epoch=leader.leader_epoch,
                              snapshot_epoch=snapshot.snapshot_epoch, created_ms=snapshot.create_timestamp_ms,
                              state_epoch=snapshot.state_epoch)

    def acquire(self, *, key: ShareStateKey, member_id: str, leader: LeaderLog, max_records: int,
                max_bytes: int) -> tuple[list[AcquiredRange], bytes]:
        """Acquire records for ``member_id`` (state.acquire); returns the ranges and the log bytes
        that hold them (whole batches, as read)."""
        sp = self._get(key, leader)
        now = self._clock()
        with sp.lock:
            state = sp.state
            state.advance_to(leader.log_start_offset)
            state.expire_locks(now)
            if not state.has_available(leader.high_watermark):
                return [], b""
            data = leader.read(state.find_next_read_offset(), max_bytes)
            found = list(iter_batches(data))
            headers = [h for h, _ in found]
            taken = state.acquire(member=member_id, batches=[(h.base_offset, h.last_offset) for h in headers],
                                  max_records=max_records, now_ms=now)
            if taken and leader.aborted is not None:
                taken = _archive_aborted(state, member_id, taken, headers, leader.aborted, now)
        if not taken:
            return [], b""
        # The bytes end with the last batch holding an acquired record: a read of up to a MiB for
        # a fetch of 500 records would otherwise send about twice what the member may use.
        last = taken[-1].last
        end = next((pos + h.size_in_bytes for h, pos in found if h.base_offset <= last <= h.last_offset), len(data))
        return [AcquiredRange(a.first, a.last, a.delivery_count) for a in taken], data[:end]

    def acknowledge(self, *, key: ShareStateKey, member_id: str, leader: LeaderLog,
                    batches: Sequence[ShareAckBatch]) -> None:
        """Apply and persist ``member_id``'s acknowledgements (all or nothing; class doc)."""
        sp = self._get(key, leader)
        now = self._clock()
        with sp.lock:
            before = sp.state.copy()
            try:
                sp.state.expire_locks(now)
                sp.state.acknowledge(member=member_id, batches=batches, now_ms=now)
                self._persist(sp, now)
            except LowtideError:
                sp.state = before
                raise
            moved = sp.state.start_offset if sp.state.start_offset != before.start_offset else None
        if moved is not None and self.on_start_offset_moved is not None:
            self.on_start_offset_moved(key, moved)

    def release(self, *, key: ShareStateKey, member_id: str, leader: LeaderLog) -> None:
        """What ``member_id`` holds goes back (its session closed); persisted like an acknowledgement."""
        sp = self._get(key, leader)
        now = self._clock()
        with sp.lock:
            before = sp.state.copy()
            if not sp.state.release_member(member_id):
                return
            try:
                self._persist(sp, now)
            except LowtideError:
                sp.state = before
                raise

    def _persist(self, sp: SharePartition, now: int) -> None:
        if self._state_log is None:
            return
        snapshot = sp.snapshot(now)
        self._state_log.write(sp.key, snapshot)
        sp.snapshot_epoch = snapshot.snapshot_epoch

    def read_start_offsets(self, group_id: str) -> dict[tuple[str, int], ShareSnapshot]:
        """The durable state of every share-partition of ``group_id`` ((topic id, partition) ->
        its latest snapshot); empty without a state log."""
        return {} if self._state_log is None else self._state_log.read_group(group_id)

    def reset(self, key: ShareStateKey, start_offset: int) -> None:
        """An admin's reset of an empty share group's share-partition (AlterShareGroupOffsets): a
        new state at ``start_offset`` with nothing in flight, under the next state epoch, so that
        a leader holding the old state in memory reloads it (``open_session``) and a write of
        the old state epoch is fenced when read."""
        if self._state_log is None:
            return
        self._state_log.write(key, reset_snapshot(self._state_log.read(key), start_offset, self._clock()))

    def delete_offsets(self, group_id: str, topic_ids: frozenset[str]) -> None:
        """DeleteShareGroupOffsets of an empty share group: its share-partition states of those
        topics are tombstoned; a leader holding one in memory finds it gone when a member opens a
        session next (``_check_reset``) and starts again as a new group would
        (``share.auto.offset.reset``)."""
        if self._state_log is not None:
            self._state_log.delete_group(group_id, topic_ids=topic_ids)

    def read_share_starts(self, group_id: str) -> dict[tuple[str, int], tuple[int, int]]:
        """``read_start_offsets`` as consumed retention reads them: (start offset, write timestamp)."""
        return {k: (v.start_offset, v.write_timestamp_ms) for k, v in self.read_start_offsets(group_id).items()}

    def copy_loaded(self) -> list[tuple[ShareStateKey, SharePartitionState]]:
        """A copy of every share-partition loaded here (for /metrics)."""
        with self._registry:
            partitions = list(self._partitions.values())
        out = []
        for sp in partitions:
            # A share-partition busy writing its state (up to the write's timeout) is left out of
            # this scrape rather than holding the scrape up.
            if not sp.lock.acquire(timeout=0.2):
                continue
            try:
                out.append((sp.key, sp.state.copy()))
            finally:
                sp.lock.release()
        return out

    def describe(self, key: ShareStateKey) -> SharePartitionState | None:
        """A copy of a share-partition's state as this leader holds it (None: not loaded here)."""
        with self._registry:
            sp = self._partitions.get((key.group_id, key.topic_id, key.partition))
        if sp is None:
            return None
        with sp.lock:
            return sp.state.copy()


def _aborted_spans(headers: Sequence, aborted: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The (first, last) offsets of the data batches in ``headers`` that belong to an aborted
    transaction: a transactional batch of producer P at an offset from one of P's aborted
    transactions' first offset up to its ABORT marker (Kafka's read_committed rule, per batch)."""
    by_producer: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, marker in aborted:
        by_producer.setdefault(producer_id, []).append((first, marker))
    return [(h.base_offset, h.last_offset) for h in headers
            if h.is_transactional and not h.is_control
            and any(first <= h.base_offset < marker for first, marker in by_producer.get(h.producer_id, ()))]


def _archive_aborted(state: SharePartitionState, member_id: str, taken: list, headers: Sequence,
                     aborted: Callable[[int, int], Sequence[tuple[int, int, int]]], now_ms: int) -> list:
    """A read_committed acquisition: records of aborted transactions among ``taken`` are archived
    at once (never delivered; not written here: acquisition never writes, and the next durable
    write carries them) and left out of what the member is told it acquired."""
    spans = _aborted_spans(headers, aborted(taken[0].first, taken[-1].last + 1))
    if not spans:
        return taken
    cut = sorted({(max(a.first, first), min(a.last, last)) for a in taken for first, last in spans
                  if first <= a.last and last >= a.first})
    state.acknowledge(member=member_id, now_ms=now_ms, batches=[ShareAckBatch(first, last, (REJECT,))
                                                                for first, last in cut])
    kept = []
    for a in taken:
        start = a.first
        for first, last in cut:
            if last < start or first > a.last:
                continue
            if first > start:
                kept.append(replace(a, first=start, last=first - 1))
            start = last + 1
        if start <= a.last:
            kept.append(replace(a, first=start))
    return kept
