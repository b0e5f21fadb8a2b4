from __future__ import annotations

import os

import pytest

from lowtide.errors import InvalidRequest
from lowtide.objectstore import LocalObjectStore, ObjectNotFound, open_object_store
from tests.unit.objectstore.contract import ObjectStoreContract


@pytest.fixture
def store(tmp_path):
    return LocalObjectStore(tmp_path / "objects")


class TestLocalObjectStoreContract(ObjectStoreContract):
    pass


def test_an_object_is_a_file_at_its_key_under_the_root(store):
    store.put("wal/00/file-1", b"hello")
    assert (store.root / "wal" / "00" / "file-1").read_bytes() == b"hello"


def test_a_put_leaves_no_temporary_file_behind(store):
    store.put("a/b", b"x" * 100_000)
    assert sorted(os.listdir(store.root / "a")) == ["b"]


def test_a_temporary_file_of_a_crashed_put_is_never_listed_or_read_as_an_object(store):
    store.put("a/b", b"whole")
    # What a put that died between write and rename leaves: a dot-named .tmp next to the target.
    (store.root / "a" / ".b.0123456789abcdef.tmp").write_bytes(b"half")
    assert [i.key for i in store.list()] == ["a/b"]
    assert store.get("a/b") == b"whole"


def test_a_symlink_out_of_the_root_cannot_be_followed_by_a_key(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    os.symlink(outside, store.root / "link")
    with pytest.raises(InvalidRequest):
        store.get("link/secret")
    with pytest.raises(InvalidRequest):
        store.put("link/new", b"x")
    assert not (outside / "new").exists()
    failures = store.delete_many(["link/secret"])
    assert isinstance(failures["link/secret"], InvalidRequest)
    assert (outside / "secret").exists()


def test_a_key_that_is_a_prefix_directory_of_other_keys_cannot_be_put(store):
    store.put("p/child", b"c")
    with pytest.raises(InvalidRequest):
        store.put("p", b"x")
    assert store.get("p/child") == b"c"


def test_list_older_than_follows_the_file_modification_time(store):
    store.put("old", b"1")
    store.put("new", b"2")
    os.utime(store.root / "old", (1_000_000, 1_000_000))
    assert [i.key for i in store.list(older_than=1_000_001)] == ["old"]
    assert store.head("old").last_modified == 1_000_000


def test_open_object_store_maps_file_urls_and_paths_to_the_local_backend(tmp_path):
    assert isinstance(open_object_store(f"file://{tmp_path}/s1", instrumented=False), LocalObjectStore)
    assert isinstance(open_object_store(f"file://{tmp_path}/s1").inner, LocalObjectStore)
    assert open_object_store(str(tmp_path / "s2")).root == (tmp_path / "s2").resolve()


def test_an_opened_store_counts_its_requests_and_bytes(tmp_path):
    from prometheus_client import REGISTRY

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, {"backend": "local", **labels}) or 0.0

    store = open_object_store(str(tmp_path / "counted"))
    before = (value("lowtide_objectstore_bytes_total", operation="put"),
              value("lowtide_objectstore_bytes_total", operation="get"),
              value("lowtide_objectstore_requests_total", operation="get", result="error"),
              value("lowtide_objectstore_objects_listed_total"))
    store.put("a", b"12345")
    assert store.get("a", offset=1, length=2) == b"23"
    with pytest.raises(ObjectNotFound):
        store.get("missing")
    assert [i.key for i in store.list()] == ["a"]
    after = (value("lowtide_objectstore_bytes_total", operation="put"),
             value("lowtide_objectstore_bytes_total", operation="get"),
             value("lowtide_objectstore_requests_total", operation="get", result="error"),
             value("lowtide_objectstore_objects_listed_total"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [5, 2, 1, 1]


@pytest.mark.parametrize("url", ["file://host/x", "relative/dir", "gs://bucket", "file:relative"])
def test_open_object_store_refuses_urls_it_cannot_serve(url):
    with pytest.raises(InvalidRequest):
        open_object_store(url)
