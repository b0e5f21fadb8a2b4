"""ACL bindings stored in Redis, shared by every front door and replica.

Redis layout::

    lowtide:acls            SET     one member per binding: canonical JSON (sorted keys, enum
                                    names), e.g. {"operation":"DELETE","pattern_type":"LITERAL",
                                    "permission":"ALLOW","principal":"User:alice",
                                    "resource_name":"orders","resource_type":"TOPIC"}
    lowtide:acls:version    STRING  integer, INCR'd in the same MULTI/EXEC as every change
    lowtide:acls:changed    CHANNEL the new version is PUBLISHed on every change (optional
                                    listeners call Authorizer.invalidate())

Canonical JSON makes a set member the identity of a binding, so adding twice is a no-op and
removal is SREM of exactly the strings that were read.
"""

from __future__ import annotations

import json
from typing import Any

import redis as redis_lib

from lowtide.auth.acl import AclBinding, AclFilter
from lowtide.errors import InvalidRequest

ACLS_KEY = "lowtide:acls"
VERSION_KEY = "lowtide:acls:version"
CHANGED_CHANNEL = "lowtide:acls:changed"

_REMOVE_ATTEMPTS = 50


def encode_binding(binding: AclBinding) -> str:
    """The canonical set member for a binding (stable across processes and versions)."""
    return json.dumps(binding.as_dict(), sort_keys=True, separators=(",", ":"))


def decode_binding(member: bytes | str) -> AclBinding:
    text = member.decode() if isinstance(member, bytes) else member
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"corrupt ACL entry in Redis key {ACLS_KEY!r}: {text!r} ({exc})") from None
    return AclBinding.from_dict(doc)


def _sort_key(b: AclBinding) -> tuple[Any, ...]:
    return (b.resource_type, b.resource_name, b.pattern_type, b.principal, b.operation, b.permission)


class AclStore:
    """CRUD over the ACL set in Redis, plus the version counter caches key off.

    Every change is one MULTI/EXEC that also bumps ``lowtide:acls:version``, so a reader that sees
    a version also sees the matching set. ``remove`` uses WATCH so it returns exactly the bindings
    it deleted even with concurrent writers. Thread-safe as far as the redis client is (redis-py
    clients are, through their connection pool).
    """

    def __init__(self, *, redis: redis_lib.Redis) -> None:
        self._redis = redis

    def add(self, bindings: list[AclBinding] | tuple[AclBinding, ...]) -> None:
        """Store the bindings; ones already present are left as they are (idempotent)."""
        members = sorted({encode_binding(b) for b in bindings})
        if not members:
            return
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(ACLS_KEY, *members)
            pipe.incr(VERSION_KEY)
            added, version = pipe.execute()
        if added:
            self._redis.publish(CHANGED_CHANNEL, str(version))

    def list(self, filter: AclFilter | None = None) -> list[AclBinding]:
        """Bindings matching ``filter`` (all when None), in a stable order."""
        bindings = [decode_binding(m) for m in self._redis.smembers(ACLS_KEY)]
        if filter is not None:
            bindings = [b for b in bindings if filter.matches(b)]
        return sorted(bindings, key=_sort_key)

    def remove(self, filters: list[AclFilter] | tuple[AclFilter, ...]) -> list[AclBinding]:
        """Delete every binding matching any filter; return the deleted ones (stable order)."""
        if not filters:
            return []
        for _ in range(_REMOVE_ATTEMPTS):
            with self._redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(ACLS_KEY)
                    doomed = {
                        m: b
                        for m, b in ((m, decode_binding(m)) for m in pipe.smembers(ACLS_KEY))
                        if any(f.matches(b) for f in filters)
                    }
                    if not doomed:
                        pipe.unwatch()
                        return []
                    pipe.multi()
                    pipe.srem(ACLS_KEY, *doomed)
                    pipe.incr(VERSION_KEY)
                    _, version = pipe.execute()
                except redis_lib.WatchError:
                    continue  # someone changed the set between our read and our write; re-read
            self._redis.publish(CHANGED_CHANNEL, str(version))
            return sorted(doomed.values(), key=_sort_key)
        raise redis_lib.WatchError(f"{ACLS_KEY!r} kept changing; gave up after {_REMOVE_ATTEMPTS} attempts")

    def version(self) -> int:
        """The change counter: differs whenever the ACL set may have changed (0 = never written)."""
        raw = self._redis.get(VERSION_KEY)
        return int(raw) if raw is not None else 0

    def snapshot(self) -> tuple[int, list[AclBinding]]:
        """The version and every binding, read atomically (one MULTI/EXEC)."""
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(VERSION_KEY)
            pipe.smembers(ACLS_KEY)
            raw_version, members = pipe.execute()
        version = int(raw_version) if raw_version is not None else 0
        return version, [decode_binding(m) for m in members]
