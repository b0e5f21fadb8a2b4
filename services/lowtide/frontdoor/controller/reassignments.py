"""Partition reassignment (Kafka's KIP-455): AlterPartitionReassignments and
ListPartitionReassignments, and the controller's completion step. Design and the reasons behind
every rule: docs/design/reassignment.md.

A move lives in the partition record itself (``PartitionState.adding_replicas`` /
``removing_replicas``), as in KRaft's ``PartitionRegistration``, so every step is one
compare-and-set on the partition epoch together with the leader and the ISR:

=========  ==================================  ==============================================
step       who                                 record written
=========  ==================================  ==============================================
start(T)   front door (Alter, T non-empty)     replicas = T + (R - T), adding = T - R,
                                               removing = R - T; leader, epoch, ISR unchanged
replace    front door (Alter, move ongoing)    start(T) computed from the original set R
complete   controller, every round             when adding ⊆ ISR and a live ISR member of T
                                               can lead: replicas = T, ISR = ISR ∩ T, no move
                                               fields; leader epoch + 1 only if it changed
cancel     front door (Alter, no target)       replicas = R, ISR = ISR - adding; a leader
                                               from adding hands over to R ∩ ISR ∩ live
=========  ==================================  ==============================================

Replicas need no reassignment-specific code: an adding broker sees itself in ``replicas``, opens
the partition empty and follows; its first fetch is answered OFFSET_OUT_OF_RANGE with the
leader's log start offset and it restarts there, so no record below the low watermark is ever
written on it. It joins the ISR under the usual rule (caught up to the HW, LSO included). A
removed broker sees itself gone and deletes its copy (crash-safe: rename, fsync, remove). The
leader counts every live replica in ``replicas`` (adding ones included) for the low watermark, so
a DeleteRecords during a move waits for the adding replicas too.

Every step is a pure function of the stored record (``PartitionState -> PartitionState | None``):
a front door or controller killed between steps leaves a record the next one finishes, and a step
applied twice is refused by the compare-and-set and recomputed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from lowtide.auth.acl import AclOperation, Authorizer
from lowtide.errors import (
    ClusterAuthorizationFailed,
    EligibleLeadersNotAvailable,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    LowtideError,
    NoReassignmentInProgress,
    RequestTimedOut,
)
from lowtide.messages import TopicPartition
from lowtide.messages.admin import OngoingReassignment, ReassignmentOutcome
from lowtide.metadata.model import PartitionState
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)
ATTEMPTS = 10


def validate_target(state: PartitionState, target: Sequence[int], *, registered: Iterable[int],
                    allow_replication_factor_change: bool = True) -> tuple[int, ...]:
    """``target`` as a tuple, or the Kafka error saying what is wrong with it (raised)."""
    name = f"{state.topic}-{state.partition}"
    target = tuple(int(r) for r in target)
    if not target:
        raise InvalidReplicaAssignment(f"The proposed assignment for partition {name} has no replicas.")
    if len(set(target)) != len(target):
        raise InvalidReplicaAssignment(f"The proposed assignment for partition {name} contains duplicate "
                                       f"replicas {list(target)}.")
    known = set(registered)
    unknown = sorted(r for r in target if r not in known)
    if unknown:
        raise InvalidReplicaAssignment(f"The proposed assignment for partition {name} contains brokers "
                                       f"{unknown} that are not registered.")
    if not allow_replication_factor_change and len(target) != len(state.original_replicas):
        raise InvalidReplicationFactor(
            f"The replication factor is changed from {len(state.original_replicas)} to {len(target)} "
            f"for partition {name}, which is not allowed (allow_replication_factor_change is false).")
    return target


def start_reassignment(state: PartitionState, target: Sequence[int], live: set[int]) -> PartitionState | None:
    """The record with a move to ``target`` begun (or a move in progress redirected to it), or None
    when the partition already is (or is already moving) there."""
    target = tuple(target)
    if target == state.target_replicas:
        return None
    original = state.original_replicas
    adding = tuple(r for r in target if r not in original)
    removing = tuple(r for r in original if r not in target)
    replicas = target + removing
    # Replicas that were adding for an earlier target and are not in this one leave the ISR with it;
    # the leader leaves only when it was an adding replica of the earlier target: hand over. A new
    # target that is the original set (maybe reordered) is a cancel: nothing adding or removing.
    moved = _with_replicas(state, replicas, live, adding=adding, removing=removing)
    if moved is None:
        raise EligibleLeadersNotAvailable(
            f"{state.topic}-{state.partition}: the leader {state.leader} is not in the new target and no other "
            f"replica of {list(replicas)} is live and in the ISR {list(state.isr)}")
    return moved


def complete_reassignment(state: PartitionState, live: set[int]) -> PartitionState | None:
    """The record with the move finished, or None while it cannot finish yet (an adding replica
    is not in the ISR, or no live ISR member of the target can lead)."""
    if not state.reassigning:
        return None
    if not set(state.adding_replicas) <= set(state.isr):
        return None
    # Leadership moves in the same write (KRaft's PartitionChangeBuilder): the old leader sees a
    # new epoch, its parked acks=all produces answer NOT_LEADER_OR_FOLLOWER and the client
    # retries at the new leader, which holds every acknowledged record (an ISR member).
    return _with_replicas(state, state.target_replicas, live, keep_only_if_live=True)


def cancel_reassignment(state: PartitionState, live: set[int]) -> PartitionState:
    """The record with the move undone (raised NO_REASSIGNMENT_IN_PROGRESS when none)."""
    if not state.reassigning:
        raise NoReassignmentInProgress(f"{state.topic}-{state.partition} has no reassignment in progress")
    original = state.original_replicas
    moved = _with_replicas(state, original, live)
    if moved is None:
        raise EligibleLeadersNotAvailable(
            f"{state.topic}-{state.partition}: cannot cancel, the leader {state.leader} is an adding replica "
            f"and no original replica of {list(original)} is live and in the ISR {list(state.isr)}")
    return moved


def _with_replicas(state: PartitionState, replicas: tuple[int, ...], live: set[int], *,
                   adding: tuple[int, ...] = (), removing: tuple[int, ...] = (),
                   keep_only_if_live: bool = False) -> PartitionState | None:
    """The record with ``replicas`` as its replica set (``adding``/``removing`` the move's, none
    once it is over): the ISR cut to them and leadership kept or handed over
    (``_leadership_within``); None when none of them can lead."""
    isr = tuple(r for r in state.isr if r in replicas)
    leadership = _leadership_within(state, replicas, isr, live, keep_only_if_live=keep_only_if_live)
    if leadership is None:
        return None
    leader, epoch = leadership
    return replace(state, replicas=replicas, isr=isr, leader=leader, leader_epoch=epoch,
                   adding_replicas=adding, removing_replicas=removing)


def _leadership_within(state: PartitionState, replicas: Sequence[int], isr: Sequence[int], live: set[int], *,
                       keep_only_if_live: bool = False) -> tuple[int, int] | None:
    """(leader, leader epoch) once ``replicas`` is the replica set: the current leader when it is
    one of them (and live, with ``keep_only_if_live``), else the first of them that is live and in
    ``isr`` with the epoch bumped; None when there is none."""
    if state.leader in replicas and (state.leader in live or not keep_only_if_live):
        return state.leader, state.leader_epoch
    leader = next((r for r in replicas if r in isr and r in live), -1)
    return None if leader < 0 else (leader, state.leader_epoch + 1)


class PartitionReassigner:
    """AlterPartitionReassignments and ListPartitionReassignments for the Admin service and the
    Kafka listener. Alter needs ALTER on the CLUSTER, List DESCRIBE on the CLUSTER (Kafka's ACLs).

    ``alter`` returns once each move is recorded; the controller finishes it
    (``complete_reassignment``). Thread-safe (store and authorizer are; writes compare-and-set).
    """

    def __init__(self, *, store: MetadataStore, authorizer: Authorizer) -> None:
        self._store = store
        self._authorizer = authorizer

    def alter(self, *, principal: str, targets: Mapping[TopicPartition, Sequence[int] | None],
              allow_replication_factor_change: bool = True) -> list[ReassignmentOutcome]:
        """``targets``: partition -> target replicas, or None to cancel its move."""
        self._authorize(principal, AclOperation.ALTER, "reassign partitions")
        registered = set(self._store.brokers())
        live = self._store.live_broker_ids(registered)
        topics: dict[str, bool] = {}
        outcomes = []
        for tp, target in targets.items():
            tp = TopicPartition(*tp)
            try:
                self._check_topic(tp.topic, topics)
                self._alter_one(tp, target, registered=registered, live=live,
                                allow_replication_factor_change=allow_replication_factor_change)
                outcomes.append(ReassignmentOutcome(tp))
            except LowtideError as err:
                outcomes.append(ReassignmentOutcome(tp, err))
        return outcomes

    def list(self, *, principal: str,
             partitions: Iterable[TopicPartition] | None = None) -> list[OngoingReassignment]:
        """The partitions moving now (of ``partitions``, or all), by topic and partition."""
        self._authorize(principal, AclOperation.DESCRIBE, "list partition reassignments")
        states = self._store.all_partition_states()
        keys = sorted(states) if partitions is None else [tuple(tp) for tp in partitions]
        return [OngoingReassignment(topic=s.topic, partition=s.partition, replicas=tuple(s.replicas),
                                    adding_replicas=tuple(s.adding_replicas),
                                    removing_replicas=tuple(s.removing_replicas))
                for s in (states[k] for k in keys if k in states and states[k].reassigning)]

    def _authorize(self, principal: str, operation: AclOperation, what: str) -> None:
        if not self._authorizer.authorize_cluster(principal=principal, operation=operation):
            raise ClusterAuthorizationFailed(f"{principal} may not {what} (needs {operation.name} on CLUSTER)")

    def _check_topic(self, name: str, seen: dict[str, bool]) -> None:
        if name not in seen:
            seen[name] = self._store.topic(name).diskless  # raises UnknownTopicOrPartition
        if seen[name]:
            raise InvalidReplicaAssignment(
                f"topic '{name}' is diskless: its partitions live in object storage and have no replicas to move")

    def _alter_one(self, tp: TopicPartition, target: Sequence[int] | None, *, registered: set[int],
                   live: set[int], allow_replication_factor_change: bool) -> None:
        for _ in range(ATTEMPTS):
            state = self._store.partition_state(tp.topic, tp.partition)  # UNKNOWN_TOPIC_OR_PARTITION
            if target is None:
                new = cancel_reassignment(state, live)
            else:
                checked = validate_target(state, target, registered=registered,
                                          allow_replication_factor_change=allow_replication_factor_change)
                new = start_reassignment(state, checked, live)
            if new is None:
                return
            if self._store.compare_and_set_partition(state, new):
                log.info("reassignment " + ("cancelled" if target is None else "started"), extra={"fields": {
                    "topic": tp.topic, "partition": tp.partition, "replicas": list(new.replicas),
                    "adding": list(new.adding_replicas), "removing": list(new.removing_replicas),
                    "leader": new.leader, "leader_epoch": new.leader_epoch}})
                return
        raise RequestTimedOut(f"{tp.topic}-{tp.partition} changed under too many concurrent writers; retry")


def complete_reassignments(store: MetadataStore, states: Iterable[PartitionState],
                           live: set[int]) -> list[PartitionState]:
    """The controller's step: finish every move that can finish; returns the records written."""
    written = []
    for state in states:
        new = complete_reassignment(state, live)
        if new is None:
            continue
        if store.compare_and_set_partition(state, new):
            log.info("reassignment completed", extra={"fields": {
                "topic": new.topic, "partition": new.partition, "replicas": list(new.replicas),
                "removed": list(state.removing_replicas), "leader": new.leader, "leader_epoch": new.leader_epoch}})
            written.append(replace(new, partition_epoch=state.partition_epoch + 1))
    return written
