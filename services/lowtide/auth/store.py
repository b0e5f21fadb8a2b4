"""ACL bindings in the cluster metadata (etcd), shared by every front door and replica.

Layout: the ``acls`` section of lowtide.metadata.sections::

    acls/{sha256 hex of the binding}   one binding: canonical JSON (sorted keys, enum names), e.g.
                                       {"operation":"DELETE","pattern_type":"LITERAL",
                                       "permission":"ALLOW","principal":"User:alice",
                                       "resource_name":"orders","resource_type":"TOPIC"}
    acls/version                       empty; rewritten in the transaction of every change, so its
                                       store revision is the version of the ACL set

Canonical JSON makes the digest the identity of a binding, so adding twice is a no-op and removal
deletes exactly the records that were read (each only if unchanged since, compare-and-set).

Reads come from the process's metadata image (no round trip; they keep answering while etcd is
away). A change is one etcd transaction, acknowledged once etcd committed it; with etcd away it
fails with MetadataStoreUnavailable (retriable REQUEST_TIMED_OUT). ``listen`` calls back after every
change, whoever made it (the Authorizer reloads then instead of polling).
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections.abc import Callable
from typing import Any

from lowtide.auth.acl import AclBinding, AclFilter
from lowtide.errors import InvalidRequest, RequestTimedOut
from lowtide.metadata.sections import Entry, section
from lowtide.metadata.store import MetadataStore

SECTION = "acls"
VERSION_RECORD = "version"

_REMOVE_ATTEMPTS = 50

# The callbacks of every ``AclStore.listen`` of this process, per metadata store: a change made
# through any AclStore on that store calls them before it returns, so the process's authorizers
# never answer from the ACLs before its own change (the watch calls them too, a moment later).
_LOCAL_LISTENERS: weakref.WeakKeyDictionary[MetadataStore, list[Callable[[], None]]] = weakref.WeakKeyDictionary()
_LOCAL_LOCK = threading.Lock()


def encode_binding(binding: AclBinding) -> str:
    """The canonical JSON of a binding (stable across processes and versions)."""
    return json.dumps(binding.as_dict(), sort_keys=True, separators=(",", ":"))


def binding_name(encoded: str) -> str:
    """The record name of a binding's canonical JSON: its SHA-256, hex."""
    return hashlib.sha256(encoded.encode()).hexdigest()


def decode_binding(member: bytes | str) -> AclBinding:
    text = member.decode() if isinstance(member, bytes) else member
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"corrupt ACL record in the metadata store: {text!r} ({exc})") from None
    return AclBinding.from_dict(doc)


def _sort_key(b: AclBinding) -> tuple[Any, ...]:
    return (b.resource_type, b.resource_name, b.pattern_type, b.principal, b.operation, b.permission)


class AclStore:
    """CRUD over the ACL records in the metadata store, plus the version caches key off.

    Every change is one transaction that also rewrites ``acls/version``, so a reader that sees a
    version also sees the matching records once the image applied the change. ``remove`` deletes
    only records unchanged since it read them, so it returns exactly the bindings it deleted even
    with concurrent writers. Thread-safe (the metadata store is).
    """

    def __init__(self, *, metadata: MetadataStore) -> None:
        self._metadata = metadata
        self._section = section(metadata, SECTION)

    def add(self, bindings: list[AclBinding] | tuple[AclBinding, ...]) -> None:
        """Store the bindings; ones already present are left as they are (idempotent)."""
        encoded = {binding_name(e): e for e in {encode_binding(b) for b in bindings}}
        new = {name: text.encode() for name, text in encoded.items() if self._section.get(name) is None}
        if not new:
            return
        self._section.change({**new, VERSION_RECORD: b""})
        self._changed()

    def list(self, filter: AclFilter | None = None) -> list[AclBinding]:
        """Bindings matching ``filter`` (all when None), in a stable order."""
        bindings = [b for _, b in self._records().values()]
        if filter is not None:
            bindings = [b for b in bindings if filter.matches(b)]
        return sorted(bindings, key=_sort_key)

    def remove(self, filters: list[AclFilter] | tuple[AclFilter, ...]) -> list[AclBinding]:
        """Delete every binding matching any filter; return the deleted ones (stable order)."""
        if not filters:
            return []
        self._metadata.sync()  # see the bindings other processes added a moment ago
        for _ in range(_REMOVE_ATTEMPTS):
            doomed = {name: (entry, b) for name, (entry, b) in self._records().items()
                      if any(f.matches(b) for f in filters)}
            if not doomed:
                return []
            changes: dict[str, bytes | None] = {name: None for name in doomed}
            if self._section.change({**changes, VERSION_RECORD: b""},
                                    expect={name: entry for name, (entry, _) in doomed.items()}):
                self._changed()
                return sorted((b for _, b in doomed.values()), key=_sort_key)
            # Someone changed one of them between our read and our write (the image caught up): re-read.
        raise RequestTimedOut(f"the ACLs kept changing; gave up removing after {_REMOVE_ATTEMPTS} attempts")

    def version(self) -> int:
        """Differs whenever the ACL set may have changed, and only grows (0 = never written): the
        store revision of the last change."""
        entry = self._section.get(VERSION_RECORD)
        return entry.revision if entry is not None else 0

    def snapshot(self) -> tuple[int, list[AclBinding]]:
        """The version and every binding. The version is read first: the bindings are at least as
        new as it (a change applied in between shows as a newer version on the next check)."""
        version = self.version()
        return version, [b for _, b in self._records().values()]

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change of the ACLs: on the metadata watch's thread for
        every change (must be quick: set a flag), and before a change made through an AclStore of
        this process on the same metadata store returns."""
        self._section.listen(listener)
        with _LOCAL_LOCK:
            _LOCAL_LISTENERS.setdefault(self._metadata, []).append(listener)

    def _changed(self) -> None:
        with _LOCAL_LOCK:
            listeners = list(_LOCAL_LISTENERS.get(self._metadata, ()))
        for listener in listeners:
            listener()

    def _records(self) -> dict[str, tuple[Entry, AclBinding]]:
        return {name: (entry, decode_binding(entry.value)) for name, entry in self._section.items().items()
                if name != VERSION_RECORD}
