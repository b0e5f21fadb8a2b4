"""One-time move of committed offsets from their old Redis home into ``__consumer_offsets``.

The old layout (written by front doors before offsets moved to the topic)::

    lowtide:groups                 SET    every group id that has committed offsets
    lowtide:groups:{group}         HASH   "topic\\x00partition" -> JSON {"offset", "metadata", "commit_ms"}

Markers this module keeps (the names cannot clash with ``lowtide:groups:{group}``: no ``:``)::

    lowtide:groups-migrated        STRING JSON {"migrated_ms", "groups", "offsets"}: done, never again
    lowtide:groups-migrating       STRING owner, PX 60 s: one front door migrates at a time

Each group's offsets are written as one acks=all batch with their original commit times; a key
the topic already holds is left alone (a commit made after the move started is newer). The
marker is set only after every group was acknowledged, so a crash midway repeats the move on
the next start, skipping what already landed. The old keys are kept (read-only from then on),
so nothing is lost if the topic were ever lost with them.
"""

from __future__ import annotations

import json
import logging
import uuid

import redis as redis_lib

from lowtide.clock import now_ms
from lowtide.frontdoor.groups.offsets_topic import OffsetsTopic, OffsetWrite
from lowtide.groups import OffsetKey, OffsetValue

log = logging.getLogger(__name__)

LEGACY_GROUPS_KEY = "lowtide:groups"
MIGRATED_KEY = "lowtide:groups-migrated"
MIGRATING_KEY = "lowtide:groups-migrating"
MIGRATION_LEASE_MS = 60_000


def legacy_group_key(group_id: str) -> str:
    return f"lowtide:groups:{group_id}"


def read_legacy_offsets(redis: redis_lib.Redis) -> dict[str, list[tuple[OffsetKey, OffsetValue]]]:
    """Every offset in the old Redis layout, by group."""
    out: dict[str, list[tuple[OffsetKey, OffsetValue]]] = {}
    for raw_group in sorted(redis.smembers(LEGACY_GROUPS_KEY)):
        group = raw_group.decode() if isinstance(raw_group, bytes) else str(raw_group)
        for raw_field, raw in redis.hgetall(legacy_group_key(group)).items():
            text = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
            topic, _, partition = text.rpartition("\x00")
            doc = json.loads(raw)
            out.setdefault(group, []).append((
                OffsetKey(group=group, topic=topic, partition=int(partition)),
                OffsetValue(offset=int(doc["offset"]), metadata=str(doc.get("metadata", "")),
                            commit_timestamp=int(doc.get("commit_ms", -1)))))
    return out


def migrate_legacy_offsets(*, redis: redis_lib.Redis, topic: OffsetsTopic) -> bool:
    """Move the old Redis offsets into the topic once (module doc). Returns True when the move is
    done (now or before), False when it should be tried again later (another front door holds
    the lease); raises when a write failed (the marker is then not set)."""
    if redis.exists(MIGRATED_KEY):
        return True
    owner = uuid.uuid4().hex
    if not redis.set(MIGRATING_KEY, owner, nx=True, px=MIGRATION_LEASE_MS):
        return False
    try:
        legacy = read_legacy_offsets(redis)
        written = 0
        for group, items in legacy.items():
            present = {e.key for e in topic.entries(group)}
            writes = [OffsetWrite(key=k, value=v) for k, v in items if k not in present]
            topic.write(group, writes)
            written += len(writes)
        redis.set(MIGRATED_KEY, json.dumps({"migrated_ms": now_ms(), "groups": len(legacy), "offsets": written}))
        if legacy:
            log.info("moved committed offsets from Redis to __consumer_offsets", extra={"fields": {
                "groups": len(legacy), "offsets": written}})
        return True
    finally:
        if redis.get(MIGRATING_KEY) == owner.encode():
            redis.delete(MIGRATING_KEY)
