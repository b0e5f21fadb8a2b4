"""Coordinator snapshots in the object store (coordinator/snapshot_store.py) against the local
object store: upload, list, prune, download; a torn upload is never chosen; a corrupt object, a
manifest that lies, a database of another schema or offset are refused naming the key."""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3

import pytest

from lowtide.coordinator.snapshot_store import (
    SnapshotCorrupt,
    SnapshotStore,
    manifest_key,
    shard_prefix,
)
from lowtide.coordinator.snapshots import latest_snapshot, restore_snapshot
from lowtide.coordinator.state import CoordinatorState, snapshot_offset
from lowtide.objectstore import LocalObjectStore, ObjectNotFound
from tests.unit.coordinator.test_rebuild import rebuild, serve_a_mixed_workload


@pytest.fixture
def store(tmp_path):
    return LocalObjectStore(tmp_path / "objects")


def snapshots_of(shard, tmp_path, *, rounds: int) -> list:
    """Local snapshots after each of ``rounds`` rounds of a mixed workload, oldest first."""
    paths = []
    for r in range(rounds):
        serve_a_mixed_workload(shard, random.Random(r), files=15, start=r * 15)
        paths.append(shard.state.snapshot(tmp_path / "local"))
    return paths


def test_an_uploaded_snapshot_downloads_onto_an_empty_disk_and_restores_the_same_tables(shard, store, tmp_path):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    stored = SnapshotStore(store=store, shard=0, keep=2)
    manifest = stored.upload(path)
    assert manifest.offset == snapshot_offset(path) == shard.state.applied_offset
    assert manifest.object_key.startswith("_coordinator/shard-0/snapshot-")
    assert store.get(manifest.object_key) == path.read_bytes()

    empty = tmp_path / "new-pod" / "snapshots"
    fetched = stored.fetch_newer(directory=empty, than=-1)
    assert fetched is not None and fetched.name == path.name and fetched.read_bytes() == path.read_bytes()
    restored = restore_snapshot(fetched, tmp_path / "new-pod" / "state.sqlite", coordinator_id=0)
    try:
        assert restored.dump() == shard.state.dump()
        assert restored.dump()["batches"]
    finally:
        restored.close()
    # Nothing newer than what the disk has: nothing fetched.
    assert stored.fetch_newer(directory=empty, than=manifest.offset) is None


def test_the_newest_snapshot_plus_the_log_tail_equals_the_whole_log(shard, store, tmp_path):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    stored = SnapshotStore(store=store, shard=0, keep=2)
    stored.upload(path)
    serve_a_mixed_workload(shard, random.Random(99), files=10, start=500)  # the tail after the snapshot
    fetched = stored.fetch_newer(directory=tmp_path / "pod", than=-1)
    state = restore_snapshot(fetched, tmp_path / "pod" / "state.sqlite", coordinator_id=0)
    try:
        rebuild(None, shard.log, start=state.applied_offset + 1, state=state)
        assert state.dump() == shard.state.dump()
    finally:
        state.close()


def test_prune_keeps_the_newest_n_in_the_store_and_lists_them_oldest_first(shard, store, tmp_path):
    paths = snapshots_of(shard, tmp_path, rounds=4)
    stored = SnapshotStore(store=store, shard=0, keep=2)
    for path in paths:
        stored.upload(path)
    assert [s.offset for s in stored.list()] == [snapshot_offset(p) for p in paths]
    removed = stored.prune()
    assert len(removed) == 4  # two manifests, two data objects
    offsets = [snapshot_offset(p) for p in paths[-2:]]
    assert [s.offset for s in stored.list()] == offsets
    keys = [i.key for i in store.list(prefix=shard_prefix(0))]
    assert sorted(int(k.rsplit("/", 1)[1][len("snapshot-"):][:20]) for k in keys) == sorted(offsets * 2)
    assert stored.prune() == []


def test_another_shards_snapshots_are_neither_listed_nor_pruned(shard, store, tmp_path):
    paths = snapshots_of(shard, tmp_path, rounds=3)
    one, ten = SnapshotStore(store=store, shard=1, keep=1), SnapshotStore(store=store, shard=10, keep=1)
    for path in paths:
        one.upload(path)
    ten.upload(paths[0])
    one.prune()
    assert [s.offset for s in one.list()] == [snapshot_offset(paths[-1])]
    assert [s.offset for s in ten.list()] == [snapshot_offset(paths[0])]


def test_a_torn_upload_is_never_chosen_and_goes_with_the_next_prune(shard, store, tmp_path):
    older, newer = snapshots_of(shard, tmp_path, rounds=2)
    stored = SnapshotStore(store=store, shard=0, keep=1)
    stored.upload(older)
    # The process died between the two puts of the newer one: its data object, no manifest.
    torn_key = f"{shard_prefix(0)}snapshot-{snapshot_offset(newer):020d}-0123456789abcdef.sqlite"
    store.put(torn_key, newer.read_bytes()[:4096])
    # And one died inside a put: the local store's dot-named temporary file.
    (store.root / shard_prefix(0) / f".snapshot-{snapshot_offset(newer):020d}.json.00.tmp").write_bytes(b"{")
    assert stored.newest().offset == snapshot_offset(older)
    fetched = stored.fetch_newer(directory=tmp_path / "pod", than=-1)
    assert fetched is not None and snapshot_offset(fetched) == snapshot_offset(older)
    # A data object without a manifest at or above the oldest kept one may be an upload in
    # progress: it stays. Once a newer snapshot is complete, it goes.
    assert torn_key not in stored.prune()
    assert store.head(torn_key) is not None
    serve_a_mixed_workload(shard, random.Random(7), files=5, start=900)
    stored.upload(shard.state.snapshot(tmp_path / "local"))
    removed = stored.prune()
    assert torn_key in removed and store.head(torn_key) is None
    assert [s.offset for s in stored.list()] == [shard.state.applied_offset]


def test_two_uploads_at_one_offset_never_mix_one_processs_manifest_with_the_others_bytes(shard, store, tmp_path):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    a, b = SnapshotStore(store=store, shard=0, keep=2), SnapshotStore(store=store, shard=0, keep=2)
    first = a.upload(path)
    second = b.upload(path)
    assert first.object_key != second.object_key
    fetched = a.fetch_newer(directory=tmp_path / "pod", than=-1)
    assert fetched.read_bytes() == path.read_bytes()


def corrupt_newest(store: LocalObjectStore, stored: SnapshotStore, edit) -> str:
    manifest = stored.manifest(stored.newest())
    target = store.path_for(manifest.object_key)
    target.write_bytes(edit(target.read_bytes()))
    return manifest.object_key


@pytest.mark.parametrize("edit", [
    pytest.param(lambda b: b[:len(b) // 2], id="truncated"),
    pytest.param(lambda b: b[:5000] + bytes([b[5000] ^ 0x40]) + b[5001:], id="bit-flip"),
])
def test_a_corrupt_object_is_refused_naming_its_key_and_nothing_is_left_on_disk(shard, store, tmp_path, edit):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    stored = SnapshotStore(store=store, shard=0, keep=2)
    stored.upload(path)
    key = corrupt_newest(store, stored, edit)
    pod = tmp_path / "pod"
    with pytest.raises(SnapshotCorrupt, match=key):
        stored.fetch_newer(directory=pod, than=-1)
    assert latest_snapshot(pod) is None and not any(pod.iterdir())


def test_a_manifest_that_vouches_for_a_broken_database_is_refused_by_the_sqlite_checks(shard, store, tmp_path):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    stored = SnapshotStore(store=store, shard=0, keep=2)
    good = stored.upload(path)
    # Bytes whose hash matches their manifest but that are not an intact database: a snapshot that
    # was broken before it was uploaded. Rewrite the object and the manifest to match.
    data = bytearray(path.read_bytes())
    page = 1024
    data[3 * page:4 * page] = bytes(page)  # zero a b-tree page
    store.put(good.object_key, bytes(data))
    doc = json.loads(store.get(manifest_key(0, good.offset)))
    doc.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    store.put(manifest_key(0, good.offset), json.dumps(doc).encode())
    with pytest.raises(SnapshotCorrupt, match=good.object_key):
        stored.fetch_newer(directory=tmp_path / "pod", than=-1)


def test_a_database_whose_offset_differs_from_its_name_is_refused(shard, store, tmp_path):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    liar = tmp_path / "liar" / f"snapshot-{snapshot_offset(path) + 5:020d}.sqlite"
    liar.parent.mkdir()
    liar.write_bytes(path.read_bytes())
    stored = SnapshotStore(store=store, shard=0, keep=2)
    manifest = stored.upload(liar)
    with pytest.raises(SnapshotCorrupt, match=f"{manifest.object_key}.*applied offset is {snapshot_offset(path)}"):
        stored.fetch_newer(directory=tmp_path / "pod", than=-1)


def upload_altered(shard, store, tmp_path, sql: str) -> tuple[SnapshotStore, object]:
    """A snapshot of ``shard`` changed by ``sql`` in a copy (a valid SQLite file, so the manifest's
    hash matches), uploaded: the store and its manifest."""
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    altered = tmp_path / "altered" / path.name
    altered.parent.mkdir()
    altered.write_bytes(path.read_bytes())
    db = sqlite3.connect(altered)
    db.execute(sql)
    db.commit()
    db.close()
    stored = SnapshotStore(store=store, shard=0, keep=2)
    return stored, stored.upload(altered)


def test_a_database_of_another_schema_is_refused(shard, store, tmp_path):
    stored, manifest = upload_altered(shard, store, tmp_path, "ALTER TABLE batches ADD COLUMN future_column INTEGER")
    with pytest.raises(SnapshotCorrupt, match=f"{manifest.object_key}.*not this version"):
        stored.fetch_newer(directory=tmp_path / "pod", than=-1)


@pytest.mark.parametrize("change", [
    pytest.param({"format": 2}, id="format"),
    pytest.param({"shard": 1}, id="shard"),
    pytest.param({"offset": 0}, id="offset"),
    pytest.param({"object": "wal/elsewhere"}, id="object-elsewhere"),
])
def test_a_manifest_that_does_not_match_its_key_is_refused_naming_it(shard, store, tmp_path, change):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    stored = SnapshotStore(store=store, shard=0, keep=2)
    good = stored.upload(path)
    key = manifest_key(0, good.offset)
    store.put(key, json.dumps({**json.loads(store.get(key)), **change}).encode())
    with pytest.raises(SnapshotCorrupt, match=key):
        stored.fetch_newer(directory=tmp_path / "pod", than=-1)


def test_a_snapshot_pruned_between_listing_and_download_is_object_not_found(shard, store, tmp_path):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    stored = SnapshotStore(store=store, shard=0, keep=2)
    manifest = stored.upload(path)
    chosen = stored.newest()
    store.delete(manifest.object_key)
    with pytest.raises(ObjectNotFound):
        stored.download(chosen, directory=tmp_path / "pod")


def test_an_empty_store_restores_nothing(store, tmp_path):
    assert SnapshotStore(store=store, shard=0, keep=2).fetch_newer(directory=tmp_path / "pod", than=-1) is None


def test_the_downloaded_file_is_an_ordinary_local_snapshot(shard, store, tmp_path):
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    stored = SnapshotStore(store=store, shard=0, keep=2)
    stored.upload(path)
    pod = tmp_path / "pod"
    fetched = stored.fetch_newer(directory=pod, than=-1)
    assert latest_snapshot(pod) == fetched
    state = CoordinatorState(fetched, coordinator_id=0)
    try:
        assert state.applied_offset == snapshot_offset(path)
    finally:
        state.close()


def test_an_older_versions_snapshot_without_a_table_added_since_is_taken(shard, store, tmp_path):
    """Tables are added with CREATE TABLE IF NOT EXISTS (state.SCHEMA): opening an older state
    creates them empty, and an older version's snapshot restores the same way."""
    (path,) = snapshots_of(shard, tmp_path, rounds=1)
    older = tmp_path / "older" / path.name
    older.parent.mkdir()
    older.write_bytes(path.read_bytes())
    db = sqlite3.connect(older)
    newest_table = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN "
                              "('applied', 'partitions', 'files', 'batches', 'producers', 'sqlite_sequence') "
                              "ORDER BY rowid DESC LIMIT 1").fetchone()
    if newest_table is None:
        pytest.skip("this version added no table to the original five")
    db.execute(f"DROP TABLE {newest_table[0]}")
    db.commit()
    db.close()
    stored = SnapshotStore(store=store, shard=0, keep=2)
    stored.upload(older)
    fetched = stored.fetch_newer(directory=tmp_path / "pod", than=-1)
    state = restore_snapshot(fetched, tmp_path / "pod" / "state.sqlite", coordinator_id=0)
    try:
        assert state.dump()["batches"] == shard.state.dump()["batches"]
    finally:
        state.close()


def test_a_snapshot_without_the_applied_table_is_refused(shard, store, tmp_path):
    stored, manifest = upload_altered(shard, store, tmp_path, "DROP TABLE applied")
    with pytest.raises(SnapshotCorrupt, match=manifest.object_key):
        stored.fetch_newer(directory=tmp_path / "pod", than=-1)
