"""Object storage in a local directory: the embedded default backend (``file:///abs/dir``).

Layout: the object ``a/b/c`` is the file ``ROOT/a/b/c``; the key rules of ``base.check_key`` (no
empty, ``.``/``..`` or dot-leading segment, no backslash or control character) keep every key inside
ROOT, and the resolved path is checked once more against ROOT before any file is touched.

A put is crash-safe and atomic::

    ROOT/a/b/.c.<16 hex>.tmp   <- written, fsynced           (dot-name: never listed, never a key)
    ROOT/a/b/c                 <- os.replace(tmp, c), then the directory is fsynced

so a reader (another process too: replicas share one store) sees the old object or the whole new
one. A crash mid-put leaves a dot-named ``.tmp`` file that ``list`` ignores. Last-modified is the
file's mtime. Directories left empty by ``delete`` are kept: removing them would race with a
concurrent ``put`` creating a file in them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from itertools import groupby
from pathlib import Path

from lowtide.errors import InvalidRequest, LowtideError
from lowtide.objectstore.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    check_key,
    check_prefix,
    check_range,
)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalObjectStore(ObjectStore):
    """Objects as files under one directory (created if missing).

    Thread-safety: safe for concurrent use by threads and processes; concurrent puts of one key
    each write their own temporary file and the last rename wins, as on S3.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    def path_for(self, key: str) -> Path:
        """The file of ``key``; INVALID_REQUEST for a key that breaks the rules or leaves ROOT."""
        path = self.root / check_key(key)
        # Belt and braces: check_key already rejects '..', but a symlink or a future rule change
        # must still never let a key name a file outside the store.
        if not path.resolve().is_relative_to(self.root):
            raise InvalidRequest(f"object key {key!r} resolves outside the store")
        return path

    def put(self, key: str, data: bytes | memoryview) -> ObjectInfo:
        path = self.path_for(key)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            _fsync_directory(path.parent)
            st = path.stat()
        except IsADirectoryError as exc:
            tmp.unlink(missing_ok=True)
            raise InvalidRequest(f"object key {key!r} is a prefix of other keys") from exc
        except NotADirectoryError as exc:
            tmp.unlink(missing_ok=True)
            raise InvalidRequest(f"a prefix of object key {key!r} is an object") from exc
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ObjectStoreUnavailable(f"put {key}: {exc}") from exc
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        check_range(offset, length)
        path = self.path_for(key)
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if offset > size:
                    raise InvalidRequest(f"offset {offset} is past the end of {key} ({size} bytes)")
                want = size - offset if length is None else min(length, size - offset)
                return os.pread(f.fileno(), want, offset) if want else b""
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectNotFound(f"no object {key}") from exc
        except OSError as exc:
            raise ObjectStoreUnavailable(f"get {key}: {exc}") from exc

    def list(self, *, prefix: str = "", older_than: float | None = None) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        # Walk only the directory the prefix lies in; a prefix is a string prefix (S3's meaning),
        # so "wal/ab" matches "wal/abc" and "wal/ab/x" alike.
        start = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        return self._walk(start, prefix, older_than, len(str(self.root)) + 1)

    def _walk(self, directory: Path, prefix: str, older_than: float | None, root_len: int) -> Iterator[ObjectInfo]:
        # Streams in key order, one directory's entries in memory at a time (never the whole
        # listing: the orphan scanner lists stores of millions of objects). Keys under directory
        # "a" all start with "a/", so sorting a directory's entries by name, a directory's name
        # followed by "/", gives S3's UTF-8 byte order of the full keys.
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise ObjectStoreUnavailable(f"list {prefix!r}: {exc}") from exc
        ordered = sorted(((entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name).encode(), entry)
                         for entry in entries if not entry.name.startswith("."))  # dot-names: puts in flight
        del entries
        for sort_key, entry in ordered:
            key = entry.path[root_len:]
            if sort_key.endswith(b"/"):
                if key.startswith(prefix) or prefix.startswith(key + "/"):
                    yield from self._walk(Path(entry.path), prefix, older_than, root_len)
                continue
            if not key.startswith(prefix):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while we listed
            if older_than is None or st.st_mtime < older_than:
                yield ObjectInfo(key, st.st_size, st.st_mtime)

    def delete(self, key: str) -> None:
        path = self.path_for(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return  # a prefix of other keys, not an object: nothing to delete
        except OSError as exc:
            raise ObjectStoreUnavailable(f"delete {key}: {exc}") from exc

    def delete_many(self, keys: Sequence[str]) -> dict[str, LowtideError]:
        # One directory open (and one resolve check against ROOT) per parent directory, then
        # unlinkat relative to it: per key, only the key rules and one syscall. The orphan scanner
        # deletes its batches this way; unlinks in one directory serialize on its lock anyway, so
        # threads would not help.
        failures: dict[str, LowtideError] = {}
        checked: list[tuple[str, str, str]] = []  # (parent, name, key)
        for key in keys:
            try:
                parent, _, name = check_key(key).rpartition("/")
            except LowtideError as exc:
                failures[key] = exc
                continue
            checked.append((parent, name, key))
        checked.sort()
        for parent, group in groupby(checked, key=lambda item: item[0]):
            members = list(group)
            directory = self.root / parent if parent else self.root
            try:
                if not directory.resolve().is_relative_to(self.root):
                    raise InvalidRequest(f"object keys under {parent!r} resolve outside the store")
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            except (FileNotFoundError, NotADirectoryError):
                continue  # no such directory: none of these objects exists
            except LowtideError as exc:
                failures.update((key, exc) for _, _, key in members)
                continue
            except OSError as exc:
                failures.update((key, ObjectStoreUnavailable(f"delete {key}: {exc}")) for _, _, key in members)
                continue
            try:
                for _, name, key in members:
                    try:
                        os.unlink(name, dir_fd=fd)
                    except (FileNotFoundError, IsADirectoryError):
                        continue  # gone already, or a prefix of other keys: nothing to delete
                    except OSError as exc:
                        failures[key] = ObjectStoreUnavailable(f"delete {key}: {exc}")
            finally:
                os.close(fd)
        return failures

    def head(self, key: str) -> ObjectInfo | None:
        path = self.path_for(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ObjectStoreUnavailable(f"head {key}: {exc}") from exc
        if not path.is_file():
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime)
