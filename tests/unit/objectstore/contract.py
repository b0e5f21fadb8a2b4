"""The object store contract (lowtide.objectstore.base), run against every backend: the local one
in tests/unit/objectstore, the S3 one against a real S3 server process in tests/integration."""

from __future__ import annotations

import time

import pytest

from lowtide.errors import InvalidRequest
from lowtide.objectstore import ObjectNotFound, ObjectStore


class ObjectStoreContract:
    """Mixed into a Test* class that provides a ``store`` fixture (an empty store)."""

    def test_a_put_object_reads_back_whole_and_by_ranges(self, store: ObjectStore):
        data = bytes(range(256)) * 40
        info = store.put("wal/0001", data)
        assert (info.key, info.size) == ("wal/0001", len(data))
        assert store.get("wal/0001") == data
        assert store.get("wal/0001", offset=100, length=50) == data[100:150]
        assert store.get("wal/0001", offset=10_000) == data[10_000:]

    def test_a_range_past_the_end_is_clipped_and_one_starting_there_is_empty(self, store: ObjectStore):
        store.put("f", b"abcdef")
        assert store.get("f", offset=4, length=100) == b"ef"
        assert store.get("f", offset=6) == b""
        assert store.get("f", offset=6, length=3) == b""

    def test_a_range_starting_beyond_the_end_is_an_invalid_request(self, store: ObjectStore):
        store.put("f", b"abcdef")
        with pytest.raises(InvalidRequest):
            store.get("f", offset=7, length=1)

    def test_getting_a_missing_key_is_object_not_found(self, store: ObjectStore):
        with pytest.raises(ObjectNotFound) as info:
            store.get("nope", offset=0, length=10)
        assert info.value.name == "KAFKA_STORAGE_ERROR" and not info.value.retriable

    def test_a_second_put_replaces_the_object(self, store: ObjectStore):
        store.put("k", b"old-old")
        store.put("k", b"new")
        assert store.get("k") == b"new"
        assert store.head("k").size == 3

    def test_head_describes_an_object_and_is_none_for_a_missing_one(self, store: ObjectStore):
        before = time.time() - 5
        store.put("a/b", b"12345")
        info = store.head("a/b")
        assert (info.key, info.size) == ("a/b", 5)
        assert before <= info.last_modified <= time.time() + 5
        assert store.head("a/c") is None
        assert store.head("a") is None

    def test_list_gives_keys_under_a_string_prefix_in_byte_order(self, store: ObjectStore):
        for key in ("wal/b", "wal/a/1", "wal-x", "wal/a-2", "other/z", "wal/ab"):
            store.put(key, key.encode())
        assert [i.key for i in store.list()] == ["other/z", "wal-x", "wal/a-2", "wal/a/1", "wal/ab", "wal/b"]
        assert [i.key for i in store.list(prefix="wal/a")] == ["wal/a-2", "wal/a/1", "wal/ab"]
        assert [i.key for i in store.list(prefix="wal/")] == ["wal/a-2", "wal/a/1", "wal/ab", "wal/b"]
        assert [(i.key, i.size) for i in store.list(prefix="other/")] == [("other/z", 7)]
        assert list(store.list(prefix="none/")) == []

    def test_list_older_than_keeps_only_objects_modified_before_the_threshold(self, store: ObjectStore):
        store.put("x/1", b"1")
        assert [i.key for i in store.list(older_than=time.time() + 5)] == ["x/1"]
        assert list(store.list(older_than=time.time() - 3600)) == []

    def test_delete_removes_the_object_and_deleting_again_is_not_an_error(self, store: ObjectStore):
        store.put("d/1", b"x")
        store.put("d/2", b"y")
        store.delete("d/1")
        store.delete("d/1")
        store.delete("never/was")
        assert store.head("d/1") is None
        assert [i.key for i in store.list(prefix="d/")] == ["d/2"]

    def test_delete_many_removes_every_key_across_prefixes_and_skips_missing_ones(self, store: ObjectStore):
        for key in ("d/1", "d/2", "d/keep", "e/f/3", "top"):
            store.put(key, key.encode())
        failures = store.delete_many(["d/2", "top", "e/f/3", "d/1", "never/was", "d/gone", "d/1"])
        assert failures == {}
        assert [i.key for i in store.list()] == ["d/keep"]
        assert store.delete_many([]) == {}

    def test_delete_many_more_keys_than_one_bulk_request_takes(self, store: ObjectStore):
        keys = [f"bulk/{i:05d}" for i in range(1203)]  # S3's DeleteObjects takes 1,000 keys
        for key in keys:
            store.put(key, b"b")
        store.put("bulk~after", b"a")
        assert store.delete_many(keys) == {}
        assert [i.key for i in store.list(prefix="bulk")] == ["bulk~after"]

    def test_delete_many_names_a_key_breaking_the_rules_and_still_deletes_the_others(self, store: ObjectStore):
        store.put("ok/1", b"1")
        store.put("ok/2", b"2")
        failures = store.delete_many(["ok/1", "../etc/passwd", "a//b", "ok/2"])
        assert set(failures) == {"../etc/passwd", "a//b"}
        assert all(isinstance(e, InvalidRequest) for e in failures.values())
        assert list(store.list()) == []

    @pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/", "../etc/passwd", "a/../../b", "a/./b",
                                     ".hidden", "a/.tmp", "a\\b", "a\x00b", "a\nb", "x" * 1025])
    def test_a_key_breaking_the_rules_is_an_invalid_request_and_touches_nothing(self, store: ObjectStore, key):
        with pytest.raises(InvalidRequest):
            store.put(key, b"data")
        with pytest.raises(InvalidRequest):
            store.get(key)
        with pytest.raises(InvalidRequest):
            store.delete(key)
        assert list(store.list()) == []

    def test_a_negative_range_is_an_invalid_request(self, store: ObjectStore):
        store.put("f", b"abc")
        with pytest.raises(InvalidRequest):
            store.get("f", offset=-1)
        with pytest.raises(InvalidRequest):
            store.get("f", offset=0, length=-2)
