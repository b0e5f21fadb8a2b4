"""Consumer-group committed offsets: the domain behind OffsetCommit / OffsetFetch / ListGroups /
DescribeGroups / DeleteGroups.

Offsets live in the internal compacted topic ``__consumer_offsets`` (``offsets_topic.py`` writes
and materializes it; ``lowtide.groups.codec`` draws Kafka's record format). ``GroupStore`` is the
group-shaped view of that topic this module works with: a commit is one acks=all batch of
OffsetCommit records, deleting a group is one batch of tombstones (one per committed key, so the
log cleaner's KIP-534 delete horizon applies to them), and a group exists while it has at least
one committed offset. Offsets once held in Redis are moved into the topic on first start
(``offsets_migration.py``).

Membership (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) is ``membership.GroupMembership``, in the
front door's memory; when one is given, ``GroupCoordinator`` consults it: a commit with a
generation is checked against the group as Kafka's classic coordinator does, a group with members
(or an Empty one still in memory) is listed and described with its state, protocol and members,
is not deleted while it has members (NON_EMPTY_GROUP), and OffsetDelete refuses the topics its
consumers subscribe to (GROUP_SUBSCRIBED_TO_TOPIC, KIP-496).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from lowtide import clock
from lowtide.auth.acl import CLUSTER_RESOURCE_NAME, AclOperation, Authorizer, ResourceType
from lowtide.errors import (
    GroupAuthorizationFailed,
    GroupIdNotFound,
    GroupSubscribedToTopic,
    InvalidGroupId,
    InvalidRequest,
    LowtideError,
    NonEmptyGroup,
    TopicAuthorizationFailed,
    UnknownTopicOrPartition,
    UnstableOffsetCommit,
)
from lowtide.frontdoor.groups.classic_group import CONSUMER_PROTOCOL_TYPE, EMPTY
from lowtide.frontdoor.groups.offsets_topic import OffsetsTopic, OffsetWrite
from lowtide.groups import OffsetKey, OffsetValue
from lowtide.messages.admin import (
    CommittedOffset,
    GroupListing,
    GroupOutcome,
    GroupSnapshot,
    OffsetCommit,
    PartitionOutcome,
)
from lowtide.metadata.store import MetadataStore

if TYPE_CHECKING:
    from lowtide.frontdoor.groups.consumer_membership import ConsumerGroups
    from lowtide.frontdoor.groups.membership import GroupMembership

MAX_GROUP_ID_LENGTH = 255


class GroupStore:
    """Committed offsets per group over ``OffsetsTopic`` (module doc). Thread-safe.

    ``commit`` and ``delete`` return once the leader acknowledged the records (acks=all) and
    raise the write's error otherwise (nothing changed); reads wait for the topic's first load
    (COORDINATOR_LOAD_IN_PROGRESS past ``load_timeout_s``).
    """

    def __init__(self, *, topic: OffsetsTopic) -> None:
        self.topic = topic

    def commit(self, group_id: str, commits: Sequence[OffsetCommit], *, producer: tuple[int, int] | None = None,
               now_ms: int | None = None) -> None:
        """Commit the offsets; with ``producer`` (id, epoch), as records of that producer's
        transaction (pending until its marker)."""
        if not commits:
            return
        now_ms = now_ms if now_ms is not None else clock.now_ms()
        self.topic.write(group_id, [OffsetWrite(key=OffsetKey(group=group_id, topic=c.topic, partition=c.partition),
                                                value=OffsetValue(offset=c.offset, metadata=c.metadata,
                                                                  commit_timestamp=now_ms,
                                                                  leader_epoch=c.leader_epoch))
                                    for c in commits], producer=producer)

    def unstable(self, group_id: str) -> set[tuple[str, int]]:
        """Partitions whose offsets an undecided transaction of the group holds, after reading the
        group's partition up to its high watermark (so what another front door wrote counts)."""
        self.topic.catch_up(group_id)
        return self.topic.pending(group_id)

    def committed(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        return {(e.key.topic, e.key.partition): CommittedOffset(
            topic=e.key.topic, partition=e.key.partition, offset=e.value.offset, metadata=e.value.metadata,
            commit_ms=e.value.commit_timestamp, leader_epoch=e.value.leader_epoch)
            for e in self.topic.entries(group_id)}

    def group_ids(self) -> list[str]:
        return self.topic.group_ids()

    def exists(self, group_id: str) -> bool:
        return bool(self.topic.entries(group_id))

    def delete_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]]) -> None:
        """Tombstone the committed offsets of ``partitions`` (those without one need nothing)."""
        wanted = set(partitions)
        self.topic.write(group_id, [OffsetWrite(key=e.key, value=None) for e in self.topic.entries(group_id)
                                    if (e.key.topic, e.key.partition) in wanted])

    def delete(self, group_id: str) -> bool:
        """Tombstone every committed key of the group; False when it has none (no such group)."""
        entries = self.topic.entries(group_id)
        if not entries:
            return False
        self.topic.write(group_id, [OffsetWrite(key=e.key, value=None) for e in entries])
        return True


def validate_group_id(group_id: str) -> None:
    if not group_id or len(group_id) > MAX_GROUP_ID_LENGTH or "\x00" in group_id:
        raise InvalidGroupId(f"invalid group id {group_id!r}: 1-{MAX_GROUP_ID_LENGTH} characters, no NUL")


class ShareListings(Protocol):
    """The share group coordinator as ListGroups and DeleteGroups ask it (``share.groups.ShareGroups``)."""

    def listings(self) -> list[tuple[str, str]]: ...

    def delete_if_empty(self, group_id: str) -> bool: ...


class GroupCoordinator:
    """OffsetCommit / OffsetFetch / ListGroups / DescribeGroups / DeleteGroups.

    Authorization when enabled (Kafka's rules): commit needs READ on the GROUP and READ on each
    TOPIC; fetch and describe need DESCRIBE on the GROUP; delete needs DELETE on the GROUP; list
    returns only the groups the principal may DESCRIBE (all of them with DESCRIBE on CLUSTER);
    OffsetDelete needs DELETE on the GROUP and READ on each TOPIC (Kafka's KafkaApis rule).
    Thread-safe.
    """

    def __init__(self, *, store: GroupStore, metadata: MetadataStore, authorizer: Authorizer,
                 members: GroupMembership | None = None, consumer: ConsumerGroups | None = None,
                 share: ShareListings | None = None) -> None:
        self._store = store
        self._metadata = metadata
        self._authorizer = authorizer
        self._members = members
        # KIP-932 share groups (share/groups.py): listed by ListGroups with their type.
        self._share = share
        # KIP-848 consumer groups (consumer_membership.py): commits are checked against their
        # member epochs, and they are listed, described and deleted with their own state.
        self._consumer = consumer

    def _is_consumer(self, group_id: str) -> bool:
        return self._consumer is not None and self._consumer.is_consumer_group(group_id)

    def _allowed(self, principal: str, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        return self._authorizer.authorize(principal=principal, operation=operation, resource_type=resource_type,
                                          resource_name=name)

    def _require_group(self, principal: str, operation: AclOperation, group_id: str) -> None:
        if not self._allowed(principal, operation, ResourceType.GROUP, group_id):
            raise GroupAuthorizationFailed(f"{principal} is not authorized to {operation.name} on GROUP {group_id!r}")

    def commit_offsets(self, *, principal: str, group_id: str, commits: Sequence[OffsetCommit],
                       generation_id: int = -1, member_id: str = "", group_instance_id: str = "",
                       txn_producer: tuple[int, int] | None = None) -> list[tuple[OffsetCommit, LowtideError | None]]:
        """Store the valid commits; per-partition errors for the others. A refused group fails all.
        ``generation_id`` < 0 without a member: a standalone commit (only while the group has no
        members); otherwise the membership's answer (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
        FENCED_INSTANCE_ID, REBALANCE_IN_PROGRESS) is every valid partition's error.

        ``txn_producer`` (producer id, epoch): Kafka's TxnOffsetCommit, the commits are records of
        that producer's transaction, decided by its marker. Kafka skips the member check for one
        without generation and member (the pre-KIP-447 ``sendOffsetsToTransaction(offsets, groupId)``),
        whatever members the group has."""
        validate_group_id(group_id)
        self._require_group(principal, AclOperation.READ, group_id)
        group_error: LowtideError | None = None
        unchecked = txn_producer is not None and generation_id < 0 and not member_id
        if not unchecked and self._consumer is not None and self._is_consumer(group_id):
            try:  # OffsetCommit v9+: generation_id is the member epoch
                self._consumer.validate_commit(group_id, member_id=member_id, member_epoch=generation_id,
                                               partitions=[(c.topic, c.partition) for c in commits])
            except LowtideError as err:
                group_error = err
        elif self._members is not None and not unchecked:
            try:
                self._members.validate_commit(group_id, generation_id=generation_id, member_id=member_id,
                                              group_instance_id=group_instance_id)
            except LowtideError as err:
                group_error = err
        partition_counts = self._partition_counts({c.topic for c in commits})
        results: list[tuple[OffsetCommit, LowtideError | None]] = []
        accepted: list[OffsetCommit] = []
        topic_allowed: dict[str, bool] = {}
        for c in commits:
            if c.topic not in topic_allowed:
                topic_allowed[c.topic] = self._allowed(principal, AclOperation.READ, ResourceType.TOPIC, c.topic)
            error: LowtideError | None = None
            if not topic_allowed[c.topic]:
                error = TopicAuthorizationFailed(f"{principal} is not authorized to READ on TOPIC {c.topic!r}")
            elif not 0 <= c.partition < partition_counts.get(c.topic, 0):
                error = UnknownTopicOrPartition(f"partition {c.topic}-{c.partition} does not exist")
            elif c.offset < 0:
                error = InvalidRequest(f"offset {c.offset} for {c.topic}-{c.partition} is negative")
            elif group_error is not None:
                error = group_error
            else:
                accepted.append(c)
            results.append((c, error))
        try:
            self._store.commit(group_id, accepted, producer=txn_producer)
        except LowtideError as err:  # nothing was acknowledged: every accepted commit failed with it
            failed = {id(c) for c in accepted}
            results = [(c, err if id(c) in failed else e) for c, e in results]
        return results

    def fetch_offsets(self, *, principal: str, group_id: str, partitions: Sequence[tuple[str, int]] = (),
                      require_stable: bool = False, member_id: str | None = None,
                      member_epoch: int = -1) -> list[CommittedOffset]:
        """Committed offsets of the named partitions (-1 when none), or all the group has committed.
        ``require_stable`` (KIP-447): a partition an undecided transaction holds offsets of is
        answered with UNSTABLE_OFFSET_COMMIT (retriable) instead. ``member_id``/``member_epoch``
        (OffsetFetch v9, KIP-848): checked against a consumer group's members, the whole fetch
        refused with UNKNOWN_MEMBER_ID or STALE_MEMBER_EPOCH (ILLEGAL_GENERATION for a classic
        member); none (None, -1) is the admin client's fetch, always allowed."""
        validate_group_id(group_id)
        self._require_group(principal, AclOperation.DESCRIBE, group_id)
        if self._consumer is not None and (member_id is not None or member_epoch >= 0) and self._is_consumer(group_id):
            self._consumer.validate_fetch(group_id, member_id=member_id, member_epoch=member_epoch)
        unstable = self._store.unstable(group_id) if require_stable else set()
        committed = self._store.committed(group_id)
        if not partitions:
            partitions = sorted(set(committed) | unstable)
        return [CommittedOffset(topic=t, partition=p, error=UnstableOffsetCommit(
                    f"group {group_id!r} has offsets of an undecided transaction on {t}-{p}; retry"))
                if (t, p) in unstable else committed.get((t, p)) or CommittedOffset(topic=t, partition=p)
                for t, p in partitions]

    def list_groups(self, *, principal: str) -> list[str]:
        return [g.group_id for g in self.list_group_listings(principal=principal)]

    def list_group_listings(self, *, principal: str) -> list[GroupListing]:
        """Groups with committed offsets and groups with members (or Empty ones still in memory),
        by id; the member side gives the protocol type and state."""
        listings = {g: GroupListing(group_id=g) for g in self._store.group_ids()}
        for snap in self._members.snapshots() if self._members is not None else ():
            listings[snap.group_id] = GroupListing(group_id=snap.group_id, protocol_type=snap.protocol_type,
                                                   state=snap.state)
        for group_id, state in self._consumer.listings() if self._consumer is not None else ():
            listings[group_id] = GroupListing(group_id=group_id, protocol_type=CONSUMER_PROTOCOL_TYPE, state=state,
                                              group_type="consumer")
        for group_id, state in self._share.listings() if self._share is not None else ():
            listings[group_id] = GroupListing(group_id=group_id, protocol_type="share", state=state,
                                              group_type="share")
        out = [listings[g] for g in sorted(listings)]
        if self._allowed(principal, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME):
            return out
        return [g for g in out if self._allowed(principal, AclOperation.DESCRIBE, ResourceType.GROUP, g.group_id)]

    def _snapshot(self, group_id: str) -> GroupSnapshot | None:
        return self._members.snapshot(group_id) if self._members is not None else None

    def describe_groups(self, *, principal: str, group_ids: Sequence[str]) -> list[GroupOutcome]:
        def describe(group_id: str) -> GroupOutcome:
            if self._is_consumer(group_id):
                # Kafka's DescribeGroups v0-v5 answers a consumer group Dead, without error
                # (v6 would say GROUP_ID_NOT_FOUND): ConsumerGroupDescribe describes it.
                return GroupOutcome(group_id=group_id, group=GroupSnapshot(
                    group_id=group_id, state="Dead", protocol_type="", protocol="", generation_id=-1, leader="",
                    members=(), subscribed_topics=None))
            snapshot = self._snapshot(group_id)
            committed = self._store.committed(group_id)
            if not committed and snapshot is None:
                raise GroupIdNotFound(f"group {group_id!r} does not exist")
            return GroupOutcome(group_id=group_id, offsets=tuple(committed[k] for k in sorted(committed)),
                                group=snapshot)

        return self._per_group(principal, group_ids, AclOperation.DESCRIBE, describe)

    def delete_groups(self, *, principal: str, group_ids: Sequence[str]) -> list[GroupOutcome]:
        def delete(group_id: str) -> GroupOutcome:
            in_memory = self._members is not None and self._members.delete_if_empty(group_id)  # NON_EMPTY_GROUP
            if self._consumer is not None and self._consumer.delete_if_empty(group_id):
                in_memory = True
            if self._share is not None and self._share.delete_if_empty(group_id):  # NON_EMPTY_GROUP
                in_memory = True
            if not self._store.delete(group_id) and not in_memory:
                raise GroupIdNotFound(f"group {group_id!r} does not exist")
            return GroupOutcome(group_id=group_id)

        return self._per_group(principal, group_ids, AclOperation.DELETE, delete)

    def _per_group(self, principal: str, group_ids: Sequence[str], operation: AclOperation,
                   answer: Callable[[str], GroupOutcome]) -> list[GroupOutcome]:
        """One outcome per group id, in request order: ``answer(group_id)`` once the id is valid and
        ``principal`` may do ``operation`` on the group, else the error (Kafka answers per group)."""
        out = []
        for group_id in group_ids:
            try:
                validate_group_id(group_id)
                self._require_group(principal, operation, group_id)
                out.append(answer(group_id))
            except LowtideError as err:
                out.append(GroupOutcome(group_id=group_id, error=err))
        return out

    def delete_offsets(self, *, principal: str, group_id: str,
                       partitions: Sequence[tuple[str, int]]) -> list[PartitionOutcome]:
        """Kafka's OffsetDelete (KIP-496): tombstone the group's committed offsets of ``partitions``.
        Raises GROUP_ID_NOT_FOUND (no such group), NON_EMPTY_GROUP (members, not a consumer group);
        per partition TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION, or
        GROUP_SUBSCRIBED_TO_TOPIC when the current generation's members subscribe to the topic."""
        validate_group_id(group_id)
        self._require_group(principal, AclOperation.DELETE, group_id)
        snapshot = self._snapshot(group_id)
        if snapshot is None and not self._store.exists(group_id) and not self._is_consumer(group_id):
            raise GroupIdNotFound(f"group {group_id!r} does not exist")
        subscribed: frozenset[str] = frozenset()
        if self._consumer is not None and self._is_consumer(group_id):
            subscribed = self._consumer.subscribed_topics(group_id)
        elif snapshot is not None and snapshot.state != EMPTY:
            if snapshot.protocol_type != CONSUMER_PROTOCOL_TYPE:
                raise NonEmptyGroup(f"group {group_id!r} ({snapshot.protocol_type!r}) has members")
            subscribed = snapshot.subscribed_topics or frozenset()
        partition_counts = self._partition_counts({t for t, _ in partitions})
        topic_allowed: dict[str, bool] = {}
        results: list[PartitionOutcome] = []
        for topic, partition in partitions:
            if topic not in topic_allowed:
                topic_allowed[topic] = self._allowed(principal, AclOperation.READ, ResourceType.TOPIC, topic)
            error: LowtideError | None = None
            if not topic_allowed[topic]:
                error = TopicAuthorizationFailed(f"{principal} is not authorized to READ on TOPIC {topic!r}")
            elif not 0 <= partition < partition_counts.get(topic, 0):
                error = UnknownTopicOrPartition(f"partition {topic}-{partition} does not exist")
            elif topic in subscribed:
                error = GroupSubscribedToTopic(f"group {group_id!r} has members subscribed to {topic!r}")
            results.append(PartitionOutcome(topic=topic, partition=partition, error=error))
        eligible = [(r.topic, r.partition) for r in results if r.error is None]
        try:
            self._store.delete_offsets(group_id, eligible)
        except LowtideError as err:  # nothing was acknowledged
            results = [PartitionOutcome(r.topic, r.partition, err if r.error is None else r.error) for r in results]
        return results

    def _partition_counts(self, topics: set[str]) -> dict[str, int]:
        names = sorted(topics)
        if not names:
            return {}
        topics = self._metadata.topics()
        return {n: topics[n].partitions for n in names if n in topics}
