"""One hosted replica of a partition: the log plus replication state.

Leader side (Kafka's ``Partition``): tracks every follower's log end offset (its fetch offset)
and log start offset (KIP-107: sent in each fetch), the ISR, the high watermark
(min LEO over the ISR) and the low watermark (min LSO over the leader and every *live* replica,
as Kafka counts replicas on live brokers, not only the ISR).
Follower side: applies the leader's records, HW and LSO.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lowtide.clock import now_ms
from lowtide.errors import (
    FencedLeaderEpoch,
    NotEnoughReplicas,
    NotLeaderOrFollower,
    OffsetNotAvailable,
    OffsetOutOfRange,
    PolicyViolation,
    UnknownLeaderEpoch,
)
from lowtide.log.partition_log import AppendInfo, LogConfig, LogStartOffsetCommit, PartitionLog
from lowtide.messages import TopicPartition
from lowtide.metadata.model import PartitionState, TopicInfo

LEADER, FOLLOWER, NONE = "leader", "follower", "none"
# What ``Partition.apply_state`` returns when this replica still leads under the same epoch but the
# replica set changed (a reassignment started, completed or was cancelled, or an operator edited
# ``replicas``): the leader now tracks another set of followers, so the low watermark and the
# DeleteRecords parked on it must be looked at again.
REPLICAS_CHANGED = "replicas-changed"


@dataclass
class FollowerState:
    """What the leader knows of one follower. -1 = not heard from since this leadership began."""

    log_end_offset: int = -1
    log_start_offset: int = -1
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    leader_leo_at_last_fetch: int = -1


class Partition:
    """A replica of one partition hosted here.

    Thread-safety: every public method takes the partition lock; the PartitionLog underneath has
    its own lock and is always taken after this one (never the other way round). Methods return
    what changed so the caller (the request paths, the fetcher) can notify waiters outside the lock.
    """

    def __init__(self, *, topic: TopicInfo, partition: int, log: PartitionLog, broker_id: int) -> None:
        self.topic_info = topic
        self.topic = topic.name
        self.partition = partition
        self.log = log
        self.broker_id = broker_id
        self.role = NONE
        self.leader_id = -1
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: frozenset[int] = frozenset()
        self.partition_epoch = -1
        self.followers: dict[int, FollowerState] = {}
        # Leader: followers whose ISR expansion is being written (True), or whose write ended
        # with no answer (False: cleared by the next record adopted from the store, which shows
        # whether it landed). The HW is computed over the ISR and these (Kafka's "maximal ISR"):
        # while the write is in flight the store may already list the follower, and an HW that
        # moved past its LEO meanwhile would make an electable replica that lacks acknowledged
        # records (the EOS copier lost a transaction's batch that way, under faults;
        # docs/design/invariants.md#the-rules-behind-them).
        self._adding: dict[int, bool] = {}
        # Leader: the highest low watermark computed in this leadership (see low_watermark).
        self._lw_floor = -1
        # Leader: the log end offset when this replica took the leadership (Kafka's
        # leaderEpochStartOffsetOpt, set by makeLeader): see check_high_watermark_settled.
        self.leadership_start_offset = -1
        # Follower: set when this replica starts following a leader (a new epoch, or a restart);
        # until the leader has said where our latest epoch ends (OffsetForLeaderEpoch) we neither
        # truncate nor fetch (KIP-101: truncating to our own HW could drop acknowledged records).
        self.truncation_pending = False
        self._lock = threading.RLock()

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    # -- leadership ---------------------------------------------------------------------------
    def apply_state(self, st: PartitionState) -> str | None:
        """Apply metadata. Returns the new role when leadership or the leader epoch changed,
        ``REPLICAS_CHANGED`` when this replica still leads under the same epoch but the set of
        replicas changed (the followers tracked follow it), else None.

        A record older than the one applied last under the same leader epoch (a reconcile pass
        that read the store before this leader's own ISR change landed) is ignored: adopting it
        would roll the ISR back, and the HW computed over a smaller ISR than the one elections
        use could pass a member's LEO."""
        with self._lock:
            changed = st.leader_epoch != self.leader_epoch or (
                (st.leader == self.broker_id) != (self.role == LEADER))
            if not changed and st.partition_epoch < self.partition_epoch:
                return None
            replicas_changed = set(st.replicas) != set(self.replicas)
            self.replicas = st.replicas
            self.isr = frozenset(st.isr)
            self.partition_epoch = st.partition_epoch
            self._settle_adding(changed)
            if not changed:
                if self.role != LEADER:
                    return None
                if replicas_changed:
                    self._sync_followers()
                # The ISR may have shrunk under us (a completed reassignment keeps ISR ∩ target):
                # the store's ISR is the one elections use, so the HW may follow it at once.
                self._maybe_increment_high_watermark()
                return REPLICAS_CHANGED if replicas_changed else None
            self.leader_epoch = st.leader_epoch
            self.leader_id = st.leader
            if st.leader == self.broker_id:
                self.role = LEADER
                self.truncation_pending = False
                # Persisted before the first append of this epoch, so a follower that asks later
                # learns where the previous epoch ended here (KIP-101).
                self.log.assign_leader_epoch(st.leader_epoch)
                self.leadership_start_offset = self.log.log_end_offset
                # Kafka resets follower state on becoming leader (and a new leadership starts
                # its LW afresh: the previous leader's acknowledgements are not known here).
                self.followers = {}
                self._lw_floor = -1
                self._sync_followers()
                # As Kafka's makeLeader: the ISR may be down to this replica (its old leader
                # failed), so what it holds may already be committed. Without this a follower
                # elected right after an acks=all append, before its next fetch told it the
                # HW, stayed at its old HW until the next append.
                self._maybe_increment_high_watermark()
            else:
                self.role = FOLLOWER if st.leader >= 0 else NONE
                self.followers = {}
                # Records past the divergence point may not exist on the new leader: the fetcher
                # asks it where our latest epoch ends before fetching (see truncate_to_epoch_end).
                self.truncation_pending = self.role == FOLLOWER
            return self.role

    def _sync_followers(self) -> None:
        """Leader: track exactly the followers in ``replicas``. A new one starts "not heard
        from" (-1: it holds the low watermark at -1 while live, so no DeleteRecords is
        acknowledged without it); ISR members count as caught up now. One gone is forgotten, so
        it neither counts toward the LW nor can be put back into the ISR by a late fetch."""
        t = now_ms()
        wanted = {r for r in self.replicas if r != self.broker_id}
        for r in wanted - self.followers.keys():
            self.followers[r] = FollowerState(last_caught_up_ms=t if r in self.isr else 0)
        for r in self.followers.keys() - wanted:
            del self.followers[r]

    def update_topic(self, topic: TopicInfo, log_config: LogConfig) -> bool:
        """Adopt a changed topic record (AlterConfigs): its config for the paths that read
        ``topic_info`` (min.insync.replicas, consumed retention, DeleteRecords' policy check) and
        ``log_config`` for the log (retention, cleanup policy, segment settings, the cleaner).
        Returns whether the config changed."""
        with self._lock:
            if topic.config == self.topic_info.config:
                return False
            self.topic_info = topic
            self.log.update_config(log_config)
            return True

    def check_leader(self, current_leader_epoch: int = -1) -> None:
        if self.role != LEADER:
            raise NotLeaderOrFollower(f"replica {self.broker_id} is not the leader of {self.topic}-{self.partition}"
                                      f" (leader is {self.leader_id})")
        if current_leader_epoch >= 0:
            if current_leader_epoch < self.leader_epoch:
                raise FencedLeaderEpoch(f"epoch {current_leader_epoch} < {self.leader_epoch}")
            if current_leader_epoch > self.leader_epoch:
                raise UnknownLeaderEpoch(f"epoch {current_leader_epoch} > {self.leader_epoch}")

    def check_high_watermark_settled(self) -> None:
        """Leader: OFFSET_NOT_AVAILABLE while the HW is below where this leadership started (as
        Kafka's ListOffsets). A leader just elected may hold an HW below records acknowledged under
        its predecessor (a follower learns the HW one round late), and a leader restarted under the
        same epoch (kill -9, back before the controller moved the leadership) starts from its HW
        checkpoint, which lags what it acknowledged before. Until its followers' fetches bring the
        HW to where its log ended then, an HW answered could be below acknowledged offsets: a
        front door loading ``__consumer_offsets`` to it served groups without their latest records."""
        with self._lock:
            self.check_leader()
            hw = self.log.high_watermark
            if self.leadership_start_offset > hw:
                raise OffsetNotAvailable(
                    f"{self.topic}-{self.partition}: the leader's high watermark {hw} has not reached where "
                    f"its leadership (epoch {self.leader_epoch}) started ({self.leadership_start_offset}) yet")

    # -- leader: produce ---------------------------------------------------------------------
    def append_as_leader(self, records: bytes, *, acks: int, min_insync_replicas: int,
                         current_leader_epoch: int = -1, from_coordinator: bool = False,
                         expected_end_offset: int = -1) -> AppendInfo:
        """``from_coordinator``: transaction markers (control batches), which clients may not write;
        ``expected_end_offset`` >= 0: a conditional append (``PartitionLog.append_as_leader``)."""
        with self._lock:
            self.check_leader(current_leader_epoch)
            if acks == -1 and len(self.isr) < min_insync_replicas:
                raise NotEnoughReplicas(f"{self.topic}-{self.partition}: ISR {sorted(self.isr)} is smaller than "
                                        f"min.insync.replicas={min_insync_replicas}")
            info = self.log.append_as_leader(records, leader_epoch=self.leader_epoch,
                                             from_coordinator=from_coordinator,
                                             expected_end_offset=expected_end_offset)
            self._maybe_increment_high_watermark()
            return info

    def end_offset_for_epoch(self, epoch: int, *, current_leader_epoch: int = -1) -> tuple[int, int]:
        """Leader side of OffsetForLeaderEpoch: (largest epoch <= ``epoch`` known, its end offset)."""
        with self._lock:
            self.check_leader(current_leader_epoch)
            return self.log.end_offset_for_epoch(epoch)

    # -- leader: follower progress ----------------------------------------------------------
    def update_follower(self, replica_id: int, *, fetch_offset: int, log_start_offset: int) -> tuple[bool, bool]:
        """Record a follower fetch. Returns (hw_changed, follower_lso_changed).

        A fetch below this leader's log start offset is answered OFFSET_OUT_OF_RANGE and the
        follower restarts empty at our LSO (``handle_out_of_range``): whatever it holds now is
        about to go, so the LSO it reports is recorded as -1 ("not heard from"), never as a
        number. Without this a fresh replica (an adding one in a reassignment: its log opens at
        0) reported LSO 0 on its first fetch and the LW computed over it dropped from an
        acknowledged one to 0 for a round trip, which a DeleteRecords landing then returned.
        Covered the same way: an adding replica killed before its first answer (its log reopens
        empty at 0: LEO == LSO == 0 < ours), and a lagging follower a DeleteRecords or retention
        overtook (its LEO is below our new LSO). The one cost: while such a follower is
        repositioning (one round trip; every round, if retention keeps outrunning a throttled
        copy), a DeleteRecords at an offset it already passed waits for it instead of being
        answered with its stale LSO. An ISR member is never affected: its LEO is >= HW >= LSO."""
        with self._lock:
            if self.role != LEADER or replica_id not in self.followers:
                return False, False
            f = self.followers[replica_id]
            t = now_ms()
            leo = self.log.log_end_offset
            if fetch_offset >= leo:
                f.last_caught_up_ms = t
            elif fetch_offset >= f.leader_leo_at_last_fetch >= 0:
                f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
            f.leader_leo_at_last_fetch = leo
            f.last_fetch_ms = t
            f.log_end_offset = fetch_offset
            if fetch_offset < self.log.log_start_offset:
                log_start_offset = -1
            lso_changed = log_start_offset != f.log_start_offset
            f.log_start_offset = log_start_offset
            return self._maybe_increment_high_watermark(), lso_changed

    def isr_expansion_candidate(self, replica_id: int) -> frozenset[int] | None:
        """The ISR with ``replica_id`` added, if it is one of ``replicas``, out of the ISR and has
        caught up to the HW (and our LSO)."""
        with self._lock:
            f = self.followers.get(replica_id)
            # ``replicas`` too, not only ``followers``: a replica removed by a reassignment must
            # never be made electable again by a fetch of its still in flight.
            if (self.role != LEADER or f is None or replica_id not in self.replicas or replica_id in self.isr
                    or f.log_end_offset < self.log.high_watermark or f.log_end_offset < 0
                    # An ISR member may be elected; one whose LSO lags ours could then serve
                    # records below a low watermark acknowledged without it
                    # (docs/design/invariants.md#the-rules-behind-them).
                    or f.log_start_offset < self.log.log_start_offset
                    # One write at a time per follower: its outcome decides the next.
                    or replica_id in self._adding):
                return None
            # Counted in the HW from now on (see ``_adding``); the caller must end it with
            # ``end_isr_expansion`` whatever the write does.
            self._adding[replica_id] = True
            return self.isr | {replica_id}

    def end_isr_expansion(self, added: Iterable[int], *, known: bool) -> None:
        """The expansion write that added ``added`` returned: ``known`` when it was answered
        (adopted or refused; the ISR now says which), else its outcome is unknown and they
        stay counted in the HW until the next record adopted from the store shows it."""
        with self._lock:
            for r in added:
                if r not in self._adding:
                    continue
                if known:
                    del self._adding[r]
                else:
                    self._adding[r] = False

    def _settle_adding(self, leadership_changed: bool) -> None:
        # A record adopted: an expansion whose outcome was unknown is now known (it is in the
        # ISR or it is not); one still being written stays. A new leadership starts afresh.
        if leadership_changed:
            self._adding = {}
        elif self._adding:
            self._adding = {r: busy for r, busy in self._adding.items() if busy and r not in self.isr}

    def isr_shrink_candidate(self, *, lag_time_max_ms: int,
                             live_brokers: set[int] | frozenset[int] | None = None,
                             seen_ms: Callable[[int, TopicPartition], int] | None = None) -> frozenset[int] | None:
        """The ISR without followers that lag by more than ``lag_time_max_ms`` and, when
        ``live_brokers`` is given, without members that are not live; None if nothing changes.

        ``seen_ms(replica, key)``: when that follower's fetch session holding this partition last
        had a round (0: none). A session round does not list a partition that did not move, so a
        follower whose last told position is our LEO counts as caught up at that time."""
        with self._lock:
            if self.role != LEADER:
                return None
            t = now_ms()
            lagging = set()
            for r in self.isr:
                f = self.followers.get(r)
                if r == self.broker_id or f is None or t - f.last_caught_up_ms <= lag_time_max_ms:
                    continue
                if seen_ms is not None and f.log_end_offset >= self.log.log_end_offset:
                    f.last_caught_up_ms = max(f.last_caught_up_ms, seen_ms(r, (self.topic, self.partition)))
                if t - f.last_caught_up_ms > lag_time_max_ms:
                    lagging.add(r)
            if live_brokers is not None:
                lagging |= {r for r in self.isr if r != self.broker_id and r not in live_brokers}
            return self.isr - lagging if lagging else None

    def set_isr(self, st: PartitionState) -> bool:
        """Adopt an ISR the metadata store accepted; returns whether the HW moved."""
        with self._lock:
            # Another epoch's record, or an older one than applied (a reconcile pass raced us).
            if st.leader_epoch != self.leader_epoch or st.partition_epoch < self.partition_epoch:
                return False
            self.isr = frozenset(st.isr)
            self.partition_epoch = st.partition_epoch
            self._settle_adding(False)
            return self._maybe_increment_high_watermark()

    def _maybe_increment_high_watermark(self) -> bool:
        if self.role != LEADER:
            return False
        leos = [self.log.log_end_offset]
        for r in (self.isr | self._adding.keys()) if self._adding else self.isr:
            if r == self.broker_id:
                continue
            f = self.followers.get(r)
            leos.append(f.log_end_offset if f else -1)
        new_hw = min(leos)
        if new_hw > self.log.high_watermark:
            self.log.set_high_watermark(new_hw)
            return True
        return False

    def low_watermark(self, live_brokers: set[int] | frozenset[int]) -> int:
        """min LSO over the leader, every live replica and every ISR member (-1 if one of them
        has not reported yet).

        The ISR is counted even when a member's session has lapsed: election picks from the ISR,
        so a replica left out of an acknowledged LW must be out of the ISR first (the leader
        shrinks the ISR as soon as a member is no longer live; see IsrUpdater.drop_dead).

        Never lower than a value it returned before in this leadership: -1 instead. A replica
        that stopped counting (its broker's session lapsed, out of the ISR) while the LW rose
        past its LSO, and counts again when it comes back, still reports its old LSO until its
        first fetch answer moves it up; returning that would lower an LW a DeleteRecords may
        already have acknowledged (and one answered meanwhile would say so). Until it catches
        up (a round trip or two: a live follower adopts the leader's LSO from every answer) the
        LW is unknown, as for a replica not heard from."""
        with self._lock:
            if self.role != LEADER:
                return -1
            lw = self.log.log_start_offset
            for r in self.replicas:
                if r == self.broker_id or (r not in live_brokers and r not in self.isr):
                    continue
                f = self.followers.get(r)
                lw = min(lw, f.log_start_offset if f else -1)
            if lw < self._lw_floor:
                return -1
            self._lw_floor = lw
            return lw

    # -- leader: DeleteRecords ---------------------------------------------------------------
    def delete_records_before(self, offset: int, *,
                              lso_commit: LogStartOffsetCommit | None = None) -> tuple[int, bool]:
        """KIP-107 leader step: returns (required offset, lso changed). With ``lso_commit`` the new
        LSO is only written: it is flushed and taken by ``lso_commit.commit()``."""
        with self._lock:
            self.check_leader()
            if "delete" not in self.topic_info.cleanup_policy:
                raise PolicyViolation(f"topic '{self.topic}' has cleanup.policy="
                                      f"{self.topic_info.config.get('cleanup.policy')}: records cannot be deleted")
            hw = self.log.high_watermark
            if offset == -1:
                offset = hw
            if offset < -1 or offset > hw:
                raise OffsetOutOfRange(f"{self.topic}-{self.partition}: offset {offset} is not in "
                                       f"[-1, high watermark {hw}]")
            if offset <= self.log.log_start_offset:
                return offset, False
            return offset, self.log.increment_log_start_offset(offset, commit=lso_commit)

    # -- follower ----------------------------------------------------------------------------
    def apply_fetched(self, *, records: bytes, leader_hw: int, leader_lso: int, leader_epoch: int,
                      lso_commit: LogStartOffsetCommit | None = None) -> tuple[bool, bool]:
        """Follower: append what the leader sent, then adopt its HW and LSO (KIP-107 step 6).
        An answer from another leader epoch than ours, or one that arrives before our truncation,
        is dropped. Returns (appended, lso_changed).

        With ``lso_commit`` (one per fetch answer) a raised LSO is only written here, and flushed
        with those of the other partitions and taken by ``lso_commit.commit()``, which the caller
        runs before its next fetch reports the LSOs; lso_changed then says it will move. A restart
        at the leader's LSO (below) is made durable at once."""
        with self._lock:
            if self.role != FOLLOWER or leader_epoch != self.leader_epoch or self.truncation_pending:
                return False, False
            appended = False
            if records:
                self.log.append_as_follower(records)
                appended = True
            leo = self.log.log_end_offset
            if leader_lso > leo:
                # The leader deleted past everything we have: start over at its LSO.
                self.log.truncate_fully_and_start_at(leader_lso)
                return appended, True
            self.log.set_high_watermark(min(leader_hw, leo))
            lso_changed = False
            if leader_lso > self.log.log_start_offset:
                lso_changed = self.log.increment_log_start_offset(min(leader_lso, self.log.high_watermark),
                                                                  commit=lso_commit)
            return appended, lso_changed

    def epoch_to_query(self) -> int | None:
        """Follower with a pending truncation: the epoch to ask the leader about, or None when no
        question is needed (then the truncation is settled here: an empty log has nothing to
        drop; a log from before epochs were recorded falls back to its HW, as Kafka does)."""
        with self._lock:
            if self.role != FOLLOWER or not self.truncation_pending:
                return None
            if not self.log.epochs_known:
                self.log.truncate_to(self.log.high_watermark)
                self.truncation_pending = False
                return None
            latest = self.log.latest_epoch
            if latest < 0:
                self.truncation_pending = False
                return None
            return latest

    def truncate_to_epoch_end(self, *, leader_epoch: int, asked_epoch: int, end_offset: int,
                              leader_epoch_now: int) -> bool:
        """KIP-279 follower step: the leader (in ``leader_epoch_now``) said ``asked_epoch`` ends,
        for it, as epoch ``leader_epoch`` at ``end_offset``. Truncate to min(that, where that
        epoch ends here). Returns whether the truncation is settled (False: ask again later)."""
        with self._lock:
            if (self.role != FOLLOWER or not self.truncation_pending or leader_epoch_now != self.leader_epoch
                    or asked_epoch != self.log.latest_epoch):
                return False
            if leader_epoch < 0 or end_offset < 0:
                # The leader knows no epoch <= ours: it cannot be newer than ours unless our view
                # is stale. Ask again after the metadata settles; never guess.
                return False
            own_epoch, own_end = self.log.end_offset_for_epoch(leader_epoch)
            target = min(end_offset, own_end if own_end >= 0 else end_offset, self.log.log_end_offset)
            self.log.truncate_to(target)
            self.truncation_pending = False
            return True

    def handle_out_of_range(self, *, leader_lso: int, leader_leo: int) -> None:
        with self._lock:
            if self.role != FOLLOWER or self.truncation_pending:
                return
            if self.log.log_end_offset < leader_lso:
                self.log.truncate_fully_and_start_at(leader_lso)
            elif self.log.log_end_offset > leader_leo:
                self.log.truncate_to(max(leader_leo, self.log.log_start_offset))
