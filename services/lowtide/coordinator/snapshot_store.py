"""Coordinator shard snapshots in the object store, so a shard started with an empty disk (a new pod,
a lost volume) restores from the newest snapshot plus the metadata log tail.

Key layout (keys relative to the store's URL, as every key is; the orphan scanner lists only ``wal/``)::

    _coordinator/shard-<K>/snapshot-<20-digit offset>-<16 hex>.sqlite   the snapshot: byte for byte the local
                                                                        file (coordinator/snapshots.py)
    _coordinator/shard-<K>/snapshot-<20-digit offset>.json              its manifest, put last: the commit point

    manifest (UTF-8 JSON, one object):
    {"format": 1,                  manifest version; any other is refused
     "shard": K,                   must equal the shard in the key
     "offset": N,                  the applied metadata offset: must equal the key's and the database's
     "object": "<data key>",       the .sqlite object this manifest vouches for (under the same shard prefix)
     "size": <bytes>,              of that object
     "sha256": "<64 hex>",         of that object
     "created_ms": <epoch ms>}     when it was uploaded (for people; nothing reads it)

Upload: the .sqlite object under a fresh random suffix, then the manifest. A ``put`` is atomic on
both backends (objectstore/base.py: the local store writes a dot-named .tmp, fsyncs, renames; S3's
PutObject publishes whole objects only), so no reader sees part of an object; but a crash between
the two puts leaves a data object with no manifest, and only manifests are ever read as snapshots.
The random suffix is there because two processes may snapshot one shard at the same offset (a
deposed leader still running, a standby): each manifest then names its own data object, whichever
manifest is put last wins, and a manifest never vouches for the other process's bytes. The
sha256 is checked on download as well, so a torn, truncated or bit-flipped object (a store that
broke its atomicity, a copy tool) is refused naming its key, never restored.

Restore (``fetch_newer``): the newest manifest above the local newest snapshot; its object is read
in ranges into ``<data-dir>/snapshots/snapshot-<offset>.sqlite.tmp`` (fsynced), checked (size and
sha256 against the manifest, SQLite ``PRAGMA integrity_check``, the tables and columns of this
version's schema or an older one's missing only tables added since, ``applied.metadata_offset``
equal to the offset in the key) and only then renamed
to ``snapshot-<offset>.sqlite`` (directory fsynced), so the local restore path
(``snapshots.restore_snapshot``) takes it like one written here. Only the newest is tried: the metadata
log is deleted up to it (see below), so an older one could not be completed from the log anyway.

Ordering with the log truncation (coordinator/snapshot_publisher.py ``SnapshotPublisher.take``): local snapshot, then
``upload`` returns once the manifest is put (durable in the store), and only then DeleteRecords on
``__diskless_metadata-K`` below offset + 1. A crash or a store outage in between leaves the log
whole, so a lost disk never loses state. ``prune`` then keeps the newest ``keep`` manifests: it
removes older manifests first (the snapshot stops being chosen), then their objects, and data
objects with no manifest below the oldest one kept (a torn upload, the loser of a race); a data
object without a manifest at or above it may be an upload in progress and stays.

Thread-safety: a ``SnapshotStore`` holds no mutable state; every method may be called from any
thread (the shard calls it from its shard thread only). Processes may share a shard's prefix (see
the random suffix above).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from lowtide.clock import now_ms
from lowtide.coordinator.state import SCHEMA, SNAPSHOT_PREFIX, SNAPSHOT_SUFFIX, fsync_path, snapshot_offset
from lowtide.errors import KafkaStorageError
from lowtide.objectstore.base import ObjectInfo, ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

ROOT = "_coordinator"
MANIFEST_FORMAT = 1
MANIFEST_SUFFIX = ".json"
# Ranged reads of a download: bounds the memory a restore holds, whatever the snapshot's size.
DOWNLOAD_CHUNK = 8 << 20
_DATA_NAME = re.compile(r"snapshot-(\d{20})-([0-9a-f]{16})\.sqlite\Z")
_MANIFEST_NAME = re.compile(r"snapshot-(\d{20})\.json\Z")


class SnapshotCorrupt(KafkaStorageError):
    """A stored snapshot failed a check (manifest, size, sha256, SQLite integrity, schema, offset).
    The message names the key. Not retriable: reading the same bytes again cannot succeed; an
    operator removes the bad manifest (the shard then takes the one before, if the log covers it)."""

    retriable = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredSnapshot:
    """One complete snapshot in the store: its offset and manifest key (the manifest says which
    data object, its size and its hash: read by ``manifest``)."""

    shard: int
    offset: int
    manifest_key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    shard: int
    offset: int
    object_key: str
    size: int
    sha256: str
    created_ms: int

    def encode(self) -> bytes:
        return json.dumps({"format": MANIFEST_FORMAT, "shard": self.shard, "offset": self.offset,
                           "object": self.object_key, "size": self.size, "sha256": self.sha256,
                           "created_ms": self.created_ms}, sort_keys=True).encode()


def shard_prefix(shard: int) -> str:
    return f"{ROOT}/shard-{shard}/"


def manifest_key(shard: int, offset: int) -> str:
    return f"{shard_prefix(shard)}snapshot-{offset:020d}{MANIFEST_SUFFIX}"


def local_name(offset: int) -> str:
    """The local snapshot file name of ``offset`` (state.CoordinatorState.snapshot's)."""
    return f"{SNAPSHOT_PREFIX}{offset:020d}{SNAPSHOT_SUFFIX}"


def _schema_columns(db: sqlite3.Connection) -> dict[str, list[str]]:
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                       "AND name != 'sqlite_sequence' ORDER BY name")]
    return {t: [c[1] for c in db.execute(f"PRAGMA table_info({t})")] for t in tables}


def _expected_columns() -> dict[str, list[str]]:
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(SCHEMA)
        return _schema_columns(db)
    finally:
        db.close()


def verify_database(path: Path, *, offset: int, key: str) -> None:
    """SnapshotCorrupt (naming ``key``) unless ``path`` is an intact SQLite database of this
    version's schema (or an older one's, missing only tables added since) whose applied offset is
    ``offset``."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise SnapshotCorrupt(f"snapshot {key}: cannot open it as SQLite: {exc}") from exc
    try:
        problems = [r[0] for r in db.execute("PRAGMA integrity_check(5)")]
        if problems != ["ok"]:
            raise SnapshotCorrupt(f"snapshot {key}: SQLite integrity check failed: {'; '.join(problems)}")
        have, want = _schema_columns(db), _expected_columns()
        # A table this version added is missing from an older version's snapshot: opening it
        # creates the table empty (state.SCHEMA is CREATE ... IF NOT EXISTS), as for an older local
        # state, and that is the state an older log gives. A table or column this version does not
        # know (a newer version's snapshot) or a changed one cannot be read right: refused.
        foreign = sorted(t for t in have if want.get(t) != have[t])
        if foreign or "applied" not in have:
            raise SnapshotCorrupt(f"snapshot {key}: its tables {have} are not this version's {want} "
                                  f"(differing: {foreign or ['applied missing']})")
        row = db.execute("SELECT metadata_offset FROM applied WHERE id = 0").fetchone()
        if row is None or row[0] != offset:
            raise SnapshotCorrupt(f"snapshot {key}: its applied offset is {row and row[0]}, its name says {offset}")
    except sqlite3.DatabaseError as exc:  # "file is not a database", a malformed page
        raise SnapshotCorrupt(f"snapshot {key}: not a readable SQLite database: {exc}") from exc
    finally:
        db.close()


class SnapshotStore:
    """Shard ``shard``'s snapshots under ``_coordinator/shard-<shard>/`` of ``store`` (module
    docstring: layout, ordering, checks). ``keep`` is how many complete ones ``prune`` leaves,
    the local policy's (snapshots.SnapshotPolicy.keep)."""

    def __init__(self, *, store: ObjectStore, shard: int, keep: int) -> None:
        if shard < 0 or keep < 1:
            raise ValueError(f"bad snapshot store: shard {shard}, keep {keep}")
        self.store = store
        self.shard = shard
        self.keep = keep
        self.prefix = shard_prefix(shard)

    def __repr__(self) -> str:
        return f"SnapshotStore({self.store!r}, shard={self.shard})"

    # ---- upload --------------------------------------------------------------------------------
    def upload(self, path: Path) -> Manifest:
        """Put the local snapshot ``path`` (snapshot-<offset>.sqlite), then its manifest; returns
        once both are in the store. Holds the file in memory once while it is put."""
        offset = snapshot_offset(path)
        data = path.read_bytes()
        object_key = f"{self.prefix}snapshot-{offset:020d}-{secrets.token_hex(8)}{SNAPSHOT_SUFFIX}"
        manifest = Manifest(shard=self.shard, offset=offset, object_key=object_key, size=len(data),
                            sha256=hashlib.sha256(data).hexdigest(), created_ms=now_ms())
        self.store.put(object_key, data)
        del data
        self.store.put(manifest_key(self.shard, offset), manifest.encode())
        return manifest

    # ---- listing -------------------------------------------------------------------------------
    def _listing(self) -> tuple[list[StoredSnapshot], list[tuple[int, ObjectInfo]]]:
        """Complete snapshots (those with a manifest), oldest first, and every data object."""
        snapshots: list[StoredSnapshot] = []
        data: list[tuple[int, ObjectInfo]] = []
        for info in self.store.list(prefix=self.prefix):
            name = info.key[len(self.prefix):]
            if m := _MANIFEST_NAME.match(name):
                snapshots.append(StoredSnapshot(shard=self.shard, offset=int(m.group(1)), manifest_key=info.key))
            elif m := _DATA_NAME.match(name):
                data.append((int(m.group(1)), info))
        snapshots.sort(key=lambda s: s.offset)
        return snapshots, data

    def list(self) -> list[StoredSnapshot]:
        """The complete snapshots in the store, oldest first."""
        return self._listing()[0]

    def has(self, offset: int) -> bool:
        """Whether a complete snapshot at ``offset`` (its manifest) is in the store."""
        return any(s.offset == offset for s in self.list())

    def newest(self) -> StoredSnapshot | None:
        found = self.list()
        return found[-1] if found else None

    def manifest(self, snapshot: StoredSnapshot) -> Manifest:
        """The manifest of ``snapshot``, checked against its key; SnapshotCorrupt if it is not one."""
        key = snapshot.manifest_key
        raw = self.store.get(key)
        try:
            doc = json.loads(raw)
            manifest = Manifest(shard=doc["shard"], offset=doc["offset"], object_key=doc["object"], size=doc["size"],
                                sha256=doc["sha256"], created_ms=doc.get("created_ms", 0))
            version = doc["format"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotCorrupt(f"snapshot manifest {key}: unreadable ({type(exc).__name__}: {exc})") from exc
        if version != MANIFEST_FORMAT:
            raise SnapshotCorrupt(f"snapshot manifest {key}: format {version!r}, this version reads {MANIFEST_FORMAT}")
        m = _DATA_NAME.match(manifest.object_key[len(self.prefix):]) if isinstance(manifest.object_key, str) else None
        if (manifest.shard != self.shard or manifest.offset != snapshot.offset or m is None
                or not manifest.object_key.startswith(self.prefix) or int(m.group(1)) != snapshot.offset):
            raise SnapshotCorrupt(f"snapshot manifest {key}: names shard {manifest.shard}, offset {manifest.offset}, "
                                  f"object {manifest.object_key!r}, which do not match its key")
        return manifest

    # ---- download ------------------------------------------------------------------------------
    def download(self, snapshot: StoredSnapshot, *, directory: Path) -> Path:
        """Fetch and check ``snapshot`` into ``directory`` as a local snapshot file (crash-safe:
        .tmp, fsync, checks, rename, fsync dir); SnapshotCorrupt naming the key if a check fails,
        ObjectNotFound if it was pruned meanwhile, ObjectStoreUnavailable on a store outage."""
        manifest = self.manifest(snapshot)
        key = manifest.object_key
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / local_name(snapshot.offset)
        tmp = final.with_name(final.name + ".tmp")
        tmp.unlink(missing_ok=True)
        digest, size = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as out:
                while True:
                    chunk = self.store.get(key, offset=size, length=DOWNLOAD_CHUNK)
                    if not chunk:
                        break
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    if len(chunk) < DOWNLOAD_CHUNK:
                        break
                out.flush()
                os.fsync(out.fileno())
            if size != manifest.size or digest.hexdigest() != manifest.sha256:
                raise SnapshotCorrupt(f"snapshot {key}: {size} bytes with sha256 {digest.hexdigest()}, its manifest "
                                      f"{snapshot.manifest_key} says {manifest.size} bytes with {manifest.sha256}")
            verify_database(tmp, offset=snapshot.offset, key=key)
            os.replace(tmp, final)
            fsync_path(directory, directory=True)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return final

    def fetch_newer(self, *, directory: Path, than: int) -> Path | None:
        """The newest stored snapshot, downloaded and checked into ``directory``, if its offset is
        above ``than`` (the local newest snapshot's, or the applied offset); else None."""
        newest = self.newest()
        if newest is None or newest.offset <= than:
            return None
        path = self.download(newest, directory=directory)
        log.info("downloaded a snapshot from the object store", extra={"fields": {
            "shard": self.shard, "offset": newest.offset, "manifest": newest.manifest_key}})
        return path

    # ---- pruning -------------------------------------------------------------------------------
    def prune(self) -> list[str]:
        """Keep the newest ``keep`` complete snapshots; remove older manifests, then their data and
        the data objects without a manifest below the oldest one kept. Returns the keys removed."""
        snapshots, data = self._listing()
        if not snapshots:
            return []
        gone = snapshots[:-self.keep] if len(snapshots) > self.keep else []
        oldest_kept = snapshots[-self.keep:][0].offset
        manifests = [s.manifest_key for s in gone]
        # Manifests first: a snapshot half-removed is one without a manifest, which nobody chooses.
        failed = self.store.delete_many(manifests)
        if failed:
            raise next(iter(failed.values()))
        objects = [info.key for offset, info in data if offset < oldest_kept]
        failed = self.store.delete_many(objects)
        if failed:
            raise next(iter(failed.values()))
        return manifests + objects


__all__ = ["ROOT", "Manifest", "ObjectNotFound", "SnapshotCorrupt", "SnapshotStore", "StoredSnapshot",
           "manifest_key", "shard_prefix", "verify_database"]
