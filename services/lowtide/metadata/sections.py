"""Named sections of the cluster metadata: small records other packages keep in the store, each
under ``{root}{section}/{name}`` in etcd (docs/design/metadata.md#sections).

The sections (``SECTIONS``) are fixed here, so the key layout stays in this package:

    acls/{digest}               one ACL binding (canonical JSON; the name is its SHA-256 hex)
    acls/version                empty, rewritten by every ACL change: its revision is the ACLs' version
    scram/{user}/{mechanism}    one SCRAM credential (salt, iterations, stored and server keys)
    scram/decoy                 the secret unknown users' decoy salts derive from
    tokens/{digest}             a token's SHA-256 hex -> its principal (sessions: under their lease)
    quotas/{entity}             client quota configs
    producer_ids/next           the next block of producer ids (Kafka's AllocateProducerIds)
    transactions/{id}           a transactional id's state
    shards/{k}/...              diskless coordinator shards: lease, epoch, address, standbys
                                (lowtide.coordinator.leadership draws them)
    scanners/{name}             a running orphan scanner's address (lowtide.scanner.server)
    group_configs/{group}       a group's configs (Kafka's GROUP config resource: lowtide.metadata.group_configs)

A ``Section`` reads from the process's metadata image (no round trip; keeps answering while etcd
is away) and writes etcd transactions guarded by the cluster id, like every metadata write: a
change is acknowledged only once etcd committed it, and the writer's own image shows it on return.
Values are bytes; what they mean belongs to the caller (lowtide.auth, lowtide.coordinator...).

Thread-safety: as ``MetadataStore``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.etcd import delete_op, if_missing, if_mod_revision, if_value, put_op
from lowtide.metadata.store import MetadataStore

SECTIONS = frozenset({"acls", "scram", "tokens", "quotas", "producer_ids", "transactions", "shards", "scanners",
                      "group_configs"})


@dataclass(frozen=True)
class Entry:
    """One record: its value, the store revision of its last change (for compare-and-set) and the
    lease it is attached to (0: none, it stays until deleted)."""

    value: bytes
    revision: int
    lease: int = 0


class Section:
    """The records of one section (module doc)."""

    def __init__(self, store: MetadataStore, name: str) -> None:
        if name not in SECTIONS:
            raise ValueError(f"unknown metadata section {name!r} (have: {', '.join(sorted(SECTIONS))})")
        self._store = store
        self.name = name
        self._prefix = store._k(name, "")

    def _key(self, name: str) -> str:
        return self._prefix + name

    # -- reading ----------------------------------------------------------------------------------
    def items(self, prefix: str = "") -> dict[str, Entry]:
        """Every record (whose name starts with ``prefix``), by name."""
        image = self._store._img()
        return {kv.key[len(self._prefix):]: Entry(kv.value, kv.mod_revision, kv.lease)
                for kv in image.under(self._prefix + prefix)}

    def get(self, name: str, *, fresh: bool = False) -> Entry | None:
        """One record; ``fresh`` reads it from etcd (``read``) when the image lacks the name: a
        record another process wrote a moment ago is found even while this image's watch lags
        (on a loaded machine, past any wait worth giving it)."""
        kv = self._store._img().get(self._key(name))
        if kv is None and fresh:
            return self.read(name)
        return Entry(kv.value, kv.mod_revision, kv.lease) if kv is not None else None

    def read(self, name: str) -> Entry | None:
        """One record as etcd holds it now (one linearizable read, no wait on the watch); the
        image's copy when etcd does not answer. For a decision that must not rest on a state older
        than one another process acknowledged, on a machine where the watch may lag seconds."""
        try:
            kv = self._store.client.get(self._key(name))
        except MetadataStoreUnavailable:
            kv = self._store._img().get(self._key(name))
        return Entry(kv.value, kv.mod_revision, kv.lease) if kv is not None else None

    def revision(self) -> int:
        """A number that moves whenever the section may have changed (the image's revision)."""
        return self._store.version()

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change to this section (on the watch thread)."""
        prefix = self._prefix

        def on_keys(keys: list[str]) -> None:
            if any(k.startswith(prefix) for k in keys):
                listener()

        self._store.listen(on_keys)

    # -- writing ----------------------------------------------------------------------------------
    def put(self, name: str, value: bytes, *, expect: Entry | bytes | None | bool = True, lease: int = 0) -> bool:
        """Write one record. ``expect``: True = unconditionally; None = only if absent; an
        ``Entry`` = only if unchanged since it was read; bytes = only if it holds that value.
        False when the condition failed."""
        return self.change({name: value}, expect={} if expect is True else {name: expect}, lease=lease)

    def put_many(self, items: Mapping[str, bytes], *, lease: int = 0) -> None:
        if items:
            self.change(dict(items), lease=lease)

    def delete(self, names: Iterable[str], *, expect: Mapping[str, Entry | bytes] | None = None) -> bool:
        """Delete records (each only if unchanged since read, or holding the value given, when
        ``expect`` names it)."""
        names = list(names)
        if not names:
            return True
        return self.change({n: None for n in names}, expect=dict(expect or {}))

    def change(self, changes: Mapping[str, bytes | None], *,
               expect: Mapping[str, Entry | bytes | None] | None = None, lease: int = 0) -> bool:
        """One transaction: put (bytes) or delete (None) each named record, if every record named
        in ``expect`` is as given (an Entry: unchanged since read; bytes: it holds that value, so
        a missing record fails; None: absent). False when a comparison failed (the caller re-reads
        and decides again)."""
        compare = []
        for name, entry in (expect or {}).items():
            key = self._key(name)
            if entry is None:
                compare.append(if_missing(key))
            elif isinstance(entry, bytes):
                compare.append(if_value(key, entry))
            else:
                compare.append(if_mod_revision(key, entry.revision))
        ops = [delete_op(self._key(n)) if v is None else put_op(self._key(n), v, lease=lease)
               for n, v in changes.items()]
        ok = self._store._commit(compare, ops, what=f"changing {self.name}").succeeded
        if not ok:
            self._store.sync()
        return ok

    # -- leases -----------------------------------------------------------------------------------
    def grant_lease(self, ttl_ms: int, *, timeout_s: float | None = None) -> int:
        """A lease of ``ttl_ms`` (rounded up to whole seconds, at least 2: etcd's granularity and
        its shortest lease): records put under it vanish when it is not kept alive."""
        return self._store.client.grant_lease(max(2, math.ceil(ttl_ms / 1000)), timeout_s=timeout_s)

    def keep_alive(self, lease: int, *, timeout_s: float | None = None) -> bool:
        """Refresh a lease (its full TTL from now); False when it has expired."""
        return self._store.client.keep_alive(lease, timeout_s=timeout_s) > 0

    def revoke_lease(self, lease: int, *, timeout_s: float = 2.0) -> None:
        """End a lease now: etcd deletes every record put under it."""
        self._store.client.revoke_lease(lease, timeout_s=timeout_s)


def section(store: MetadataStore, name: str) -> Section:
    return Section(store, name)
