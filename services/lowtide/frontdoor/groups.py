"""Consumer-group committed offsets, stored in Redis.

Redis layout::

    lowtide:groups                 SET    every group id that has committed offsets
    lowtide:groups:{group}         HASH   "topic\\x00partition" -> JSON {"offset", "metadata", "commit_ms"}

      lowtide:groups ──► {"etl", "audit"}
      lowtide:groups:etl
        ├─ "orders\\x000" -> {"offset": 10000, "metadata": "", "commit_ms": 1732201500123}
        └─ "orders\\x001" -> {"offset":  5230, "metadata": "", "commit_ms": 1732201500123}

Why Redis and not a ``__consumer_offsets`` topic: the front door is stateless and already reads
the metadata from Redis; a commit is one HSET + SADD in a MULTI, and the KIP-68 retention callers
(broker side and client side) read the minimum committed offset with one HGETALL per group.
A NUL separates topic and partition because topic names cannot contain it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import redis as redis_lib

from lowtide import clock
from lowtide.auth.acl import CLUSTER_RESOURCE_NAME, AclOperation, Authorizer, ResourceType
from lowtide.errors import (
    GroupAuthorizationFailed,
    GroupIdNotFound,
    InvalidGroupId,
    InvalidRequest,
    LowtideError,
    TopicAuthorizationFailed,
    UnknownTopicOrPartition,
)
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import TOPICS, MetadataStore

GROUPS_KEY = "lowtide:groups"
MAX_GROUP_ID_LENGTH = 255


def group_key(group_id: str) -> str:
    return f"lowtide:groups:{group_id}"


def offset_field(topic: str, partition: int) -> str:
    return f"{topic}\x00{partition}"


def parse_offset_field(raw: bytes | str) -> tuple[str, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    topic, _, partition = text.rpartition("\x00")
    return topic, int(partition)


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    topic: str
    partition: int
    offset: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A committed offset (-1 when nothing is committed), or an error for that partition."""

    topic: str
    partition: int
    offset: int = -1
    metadata: str = ""
    commit_ms: int = -1
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    group_id: str
    error: LowtideError | None = None
    offsets: tuple[CommittedOffset, ...] = ()


class GroupStore:
    """Reads and writes committed offsets in the layout of the module doc. Thread-safe."""

    def __init__(self, *, redis: redis_lib.Redis) -> None:
        self._redis = redis

    def commit(self, group_id: str, commits: Sequence[OffsetCommit], *, now_ms: int | None = None) -> None:
        if not commits:
            return
        now_ms = now_ms if now_ms is not None else clock.now_ms()
        mapping = {offset_field(c.topic, c.partition): json.dumps(
            {"offset": c.offset, "metadata": c.metadata, "commit_ms": now_ms}) for c in commits}
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(GROUPS_KEY, group_id)
            pipe.hset(group_key(group_id), mapping=mapping)
            pipe.execute()

    def committed(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        out = {}
        for raw_field, raw in self._redis.hgetall(group_key(group_id)).items():
            topic, partition = parse_offset_field(raw_field)
            doc = json.loads(raw)
            out[(topic, partition)] = CommittedOffset(topic=topic, partition=partition, offset=int(doc["offset"]),
                                                      metadata=doc.get("metadata", ""),
                                                      commit_ms=int(doc.get("commit_ms", -1)))
        return out

    def group_ids(self) -> list[str]:
        return sorted(g.decode() if isinstance(g, bytes) else g for g in self._redis.smembers(GROUPS_KEY))

    def exists(self, group_id: str) -> bool:
        return bool(self._redis.sismember(GROUPS_KEY, group_id))

    def delete(self, group_id: str) -> bool:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(GROUPS_KEY, group_id)
            pipe.delete(group_key(group_id))
            removed, _ = pipe.execute()
        return bool(removed)


def validate_group_id(group_id: str) -> None:
    if not group_id or len(group_id) > MAX_GROUP_ID_LENGTH or "\x00" in group_id:
        raise InvalidGroupId(f"invalid group id {group_id!r}: 1-{MAX_GROUP_ID_LENGTH} characters, no NUL")


class GroupCoordinator:
    """OffsetCommit / OffsetFetch / ListGroups / DescribeGroups / DeleteGroups.

    Authorization when enabled (Kafka's rules): commit needs READ on the GROUP and READ on each
    TOPIC; fetch and describe need DESCRIBE on the GROUP; delete needs DELETE on the GROUP; list
    returns only the groups the principal may DESCRIBE (all of them with DESCRIBE on CLUSTER).
    Thread-safe.
    """

    def __init__(self, *, store: GroupStore, metadata: MetadataStore, authorizer: Authorizer) -> None:
        self._store = store
        self._metadata = metadata
        self._authorizer = authorizer

    def _allowed(self, principal: str, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        return self._authorizer.authorize(principal=principal, operation=operation, resource_type=resource_type,
                                          resource_name=name)

    def _require_group(self, principal: str, operation: AclOperation, group_id: str) -> None:
        if not self._allowed(principal, operation, ResourceType.GROUP, group_id):
            raise GroupAuthorizationFailed(f"{principal} is not authorized to {operation.name} on GROUP {group_id!r}")

    def commit_offsets(self, *, principal: str, group_id: str,
                       commits: Sequence[OffsetCommit]) -> list[tuple[OffsetCommit, LowtideError | None]]:
        """Store the valid commits; per-partition errors for the others. A refused group fails all."""
        validate_group_id(group_id)
        self._require_group(principal, AclOperation.READ, group_id)
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
            else:
                accepted.append(c)
            results.append((c, error))
        self._store.commit(group_id, accepted)
        return results

    def fetch_offsets(self, *, principal: str, group_id: str,
                      partitions: Sequence[tuple[str, int]] = ()) -> list[CommittedOffset]:
        """Committed offsets of the named partitions (-1 when none), or all the group has committed."""
        validate_group_id(group_id)
        self._require_group(principal, AclOperation.DESCRIBE, group_id)
        committed = self._store.committed(group_id)
        if not partitions:
            return [committed[k] for k in sorted(committed)]
        return [committed.get((t, p)) or CommittedOffset(topic=t, partition=p) for t, p in partitions]

    def list_groups(self, *, principal: str) -> list[str]:
        groups = self._store.group_ids()
        if self._allowed(principal, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME):
            return groups
        return [g for g in groups if self._allowed(principal, AclOperation.DESCRIBE, ResourceType.GROUP, g)]

    def describe_groups(self, *, principal: str, group_ids: Sequence[str]) -> list[GroupOutcome]:
        out = []
        for group_id in group_ids:
            try:
                validate_group_id(group_id)
                self._require_group(principal, AclOperation.DESCRIBE, group_id)
                if not self._store.exists(group_id):
                    raise GroupIdNotFound(f"group {group_id!r} does not exist")
                committed = self._store.committed(group_id)
                out.append(GroupOutcome(group_id=group_id, offsets=tuple(committed[k] for k in sorted(committed))))
            except LowtideError as err:
                out.append(GroupOutcome(group_id=group_id, error=err))
        return out

    def delete_groups(self, *, principal: str, group_ids: Sequence[str]) -> list[GroupOutcome]:
        out = []
        for group_id in group_ids:
            try:
                validate_group_id(group_id)
                self._require_group(principal, AclOperation.DELETE, group_id)
                if not self._store.delete(group_id):
                    raise GroupIdNotFound(f"group {group_id!r} does not exist")
                out.append(GroupOutcome(group_id=group_id))
            except LowtideError as err:
                out.append(GroupOutcome(group_id=group_id, error=err))
        return out

    def _partition_counts(self, topics: set[str]) -> dict[str, int]:
        names = sorted(topics)
        if not names:
            return {}
        raw = self._metadata.redis.hmget(TOPICS, names)
        return {n: TopicInfo.from_json(r).partitions for n, r in zip(names, raw, strict=True) if r is not None}
