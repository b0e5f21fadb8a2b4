"""KIP-848 consumer groups at the front door: ConsumerGroupHeartbeat and ConsumerGroupDescribe, the
checks OffsetCommit makes against a consumer group's member epochs, and the consumer groups'
part of ListGroups/DeleteGroups. Design: docs/design/kip-848-consumer-groups.md.

One group's state machine is ``consumer_group.ConsumerGroup``; this module is the coordinator
around it:

* **Where the state lives.** In this process's memory, and in ``__consumer_offsets`` as Kafka
  keeps it (``lowtide.groups.consumer_codec`` draws the records): every change a heartbeat or an
  expiry makes is written as one acks=all batch *before* the answer goes out, so what a member
  was told is on the replicas. A front door that starts (or restarts after kill -9) rebuilds a
  group from those records the first time the group is asked for; members keep their ids,
  epochs and assignments and get a fresh session. A write that fails (the partition's leader
  died) puts the group back as it was and answers COORDINATOR_NOT_AVAILABLE: the member retries
  the same heartbeat.
* **Time.** A timer thread ticks every ``tick_interval_s``: members past their session timeout,
  or still holding partitions they were asked to revoke past their rebalance timeout, are
  removed (a new group epoch; their partitions go to others once reassigned).
* **Online upgrade and downgrade** (Kafka 4's, ``group.consumer.migration.policy``). A heartbeat
  joining a classic group with members converts it (``classic_members.group_from_classic``: the
  classic membership hands the group over) when the policy allows, else GROUP_ID_NOT_FOUND ("not
  a consumer group"); the converted group and the joining member are one batch of records (a
  failed write gives the classic group back). The classic members stay, served through
  JoinGroup/SyncGroup/Heartbeat/LeaveGroup (``classic_join``...: the classic membership routes a
  group it does not hold here first). When the last consumer-protocol member is gone (left,
  expired) and classic members remain, the group's records are tombstoned and the classic
  membership takes it back as a classic group (``classic_members.classic_from_group``).
* **ACLs** (Kafka's): READ on the GROUP to heartbeat, DESCRIBE to describe, DELETE to delete.

Thread-safe: a registry lock (find, load or create a group) and one lock per group; a group's
lock is held across its write, so one group's heartbeats are serialized (as a Kafka coordinator
shard serializes them) while other groups go on. Nobody waits for a group's lock holding the
registry lock (it is released first), so a group's lock may take the registry lock briefly (to drop
a group deleted or downgraded) and the classic membership's locks (hand over, install, release): the
classic membership never calls here holding its own.
"""

from __future__ import annotations

import copy
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
    CoordinatorNotAvailable,
    CorruptMessage,
    GroupIdNotFound,
    IllegalGeneration,
    InvalidRequest,
    LowtideError,
    NonEmptyGroup,
    StaleMemberEpoch,
    UnknownMemberId,
    UnsupportedAssignor,
)
from lowtide.frontdoor.groups import classic_members
from lowtide.frontdoor.groups.assignors import ASSIGNORS
from lowtide.frontdoor.groups.classic_group import CONSUMER_PROTOCOL_TYPE, ClassicGroup, Timing
from lowtide.frontdoor.groups.classic_members import (
    DEFAULT_MIGRATION_POLICY,
    ClassicJoin,
    can_downgrade,
    classic_from_group,
    group_from_classic,
    upgrade_allowed,
)
from lowtide.frontdoor.groups.consumer_group import (
    DEAD,
    RECORD_ORDER,
    STATIC_LEAVE_EPOCH,
    UNREVOKED_PARTITIONS,
    ConsumerGroup,
    ConsumerMember,
    JoinSpec,
    member_due,
    valid_regex,
)
from lowtide.frontdoor.groups.groups import validate_group_id
from lowtide.groups.consumer_codec import (
    CURRENT_MEMBER,
    GROUP_METADATA,
    MEMBER_METADATA,
    TARGET_MEMBER,
    TARGET_METADATA,
    ConsumerKey,
    ConsumerValue,
    CurrentMember,
    GroupMetadata,
    MemberMetadata,
    TargetMember,
    TargetMetadata,
    TopicIdPartitions,
    decode_consumer_value,
)
from lowtide.groups.state import ConsumerRecord
from lowtide.messages.admin import JoinRequest, JoinResult, LeaveOutcome, LeavingMember, SyncResult
from lowtide.messages.consumer_groups import (
    ConsumerGroupDescription,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    ConsumerMemberDescription,
    TopicPartitions,
)

log = logging.getLogger(__name__)

# A group made by a join that was refused (it never had a member) is forgotten after this long:
# long past any call that could still be using it.
_UNBORN_RETENTION_S = 60.0
# Kafka's group resource operations, for ConsumerGroupDescribe's authorized_operations bit field.
_GROUP_OPERATIONS = (AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE,
                     AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS)


@dataclass(frozen=True)
class ConsumerGroupConfig:
    session_timeout_ms: int = 45_000    # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    max_size: int = 2**31 - 1           # group.consumer.max.size
    migration_policy: str = DEFAULT_MIGRATION_POLICY  # group.consumer.migration.policy
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors (the first is the default)
    tick_interval_s: float = 0.1


class RecordLog(Protocol):
    """Where the groups' records go and come back from (``offsets_topic.OffsetsTopic``)."""

    def write_consumer(self, group: str, records: Sequence[tuple[ConsumerKey, ConsumerValue | None]]) -> None: ...

    def consumer_records(self, group: str | None = None) -> list[ConsumerRecord]: ...


class TopicInfoLike(Protocol):
    topic_id: str
    partitions: int


class Topics(Protocol):
    def topics(self) -> Mapping[str, TopicInfoLike]: ...


class ClassicGroups(Protocol):
    """What this module asks the classic membership (``membership.GroupMembership``)."""

    timing: Timing
    max_group_size: int

    def has_members(self, group_id: str) -> bool: ...

    def attach_consumer_groups(self, consumer: object) -> None: ...

    def hand_over(self, group_id: str) -> ClassicGroup | None: ...

    def take_back(self, group: ClassicGroup) -> None: ...

    def install(self, group: ClassicGroup) -> None: ...

    def release(self, group_id: str) -> None: ...


class _Entry:
    __slots__ = ("created", "group", "lock")

    def __init__(self, group: ConsumerGroup, created: float) -> None:
        self.group = group
        self.lock = threading.Lock()
        self.created = created


def _partitions(assignment: Mapping[str, frozenset[int]], ids: Mapping[str, str]) -> TopicIdPartitions:
    return tuple((ids[t], tuple(sorted(ps))) for t, ps in sorted(assignment.items()) if t in ids and ps)


def _by_name(items: TopicIdPartitions, names: Mapping[str, str]) -> dict[str, frozenset[int]]:
    return {names[t]: frozenset(ps) for t, ps in items if t in names and ps}


class ConsumerGroups:
    """The KIP-848 consumer group coordinator (module doc). ``start`` the timer before use."""

    def __init__(self, *, log_: RecordLog, topics: Topics, authorizer: Authorizer,
                 config: ConsumerGroupConfig = ConsumerGroupConfig(), clock: Callable[[], float] = time.monotonic,
                 classic: ClassicGroups | None = None) -> None:
        self._log = log_
        self._topics = topics
        self._authorizer = authorizer
        self.config = config
        self._clock = clock
        self.classic = classic
        self._registry = threading.Lock()
        self._groups: dict[str, _Entry] = {}
        self._ticker = Ticker(name="consumer-groups", interval_s=self.config.tick_interval_s, tick=self.tick)
        if classic is not None:  # the classic membership routes classic calls of our groups here
            classic.attach_consumer_groups(self)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()

    def tick(self) -> None:
        """Expire members (the timer thread calls this)."""
        with self._registry:
            entries = list(self._groups.values())
        now = self._clock()
        with self._registry:  # made by a join that was refused a while ago: nothing to keep
            for group_id in [g for g, e in self._groups.items() if not self._exists(e.group)
                             and now - e.created > _UNBORN_RETENTION_S]:
                del self._groups[group_id]
        for entry in entries:
            with entry.lock:
                if not any(member_due(m, now) for m in entry.group.members.values()):
                    continue  # nothing due: no copy, no write
                try:
                    self._change(entry, lambda group: self._expire(group))
                except LowtideError as err:  # retried next tick
                    log.warning("cannot write consumer group %s: %s", entry.group.group_id, err.message)
                    continue
                self._maybe_downgrade(entry)

    def _expire(self, group: ConsumerGroup) -> None:
        gone = group.expire(self._clock())
        if gone:
            log.info("consumer group members expired", extra={"fields": {
                "group": group.group_id, "members": gone, "group_epoch": group.group_epoch}})

    # -- the registry --------------------------------------------------------------------------
    def _ids(self) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
        """(name -> topic id, topic id -> name, name -> partition count) of the cluster's topics."""
        topics = self._topics.topics()
        return ({n: i.topic_id for n, i in topics.items()}, {i.topic_id: n for n, i in topics.items()},
                {n: i.partitions for n, i in topics.items()})

    @contextmanager
    def _locked(self, group_id: str, *, create: bool) -> Iterator[_Entry | None]:
        with self._registry:
            entry = self._groups.get(group_id)
            if entry is None:
                loaded = self._load(group_id)
                if loaded is None and not create:
                    entry = None
                else:
                    entry = self._groups[group_id] = _Entry(loaded or ConsumerGroup(group_id=group_id),
                                                            created=self._clock())
        if entry is None:
            yield None
            return
        with entry.lock:
            yield entry

    def _load(self, group_id: str) -> ConsumerGroup | None:
        """Rebuild a group from its records in ``__consumer_offsets`` (None: it has none)."""
        records = self._log.consumer_records(group_id)
        if not records:
            return None
        _, names, counts = self._ids()
        group = ConsumerGroup(group_id=group_id)
        metadata: dict[str, MemberMetadata] = {}
        current: dict[str, CurrentMember] = {}
        for record in records:
            try:
                value = decode_consumer_value(record.key.type, record.value or b"")
            except CorruptMessage as err:
                log.warning("skipping a consumer group record of %s: %s", group_id, err.message)
                continue
            if isinstance(value, GroupMetadata):
                group.group_epoch = value.epoch
            elif isinstance(value, TargetMetadata):
                group.assignment_epoch = value.assignment_epoch
            elif isinstance(value, MemberMetadata):
                metadata[record.key.member_id] = value
            elif isinstance(value, TargetMember):
                group.target[record.key.member_id] = _by_name(value.partitions, names)
            elif isinstance(value, CurrentMember):
                current[record.key.member_id] = value
        now = self._clock()
        for member_id, meta in metadata.items():
            state = current.get(member_id)
            member = ConsumerMember(
                member_id=member_id, instance_id=meta.instance_id, rack_id=meta.rack_id, client_id=meta.client_id,
                client_host=meta.client_host, subscribed_topics=tuple(sorted(meta.subscribed_topic_names)),
                subscribed_regex=meta.subscribed_topic_regex, rebalance_timeout_ms=meta.rebalance_timeout_ms,
                server_assignor=meta.server_assignor, classic=meta.classic,
                session_deadline=now + (meta.classic.session_timeout_ms if meta.classic is not None
                                        else self.config.session_timeout_ms) / 1000)
            if state is not None:
                member.member_epoch, member.previous_member_epoch = state.member_epoch, state.previous_member_epoch
                member.state = state.state
                member.assigned = _by_name(state.assigned, names)
                member.pending_revocation = _by_name(state.pending_revocation, names)
                # Assignment epochs are not recorded: taken as the member epoch (a commit with an
                # older epoch is then STALE_MEMBER_EPOCH, and the consumer commits again).
                member.assignment_epochs = {(t, p): member.member_epoch for t, ps in member.owns().items()
                                            for p in ps}
                if member.state == UNREVOKED_PARTITIONS:
                    member.revocation_deadline = now + member.rebalance_timeout_ms / 1000
            group.members[member_id] = member
        group.target = {m: a for m, a in group.target.items() if m in group.members}
        # The partition counts the epoch saw are not recorded (Kafka's type-4 record is not
        # written): taken as they are now, so loading alone never starts a rebalance. A topic
        # that grew while nobody coordinated is seen at its next change.
        group.refresh_topics(counts)
        group.dirty.clear()
        group.maybe_compute_target()  # an epoch whose target was never written: computed now
        log.info("consumer group loaded", extra={"fields": {
            "group": group_id, "group_epoch": group.group_epoch, "members": len(group.members)}})
        return group

    def _change(self, entry: _Entry, change: Callable[[ConsumerGroup], object]) -> object:
        """Run ``change`` on the group, then write the records it marked; on any failure the group
        is put back as it was (what was not written was never told to anyone)."""
        group = entry.group
        before = copy.deepcopy(group)
        try:
            result = change(group)
            self._flush(group)
            return result
        except BaseException:
            entry.group = before
            before.dirty.clear()
            raise

    def _flush(self, group: ConsumerGroup) -> None:
        if not group.dirty:
            return
        ids, _, _ = self._ids()
        records: list[tuple[ConsumerKey, ConsumerValue | None]] = []
        for kind, member_id in sorted(group.dirty, key=lambda d: (RECORD_ORDER.index(d[0]), d[1])):
            key = ConsumerKey(type=kind, group=group.group_id, member_id=member_id)
            member = group.members.get(member_id)
            value: ConsumerValue | None = None
            if kind == GROUP_METADATA:
                value = GroupMetadata(epoch=group.group_epoch)
            elif kind == TARGET_METADATA:
                value = TargetMetadata(assignment_epoch=group.assignment_epoch)
            elif member is None:
                value = None  # the member is gone: a tombstone
            elif kind == MEMBER_METADATA:
                value = MemberMetadata(
                    instance_id=member.instance_id, rack_id=member.rack_id, client_id=member.client_id,
                    client_host=member.client_host, subscribed_topic_names=member.subscribed_topics,
                    subscribed_topic_regex=member.subscribed_regex, rebalance_timeout_ms=member.rebalance_timeout_ms,
                    server_assignor=member.server_assignor, classic=member.classic)
            elif kind == TARGET_MEMBER:
                value = TargetMember(partitions=_partitions(group.target.get(member_id, {}), ids))
            elif kind == CURRENT_MEMBER:
                value = CurrentMember(member_epoch=member.member_epoch,
                                      previous_member_epoch=member.previous_member_epoch, state=member.state,
                                      assigned=_partitions(member.assigned, ids),
                                      pending_revocation=_partitions(member.pending_revocation, ids))
            records.append((key, value))
        try:
            self._log.write_consumer(group.group_id, records)
        except LowtideError as err:
            raise CoordinatorNotAvailable(f"cannot write consumer group {group.group_id!r}: {err.name}: "
                                          f"{err.message}") from None
        group.dirty.clear()

    # -- checks --------------------------------------------------------------------------------
    def _require(self, principal: str, operation: AclOperation, group_id: str) -> None:
        # GROUP_AUTHORIZATION_FAILED naming the operation and group, worded as every ACL refusal.
        self._authorizer.require(principal=principal, operation=operation, resource_type=ResourceType.GROUP,
                                 resource_name=group_id)

    def _validate(self, request: ConsumerHeartbeat) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        validate_group_id(request.group_id)
        epoch = request.member_epoch
        if request.version >= 1 and not request.member_id:
            raise InvalidRequest("MemberId can't be empty.")
        if epoch > 0 and not request.member_id:
            raise InvalidRequest("MemberId can't be empty.")
        if epoch < STATIC_LEAVE_EPOCH:
            raise InvalidRequest(f"MemberEpoch {epoch} is invalid.")
        if epoch == STATIC_LEAVE_EPOCH and not request.instance_id:
            raise InvalidRequest("InstanceId can't be null when MemberEpoch is -2.")
        if epoch == 0:
            if request.rebalance_timeout_ms <= 0:
                raise InvalidRequest("RebalanceTimeoutMs must be provided in first request.")
            if request.topic_partitions:
                raise InvalidRequest("TopicPartitions must be empty when (re-)joining.")
            if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
                raise InvalidRequest("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        if request.subscribed_topic_regex and not valid_regex(request.subscribed_topic_regex):
            raise InvalidRequest(f"SubscribedTopicRegex {request.subscribed_topic_regex!r} is not a valid regex.")
        if request.server_assignor and request.server_assignor not in self.config.assignors:
            raise UnsupportedAssignor(f"ServerAssignor {request.server_assignor} is not supported. Supported "
                                      f"assignors: {', '.join(self.config.assignors)}.")

    def _not_classic(self, group_id: str) -> None:
        if self.classic is not None and self.classic.has_members(group_id):
            raise GroupIdNotFound(f"Group {group_id} is not a consumer group.")

    def _take_classic(self, entry: _Entry, request: ConsumerHeartbeat) -> ClassicGroup | None:
        """Kafka's online upgrade (module doc): with the entry's lock held and no member in the
        consumer group yet, convert the classic group with members of this id; None when there is none. The
        caller gives the classic group back (``take_back``) when the change is not written."""
        # An empty consumer group is replaced too (a classic group with members next to it can only
        # come from a race; the id has one type, as in Kafka's group store).
        if self.classic is None or entry.group.members or not self.classic.has_members(request.group_id):
            return None
        if request.member_epoch != 0 or not upgrade_allowed(self.config.migration_policy):
            raise GroupIdNotFound(f"Group {request.group_id} is not a consumer group.")
        classic = self.classic.hand_over(request.group_id)
        if classic is None:  # emptied meanwhile: an ordinary new consumer group
            return None
        try:
            _, _, counts = self._ids()
            entry.group = group_from_classic(classic, topics=counts, now=self._clock(), max_size=self.config.max_size)
        except LowtideError:
            self.classic.take_back(classic)
            raise
        log.info("classic group upgraded to a consumer group", extra={"fields": {
            "group": request.group_id, "generation": classic.generation, "members": len(classic.members)}})
        return classic

    # -- ConsumerGroupHeartbeat ----------------------------------------------------------------
    def heartbeat(self, *, principal: str, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        """Kafka's ConsumerGroupHeartbeat; every refusal is the answer's error."""
        try:
            self._validate(request)
            self._require(principal, AclOperation.READ, request.group_id)
            return self._heartbeat(request)
        except LowtideError as err:
            return ConsumerHeartbeatResult(member_id=request.member_id, member_epoch=request.member_epoch, error=err)

    def _heartbeat(self, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        member_id = request.member_id or str(uuid.uuid4())  # v0: the coordinator names a new member
        with self._locked(request.group_id, create=request.member_epoch == 0) as entry:
            if entry is None:
                self._not_classic(request.group_id)
                raise UnknownMemberId(f"group {request.group_id!r} has no member {member_id!r}")
            if request.member_epoch < 0:
                epoch = self._change(entry, lambda g: g.leave(member_id, epoch=request.member_epoch,
                                                               instance_id=request.instance_id))
                log.info("consumer group member left", extra={"fields": {
                    "group": request.group_id, "member": member_id, "epoch": epoch}})
                self._maybe_downgrade(entry)
                return ConsumerHeartbeatResult(member_id=member_id, member_epoch=int(epoch))  # type: ignore[arg-type]
            empty = entry.group
            taken = self._take_classic(entry, request)
            ids, names, counts = self._ids()
            owned = None if request.topic_partitions is None else {
                names[tp.topic_id]: frozenset(tp.partitions) for tp in request.topic_partitions
                if tp.topic_id in names and tp.partitions}
            spec = JoinSpec(member_id=member_id, member_epoch=request.member_epoch, instance_id=request.instance_id,
                            rack_id=request.rack_id, client_id=request.client_id, client_host=request.client_host,
                            rebalance_timeout_ms=request.rebalance_timeout_ms,
                            subscribed_topics=request.subscribed_topic_names,
                            subscribed_regex=request.subscribed_topic_regex, server_assignor=request.server_assignor,
                            owned=owned)
            epoch_before = entry.group.group_epoch
            try:
                member, send = self._change(entry, lambda g: g.join_or_heartbeat(  # type: ignore[misc]
                    spec, now=self._clock(), session_timeout_s=self.config.session_timeout_ms / 1000,
                    max_size=self.config.max_size, topics=counts))
            except BaseException:
                if taken is not None:  # the conversion was not written: the group stays classic
                    entry.group = empty
                    assert self.classic is not None
                    self.classic.take_back(taken)
                raise
            group = entry.group
            if group.group_epoch != epoch_before or send:
                log.info("consumer group heartbeat", extra={"fields": {
                    "group": group.group_id, "member": member.member_id, "group_epoch": group.group_epoch,
                    "member_epoch": member.member_epoch, "state": group.state(),
                    "assigned": {t: sorted(ps) for t, ps in member.assigned.items()},
                    "revoking": {t: sorted(ps) for t, ps in member.pending_revocation.items()}}})
            assignment = tuple(TopicPartitions(topic_id=ids[t], partitions=tuple(sorted(ps)), topic=t)
                               for t, ps in sorted(member.assigned.items()) if t in ids) if send else None
            return ConsumerHeartbeatResult(member_id=member.member_id, member_epoch=member.member_epoch,
                                           heartbeat_interval_ms=self.config.heartbeat_interval_ms,
                                           assignment=assignment)

    # -- classic members (classic_members.py); the classic membership routes their calls here ---
    def classic_join(self, *, request: JoinRequest) -> JoinResult | None:
        """A JoinGroup to a consumer group with members; None when the id has none (the classic
        membership serves it: an empty consumer group is deleted first, as Kafka converts it)."""
        with self._locked(request.group_id, create=False) as entry:
            if entry is None or not self._exists(entry.group):
                return None
            if not entry.group.members:
                self._delete_locked(entry)
                return None
            _, _, counts = self._ids()
            spec = ClassicJoin(
                member_id=request.member_id, instance_id=request.group_instance_id or None,
                client_id=request.client_id, client_host=request.client_host,
                session_timeout_ms=request.session_timeout_ms,
                rebalance_timeout_ms=request.rebalance_timeout_ms if request.rebalance_timeout_ms > 0
                else request.session_timeout_ms, protocol_type=request.protocol_type, protocols=request.protocols,
                require_known_member_id=request.require_known_member_id)
            try:
                result = self._change(entry, lambda g: classic_members.join(  # type: ignore[return-value]
                    g, spec, now=self._clock(), max_size=self.config.max_size, topics=counts))
            except LowtideError as err:
                return JoinResult(member_id=request.member_id, error=err)
            assert isinstance(result, JoinResult)
            if result.error is None:
                log.info("classic member joined a consumer group", extra={"fields": {
                    "group": request.group_id, "member": result.member_id, "generation": result.generation_id,
                    "group_epoch": entry.group.group_epoch, "state": entry.group.state()}})
            self._maybe_downgrade(entry)  # a static member replacing the last consumer-protocol one
            return result

    def classic_sync(self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str,
                     protocol_type: str, protocol_name: str) -> SyncResult | None:
        """A SyncGroup of a classic member of a consumer group (None: not a consumer group here)."""
        with self._locked(group_id, create=False) as entry:
            if entry is None or not entry.group.members:
                return None
            try:
                assignment = classic_members.sync(entry.group, member_id=member_id, instance_id=group_instance_id,
                                                  generation_id=generation_id, protocol_type=protocol_type,
                                                  protocol_name=protocol_name, now=self._clock())
            except LowtideError as err:
                return SyncResult(error=err)
            member = entry.group.members[member_id]
            assert member.classic is not None
            return SyncResult(protocol_type=CONSUMER_PROTOCOL_TYPE,
                              protocol_name=member.classic.supported_protocols[0].name, assignment=assignment)

    def classic_heartbeat(self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str) -> bool:
        """A Heartbeat of a classic member of a consumer group: False when not a consumer group
        here; raises its Kafka answer (REBALANCE_IN_PROGRESS: rejoin)."""
        with self._locked(group_id, create=False) as entry:
            if entry is None or not entry.group.members:
                return False
            classic_members.heartbeat(entry.group, member_id=member_id, instance_id=group_instance_id,
                                      generation_id=generation_id, now=self._clock())
            return True

    def classic_leave(self, *, group_id: str, members: Sequence[LeavingMember]) -> list[LeaveOutcome] | None:
        """A LeaveGroup of classic members of a consumer group (None: not a consumer group here);
        one batch of records for all who left."""
        with self._locked(group_id, create=False) as entry:
            if entry is None or not entry.group.members:
                return None

            def leave_all(group: ConsumerGroup) -> list[LeaveOutcome]:
                out = []
                for leaving in members:
                    try:
                        gone = classic_members.leave(group, leaving)
                        error = None
                        log.info("classic member left a consumer group", extra={"fields": {
                            "group": group_id, "member": gone, "reason": leaving.reason}})
                    except LowtideError as err:
                        error = err
                    out.append(LeaveOutcome(member_id=leaving.member_id, group_instance_id=leaving.group_instance_id,
                                            error=error))
                group.maybe_compute_target()
                return out

            try:
                outcomes = self._change(entry, leave_all)
            except LowtideError as err:
                return [LeaveOutcome(member_id=m.member_id, group_instance_id=m.group_instance_id, error=err)
                        for m in members]
            self._maybe_downgrade(entry)
            return outcomes  # type: ignore[return-value]

    def _maybe_downgrade(self, entry: _Entry) -> None:
        """Kafka's online downgrade (module doc), with the entry's lock held, after a change was
        written: tombstone the group's records, then hand its classic members to the classic
        membership as a classic group that rebalances. A failed write leaves a consumer group of
        classic members (still served), tried again after its next change (a classic member
        joining or leaving, a member expiring)."""
        group = entry.group
        if self.classic is None or not can_downgrade(group, policy=self.config.migration_policy,
                                                     max_size=self.classic.max_group_size):
            return
        gid = group.group_id
        records: list[tuple[ConsumerKey, ConsumerValue | None]] = [
            (ConsumerKey(type=kind, group=gid, member_id=m), None)
            for m in sorted(group.members) for kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_MEMBER)]
        records += [(ConsumerKey(type=TARGET_METADATA, group=gid), None), (ConsumerKey(type=GROUP_METADATA, group=gid),
                                                                            None)]
        try:
            self._log.write_consumer(gid, records)
        except LowtideError as err:
            log.warning("cannot downgrade consumer group %s: %s", gid, err.message)
            return
        classic = classic_from_group(group, now=self._clock(), timing=self.classic.timing)
        entry.group = ConsumerGroup(group_id=gid)  # calls waiting on this entry find no group
        with self._registry:
            if self._groups.get(gid) is entry:
                del self._groups[gid]
        self.classic.install(classic)
        log.info("consumer group downgraded to a classic group", extra={"fields": {
            "group": gid, "generation": classic.generation, "members": len(classic.members)}})

    def _delete_locked(self, entry: _Entry) -> None:
        """Tombstone an empty group's records and forget it (entry lock held)."""
        group_id = entry.group.group_id
        try:
            self._log.write_consumer(group_id, [(ConsumerKey(type=TARGET_METADATA, group=group_id), None),
                                                (ConsumerKey(type=GROUP_METADATA, group=group_id), None)])
        except LowtideError as err:
            raise CoordinatorNotAvailable(f"cannot delete consumer group {group_id!r}: {err.message}") from None
        entry.group = ConsumerGroup(group_id=group_id)
        with self._registry:
            if self._groups.get(group_id) is entry:
                del self._groups[group_id]
        if self.classic is not None:
            self.classic.release(group_id)
        log.info("consumer group deleted", extra={"fields": {"group": group_id, "state": DEAD}})

    # -- ConsumerGroupDescribe -----------------------------------------------------------------
    def describe(self, *, principal: str, group_ids: Sequence[str],
                 include_authorized_operations: bool = False) -> list[ConsumerGroupDescription]:
        out = []
        for group_id in group_ids:
            try:
                validate_group_id(group_id)
                self._require(principal, AclOperation.DESCRIBE, group_id)
                self._not_classic(group_id)
                out.append(self._describe(group_id, principal if include_authorized_operations else None))
            except LowtideError as err:
                out.append(ConsumerGroupDescription(group_id=group_id, error=err))
        return out

    def _describe(self, group_id: str, principal: str | None) -> ConsumerGroupDescription:
        with self._locked(group_id, create=False) as entry:
            if entry is None or not self._exists(entry.group):
                raise GroupIdNotFound(f"Group {group_id} not found.")
            group = entry.group
            ids, _, _ = self._ids()

            def parts(assignment: Mapping[str, frozenset[int]]) -> tuple[TopicPartitions, ...]:
                return tuple(TopicPartitions(topic_id=ids[t], partitions=tuple(sorted(ps)), topic=t)
                             for t, ps in sorted(assignment.items()) if t in ids and ps)

            members = tuple(ConsumerMemberDescription(
                member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
                client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=m.subscribed_topics,
                subscribed_topic_regex=m.subscribed_regex, assignment=parts(m.assigned),
                target_assignment=parts(group.target.get(m.member_id, {})), classic=m.classic is not None)
                for m in group.members.values())
            return ConsumerGroupDescription(
                group_id=group_id, state=group.state(), group_epoch=group.group_epoch,
                assignment_epoch=group.assignment_epoch, assignor_name=group.assignor(), members=members,
                authorized_operations=self._authorizer.authorized_operations(
                    principal=principal, resource_type=ResourceType.GROUP, resource_name=group_id,
                    operations=_GROUP_OPERATIONS) if principal else -(2**31))

    # -- what the other group APIs ask ---------------------------------------------------------
    @staticmethod
    def _exists(group: ConsumerGroup) -> bool:
        return bool(group.members) or group.group_epoch > 0

    def is_consumer_group(self, group_id: str) -> bool:
        with self._locked(group_id, create=False) as entry:
            return entry is not None and self._exists(entry.group)

    def validate_commit(self, group_id: str, *, member_id: str, member_epoch: int,
                        partitions: Sequence[tuple[str, int]] = ()) -> None:
        """Kafka's ConsumerGroup.validateOffsetCommit: a commit without member and epoch only
        while the group has no members; else the member must exist and send its current epoch,
        or (KIP-1251) an older one for ``partitions`` it has owned since that epoch: the Java
        consumer's commit can race the heartbeat answer that moved its epoch, and Kafka 4.1's does
        not retry it (STALE_MEMBER_EPOCH otherwise)."""
        with self._locked(group_id, create=False) as entry:
            if entry is None:
                return
            group = entry.group
            if member_epoch < 0 and not member_id:
                if group.members:
                    raise UnknownMemberId(f"consumer group {group_id!r} has members: commit as one of them")
                return
            member = group.members.get(member_id)
            if member is None:
                raise UnknownMemberId(f"member {member_id!r} is not in consumer group {group_id!r}")
            if not group.commit_epoch_ok(member, member_epoch, partitions):
                if member.classic is not None:  # Kafka answers a classic member as a classic group would
                    raise IllegalGeneration(f"member {member_id!r} of {group_id!r} committed with generation "
                                            f"{member_epoch}; its generation is {member.member_epoch}")
                raise StaleMemberEpoch(f"member {member_id!r} of {group_id!r} committed with epoch {member_epoch}; "
                                       f"its epoch is {member.member_epoch}")

    def validate_fetch(self, group_id: str, *, member_id: str | None, member_epoch: int) -> None:
        """Kafka's ConsumerGroup.validateOffsetFetch (OffsetFetch v9): without member id and
        epoch, allowed; else the member must exist (UNKNOWN_MEMBER_ID) and send its current epoch
        (STALE_MEMBER_EPOCH; a classic member: ILLEGAL_GENERATION)."""
        if member_id is None and member_epoch < 0:
            return
        with self._locked(group_id, create=False) as entry:
            member = None if entry is None or member_id is None else entry.group.members.get(member_id)
            if member is None:
                raise UnknownMemberId(f"member {member_id!r} is not in consumer group {group_id!r}")
            if member_epoch != member.member_epoch:
                kind = IllegalGeneration if member.classic is not None else StaleMemberEpoch
                raise kind(f"member {member_id!r} of {group_id!r} fetched offsets with epoch {member_epoch}; its "
                           f"epoch is {member.member_epoch}")

    def subscribed_topics(self, group_id: str) -> frozenset[str]:
        """Topics the group's members subscribe to (OffsetDelete refuses their offsets)."""
        with self._locked(group_id, create=False) as entry:
            return frozenset() if entry is None else entry.group.subscribed_topics()

    def listings(self) -> list[tuple[str, str]]:
        """(group id, state) of every consumer group, loaded ones and those only in the log."""
        with self._registry:
            known = set(self._groups)
        unloaded = {r.key.group for r in self._log.consumer_records()} - known
        for group_id in sorted(unloaded):
            with self._locked(group_id, create=False):
                pass
        with self._registry:
            entries = list(self._groups.values())
        out = []
        for entry in entries:
            with entry.lock:
                if self._exists(entry.group):
                    out.append((entry.group.group_id, entry.group.state()))
        return sorted(out)

    def delete_if_empty(self, group_id: str) -> bool:
        """DeleteGroups' part: NON_EMPTY_GROUP while it has members; otherwise its records are
        tombstoned and it is forgotten. True when there was a consumer group to delete."""
        with self._locked(group_id, create=False) as entry:
            if entry is None or not self._exists(entry.group):
                return False
            if entry.group.members:
                raise NonEmptyGroup(f"consumer group {group_id!r} has {len(entry.group.members)} members")
            self._delete_locked(entry)
        return True


def supported_assignors() -> tuple[str, ...]:
    return tuple(ASSIGNORS)
