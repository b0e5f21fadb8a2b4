"""Kafka's classic consumer group membership protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
and the generation checks OffsetCommit makes against the group (``GroupCoordinator`` in
``groups.py`` asks ``validate_commit``).

The state machine of one group is ``classic_group.ClassicGroup`` (Kafka's ClassicGroup /
GroupCoordinator.scala); this module is the coordinator around it:

* **Where the state lives.** In the memory of this front door process, not in
  ``__consumer_offsets`` (Kafka also writes GroupMetadata records there; lowtide does not yet).
  Consequences: every member of a group must talk to the same front door (a Kafka client does:
  FindCoordinator names one node), and a front door restart forgets the groups' members and
  generations, so their consumers get UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION and rejoin, as after
  a Kafka coordinator failover without the metadata. Committed offsets are not affected: they stay
  in ``GroupStore`` (``__consumer_offsets``).
* **Blocking calls.** JoinGroup returns when the rebalance it joined completes (every known
  member rejoined, or the rebalance timeout passed; an empty group's first rebalance waits
  ``initial_rebalance_delay_ms``, extended by each new joiner up to the rebalance timeout, as
  Kafka's group.initial.rebalance.delay.ms); a follower's SyncGroup returns once the leader sent
  the assignment. Each blocked call holds a gRPC handler thread (``--max-workers``) meanwhile,
  waiting on its group's ``threading.Condition``; nothing waits while holding a lock across I/O.
* **Time.** One timer thread ticks every ``tick_interval_s``: session timeouts (a member neither
  heartbeating nor in a JoinGroup/SyncGroup call is removed and the group rebalances), the join
  phase's deadline, members that never sent SyncGroup within the rebalance timeout (Kafka's
  DelayedSync), ids handed out with MEMBER_ID_REQUIRED that never came back, and groups left
  Empty with nothing for ``empty_group_retention_ms``.
* **Answers.** Errors that are Kafka's answers (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
  REBALANCE_IN_PROGRESS...) come back in the results; only INVALID_GROUP_ID and
  GROUP_AUTHORIZATION_FAILED are raised (``heartbeat`` raises everything: it has nothing else to
  say). The servicer puts both into the responses' error_code fields.
* **ACLs** (Kafka's): READ on the GROUP for JoinGroup, SyncGroup, Heartbeat and LeaveGroup.
* **Consumer groups** (KIP-848, ``consumer_membership.py``, attached with
  ``attach_consumer_groups``). A call for a group id this membership holds no members of goes to
  the consumer groups first: classic members inside a consumer group are served there
  (``classic_members.py``); when the id is no consumer group with members, it is served here. A
  classic group is handed over to the consumer side when a consumer-protocol member upgrades it
  (``hand_over``; ``take_back`` if the conversion was not written) and comes back when the last
  consumer-protocol member leaves (``install``). An id handed over is never re-created here by
  a call that raced the conversion: that call is routed again.

Thread-safe: a registry lock (held only to find, create or drop a group) and one condition per
group, always taken in that order.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from lowtide.auth.acl import AclOperation, Authorizer, ResourceType
from lowtide.common.ticker import Ticker
from lowtide.errors import (
    FencedInstanceId,
    GroupAuthorizationFailed,
    GroupMaxSizeReached,
    IllegalGeneration,
    InconsistentGroupProtocol,
    InvalidSessionTimeout,
    LowtideError,
    MemberIdRequired,
    NonEmptyGroup,
    NotCoordinator,
    RebalanceInProgress,
    UnknownMemberId,
)
from lowtide.frontdoor.groups.classic_group import (
    COMPLETING_REBALANCE,
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    ClassicGroup,
    Member,
    Timing,
    Waiter,
)
from lowtide.frontdoor.groups.groups import validate_group_id
from lowtide.messages.admin import (
    GroupSnapshot,
    JoinRequest,
    JoinResult,
    LeaveOutcome,
    LeavingMember,
    SyncResult,
)

log = logging.getLogger(__name__)

# A call that finds its group handed over between routing and serving is routed again this often.
_ROUTING_ATTEMPTS = 3


@dataclass(frozen=True)
class MembershipConfig:
    # Kafka's group.min.session.timeout.ms is 6000; lower here by default so tests can be quick.
    min_session_timeout_ms: int = 1000
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000   # group.initial.rebalance.delay.ms
    max_group_size: int = 2**31 - 1          # group.max.size
    tick_interval_s: float = 0.05
    empty_group_retention_ms: int = 600_000  # an Empty group with no member is forgotten after this


def _unborn(group: ClassicGroup) -> bool:
    """Created by a JoinGroup that failed before anyone joined: not a group to anyone outside."""
    return group.state == EMPTY and group.generation == 0 and not group.members and not group.pending_members


class _HandedOver(Exception):
    """The group id was handed to the consumer groups while a call was on its way here."""


class ConsumerSide(Protocol):
    """What this membership asks the KIP-848 consumer groups (``consumer_membership``): each
    answers None (False) when the id is no consumer group with members there."""

    def classic_join(self, *, request: JoinRequest) -> JoinResult | None: ...

    def classic_sync(self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str,
                     protocol_type: str, protocol_name: str) -> SyncResult | None: ...

    def classic_heartbeat(self, *, group_id: str, generation_id: int, member_id: str,
                          group_instance_id: str) -> bool: ...

    def classic_leave(self, *, group_id: str, members: Sequence[LeavingMember]) -> list[LeaveOutcome] | None: ...


class GroupMembership:
    """The classic membership protocol over in-memory ``ClassicGroup``s (module doc). ``start``
    the timer before use; ``stop`` ends it and answers every blocked call NOT_COORDINATOR."""

    def __init__(self, *, authorizer: Authorizer, config: MembershipConfig = MembershipConfig(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._authorizer = authorizer
        self.config = config
        self._clock = clock
        self._timing = Timing(initial_rebalance_delay_s=config.initial_rebalance_delay_ms / 1000)
        self._registry = threading.Lock()
        self._groups: dict[str, ClassicGroup] = {}
        self._ticker = Ticker(name="group-membership", interval_s=self.config.tick_interval_s, tick=self.tick)
        # Whether a group id is a KIP-848 consumer group (``consumer_membership``; set by the
        # server): a classic JoinGroup to one is refused, a group id has one type.
        self.is_consumer_group: Callable[[str], bool] | None = None
        self._consumer: ConsumerSide | None = None
        self._handed_over: set[str] = set()  # ids the consumer side holds (registry lock)
        self._prior_states: dict[str, str] = {}  # state of a group handed over, for take_back

    @property
    def timing(self) -> Timing:
        return self._timing

    @property
    def max_group_size(self) -> int:
        return self.config.max_group_size

    def attach_consumer_groups(self, consumer: ConsumerSide) -> None:
        self._consumer = consumer

    # -- online upgrade and downgrade (module doc): the consumer side calls these ---------------
    def hand_over(self, group_id: str) -> ClassicGroup | None:
        """Give the group with members of this id to the consumer side (its calls waiting here
        answered REBALANCE_IN_PROGRESS: they rejoin, routed there); None when it has none."""
        with self._registry:
            group = self._groups.get(group_id)
            if group is None:
                return None
            with group.cond:
                if group.state == DEAD or not group.members:
                    return None
                error = RebalanceInProgress(f"group {group_id!r} is becoming a consumer group; rejoin")
                for member in group.members.values():
                    if member.join_waiter is not None:
                        member.join_waiter.result = JoinResult(member_id=member.member_id, error=error)
                    if member.sync_waiter is not None:
                        member.sync_waiter.result = SyncResult(error=error)
                    member.join_waiter = member.sync_waiter = None
                self._prior_states[group_id] = group.state
                group.state = DEAD
                group.pending_members.clear()
                del self._groups[group_id]
                self._handed_over.add(group_id)
                group.cond.notify_all()
                return group

    def take_back(self, group: ClassicGroup) -> None:
        """A hand-over whose conversion was not written: the group is classic again (one that
        was rebalancing rebalances anew: its waiting calls were answered)."""
        with self._registry:
            prior = self._prior_states.pop(group.group_id, STABLE)
            group.state = STABLE if prior in (PREPARING_REBALANCE, COMPLETING_REBALANCE) else prior
            if prior != group.state:
                group.maybe_prepare_rebalance(self._clock(), self._timing)
            self._groups[group.group_id] = group
            self._handed_over.discard(group.group_id)

    def install(self, group: ClassicGroup) -> None:
        """A consumer group downgraded to this classic group: it is served here from now on."""
        with self._registry:
            old = self._groups.get(group.group_id)
            if old is not None:
                with old.cond:
                    old.state = DEAD
                    old.cond.notify_all()
            self._groups[group.group_id] = group
            self._handed_over.discard(group.group_id)
            self._prior_states.pop(group.group_id, None)

    def release(self, group_id: str) -> None:
        """The consumer side no longer holds this id (its consumer group was deleted)."""
        with self._registry:
            self._handed_over.discard(group_id)
            self._prior_states.pop(group_id, None)

    def _holds(self, group_id: str) -> bool:
        """Whether a classic group of this id has members here (a routing hint: a call that then
        finds it handed over is routed again)."""
        with self._registry:
            group = self._groups.get(group_id)
            return group is not None and group.state != DEAD and bool(group.members or group.pending_members)

    def _routed(self, group_id: str) -> ConsumerSide | None:
        return self._consumer if self._consumer is not None and not self._holds(group_id) else None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()
        with self._registry:
            groups = list(self._groups.values())
        for group in groups:
            with group.cond:
                group.cond.notify_all()

    def tick(self) -> None:
        """Apply what time decides to every group (the timer thread calls this)."""
        with self._registry:
            groups = list(self._groups.values())
        now = self._clock()
        retention_s = self.config.empty_group_retention_ms / 1000
        forget = []
        for group in groups:
            with group.cond:
                removed = group.expire(now, self._timing)
                if removed:
                    log.info("group members expired", extra={"fields": {
                        "group": group.group_id, "members": removed, "state": group.state}})
                    group.cond.notify_all()
                if _unborn(group) or (group.state == EMPTY and not group.pending_members
                                      and now - group.empty_since > retention_s):
                    forget.append(group)
        for group in forget:
            with self._registry, group.cond:
                if self._groups.get(group.group_id) is group and group.state == EMPTY and not group.members \
                        and not group.pending_members:
                    group.state = DEAD
                    del self._groups[group.group_id]

    @contextmanager
    def _locked(self, group_id: str, *, create: bool, routed: bool = False) -> Iterator[ClassicGroup | None]:
        """The group with its condition held (created when asked and missing), None when absent.
        A group found Dead was just dropped from the registry: look again. ``routed`` (the four
        membership calls): raises _HandedOver for an id the consumer side holds now."""
        while True:
            with self._registry:
                if routed and group_id in self._handed_over:
                    raise _HandedOver(group_id)
                group = self._groups.get(group_id)
                if group is None and create:
                    group = self._groups[group_id] = ClassicGroup(group_id=group_id, created=self._clock())
            if group is None:
                yield None
                return
            with group.cond:
                if group.state == DEAD:
                    continue
                try:
                    yield group
                finally:
                    group.cond.notify_all()
                return

    def _await(self, group: ClassicGroup, waiter: Waiter,
               stopped: Callable[[LowtideError], JoinResult | SyncResult]) -> JoinResult | SyncResult:
        """Wait (condition held) until a transition answers ``waiter``."""
        while waiter.result is None:
            if self._ticker.stopped:
                return stopped(NotCoordinator("this front door is shutting down; find the coordinator again"))
            group.cond.wait(0.5)
        return waiter.result

    def _require_read(self, principal: str, group_id: str) -> None:
        validate_group_id(group_id)
        if not self._authorizer.authorize(principal=principal, operation=AclOperation.READ,
                                          resource_type=ResourceType.GROUP, resource_name=group_id):
            raise GroupAuthorizationFailed(f"{principal} is not authorized to READ on GROUP {group_id!r}")

    # -- JoinGroup -----------------------------------------------------------------------------
    def join_group(self, *, principal: str, request: JoinRequest) -> JoinResult:
        """Kafka's JoinGroup; blocks until the rebalance completes (module doc)."""
        self._require_read(principal, request.group_id)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= request.session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(member_id=request.member_id, error=InvalidSessionTimeout(
                f"session timeout {request.session_timeout_ms} ms is outside "
                f"[{cfg.min_session_timeout_ms}, {cfg.max_session_timeout_ms}]"))
        if self._consumer is None and self.is_consumer_group is not None and self.is_consumer_group(request.group_id):
            return JoinResult(member_id=request.member_id, error=InconsistentGroupProtocol(
                f"group {request.group_id!r} is a consumer group (KIP-848): join it with ConsumerGroupHeartbeat "
                f"(group.protocol=consumer)"))
        for _ in range(_ROUTING_ATTEMPTS):
            consumer = self._routed(request.group_id)
            routed = consumer.classic_join(request=request) if consumer is not None else None
            if routed is not None:
                return routed
            try:
                return self._join_classic(request)
            except _HandedOver:
                continue
        return JoinResult(member_id=request.member_id, error=RebalanceInProgress(
            f"group {request.group_id!r} is changing type; rejoin"))

    def _join_classic(self, request: JoinRequest) -> JoinResult:
        waiter = Waiter()
        with self._locked(request.group_id, create=not request.member_id, routed=True) as group:
            if group is None:
                return JoinResult(member_id=request.member_id, error=UnknownMemberId(
                    f"group {request.group_id!r} has no member {request.member_id!r}"))
            answer = self._join_locked(group, request, waiter)
            if answer is not None:
                return answer
            result = self._await(group, waiter, lambda e: JoinResult(member_id=request.member_id, error=e))
        assert isinstance(result, JoinResult)
        if result.error is None:
            log.info("member joined", extra={"fields": {
                "group": request.group_id, "member": result.member_id, "generation": result.generation_id,
                "leader": result.leader == result.member_id, "reason": request.reason}})
        return result

    def _join_locked(self, group: ClassicGroup, request: JoinRequest, waiter: Waiter) -> JoinResult | None:
        """The answer at once, or None: ``waiter`` will get it."""
        now = self._clock()
        session_s = request.session_timeout_ms / 1000
        rebalance_ms = request.rebalance_timeout_ms if request.rebalance_timeout_ms > 0 else request.session_timeout_ms
        rebalance_s = rebalance_ms / 1000
        protocols = tuple(request.protocols)
        if not group.supports_protocols(request.protocol_type, [p.name for p in protocols]):
            return JoinResult(member_id=request.member_id, error=InconsistentGroupProtocol(
                f"protocol type {request.protocol_type!r} with protocols {[p.name for p in protocols]} does not "
                f"match group {group.group_id!r} (type {group.protocol_type!r}, supported by all members: "
                f"{sorted(group.candidate_protocols())})"))
        instance = request.group_instance_id

        def new_member(member_id: str) -> Member:
            return Member(member_id=member_id, group_instance_id=instance, client_id=request.client_id,
                          client_host=request.client_host, session_timeout_s=session_s,
                          rebalance_timeout_s=rebalance_s, protocol_type=request.protocol_type,
                          protocols=protocols, last_heartbeat=now)

        if not request.member_id:  # doNewMemberJoin / doStaticMemberJoin
            known_instance = bool(instance) and instance in group.static_members
            if not known_instance and group.size() >= self.config.max_group_size:
                return JoinResult(error=GroupMaxSizeReached(
                    f"group {group.group_id!r} has reached its maximum size {self.config.max_group_size}"))
            member_id = f"{instance or request.client_id}-{uuid.uuid4()}"
            if known_instance:
                return self._replace_static(group, new_member(member_id), waiter, now)
            if not instance and request.require_known_member_id:
                group.pending_members[member_id] = now + session_s
                return JoinResult(member_id=member_id, error=MemberIdRequired(
                    "rejoin with the member id of this answer"))
            group.add_member(new_member(member_id), waiter, now, self._timing)
            return None

        member_id = request.member_id
        if instance:
            existing = group.static_members.get(instance)
            if existing is None:
                return JoinResult(member_id=member_id, error=UnknownMemberId(
                    f"group.instance.id {instance!r} is not in group {group.group_id!r}"))
            if existing != member_id:
                return JoinResult(member_id=member_id, error=group_fenced(group, instance, member_id))
        if member_id in group.pending_members:  # back with the id MEMBER_ID_REQUIRED gave it
            del group.pending_members[member_id]
            group.add_member(new_member(member_id), waiter, now, self._timing)
            return None
        member = group.members.get(member_id)
        if member is None or group.state not in (PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE):
            return JoinResult(member_id=member_id, error=UnknownMemberId(
                f"member {member_id!r} is not in group {group.group_id!r}"))
        same = member.protocols == protocols
        if (group.state == COMPLETING_REBALANCE and same) or \
                (group.state == STABLE and same and member_id != group.leader_id):
            member.last_heartbeat = now  # nothing changes: the current generation, at once
            return group.current_join_result(member)
        group.update_member(member, protocols, session_timeout_s=session_s, rebalance_timeout_s=rebalance_s,
                            waiter=waiter, now=now, timing=self._timing)
        return None

    def _replace_static(self, group: ClassicGroup, new: Member, waiter: Waiter, now: float) -> JoinResult | None:
        """updateStaticMemberAndRebalance: a known group.instance.id came back without its member id."""
        old = group.members[group.static_members[new.group_instance_id]]
        current_leader = group.leader_id or ""
        group.replace_static_member(old, new)
        log.info("static member replaced", extra={"fields": {
            "group": group.group_id, "instance": new.group_instance_id, "old": old.member_id, "new": new.member_id}})
        if group.state == STABLE and group.select_protocol() == group.protocol_name:
            # No rebalance: the same generation and assignment under the new id (the old leader id
            # is named, so a replaced leader does not compute an assignment nobody would get).
            return group.current_join_result(new, leader=current_leader)
        if group.state == PREPARING_REBALANCE:
            new.join_waiter = waiter
            group.maybe_complete_join(now, self._timing)
            return None
        group.update_member(new, new.protocols, session_timeout_s=new.session_timeout_s,
                            rebalance_timeout_s=new.rebalance_timeout_s, waiter=waiter, now=now, timing=self._timing)
        return None

    # -- SyncGroup -----------------------------------------------------------------------------
    def sync_group(self, *, principal: str, group_id: str, generation_id: int, member_id: str,
                   group_instance_id: str = "", protocol_type: str = "", protocol_name: str = "",
                   assignments: Mapping[str, bytes] | None = None) -> SyncResult:
        """Kafka's SyncGroup: the leader's call hands out ``assignments`` and makes the generation
        Stable; a follower's call blocks until then."""
        self._require_read(principal, group_id)
        for _ in range(_ROUTING_ATTEMPTS):
            consumer = self._routed(group_id)
            routed = consumer.classic_sync(
                group_id=group_id, generation_id=generation_id, member_id=member_id,
                group_instance_id=group_instance_id, protocol_type=protocol_type,
                protocol_name=protocol_name) if consumer is not None else None
            if routed is not None:
                return routed
            try:
                return self._sync_classic(group_id=group_id, generation_id=generation_id, member_id=member_id,
                                          group_instance_id=group_instance_id, protocol_type=protocol_type,
                                          protocol_name=protocol_name, assignments=assignments)
            except _HandedOver:
                continue
        return SyncResult(error=RebalanceInProgress(f"group {group_id!r} is changing type; rejoin"))

    def _sync_classic(self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str,
                      protocol_type: str, protocol_name: str, assignments: Mapping[str, bytes] | None) -> SyncResult:
        waiter = Waiter()
        with self._locked(group_id, create=False, routed=True) as group:
            if group is None:
                return SyncResult(error=UnknownMemberId(f"group {group_id!r} has no member {member_id!r}"))
            try:
                member = group.validate_member(member_id, group_instance_id)
                check_generation(group, generation_id)
            except LowtideError as err:
                return SyncResult(error=err)
            if (protocol_type and protocol_type != group.protocol_type) or \
                    (protocol_name and protocol_name != group.protocol_name):
                return SyncResult(error=InconsistentGroupProtocol(
                    f"group {group_id!r} runs {group.protocol_type!r}/{group.protocol_name!r}, "
                    f"not {protocol_type!r}/{protocol_name!r}"))
            now = self._clock()
            if group.state == PREPARING_REBALANCE:
                return SyncResult(error=RebalanceInProgress(f"group {group_id!r} is rebalancing; rejoin"))
            member.last_heartbeat = now
            group.pending_sync.discard(member_id)
            if group.state == STABLE:
                return SyncResult(protocol_type=group.protocol_type or "", protocol_name=group.protocol_name or "",
                                  assignment=member.assignment)
            if member.sync_waiter is not None:  # a second SyncGroup while the first one waits
                member.sync_waiter.result = SyncResult(error=RebalanceInProgress("superseded by a newer SyncGroup"))
            member.sync_waiter = waiter
            if member_id == group.leader_id:
                group.complete_sync(dict(assignments or {}))
                log.info("group stable", extra={"fields": {
                    "group": group_id, "generation": group.generation, "protocol": group.protocol_name,
                    "members": len(group.members)}})
            result = self._await(group, waiter, lambda e: SyncResult(error=e))
        assert isinstance(result, SyncResult)
        return result

    # -- Heartbeat -----------------------------------------------------------------------------
    def heartbeat(self, *, principal: str, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str = "") -> None:
        """Kafka's Heartbeat: keeps the member's session; raises UNKNOWN_MEMBER_ID,
        FENCED_INSTANCE_ID, ILLEGAL_GENERATION, or REBALANCE_IN_PROGRESS (rejoin) when so."""
        self._require_read(principal, group_id)
        for _ in range(_ROUTING_ATTEMPTS):
            consumer = self._routed(group_id)
            if consumer is not None and consumer.classic_heartbeat(
                    group_id=group_id, generation_id=generation_id, member_id=member_id,
                    group_instance_id=group_instance_id):
                return
            try:
                self._heartbeat_classic(group_id=group_id, generation_id=generation_id, member_id=member_id,
                                        group_instance_id=group_instance_id)
                return
            except _HandedOver:
                continue
        raise RebalanceInProgress(f"group {group_id!r} is changing type; rejoin")

    def _heartbeat_classic(self, *, group_id: str, generation_id: int, member_id: str,
                           group_instance_id: str) -> None:
        with self._locked(group_id, create=False, routed=True) as group:
            if group is None:
                raise UnknownMemberId(f"group {group_id!r} has no member {member_id!r}")
            member = group.validate_member(member_id, group_instance_id)
            check_generation(group, generation_id)
            member.last_heartbeat = self._clock()
            if group.state == PREPARING_REBALANCE:
                raise RebalanceInProgress(f"group {group_id!r} is rebalancing; rejoin")

    # -- LeaveGroup ----------------------------------------------------------------------------
    def leave_group(self, *, principal: str, group_id: str,
                    members: Sequence[LeavingMember]) -> list[LeaveOutcome]:
        """Kafka's LeaveGroup (v3+ batch): each member by id, or by group.instance.id alone (an
        administrative removal); the group rebalances without them."""
        self._require_read(principal, group_id)
        for _ in range(_ROUTING_ATTEMPTS):
            consumer = self._routed(group_id)
            routed = consumer.classic_leave(group_id=group_id, members=members) if consumer is not None else None
            if routed is not None:
                return routed
            try:
                return self._leave_classic(group_id, members)
            except _HandedOver:
                continue
        return [LeaveOutcome(member_id=m.member_id, group_instance_id=m.group_instance_id, error=RebalanceInProgress(
            f"group {group_id!r} is changing type; retry")) for m in members]

    def _leave_classic(self, group_id: str, members: Sequence[LeavingMember]) -> list[LeaveOutcome]:
        out = []
        with self._locked(group_id, create=False, routed=True) as group:
            for leaving in members:
                error = None if group is not None else UnknownMemberId(f"group {group_id!r} has no members")
                if group is not None:
                    error = self._leave_locked(group, leaving)
                out.append(LeaveOutcome(member_id=leaving.member_id, group_instance_id=leaving.group_instance_id,
                                        error=error))
        return out

    def _leave_locked(self, group: ClassicGroup, leaving: LeavingMember) -> LowtideError | None:
        now = self._clock()
        member_id, instance = leaving.member_id, leaving.group_instance_id
        if not member_id:
            member_id = group.static_members.get(instance, "") if instance else ""
            if not member_id:
                return UnknownMemberId(f"group.instance.id {instance!r} is not in group {group.group_id!r}")
        elif member_id in group.pending_members:
            del group.pending_members[member_id]
            group.maybe_complete_join(now, self._timing)
            return None
        elif instance and group.static_members.get(instance, member_id) != member_id:
            return group_fenced(group, instance, member_id)
        if member_id not in group.members:
            return UnknownMemberId(f"member {member_id!r} is not in group {group.group_id!r}")
        group.remove_member(member_id, now, self._timing, error=UnknownMemberId(f"member {member_id!r} left"))
        log.info("member left", extra={"fields": {"group": group.group_id, "member": member_id,
                                                  "reason": leaving.reason, "state": group.state}})
        return None

    # -- what the offsets side asks (groups.GroupCoordinator) ----------------------------------
    def validate_commit(self, group_id: str, *, generation_id: int, member_id: str = "",
                        group_instance_id: str = "") -> None:
        """Kafka's ClassicGroup.validateOffsetCommit: raises the error every partition of the
        commit gets. A generation < 0 without member is a standalone commit, accepted only while
        the group has no members."""
        with self._locked(group_id, create=False) as group:
            if group is None or _unborn(group):
                if generation_id >= 0:
                    raise IllegalGeneration(f"group {group_id!r} has no generation {generation_id}")
                return
            if generation_id < 0 and group.state == EMPTY:
                return
            if generation_id >= 0 or member_id or group_instance_id:
                member = group.validate_member(member_id, group_instance_id)
                check_generation(group, generation_id)
                member.last_heartbeat = self._clock()
            elif group.state != EMPTY:
                raise UnknownMemberId(f"group {group_id!r} has members: commit with a member id and generation")
            if group.state == COMPLETING_REBALANCE:
                raise RebalanceInProgress(f"group {group_id!r} is completing a rebalance; commit after SyncGroup")

    def has_members(self, group_id: str) -> bool:
        """Whether a classic group of this id has members (or ids handed out): it is not free to
        become a consumer group."""
        with self._locked(group_id, create=False) as group:
            return group is not None and bool(group.members or group.pending_members)

    def snapshot(self, group_id: str) -> GroupSnapshot | None:
        with self._locked(group_id, create=False) as group:
            return None if group is None or _unborn(group) else group.snapshot()

    def snapshots(self) -> list[GroupSnapshot]:
        with self._registry:
            groups = list(self._groups.values())
        out = []
        for group in groups:
            with group.cond:
                if group.state != DEAD and not _unborn(group):
                    out.append(group.snapshot())
        return out

    def delete_if_empty(self, group_id: str) -> bool:
        """DeleteGroups' part: NON_EMPTY_GROUP while it has members; otherwise forget it (Dead).
        True when there was a group here to delete."""
        with self._registry:
            group = self._groups.get(group_id)
            if group is None:
                return False
            with group.cond:
                if group.members:
                    raise NonEmptyGroup(f"group {group_id!r} has {len(group.members)} members ({group.state})")
                existed = not _unborn(group)
                group.state = DEAD
                group.pending_members.clear()
                del self._groups[group_id]
                group.cond.notify_all()
                return existed


def check_generation(group: ClassicGroup, generation_id: int) -> None:
    if generation_id != group.generation:
        raise IllegalGeneration(f"generation {generation_id} is not group {group.group_id!r}'s current "
                                f"generation {group.generation}")


def group_fenced(group: ClassicGroup, instance: str, member_id: str) -> LowtideError:
    return FencedInstanceId(f"group.instance.id {instance!r} of group {group.group_id!r} belongs to member "
                            f"{group.static_members.get(instance)!r}, not {member_id!r}")

