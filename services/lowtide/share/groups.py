"""The share group coordinator (KIP-932) at the front door: ShareGroupHeartbeat and
ShareGroupDescribe, with server-side assignment by the ``simple`` assignor (``share/assignor.py``).
Design: docs/design/kip-932-share-groups.md.

A share group's members hold no partition state (that is at the partition leaders), so there is no
revocation phase as in KIP-848: a change of membership or subscription bumps the group epoch,
recomputes the assignment at once, and every member gets its new assignment and the group epoch
on its next heartbeat.

Heartbeat rules (Kafka's, v1): the member id comes from the client and may not be empty; epoch 0
joins (with its subscribed topic names), -1 leaves, any other epoch must be the member's current
one (FENCED_MEMBER_EPOCH), an unknown member with epoch != 0 is UNKNOWN_MEMBER_ID. READ on the
group to heartbeat, DESCRIBE to describe. A group id already used by a consumer group or a classic
group is GROUP_ID_NOT_FOUND ("not a share group"), as Kafka answers.

Members not heard from for ``session_timeout_ms`` are removed by the timer. The state is in this
process's memory only (this slice): after a restart members are UNKNOWN_MEMBER_ID and rejoin.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lowtide.auth.acl import AclOperation, Authorizer, ResourceType
from lowtide.common.ticker import Ticker
from lowtide.errors import (
    FencedMemberEpoch,
    GroupAuthorizationFailed,
    GroupIdNotFound,
    GroupMaxSizeReached,
    InvalidGroupId,
    InvalidRequest,
    LowtideError,
    NonEmptyGroup,
    TopicAuthorizationFailed,
    UnknownMemberId,
    UnknownTopicOrPartition,
)
from lowtide.messages.consumer_groups import (
    ConsumerGroupDescription,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    ConsumerMemberDescription,
    TopicPartitions,
)
from lowtide.messages.group_configs import SHARE_HEARTBEAT_INTERVAL_MS, SHARE_SESSION_TIMEOUT_MS
from lowtide.share import assignor
from lowtide.share.codec import ShareStateKey

log = logging.getLogger(__name__)

LEAVE_EPOCH = -1
MAX_GROUP_ID_LENGTH = 255
_GROUP_OPERATIONS = (AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE)


@dataclass(frozen=True)
class ShareGroupConfig:
    """Kafka's ``group.share.*`` coordinator settings."""

    session_timeout_ms: int = 45_000    # group.share.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.share.heartbeat.interval.ms
    max_size: int = 200                 # group.share.max.size
    tick_interval_s: float = 0.1


class TopicInfoLike(Protocol):
    topic_id: str
    partitions: int


class Topics(Protocol):
    def topics(self) -> Mapping[str, TopicInfoLike]: ...


@dataclass
class ShareMember:
    """One member of a share group (guarded by ``ShareGroups``' lock)."""

    member_id: str
    member_epoch: int
    subscribed: frozenset[str]
    rack_id: str | None
    client_id: str
    client_host: str
    session_deadline: float
    assigned: frozenset[tuple[str, int]] = frozenset()
    # What the last answer carried (None: never sent); an answer repeats the assignment only when it changed.
    sent: frozenset[tuple[str, int]] | None = None


@dataclass
class ShareGroup:
    """One share group: its epoch, members and the partition counts its assignment was made for
    (guarded by ``ShareGroups``' lock)."""

    group_id: str
    group_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    # The partition counts the assignment was computed for: a topic growing reassigns.
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"


class ShareGroups:
    """The share group coordinator (module doc). ``start`` the timer before use.

    Thread-safety: thread-safe; one lock guards every group (a share heartbeat changes memory only:
    no I/O is done under it).
    """

    def __init__(self, *, topics: Topics, authorizer: Authorizer, config: ShareGroupConfig = ShareGroupConfig(),
                 clock: Callable[[], float] = time.monotonic,
                 other_group: Callable[[str], bool] | None = None,
                 forget_state: Callable[..., None] | None = None,
                 read_state: Callable[[str], Mapping[tuple[str, int], object]] | None = None,
                 reset_state: Callable[[ShareStateKey, int], None] | None = None,
                 group_configs: Callable[[str], Mapping[str, str]] | None = None) -> None:
        self._topics = topics
        # A group's configs (messages.group_configs): share.session.timeout.ms and share.heartbeat.interval.ms
        # override the coordinator's for that group, read at each heartbeat.
        self._group_configs = group_configs or (lambda group_id: {})
        self._authorizer = authorizer
        self.config = config
        self._clock = clock
        # Whether a group id is taken by a consumer or classic group (None: not checked).
        self.other_group = other_group
        # Deletes a deleted group's share-partition state (tombstones in __share_group_state).
        self.forget_state = forget_state
        # Reads a group's share-partition states ((topic id, partition) -> ShareSnapshot) from
        # __share_group_state, for an admin's describe of its start offsets.
        self.read_state = read_state
        # Writes a share-partition's reset state (a new start offset, nothing in flight).
        self.reset_state = reset_state
        self._lock = threading.Lock()
        self._groups: dict[str, ShareGroup] = {}
        self._ticker = Ticker(name="share-groups", interval_s=config.tick_interval_s, tick=self.tick)

    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()

    def is_share_group(self, group_id: str) -> bool:
        with self._lock:
            group = self._groups.get(group_id)
            return group is not None and (bool(group.members) or group.group_epoch > 0)

    def listings(self) -> list[tuple[str, str]]:
        """(group id, state) of every share group."""
        with self._lock:
            return [(g.group_id, g.state) for g in self._groups.values() if g.members or g.group_epoch > 0]

    def delete_if_empty(self, group_id: str) -> bool:
        """DeleteGroups of a share group: False when ``group_id`` is no share group here;
        NON_EMPTY_GROUP while it has members; else its share-partition state is deleted (durably,
        first: a failure leaves the group as it was) and the group forgotten."""
        with self._lock:
            group = self._groups.get(group_id)
            if group is None or not (group.members or group.group_epoch > 0):
                return False
            if group.members:
                raise NonEmptyGroup(f"share group {group_id!r} has {len(group.members)} members")
        if self.forget_state is not None:
            self.forget_state(group_id)
        with self._lock:
            group = self._groups.get(group_id)
            if group is not None and group.members:  # a member joined meanwhile: it keeps the group
                raise NonEmptyGroup(f"share group {group_id!r} has {len(group.members)} members")
            self._groups.pop(group_id, None)
        return True

    def tick(self) -> None:
        """Remove members whose session expired (the timer thread)."""
        now = self._clock()
        with self._lock:
            for group in self._groups.values():
                gone = [m for m, member in group.members.items() if now >= member.session_deadline]
                for member_id in gone:
                    del group.members[member_id]
                if gone:
                    log.info("share group members expired", extra={"fields": {
                        "group": group.group_id, "members": gone}})
                    self._reassign(group)

    # -- heartbeat -----------------------------------------------------------------------------
    def heartbeat(self, *, principal: str, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        self._validate_heartbeat(request)
        self._require_acl(principal, AclOperation.READ, request.group_id)
        if self.other_group is not None and not self.is_share_group(request.group_id) \
                and self.other_group(request.group_id):
            raise GroupIdNotFound(f"group {request.group_id!r} is not a share group")
        now = self._clock()
        own = self._group_configs(request.group_id)
        heartbeat_ms = int(own.get(SHARE_HEARTBEAT_INTERVAL_MS, self.config.heartbeat_interval_ms))
        session_ms = int(own.get(SHARE_SESSION_TIMEOUT_MS, self.config.session_timeout_ms))
        with self._lock:
            group = self._groups.setdefault(request.group_id, ShareGroup(group_id=request.group_id))
            member = group.members.get(request.member_id)
            if request.member_epoch == LEAVE_EPOCH:
                if member is not None:
                    del group.members[request.member_id]
                    self._reassign(group)
                return ConsumerHeartbeatResult(member_id=request.member_id, member_epoch=LEAVE_EPOCH,
                                               heartbeat_interval_ms=heartbeat_ms)
            if member is None:
                if request.member_epoch != 0:
                    raise UnknownMemberId(f"member {request.member_id} is not in share group {request.group_id!r}")
                if len(group.members) >= self.config.max_size:
                    raise GroupMaxSizeReached(f"share group {request.group_id!r} has {len(group.members)} members")
                member = ShareMember(member_id=request.member_id, member_epoch=0,
                                     subscribed=frozenset(request.subscribed_topic_names or ()),
                                     rack_id=request.rack_id, client_id=request.client_id,
                                     client_host=request.client_host, session_deadline=0.0)
                group.members[request.member_id] = member
                changed = True
            else:
                if request.member_epoch not in (0, member.member_epoch):
                    raise FencedMemberEpoch(f"member {request.member_id} of share group {request.group_id!r} "
                                            f"has epoch {member.member_epoch}, not {request.member_epoch}")
                if request.member_epoch == 0:
                    member.sent = None  # it rejoined: it knows nothing
                changed = False
                if request.subscribed_topic_names is not None and \
                        frozenset(request.subscribed_topic_names) != member.subscribed:
                    member.subscribed = frozenset(request.subscribed_topic_names)
                    changed = True
                if request.rack_id is not None:
                    member.rack_id = request.rack_id
            member.session_deadline = now + session_ms / 1000
            counts = self._count_partitions(group)
            if changed or counts != group.counts:
                self._reassign(group, counts)
            member.member_epoch = group.group_epoch
            assignment = None
            if member.sent != member.assigned:
                member.sent = member.assigned
                assignment = self._describe_partitions(member.assigned)
            return ConsumerHeartbeatResult(member_id=member.member_id, member_epoch=member.member_epoch,
                                           heartbeat_interval_ms=heartbeat_ms,
                                           assignment=assignment)

    def _count_partitions(self, group: ShareGroup) -> dict[str, int]:
        wanted = {t for m in group.members.values() for t in m.subscribed}
        return {n: i.partitions for n, i in self._topics.topics().items() if n in wanted}

    def _reassign(self, group: ShareGroup, counts: dict[str, int] | None = None) -> None:
        """A new group epoch and its assignment (caller holds the lock)."""
        group.counts = self._count_partitions(group) if counts is None else counts
        group.group_epoch += 1
        members = list(group.members)
        result = assignor.assign_simple(
            members=members, subscriptions={m: group.members[m].subscribed for m in members},
            partition_counts=group.counts, current={m: group.members[m].assigned for m in members})
        for member_id, parts in result.items():
            group.members[member_id].assigned = parts

    def _describe_partitions(self, assigned: frozenset[tuple[str, int]]) -> tuple[TopicPartitions, ...]:
        infos = self._topics.topics()
        by_topic: dict[str, list[int]] = {}
        for topic, p in assigned:
            by_topic.setdefault(topic, []).append(p)
        return tuple(TopicPartitions(topic_id=infos[t].topic_id, topic=t, partitions=tuple(sorted(ps)))
                     for t, ps in sorted(by_topic.items()) if t in infos)

    # -- describe ------------------------------------------------------------------------------
    def describe(self, *, principal: str, group_ids: Sequence[str],
                 include_authorized_operations: bool = False) -> list[ConsumerGroupDescription]:
        out = []
        for group_id in group_ids:
            if not self._authorizer.authorize(principal=principal, operation=AclOperation.DESCRIBE,
                                              resource_type=ResourceType.GROUP, resource_name=group_id):
                out.append(ConsumerGroupDescription(group_id=group_id, error=GroupAuthorizationFailed(
                    f"{principal} is not authorized to DESCRIBE on GROUP {group_id!r}")))
                continue
            with self._lock:
                group = self._groups.get(group_id)
                if group is None or not (group.members or group.group_epoch > 0):
                    out.append(ConsumerGroupDescription(group_id=group_id, error=GroupIdNotFound(
                        f"share group {group_id!r} does not exist")))
                    continue
                members = tuple(ConsumerMemberDescription(
                    member_id=m.member_id, instance_id=None, rack_id=m.rack_id, member_epoch=m.member_epoch,
                    client_id=m.client_id, client_host=m.client_host,
                    subscribed_topic_names=tuple(sorted(m.subscribed)), subscribed_topic_regex=None,
                    assignment=self._describe_partitions(m.assigned),
                    target_assignment=self._describe_partitions(m.assigned))
                    for m in group.members.values())
                out.append(ConsumerGroupDescription(
                    group_id=group_id, state=group.state, group_epoch=group.group_epoch,
                    assignment_epoch=group.group_epoch, assignor_name=assignor.NAME, members=members,
                    authorized_operations=self._authorizer.authorized_operations(
                        principal=principal, resource_type=ResourceType.GROUP, resource_name=group_id,
                        operations=_GROUP_OPERATIONS)
                    if include_authorized_operations else -(2**31)))
        return out

    def start_offsets(self, *, principal: str, group_id: str) -> list[tuple[str, int, object]]:
        """(topic name, partition, ShareSnapshot) of every share-partition the group has durable
        state for, read from ``__share_group_state`` (DESCRIBE on the group; the topics the
        principal may not DESCRIBE are left out). Empty when no state reader is wired."""
        self._require_acl(principal, AclOperation.DESCRIBE, group_id)
        if self.read_state is None:
            return []
        names = {info.topic_id: name for name, info in self._topics.topics().items()}
        out = []
        for (topic_id, partition), snapshot in self.read_state(group_id).items():
            name = names.get(topic_id)
            if name is not None and self._authorizer.authorize(principal=principal, operation=AclOperation.DESCRIBE,
                                                               resource_type=ResourceType.TOPIC, resource_name=name):
                out.append((name, partition, snapshot))
        return sorted(out, key=lambda x: (x[0], x[1]))

    def reset_start_offsets(self, *, principal: str, group_id: str,
                            targets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], LowtideError | None]:
        """Kafka's AlterShareGroupOffsets: each (topic, partition)'s new start offset, written to
        ``__share_group_state``; only while the group has no members (else NON_EMPTY_GROUP for the
        whole call). READ on the group; per partition READ on the topic, a partition that exists
        and an offset >= 0."""
        self._require_acl(principal, AclOperation.READ, group_id)
        self._require_empty(group_id, "its offsets can be reset")
        if self.reset_state is None:
            raise InvalidRequest("this coordinator cannot write share group state")
        infos = self._topics.topics()
        out: dict[tuple[str, int], LowtideError | None] = {}
        for (topic, partition), offset in targets.items():
            info = infos.get(topic)
            error: LowtideError | None = None
            if info is None or not 0 <= partition < info.partitions:
                error = UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
            elif not self._authorizer.authorize(principal=principal, operation=AclOperation.READ,
                                                resource_type=ResourceType.TOPIC, resource_name=topic):
                error = TopicAuthorizationFailed(f"{principal} is not authorized to READ on TOPIC {topic!r}")
            elif offset < 0:
                error = InvalidRequest(f"start offset {offset} of {topic}-{partition} is negative")
            else:
                try:
                    self.reset_state(ShareStateKey(group_id=group_id, topic_id=info.topic_id, partition=partition),
                                     offset)
                except LowtideError as err:
                    error = err
            out[(topic, partition)] = error
        return out

    def delete_start_offsets(self, *, principal: str, group_id: str,
                             topics: Sequence[str]) -> dict[str, LowtideError | None]:
        """Kafka's DeleteShareGroupOffsets: the group's share-partition states of ``topics``
        tombstoned in ``__share_group_state`` (a member that comes back starts those partitions
        afresh, by ``share.auto.offset.reset``); only while the group has no members (else
        NON_EMPTY_GROUP for the whole call). DELETE on the group; per topic READ on it and a topic
        that exists."""
        self._require_acl(principal, AclOperation.DELETE, group_id)
        self._require_empty(group_id, "its offsets can be deleted")
        if self.forget_state is None:
            raise InvalidRequest("this coordinator cannot write share group state")
        infos = self._topics.topics()
        out: dict[str, LowtideError | None] = {}
        for topic in topics:
            info = infos.get(topic)
            error: LowtideError | None = None
            if info is None:
                error = UnknownTopicOrPartition(f"topic {topic!r} does not exist")
            elif not self._authorizer.authorize(principal=principal, operation=AclOperation.READ,
                                                resource_type=ResourceType.TOPIC, resource_name=topic):
                error = TopicAuthorizationFailed(f"{principal} is not authorized to READ on TOPIC {topic!r}")
            else:
                try:
                    self.forget_state(group_id, topic_ids=frozenset({info.topic_id}))
                except LowtideError as err:
                    error = err
            out[topic] = error
        return out

    def _require_empty(self, group_id: str, what: str) -> None:
        with self._lock:
            group = self._groups.get(group_id)
            if group is not None and group.members:
                raise NonEmptyGroup(f"share group {group_id!r} has {len(group.members)} members: {what} only while "
                                    "it is empty")

    # -- checks --------------------------------------------------------------------------------
    def _require_acl(self, principal: str, operation: AclOperation, group_id: str) -> None:
        # GROUP_AUTHORIZATION_FAILED naming the operation and group, worded as every ACL refusal.
        self._authorizer.require(principal=principal, operation=operation, resource_type=ResourceType.GROUP,
                                 resource_name=group_id)

    @staticmethod
    def _validate_heartbeat(request: ConsumerHeartbeat) -> None:
        """Kafka's throwIfShareGroupHeartbeatRequestIsInvalid."""
        if not request.group_id or len(request.group_id) > MAX_GROUP_ID_LENGTH or "\x00" in request.group_id:
            raise InvalidGroupId(f"invalid group id {request.group_id!r}")
        if not request.member_id:
            raise InvalidRequest("MemberId can't be empty.")
        if request.member_epoch < LEAVE_EPOCH:
            raise InvalidRequest(f"MemberEpoch is {request.member_epoch}, must be >= -1.")
        if request.member_epoch == 0 and not request.subscribed_topic_names:
            raise InvalidRequest("SubscribedTopicNames must be set in first request.")
