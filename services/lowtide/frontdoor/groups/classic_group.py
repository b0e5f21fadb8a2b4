"""One consumer group's state machine under Kafka's classic membership protocol (the data and the
transitions; ``membership.py`` holds the locking, the blocking calls, the timer and the ACLs).

Modelled on Kafka's ``ClassicGroup`` / ``GroupCoordinator.scala``::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
      ^                  ^  |                                          | leader's SyncGroup
      |                  |  +--(no member left: generation+1)--> Empty v
      +-- (last member   +---- join / leave / expiry / leader rejoin -- Stable
          gone)                                                        (Dead: deleted)

Every method here runs with the group's ``cond`` held by the caller and never blocks; a blocked
JoinGroup or SyncGroup call is a ``Waiter`` the transitions fill in (the caller then
``notify_all``s). Times are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

from kio.schema.consumer_protocol_subscription import v0 as sub_v0
from kio.schema.consumer_protocol_subscription import v1 as sub_v1
from kio.schema.consumer_protocol_subscription import v2 as sub_v2
from kio.schema.consumer_protocol_subscription import v3 as sub_v3
from kio.serial import entity_reader

from lowtide.errors import FencedInstanceId, LowtideError, RebalanceInProgress, UnknownMemberId
from lowtide.messages.admin import GroupSnapshot, JoinedMember, JoinResult, MemberSnapshot, Protocol, SyncResult

EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD = (
    "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")
CONSUMER_PROTOCOL_TYPE = "consumer"

M = typing.TypeVar("M")
M_co = typing.TypeVar("M_co", covariant=True)

_SUBSCRIPTION_READERS = [entity_reader(m.ConsumerProtocolSubscription) for m in (sub_v0, sub_v1, sub_v2, sub_v3)]


def consumer_subscription_topics(metadata: bytes) -> frozenset[str]:
    """The topics of a consumer protocol subscription (an int16 version, then Kafka's
    ConsumerProtocolSubscription of that version; a newer version is read as the newest known one,
    as Kafka's ConsumerProtocol does). ValueError when the bytes are not one."""
    if len(metadata) < 2:
        raise ValueError("consumer protocol subscription shorter than its version")
    version = int.from_bytes(metadata[:2], "big", signed=True)
    if version < 0:
        raise ValueError(f"consumer protocol subscription version {version}")
    try:
        entity, _ = _SUBSCRIPTION_READERS[min(version, len(_SUBSCRIPTION_READERS) - 1)](bytes(metadata), 2)
    except Exception as err:  # kio raises its own buffer errors
        raise ValueError(f"undecodable consumer protocol subscription: {err}") from None
    return frozenset(entity.topics)


class GroupMembers(typing.Protocol[M_co]):
    """What ``checked_member`` reads of a group: a classic group, or a consumer group whose classic
    members call JoinGroup/SyncGroup/Heartbeat/LeaveGroup (``classic_members``)."""

    @property
    def group_id(self) -> str: ...

    @property
    def members(self) -> Mapping[str, M_co]: ...

    @property
    def static_members(self) -> Mapping[str, str]: ...  # group.instance.id -> member id


def checked_member(group: GroupMembers[M], *, member_id: str, instance_id: str) -> M:
    """Kafka's validateMember (a classic group's, and a consumer group's for its classic members):
    FENCED_INSTANCE_ID when the instance id now belongs to another member id (a static member
    replaced by a newer join), UNKNOWN_MEMBER_ID when the member is not in the group."""
    if instance_id:  # only then: a consumer group builds its static_members on each read
        holder = group.static_members.get(instance_id)
        if holder is not None and holder != member_id:
            raise FencedInstanceId(f"group.instance.id {instance_id!r} of group {group.group_id!r} now "
                                   f"belongs to member {holder!r}, not {member_id!r}")
    member = group.members.get(member_id)
    if member is None:
        raise UnknownMemberId(f"member {member_id!r} is not in group {group.group_id!r}")
    return member


class Waiter:
    """The answer slot of one blocked JoinGroup or SyncGroup call."""

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: JoinResult | SyncResult | None = None


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str  # "" = dynamic member
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: tuple[Protocol, ...]
    last_heartbeat: float
    assignment: bytes = b""
    join_waiter: Waiter | None = None
    sync_waiter: Waiter | None = None

    def metadata_for(self, protocol: str | None) -> bytes:
        return next((p.metadata for p in self.protocols if p.name == protocol), b"")

    def vote(self, candidates: set[str]) -> str:
        """Kafka's MemberMetadata.vote: this member's most preferred protocol among the candidates."""
        return next(p.name for p in self.protocols if p.name in candidates)


@dataclass(frozen=True)
class Timing:
    """The coordinator-wide settings the transitions need (seconds)."""

    initial_rebalance_delay_s: float


@dataclass
class ClassicGroup:
    group_id: str
    created: float
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    static_members: dict[str, str] = field(default_factory=dict)  # group_instance_id -> member_id
    pending_members: dict[str, float] = field(default_factory=dict)  # MEMBER_ID_REQUIRED ids -> expiry
    pending_sync: set[str] = field(default_factory=set)
    join_deadline: float | None = None
    sync_deadline: float | None = None
    initial_join: bool = False
    initial_remaining_s: float = 0.0
    new_member_added: bool = False
    subscribed_topics: frozenset[str] | None = None
    empty_since: float = 0.0
    cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def __post_init__(self) -> None:
        self.empty_since = self.created

    # -- queries -------------------------------------------------------------------------------
    @property
    def rebalance_timeout_s(self) -> float:
        return max((m.rebalance_timeout_s for m in self.members.values()), default=0.0)

    def size(self) -> int:
        return len(self.members) + len(self.pending_members)

    def supports_protocols(self, protocol_type: str, names: list[str]) -> bool:
        """Kafka's supportsProtocols: an empty group takes any non-empty type and list; otherwise
        the type must match and one of the protocols be supported by every member."""
        if not self.members:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and bool(set(names) & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        sets = [{p.name for p in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Kafka's selectProtocol: among the protocols every member supports, the one most members
        prefer (each votes for its first candidate); ties go to the protocol voted for first in
        join order (Kafka leaves ties to a hash map's order)."""
        candidates = self.candidate_protocols()
        if not candidates:  # cannot happen through JoinGroup's checks; keep the leader's choice
            leader = self.members.get(self.leader_id or "") or next(iter(self.members.values()))
            return leader.protocols[0].name
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])  # max keeps the first of equal counts

    def all_members_joined(self) -> bool:
        return all(m.join_waiter is not None for m in self.members.values()) and not self.pending_members

    def validate_member(self, member_id: str, group_instance_id: str) -> Member:
        """Kafka's validateMember (``checked_member``)."""
        return checked_member(self, member_id=member_id, instance_id=group_instance_id)

    def snapshot(self) -> GroupSnapshot:
        stable = self.state == STABLE
        return GroupSnapshot(
            group_id=self.group_id, state=self.state, protocol_type=self.protocol_type or "",
            protocol=(self.protocol_name or "") if stable else "", generation_id=self.generation,
            leader=self.leader_id or "", subscribed_topics=self.subscribed_topics,
            members=tuple(MemberSnapshot(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, metadata=m.metadata_for(self.protocol_name) if stable else b"",
                assignment=m.assignment if stable else b"") for m in self.members.values()))

    def current_join_result(self, member: Member, *, leader: str | None = None) -> JoinResult:
        """The current generation as a JoinGroup answer for ``member`` (the leader gets the members).
        ``leader`` overrides the leader named (a static member replaced in a Stable group is told
        the old leader id, as Kafka does, so that it does not reassign a group that stays Stable)."""
        is_leader = member.member_id == self.leader_id and leader is None
        return JoinResult(
            member_id=member.member_id, generation_id=self.generation, protocol_type=self.protocol_type or "",
            protocol_name=self.protocol_name or "", leader=leader if leader is not None else self.leader_id or "",
            members=tuple(JoinedMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                       metadata=m.metadata_for(self.protocol_name))
                          for m in self.members.values()) if is_leader else ())

    # -- membership changes --------------------------------------------------------------------
    def add_member(self, member: Member, waiter: Waiter, now: float, timing: Timing) -> None:
        """addMemberAndRebalance: the member joins, waiting for the rebalance it starts or joins."""
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.state == PREPARING_REBALANCE and self.initial_join:
            self.new_member_added = True
        member.join_waiter = waiter
        self.members[member.member_id] = member
        if member.group_instance_id:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.maybe_prepare_rebalance(now, timing)
        self.maybe_complete_join(now, timing)

    def update_member(self, member: Member, protocols: tuple[Protocol, ...], *, session_timeout_s: float,
                      rebalance_timeout_s: float, waiter: Waiter, now: float, timing: Timing) -> None:
        """updateMemberAndRebalance: a known member rejoins with (possibly new) protocols."""
        member.protocols = protocols
        member.session_timeout_s = session_timeout_s
        member.rebalance_timeout_s = rebalance_timeout_s
        member.last_heartbeat = now
        if member.join_waiter is not None:  # a second JoinGroup while the first one waits
            member.join_waiter.result = JoinResult(member_id=member.member_id, error=RebalanceInProgress(
                "superseded by a newer JoinGroup of the same member"))
        member.join_waiter = waiter
        self.maybe_prepare_rebalance(now, timing)
        self.maybe_complete_join(now, timing)

    def replace_static_member(self, old: Member, new: Member) -> None:
        """A known group.instance.id joined without its member id: the new id takes the old one's
        place (assignment, leadership); the old id is fenced, including a call it has waiting."""
        fenced = FencedInstanceId(f"group.instance.id {new.group_instance_id!r} joined again as {new.member_id!r}")
        if old.join_waiter is not None:
            old.join_waiter.result = JoinResult(member_id=old.member_id, error=fenced)
        if old.sync_waiter is not None:
            old.sync_waiter.result = SyncResult(error=fenced)
        new.assignment = old.assignment
        self.members = {(new.member_id if k == old.member_id else k): (new if k == old.member_id else v)
                        for k, v in self.members.items()}
        self.static_members[new.group_instance_id] = new.member_id
        if self.leader_id == old.member_id:
            self.leader_id = new.member_id
        if old.member_id in self.pending_sync:
            self.pending_sync.discard(old.member_id)
            self.pending_sync.add(new.member_id)

    def remove_member(self, member_id: str, now: float, timing: Timing, *, error: LowtideError) -> None:
        """removeMemberAndUpdateGroup: gone (LeaveGroup, expiry); a call it has waiting gets ``error``."""
        member = self.members.pop(member_id, None)
        if member is None:
            return
        if member.join_waiter is not None:
            member.join_waiter.result = JoinResult(member_id=member_id, error=error)
        if member.sync_waiter is not None:
            member.sync_waiter.result = SyncResult(error=error)
        if member.group_instance_id and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        if self.state in (STABLE, COMPLETING_REBALANCE):
            self.maybe_prepare_rebalance(now, timing)
        self.maybe_complete_join(now, timing)

    # -- rebalance -----------------------------------------------------------------------------
    def maybe_prepare_rebalance(self, now: float, timing: Timing) -> None:
        if self.state not in (STABLE, COMPLETING_REBALANCE, EMPTY):
            return
        if self.state == COMPLETING_REBALANCE:  # resetAndPropagateAssignmentError
            for m in self.members.values():
                m.assignment = b""
                if m.sync_waiter is not None:
                    m.sync_waiter.result = SyncResult(error=RebalanceInProgress(
                        f"group {self.group_id!r} is rebalancing again"))
                    m.sync_waiter = None
        timeout = self.rebalance_timeout_s
        if self.state == EMPTY:  # InitialDelayedJoin: wait for more members to arrive
            delay = min(timing.initial_rebalance_delay_s, timeout)
            self.initial_join, self.new_member_added = True, False
            self.initial_remaining_s = max(timeout - timing.initial_rebalance_delay_s, 0.0)
            self.join_deadline = now + delay
        else:
            self.initial_join = False
            self.join_deadline = now + timeout
        self.state = PREPARING_REBALANCE
        self.pending_sync.clear()
        self.sync_deadline = None

    def maybe_complete_join(self, now: float, timing: Timing) -> None:
        """DelayedJoin / InitialDelayedJoin: complete the join phase when due."""
        if self.state != PREPARING_REBALANCE or self.join_deadline is None:
            return
        if self.initial_join:
            if now < self.join_deadline:
                return
            if self.new_member_added and self.initial_remaining_s > 0:  # each new joiner extends the wait
                delay = min(timing.initial_rebalance_delay_s, self.initial_remaining_s)
                self.initial_remaining_s -= delay
                self.new_member_added = False
                self.join_deadline = now + delay
                return
        elif not self.all_members_joined() and now < self.join_deadline:
            return
        self._complete_join(now)

    def _complete_join(self, now: float) -> None:
        """onCompleteJoin: drop the dynamic members that did not rejoin, elect a leader among those
        that did, start the next generation and answer every waiting JoinGroup."""
        for member_id in [k for k, m in self.members.items() if m.join_waiter is None and not m.group_instance_id]:
            self.members.pop(member_id)
            if self.leader_id == member_id:
                self.leader_id = None
        joined = [m for m in self.members.values() if m.join_waiter is not None]
        if self.members and not joined:  # only static members left, none rejoined: wait again
            self.initial_join = False
            self.join_deadline = now + self.rebalance_timeout_s
            return
        if self.leader_id is None or self.members[self.leader_id].join_waiter is None:
            self.leader_id = joined[0].member_id if joined else None
        self.generation += 1
        self.initial_join = False
        self.join_deadline = None
        if not self.members:
            self.protocol_name = None
            self.subscribed_topics = None
            self.state = EMPTY
            self.empty_since = now
            return
        self.protocol_name = self.select_protocol()
        self.subscribed_topics = self._compute_subscribed_topics()
        self.state = COMPLETING_REBALANCE
        self.pending_sync = set(self.members)
        self.sync_deadline = now + self.rebalance_timeout_s
        for member in joined:
            assert member.join_waiter is not None
            member.join_waiter.result = self.current_join_result(member)
            member.join_waiter = None
            member.last_heartbeat = now

    def _compute_subscribed_topics(self) -> frozenset[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        topics: set[str] = set()
        try:
            for m in self.members.values():
                topics |= consumer_subscription_topics(m.metadata_for(self.protocol_name))
        except ValueError:
            return None
        return frozenset(topics)

    def complete_sync(self, assignments: dict[str, bytes]) -> None:
        """The leader's SyncGroup: everyone gets its assignment (empty when the leader gave none)
        and the generation is Stable."""
        for member in self.members.values():
            member.assignment = assignments.get(member.member_id, b"")
            if member.sync_waiter is not None:
                member.sync_waiter.result = SyncResult(protocol_type=self.protocol_type or "",
                                                       protocol_name=self.protocol_name or "",
                                                       assignment=member.assignment)
                member.sync_waiter = None
        self.state = STABLE

    # -- time ----------------------------------------------------------------------------------
    def expire(self, now: float, timing: Timing) -> list[str]:
        """Apply what time decides: pending member ids and silent members expire, a join phase or
        a sync wait runs out. Returns the member ids removed (for the log)."""
        gone = [k for k, deadline in self.pending_members.items() if now >= deadline]
        for member_id in gone:
            del self.pending_members[member_id]
        removed = []
        for member in list(self.members.values()):
            waiting = member.join_waiter is not None or member.sync_waiter is not None
            if not waiting and now - member.last_heartbeat > member.session_timeout_s:
                removed.append(member.member_id)
                self.remove_member(member.member_id, now, timing, error=UnknownMemberId(
                    f"member {member.member_id!r} missed its session timeout"))
        if self.state in (COMPLETING_REBALANCE, STABLE) and self.pending_sync and self.sync_deadline is not None \
                and now >= self.sync_deadline:  # DelayedSync: members that never sent SyncGroup
            for member_id in sorted(self.pending_sync):
                removed.append(member_id)
                self.remove_member(member_id, now, timing, error=UnknownMemberId(
                    f"member {member_id!r} did not send SyncGroup within the rebalance timeout"))
            self.maybe_prepare_rebalance(now, timing)
        self.maybe_complete_join(now, timing)
        return removed
