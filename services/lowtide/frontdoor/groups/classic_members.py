"""Members using Kafka's classic protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) inside a
KIP-848 consumer group, and the conversions between the two group types: Kafka 4's online upgrade
(a ConsumerGroupHeartbeat joining a classic group of protocol type ``consumer`` converts it) and
downgrade (the last consumer-protocol member leaving a group of classic members converts it back).
Design: docs/design/kip-848-consumer-groups.md#classic-members-and-online-migration.

Pure functions over ``consumer_group.ConsumerGroup`` / ``classic_group.ClassicGroup`` (the caller
holds the group's lock and writes the records marked ``dirty``), modelled on Kafka's
``GroupMetadataManager.classicGroup*ToConsumerGroup``, ``ConsumerGroup.fromClassicGroup`` and
``ClassicGroup.fromConsumerGroup``:

* **JoinGroup** makes or updates the member from its first protocol's ConsumerProtocolSubscription
  (topics, owned partitions, rack), runs the consumer group's step (a new group epoch when the
  subscription changed, the target, the member's reconciliation with the partitions it says it
  owns) and answers at once: generation = the member epoch, protocol = its first protocol, no
  leader (nobody assigns: the coordinator did). The member must SyncGroup within its rebalance
  timeout.
* **SyncGroup** answers the member's current assignment as a ConsumerProtocolAssignment (v0), or
  REBALANCE_IN_PROGRESS when the group epoch moved past the member and it is not revoking.
* **Heartbeat** keeps the session; REBALANCE_IN_PROGRESS (rejoin, within the rebalance timeout)
  when the group epoch is ahead of the member, it must revoke, or partitions it waits for are free.
* **LeaveGroup** removes the member (a new group epoch).
* OffsetCommit of a classic member must carry its member epoch as the generation
  (ILLEGAL_GENERATION otherwise, not STALE_MEMBER_EPOCH).

No state here is shared: not thread-safe, the caller locks.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from kio.schema.consumer_protocol_assignment import v0 as assignment_v0
from kio.schema.consumer_protocol_assignment import v1 as assignment_v1
from kio.schema.consumer_protocol_assignment import v2 as assignment_v2
from kio.schema.consumer_protocol_assignment import v3 as assignment_v3
from kio.schema.consumer_protocol_assignment.v0 import data as assignment_v0_data
from kio.schema.consumer_protocol_subscription import v0 as sub_v0
from kio.schema.consumer_protocol_subscription import v1 as sub_v1
from kio.schema.consumer_protocol_subscription import v2 as sub_v2
from kio.schema.consumer_protocol_subscription import v3 as sub_v3
from kio.serial import entity_reader, entity_writer

from lowtide.errors import (
    FencedInstanceId,
    GroupIdNotFound,
    GroupMaxSizeReached,
    IllegalGeneration,
    InconsistentGroupProtocol,
    MemberIdRequired,
    RebalanceInProgress,
    UnknownMemberId,
)
from lowtide.frontdoor.groups.assignors import Assignment
from lowtide.frontdoor.groups.classic_group import (
    CONSUMER_PROTOCOL_TYPE,
    STABLE,
    ClassicGroup,
    Member,
    Timing,
    checked_member,
)
from lowtide.frontdoor.groups.consumer_group import (
    UNRELEASED_PARTITIONS,
    UNREVOKED_PARTITIONS,
    ConsumerGroup,
    ConsumerMember,
)
from lowtide.groups.consumer_codec import (
    CURRENT_MEMBER,
    GROUP_METADATA,
    MEMBER_METADATA,
    TARGET_MEMBER,
    TARGET_METADATA,
    ClassicMemberMetadata,
    ClassicProtocol,
)
from lowtide.messages.admin import JoinResult, LeavingMember, Protocol

# Kafka's group.consumer.migration.policy values.
MIGRATION_POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")
DEFAULT_MIGRATION_POLICY = "bidirectional"  # Kafka 4's default

_SUBSCRIPTIONS = [(m, entity_reader(m.ConsumerProtocolSubscription)) for m in (sub_v0, sub_v1, sub_v2, sub_v3)]
_ASSIGNMENTS = [entity_reader(m.ConsumerProtocolAssignment)
                for m in (assignment_v0, assignment_v1, assignment_v2, assignment_v3)]
_WRITE_ASSIGNMENT = entity_writer(assignment_v0.ConsumerProtocolAssignment)


def upgrade_allowed(policy: str) -> bool:
    return policy in ("upgrade", "bidirectional")


def downgrade_allowed(policy: str) -> bool:
    return policy in ("downgrade", "bidirectional")


# -- the embedded consumer protocol -------------------------------------------------------------
@dataclass(frozen=True)
class Subscription:
    """A classic member's ConsumerProtocolSubscription: what it subscribes to, owns, its rack."""

    topics: tuple[str, ...]
    owned: Assignment
    rack_id: str | None


def _version(data: bytes, what: str) -> int:
    if len(data) < 2:
        raise ValueError(f"{what} shorter than its version")
    version = int.from_bytes(data[:2], "big", signed=True)
    if version < 0:
        raise ValueError(f"{what} version {version}")
    return version


def decode_subscription(metadata: bytes) -> Subscription:
    """A newer version is read as the newest known one (Kafka's ConsumerProtocol does too).
    ValueError when the bytes are not one."""
    version = _version(metadata, "consumer protocol subscription")
    _, read = _SUBSCRIPTIONS[min(version, len(_SUBSCRIPTIONS) - 1)]
    try:
        entity, _ = read(bytes(metadata), 2)
    except Exception as err:  # kio raises its own buffer errors
        raise ValueError(f"undecodable consumer protocol subscription: {err}") from None
    owned: dict[str, frozenset[int]] = {}
    for tp in getattr(entity, "owned_partitions", ()):
        owned[tp.topic] = owned.get(tp.topic, frozenset()) | frozenset(tp.partitions)
    return Subscription(topics=tuple(sorted(set(entity.topics))), owned={t: ps for t, ps in owned.items() if ps},
                        rack_id=getattr(entity, "rack_id", None))


def decode_assignment(data: bytes) -> Assignment:
    """A ConsumerProtocolAssignment's partitions by topic (none for empty bytes: a member that
    has not synced its generation). ValueError when the bytes are not one."""
    if not data:
        return {}
    version = _version(data, "consumer protocol assignment")
    try:
        entity, _ = _ASSIGNMENTS[min(version, len(_ASSIGNMENTS) - 1)](bytes(data), 2)
    except Exception as err:
        raise ValueError(f"undecodable consumer protocol assignment: {err}") from None
    out: dict[str, frozenset[int]] = {}
    for tp in entity.assigned_partitions:
        out[tp.topic] = out.get(tp.topic, frozenset()) | frozenset(tp.partitions)
    return {t: ps for t, ps in out.items() if ps}


def encode_assignment(assignment: Mapping[str, frozenset[int]]) -> bytes:
    """ConsumerProtocolAssignment v0 (an int16 version, then the message), sorted."""
    entity = assignment_v0.ConsumerProtocolAssignment(assigned_partitions=tuple(
        assignment_v0_data.TopicPartition(topic=t, partitions=tuple(sorted(ps)))  # type: ignore[arg-type]
        for t, ps in sorted(assignment.items()) if ps))
    out = io.BytesIO()
    out.write((0).to_bytes(2, "big"))
    _WRITE_ASSIGNMENT(out, entity)
    return out.getvalue()


# -- classic requests inside a consumer group -----------------------------------------------
@dataclass(frozen=True)
class ClassicJoin:
    """A JoinGroup of a classic member to a consumer group."""

    member_id: str  # "" = a new member
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    require_known_member_id: bool = False


def _check_protocols(group: ConsumerGroup, member_id: str, spec: ClassicJoin) -> None:
    """Kafka's supportsClassicProtocols: type ``consumer``, and one protocol every other classic
    member supports too."""
    names = {p.name for p in spec.protocols}
    if spec.protocol_type != CONSUMER_PROTOCOL_TYPE or not names:
        raise InconsistentGroupProtocol(f"group {group.group_id!r} is a consumer group: a classic member must join "
                                        f"with protocol type {CONSUMER_PROTOCOL_TYPE!r} and a protocol")
    for other in group.members.values():
        if other.classic is not None and other.member_id != member_id:
            names &= {p.name for p in other.classic.supported_protocols}
    if not names:
        raise InconsistentGroupProtocol(f"protocols {[p.name for p in spec.protocols]} are not supported by every "
                                        f"classic member of group {group.group_id!r}")


def join(group: ConsumerGroup, spec: ClassicJoin, *, now: float, max_size: int,
         topics: Mapping[str, int]) -> JoinResult:
    """A classic JoinGroup (module doc). Raises the Kafka error it is answered with;
    MEMBER_ID_REQUIRED is an answer (nothing changes)."""
    unknown = not spec.member_id
    member_id = spec.member_id or f"{spec.instance_id or spec.client_id}-{uuid.uuid4()}"
    _check_protocols(group, member_id, spec)
    holder = group.static_members.get(spec.instance_id) if spec.instance_id else None
    member = group.members.get(member_id)
    if holder is None and member is None and len(group.members) >= max_size:
        raise GroupMaxSizeReached(f"group {group.group_id!r} has reached its maximum size {max_size}")
    if unknown and spec.require_known_member_id and not spec.instance_id:
        return JoinResult(member_id=member_id, error=MemberIdRequired("rejoin with the member id of this answer"))
    try:
        subscription = decode_subscription(spec.protocols[0].metadata)
    except ValueError as err:
        raise InconsistentGroupProtocol(f"group {group.group_id!r}: {err}") from None
    created = False
    if holder is not None and holder != member_id:
        if not unknown:
            raise FencedInstanceId(f"group.instance.id {spec.instance_id!r} of group {group.group_id!r} belongs to "
                                   f"member {holder!r}, not {member_id!r}")
        member = group.replace_static(group.members[holder], member_id)  # takes its assignment and epoch
    elif member is None:
        member = group.members[member_id] = ConsumerMember(member_id=member_id, instance_id=spec.instance_id)
        group.dirty.add((CURRENT_MEMBER, member_id))
        created = True
    elif member.classic is None:
        raise UnknownMemberId(f"member {member_id!r} of group {group.group_id!r} uses the consumer protocol")
    classic = ClassicMemberMetadata(session_timeout_ms=spec.session_timeout_ms, supported_protocols=tuple(
        ClassicProtocol(name=p.name, metadata=p.metadata) for p in spec.protocols))
    subscribed = created or subscription.topics != member.subscribed_topics or member.subscribed_regex is not None
    before = (member.subscribed_topics, member.rack_id, member.rebalance_timeout_ms, member.client_id,
              member.client_host, member.classic, member.instance_id)
    member.subscribed_topics, member.subscribed_regex, member.server_assignor = subscription.topics, None, None
    member.rack_id, member.rebalance_timeout_ms = subscription.rack_id, spec.rebalance_timeout_ms
    member.client_id, member.client_host, member.classic = spec.client_id, spec.client_host, classic
    member.instance_id = spec.instance_id
    if created or before != (member.subscribed_topics, member.rack_id, member.rebalance_timeout_ms, member.client_id,
                             member.client_host, member.classic, member.instance_id):
        group.dirty.add((MEMBER_METADATA, member_id))
    if group.refresh_topics(topics) or subscribed:
        group.bump_epoch()
    group.maybe_compute_target()
    group.reconcile(member, {t: ps for t, ps in subscription.owned.items() if t in topics}, now=now,
                    owned_is_final=True)
    member.session_deadline = now + spec.session_timeout_ms / 1000
    member.sync_deadline = now + spec.rebalance_timeout_ms / 1000
    member.join_deadline = None
    return JoinResult(member_id=member_id, generation_id=member.member_epoch, protocol_type=CONSUMER_PROTOCOL_TYPE,
                      protocol_name=spec.protocols[0].name, leader="", members=())


def _classic_member(group: ConsumerGroup, member_id: str, instance_id: str) -> ConsumerMember:
    """Kafka's validateConsumerGroupMember (the classic group's validateMember) +
    throwIfMemberDoesNotUseClassicProtocol."""
    member = checked_member(group, member_id=member_id, instance_id=instance_id)
    if member.classic is None:
        raise UnknownMemberId(f"member {member_id!r} of group {group.group_id!r} does not use the classic protocol")
    return member


def _check_generation(member: ConsumerMember, generation_id: int) -> None:
    if generation_id != member.member_epoch:
        raise IllegalGeneration(f"generation {generation_id} is not member {member.member_id!r}'s current "
                                f"generation {member.member_epoch}")


def _renew(member: ConsumerMember, now: float) -> None:
    assert member.classic is not None
    member.session_deadline = now + member.classic.session_timeout_ms / 1000


def _rebalance(member: ConsumerMember, now: float, why: str) -> RebalanceInProgress:
    """The member is asked to rejoin, and must within its rebalance timeout (Kafka's join timeout)."""
    if member.join_deadline is None:
        member.join_deadline = now + member.rebalance_timeout_ms / 1000
    return RebalanceInProgress(why)


def sync(group: ConsumerGroup, *, member_id: str, instance_id: str, generation_id: int, protocol_type: str,
         protocol_name: str, now: float) -> bytes:
    """A classic SyncGroup: the member's assignment (module doc). Changes no record."""
    member = _classic_member(group, member_id, instance_id)
    _check_generation(member, generation_id)
    assert member.classic is not None
    if (protocol_type and protocol_type != CONSUMER_PROTOCOL_TYPE) or \
            (protocol_name and protocol_name != member.classic.supported_protocols[0].name):
        joined = member.classic.supported_protocols[0].name
        raise InconsistentGroupProtocol(f"member {member_id!r} joined with {joined!r}, not "
                                        f"{protocol_type!r}/{protocol_name!r}")
    if group.group_epoch > member.member_epoch and member.state != UNREVOKED_PARTITIONS:
        raise _rebalance(member, now, f"group {group.group_id!r} is at epoch {group.group_epoch}; rejoin")
    member.sync_deadline = None
    _renew(member, now)
    return encode_assignment(member.assigned)


def heartbeat(group: ConsumerGroup, *, member_id: str, instance_id: str, generation_id: int, now: float) -> None:
    """A classic Heartbeat (module doc): raises REBALANCE_IN_PROGRESS when the member must rejoin."""
    member = _classic_member(group, member_id, instance_id)
    _check_generation(member, generation_id)
    _renew(member, now)
    if member.member_epoch < group.group_epoch or member.state == UNREVOKED_PARTITIONS or (
            member.state == UNRELEASED_PARTITIONS and not _waits_on_unreleased(group, member)):
        raise _rebalance(member, now, f"group {group.group_id!r} is rebalancing; rejoin")


def _waits_on_unreleased(group: ConsumerGroup, member: ConsumerMember) -> bool:
    """Whether a partition of the member's target it lacks is still held by another member."""
    owners = group.owner_of()
    return any(owners.get((t, p), member.member_id) != member.member_id
               for t, ps in group.target.get(member.member_id, {}).items() for p in ps
               if p not in member.assigned.get(t, frozenset()))


def leave(group: ConsumerGroup, leaving: LeavingMember) -> str:
    """A classic LeaveGroup of one member (by member id, or by instance id alone: an
    administrative removal); returns the member id removed. Raises its Kafka error."""
    if not leaving.member_id:
        holder = group.static_members.get(leaving.group_instance_id) if leaving.group_instance_id else None
        if holder is None:
            raise UnknownMemberId(f"group.instance.id {leaving.group_instance_id!r} is not in group "
                                  f"{group.group_id!r}")
        member_id = holder
    else:
        member_id = _classic_member(group, leaving.member_id, leaving.group_instance_id).member_id
    group.remove(member_id)
    return member_id


# -- conversions -------------------------------------------------------------------------------
def group_from_classic(classic: ClassicGroup, *, topics: Mapping[str, int], now: float,
                       max_size: int) -> ConsumerGroup:
    """Kafka's validateOnlineUpgrade + ConsumerGroup.fromClassicGroup: every classic member
    becomes a classic member of a consumer group at epoch = the generation, Stable, owning (and
    targeted with) the assignment its last SyncGroup gave it. Every record is marked. Raises
    GROUP_ID_NOT_FOUND ("not a consumer group") when the group cannot be converted."""
    group_id = classic.group_id
    if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
        raise GroupIdNotFound(f"Group {group_id} is not a consumer group (protocol type {classic.protocol_type!r}).")
    if len(classic.members) > max_size:
        raise GroupIdNotFound(f"Group {group_id} is not a consumer group: its {len(classic.members)} members exceed "
                              f"the consumer group maximum size {max_size}.")
    if classic.protocol_name is None:
        raise GroupIdNotFound(f"Group {group_id} is not a consumer group yet: its first rebalance is not done.")
    generation = classic.generation
    group = ConsumerGroup(group_id=group_id, group_epoch=generation, assignment_epoch=generation)
    for m in classic.members.values():
        try:
            subscription = decode_subscription(m.metadata_for(classic.protocol_name))
            assigned = {t: ps for t, ps in decode_assignment(m.assignment).items() if t in topics}
        except ValueError as err:
            raise GroupIdNotFound(f"Cannot upgrade classic group {group_id} to consumer group because the embedded "
                                  f"consumer protocol is malformed: {err}") from None
        group.members[m.member_id] = ConsumerMember(
            member_id=m.member_id, instance_id=m.group_instance_id or None, rack_id=subscription.rack_id,
            client_id=m.client_id, client_host=m.client_host, subscribed_topics=subscription.topics,
            rebalance_timeout_ms=round(m.rebalance_timeout_s * 1000), member_epoch=generation,
            previous_member_epoch=generation, assigned=assigned, session_deadline=now + m.session_timeout_s,
            assignment_epochs={(t, p): generation for t, ps in assigned.items() for p in ps},
            classic=ClassicMemberMetadata(session_timeout_ms=round(m.session_timeout_s * 1000),
                                          supported_protocols=tuple(ClassicProtocol(name=p.name, metadata=p.metadata)
                                                                    for p in m.protocols)))
        group.target[m.member_id] = dict(assigned)
        group.dirty.update({(MEMBER_METADATA, m.member_id), (TARGET_MEMBER, m.member_id),
                            (CURRENT_MEMBER, m.member_id)})
    group.dirty.update({(GROUP_METADATA, ""), (TARGET_METADATA, "")})
    group.refresh_topics(topics)  # the counts this epoch sees; the joining member's step bumps it
    return group


def can_downgrade(group: ConsumerGroup, *, policy: str, max_size: int) -> bool:
    """Kafka's validateOnlineDowngrade: members left, all of them classic, the policy allows it,
    and they fit a classic group."""
    return bool(group.members) and all(m.classic is not None for m in group.members.values()) \
        and downgrade_allowed(policy) and len(group.members) <= max_size


def classic_from_group(group: ConsumerGroup, *, now: float, timing: Timing) -> ClassicGroup:
    """Kafka's ClassicGroup.fromConsumerGroup: the classic members as a classic group at
    generation = the group epoch, each with its current assignment, then a rebalance (they rejoin,
    the leader assigns)."""
    classic = ClassicGroup(group_id=group.group_id, created=now, state=STABLE, generation=group.group_epoch,
                           protocol_type=CONSUMER_PROTOCOL_TYPE)
    for m in group.members.values():
        assert m.classic is not None
        classic.members[m.member_id] = Member(
            member_id=m.member_id, group_instance_id=m.instance_id or "", client_id=m.client_id,
            client_host=m.client_host, session_timeout_s=m.classic.session_timeout_ms / 1000,
            rebalance_timeout_s=m.rebalance_timeout_ms / 1000, protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocols=tuple(Protocol(name=p.name, metadata=p.metadata) for p in m.classic.supported_protocols),
            last_heartbeat=now, assignment=encode_assignment(m.assigned))
        if m.instance_id:
            classic.static_members[m.instance_id] = m.member_id
    classic.leader_id = next(iter(classic.members), None)
    classic.protocol_name = classic.select_protocol()
    classic.subscribed_topics = frozenset(t for m in group.members.values() for t in m.subscribed_topics)
    classic.maybe_prepare_rebalance(now, timing)
    return classic
