"""One KIP-848 consumer group: its epochs, members, target assignment and each member's
reconciliation (the data and the transitions; ``consumer_membership.py`` holds the locks, the
timer, the records' writes and the ACLs). Design: docs/design/kip-848-consumer-groups.md.

Modelled on Kafka 4's ``ConsumerGroup`` / ``GroupMetadataManager.consumerGroupHeartbeat`` /
``CurrentAssignmentBuilder``:

* **Group epoch** goes up whenever what the assignment depends on changes: a member joins or
  leaves, a subscription changes, a subscribed topic's partition count changes.
* **Target assignment** (and its epoch) is recomputed by the group's server assignor when the
  group epoch is ahead of it; a member's own **member epoch** reaches the target epoch only
  through reconciliation, on that member's heartbeats.
* **Reconciliation** of one member (``_reconcile``)::

      STABLE --target moved, member owns partitions no longer its--> UNREVOKED_PARTITIONS
         |     (epoch kept; the answer drops them; the member must revoke and say so)
         |                                               | heartbeat whose owned partitions
         |                                               v exclude the revoked ones
         +--target moved, nothing to revoke--> epoch := target epoch; takes the partitions
                                               nobody owns; those another member still
                                               owns or is revoking wait: UNRELEASED_PARTITIONS
                                               until released, then STABLE

  A partition is therefore given to its new owner only once its previous owner acknowledged
  revoking it (or left, or was removed): no partition is ever owned twice.
* **Fencing**: a heartbeat must carry the member's epoch (or its previous one, when the answer
  that moved it was lost and the member owns nothing it should not): else FENCED_MEMBER_EPOCH,
  and the member rejoins with epoch 0, owning nothing.
* **Leaving**: epoch -1 removes the member; a static member (``instance_id``) leaving with -2
  keeps its assignment, untouchable by others, until it rejoins under a new member id (it gets
  the same assignment and epoch back) or its session expires.

Every change marks the records that must be written (``dirty``); the coordinator turns them into
``__consumer_offsets`` records and writes them before answering. Times are monotonic seconds.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lowtide.errors import (
    FencedMemberEpoch,
    GroupMaxSizeReached,
    InvalidRequest,
    UnknownMemberId,
    UnreleasedInstanceId,
)
from lowtide.frontdoor.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, Assignment, MemberSpec
from lowtide.groups.consumer_codec import (
    CURRENT_MEMBER,
    GROUP_METADATA,
    MEMBER_METADATA,
    TARGET_MEMBER,
    TARGET_METADATA,
    ClassicMemberMetadata,
)

# Kafka's MemberState (the int8 of ConsumerGroupCurrentMemberAssignmentValue).
MEMBER_STABLE, UNREVOKED_PARTITIONS, UNRELEASED_PARTITIONS = 0, 1, 2
# Kafka's ConsumerGroup.ConsumerGroupState, as ListGroups and ConsumerGroupDescribe name them.
EMPTY, ASSIGNING, RECONCILING, STABLE, DEAD = "Empty", "Assigning", "Reconciling", "Stable", "Dead"
LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2


def _union(a: Mapping[str, frozenset[int]], b: Mapping[str, frozenset[int]]) -> Assignment:
    return {t: frozenset(a.get(t, frozenset()) | b.get(t, frozenset())) for t in set(a) | set(b)
            if a.get(t) or b.get(t)}


def _minus(a: Mapping[str, frozenset[int]], b: Mapping[str, frozenset[int]]) -> Assignment:
    out = {t: frozenset(ps - b.get(t, frozenset())) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def _intersect(a: Mapping[str, frozenset[int]], b: Mapping[str, frozenset[int]]) -> Assignment:
    out = {t: frozenset(ps & b.get(t, frozenset())) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def _overlaps(a: Mapping[str, frozenset[int]], b: Mapping[str, frozenset[int]]) -> bool:
    return any(ps & b.get(t, frozenset()) for t, ps in a.items())


@dataclass
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topics: tuple[str, ...] = ()
    subscribed_regex: str | None = None
    rebalance_timeout_ms: int = 300_000
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: int = MEMBER_STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    session_deadline: float = 0.0
    revocation_deadline: float | None = None
    # The member epoch at which each partition it owns was given to it (KIP-1251's assignment
    # epochs): a commit carrying an older member epoch is still this member's for a partition it
    # has held since then (its commit raced the heartbeat answer that moved its epoch).
    assignment_epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    # A member using the classic protocol (JoinGroup/SyncGroup/Heartbeat) inside this consumer
    # group: its session timeout and protocols (``classic_members.py``); None for the others.
    classic: ClassicMemberMetadata | None = None
    # Classic members only (Kafka's sync and join timeouts): a member told its new generation
    # must send SyncGroup by ``sync_deadline``; one told REBALANCE_IN_PROGRESS must rejoin by
    # ``join_deadline``; else it is removed.
    sync_deadline: float | None = None
    join_deadline: float | None = None

    def owns(self) -> Assignment:
        """What no other member may be given yet: its partitions and those it is revoking."""
        return _union(self.assigned, self.pending_revocation)


@dataclass(frozen=True)
class JoinSpec:
    """What a heartbeat says of the member (``None``: not sent, unchanged)."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = -1
    subscribed_topics: tuple[str, ...] | None = None
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None


@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    # Partition counts of the subscribed topics as the current group epoch saw them.
    partition_counts: dict[str, int] = field(default_factory=dict)
    # Topic names each subscribed regex matched when the topics were last looked at.
    regex_matches: dict[str, frozenset[str]] = field(default_factory=dict)
    # (record type, member id or "") of records to write; the coordinator drains it.
    dirty: set[tuple[int, str]] = field(default_factory=set)

    # -- queries -------------------------------------------------------------------------------
    @property
    def static_members(self) -> dict[str, str]:
        return {m.instance_id: m.member_id for m in self.members.values() if m.instance_id}

    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ASSIGNING
        if any(m.member_epoch != self.assignment_epoch or m.state != MEMBER_STABLE for m in self.members.values()):
            return RECONCILING
        return STABLE

    def assignor(self) -> str:
        """The assignor most members asked for (Kafka's rule), else the default."""
        votes = Counter(m.server_assignor for m in self.members.values() if m.server_assignor)
        return min(votes, key=lambda name: (-votes[name], name)) if votes else DEFAULT_ASSIGNOR

    def topics_of(self, member: ConsumerMember) -> frozenset[str]:
        """The member's subscription: its topic names and what its regex matches."""
        if not member.subscribed_regex:
            return frozenset(member.subscribed_topics)
        return frozenset(member.subscribed_topics) | self.regex_matches.get(member.subscribed_regex, frozenset())

    def subscribed_topics(self) -> frozenset[str]:
        return frozenset(t for m in self.members.values() for t in self.topics_of(m))

    def owner_of(self) -> dict[tuple[str, int], str]:
        return {(t, p): m.member_id for m in self.members.values() for t, ps in m.owns().items() for p in ps}

    # -- epochs and target ---------------------------------------------------------------------
    def bump_epoch(self) -> None:
        self.group_epoch += 1
        self.dirty.add((GROUP_METADATA, ""))

    def refresh_topics(self, topics: Mapping[str, int]) -> bool:
        """Look at the subscribed topics again; True when one appeared, went, or grew, which needs
        a new group epoch (Kafka's metadata hash).
        A regex subscription matches the topics' names whole (Kafka's RE2/J ``matches``); internal
        topics never match."""
        regexes = {m.subscribed_regex for m in self.members.values() if m.subscribed_regex}
        self.regex_matches = {r: frozenset(t for t in topics if not t.startswith("__") and _full_match(r, t))
                              for r in regexes}
        counts = {t: topics[t] for t in sorted(self.subscribed_topics()) if t in topics}
        if counts == self.partition_counts:
            return False
        self.partition_counts = counts
        return bool(self.members)

    def maybe_compute_target(self) -> None:
        if self.group_epoch <= self.assignment_epoch:
            return
        assign = ASSIGNORS[self.assignor()]
        new = assign(members={m.member_id: MemberSpec(subscribed_topics=self.topics_of(m),
                                                        current=self.target.get(m.member_id, {}))
                              for m in self.members.values()}, partitions=self.partition_counts)
        for member_id, assignment in new.items():
            if self.target.get(member_id) != assignment:
                self.dirty.add((TARGET_MEMBER, member_id))
        self.target = dict(new)
        self.assignment_epoch = self.group_epoch
        self.dirty.add((TARGET_METADATA, ""))

    # -- heartbeats ----------------------------------------------------------------------------
    def join_or_heartbeat(self, spec: JoinSpec, *, now: float, session_timeout_s: float, max_size: int,
                          topics: Mapping[str, int]) -> tuple[ConsumerMember, bool]:
        """One heartbeat of a member at epoch >= 0 (module doc). Returns the member and whether
        its answer must carry the assignment. Raises the Kafka error it is answered with."""
        member, send, created = self._member_for(spec, now=now, max_size=max_size)
        changed = self._update_member(member, spec) or created
        if changed:
            self.dirty.add((MEMBER_METADATA, member.member_id))
        member.session_deadline = now + session_timeout_s
        if self.refresh_topics(topics) or changed:  # one new epoch for whatever changed
            self.bump_epoch()
        self.maybe_compute_target()
        if self.reconcile(member, spec.owned, now=now):
            send = True
        return member, send or spec.owned is not None

    def _member_for(self, spec: JoinSpec, *, now: float, max_size: int) -> tuple[ConsumerMember, bool, bool]:
        """The member the heartbeat is from, whether its answer must carry the assignment, and
        whether it was just created."""
        member = self.members.get(spec.member_id)
        if spec.member_epoch > 0:
            if member is None:
                raise UnknownMemberId(f"member {spec.member_id!r} is not in group {self.group_id!r}")
            if spec.member_epoch != member.member_epoch and not (
                    spec.member_epoch == member.previous_member_epoch and spec.owned is not None
                    and not _minus(spec.owned, member.assigned)):
                raise FencedMemberEpoch(f"member {spec.member_id!r} of group {self.group_id!r} sent epoch "
                                        f"{spec.member_epoch}; its epoch is {member.member_epoch}")
            return member, False, False
        # Epoch 0: a join (or a rejoin after being fenced: the member owns nothing any more).
        if spec.instance_id:
            holder = self.static_members.get(spec.instance_id)
            if holder is not None and holder != spec.member_id:
                old = self.members[holder]
                if old.member_epoch != STATIC_LEAVE_EPOCH:
                    raise UnreleasedInstanceId(f"group.instance.id {spec.instance_id!r} of group {self.group_id!r} "
                                               f"is still held by member {holder!r}")
                return self.replace_static(old, spec.member_id), True, False
        if member is None:
            if len(self.members) >= max_size:
                raise GroupMaxSizeReached(f"group {self.group_id!r} has reached its maximum size {max_size}")
            member = self.members[spec.member_id] = ConsumerMember(member_id=spec.member_id,
                                                                    instance_id=spec.instance_id)
            self.dirty.add((CURRENT_MEMBER, member.member_id))
            return member, True, True
        if member.assigned or member.pending_revocation or member.member_epoch:
            member.assigned, member.pending_revocation, member.assignment_epochs = {}, {}, {}
            member.member_epoch, member.state, member.revocation_deadline = 0, MEMBER_STABLE, None
            self.dirty.add((CURRENT_MEMBER, member.member_id))
        return member, True, False

    def replace_static(self, old: ConsumerMember, new_id: str) -> ConsumerMember:
        """A static member back under a new member id: it takes the old one's place, assignment
        and epoch (its previous epoch, so the epoch it left with does not count)."""
        self._drop(old.member_id)
        new = ConsumerMember(**{**old.__dict__, "member_id": new_id,
                                "assignment_epochs": dict(old.assignment_epochs)})
        new.member_epoch = old.previous_member_epoch if old.member_epoch == STATIC_LEAVE_EPOCH else old.member_epoch
        self.members[new_id] = new
        if old.member_id in self.target:
            self.target[new_id] = self.target.pop(old.member_id)
        for kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_MEMBER):
            self.dirty.add((kind, new_id))
        return new

    @staticmethod
    def _update_member(member: ConsumerMember, spec: JoinSpec) -> bool:
        """Apply what the heartbeat sent; True when the assignment may have to change."""
        changed = False
        topics = None if spec.subscribed_topics is None else tuple(sorted(set(spec.subscribed_topics)))
        if topics is not None and topics != member.subscribed_topics:
            member.subscribed_topics = topics
            changed = True
        if spec.subscribed_regex is not None and spec.subscribed_regex != (member.subscribed_regex or ""):
            member.subscribed_regex = spec.subscribed_regex or None
            changed = True
        if spec.server_assignor is not None and spec.server_assignor != member.server_assignor:
            member.server_assignor = spec.server_assignor
            changed = True
        if spec.rebalance_timeout_ms > 0:
            member.rebalance_timeout_ms = spec.rebalance_timeout_ms
        if spec.rack_id is not None:
            member.rack_id = spec.rack_id
        member.client_id = spec.client_id or member.client_id
        member.client_host = spec.client_host or member.client_host
        return changed

    def reconcile(self, member: ConsumerMember, owned: Assignment | None, *, now: float,
                  owned_is_final: bool = False) -> bool:
        """Move ``member`` toward its target (module doc); True when what it should own changed.
        ``owned_is_final``: ``owned`` is all the member can hold until it is answered (a classic
        member's JoinGroup: it takes partitions only from SyncGroup), so partitions to revoke it does
        not list need no revocation round (Kafka's rule). A consumer-protocol member's heartbeat may
        have left before it applied an assignment already sent: there they are always revoked."""
        before = (member.member_epoch, member.state, member.assigned, member.pending_revocation)
        if member.state == UNREVOKED_PARTITIONS:
            if owned is None or _overlaps(owned, member.pending_revocation):
                return False  # still revoking: the same answer until it says it let them go
            member.pending_revocation, member.state, member.revocation_deadline = {}, MEMBER_STABLE, None
        if member.member_epoch != self.assignment_epoch or member.state == UNRELEASED_PARTITIONS:
            target = self.target.get(member.member_id, {})
            revoke = _minus(member.assigned, target)
            if revoke and (not owned_is_final or owned is None or _overlaps(owned, revoke)):
                member.assigned = _intersect(member.assigned, target)
                member.pending_revocation = revoke
                member.state = UNREVOKED_PARTITIONS
                member.revocation_deadline = now + member.rebalance_timeout_ms / 1000
            else:
                member.assigned = _intersect(member.assigned, target)
                owners = self.owner_of()
                wanted = _minus(target, member.assigned)
                free = {t: frozenset(p for p in ps if owners.get((t, p), member.member_id) == member.member_id)
                        for t, ps in wanted.items()}
                free = {t: ps for t, ps in free.items() if ps}
                member.assigned = _union(member.assigned, free)
                member.state = UNRELEASED_PARTITIONS if free != wanted else MEMBER_STABLE
                if member.member_epoch != self.assignment_epoch:
                    member.previous_member_epoch, member.member_epoch = member.member_epoch, self.assignment_epoch
                for t, ps in free.items():
                    for p in ps:
                        member.assignment_epochs[(t, p)] = member.member_epoch
        owned = member.owns()
        member.assignment_epochs = {k: e for k, e in member.assignment_epochs.items()
                                    if k[1] in owned.get(k[0], frozenset())}
        after = (member.member_epoch, member.state, member.assigned, member.pending_revocation)
        if after != before:
            self.dirty.add((CURRENT_MEMBER, member.member_id))
        return after[2] != before[2] or after[0] != before[0]

    def commit_epoch_ok(self, member: ConsumerMember, epoch: int, partitions: Iterable[tuple[str, int]]) -> bool:
        """Whether a commit with member epoch ``epoch`` is ``member``'s: its current epoch, or an
        older one for partitions it has owned since that epoch (KIP-1251)."""
        if epoch == member.member_epoch:
            return True
        if member.classic is not None:  # a classic member commits with its generation: exactly
            return False
        partitions = list(partitions)
        if epoch > member.member_epoch or epoch <= 0 or not partitions:
            return False
        owned = member.owns()
        return all(p in owned.get(t, frozenset()) and member.assignment_epochs.get((t, p), member.member_epoch) <= epoch
                   for t, p in partitions)

    # -- leaving -------------------------------------------------------------------------------
    def leave(self, member_id: str, *, epoch: int, instance_id: str | None) -> int:
        """A heartbeat with epoch -1 (leave) or -2 (a static member's temporary leave); returns
        the epoch to answer with."""
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberId(f"member {member_id!r} is not in group {self.group_id!r}")
        if epoch == STATIC_LEAVE_EPOCH:
            if not member.instance_id or (instance_id and instance_id != member.instance_id):
                raise InvalidRequest("member epoch -2 is for a static member leaving with its group.instance.id")
            if member.member_epoch != STATIC_LEAVE_EPOCH:
                member.previous_member_epoch, member.member_epoch = member.member_epoch, STATIC_LEAVE_EPOCH
                self.dirty.add((CURRENT_MEMBER, member_id))
            return STATIC_LEAVE_EPOCH
        self.remove(member_id)
        return LEAVE_EPOCH

    def remove(self, member_id: str) -> None:
        """The member is gone (left, expired, did not revoke in time): a new group epoch."""
        if member_id not in self.members:
            return
        self._drop(member_id)
        self.bump_epoch()

    def _drop(self, member_id: str) -> None:
        self.members.pop(member_id, None)
        self.target.pop(member_id, None)
        for kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_MEMBER):
            self.dirty.add((kind, member_id))

    def expire(self, now: float) -> list[str]:
        """Members past their session, or that did not revoke within their rebalance timeout, are
        removed (Kafka fences them); returns their ids."""
        gone = [m.member_id for m in self.members.values() if member_due(m, now)]
        for member_id in gone:
            self.remove(member_id)
        if gone:
            self.maybe_compute_target()
        return gone


def member_due(member: ConsumerMember, now: float) -> bool:
    """Whether time removes the member: its session ran out, it did not revoke within its
    rebalance timeout, or (a classic member) it did not sync or rejoin in time."""
    return any(deadline is not None and now >= deadline for deadline in (
        member.session_deadline, member.revocation_deadline, member.sync_deadline, member.join_deadline))


def _full_match(pattern: str, topic: str) -> bool:
    try:
        return re.fullmatch(pattern, topic) is not None
    except re.error:
        return False


def valid_regex(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


# Record types a change writes, in the order Kafka writes them.
RECORD_ORDER: tuple[int, ...] = (MEMBER_METADATA, GROUP_METADATA, TARGET_MEMBER, TARGET_METADATA, CURRENT_MEMBER)
