"""The object storage interface of diskless topics: keys, object descriptions, errors.

A WAL file of diskless topics is one immutable object: written once whole (``put``), read by byte
ranges (``get``), listed with its last-modified time by the orphan scanner (``list``), and removed
once no coordinator owns it (``delete``). Nothing is ever appended or overwritten in place, so the
interface is the common subset of a POSIX directory and S3, and both backends behave the same:

* ``put`` is atomic: a reader sees the old object (or none) or the whole new one, never a part.
* ``get`` of ``[offset, offset + length)`` clips at the end of the object; ``offset == size`` gives
  ``b""``; ``offset > size`` is INVALID_REQUEST; a missing key is ``ObjectNotFound``.
* ``list`` yields objects in key order (S3's order: UTF-8 byte order) whose key starts with
  ``prefix`` (a string prefix, not a directory), optionally only those last modified strictly before
  ``older_than`` (epoch seconds).
* ``delete`` is idempotent (S3's DeleteObject is): deleting a missing key is not an error.
  ``delete_many`` deletes many keys in as few calls as the backend allows (S3's DeleteObjects takes
  1,000 keys a request; the local store unlinks relative to one open directory): one key's failure
  does not stop the others, it is returned with that key.
* ``head`` returns the object's description, or None when it does not exist.

Keys are the same on both backends: 1..1024 UTF-8 bytes, segments separated by ``/``, no empty
segment (so no leading, trailing or doubled ``/``), no segment ``.``/``..`` or starting with ``.``
(the local backend keeps its temporary files under dot-names), no NUL, backslash or control
character. A key breaking these rules is INVALID_REQUEST before anything is touched: on the local
backend this is what keeps a key from naming a path outside the store's directory.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from lowtide.errors import InvalidRequest, KafkaStorageError, LowtideError

MAX_KEY_BYTES = 1024


class ObjectNotFound(KafkaStorageError):
    """The key names no object. Kafka has no closer code than KAFKA_STORAGE_ERROR (56); unlike a
    storage outage, retrying cannot make a missing object appear, so it is not retriable."""

    retriable = False
    invalid_metadata = False


class ObjectStoreUnavailable(KafkaStorageError):
    """The store did not answer (or failed) after the backend's retries: KAFKA_STORAGE_ERROR, retriable."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object: its key, size in bytes and last-modified time (epoch seconds, float)."""

    key: str
    size: int
    last_modified: float


# A control character, DEL or a backslash; one C scan instead of a Python step per character
# (every CommitFile checks its object key).
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")


def check_key(key: str) -> str:
    """Return ``key`` if it follows the key rules of this module, else raise INVALID_REQUEST."""
    if not isinstance(key, str) or not key:
        raise InvalidRequest("object key must be a non-empty string")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidRequest(f"object key longer than {MAX_KEY_BYTES} bytes")
    if _FORBIDDEN.search(key):
        raise InvalidRequest(f"object key {key!r} contains a control character or a backslash")
    for segment in key.split("/"):
        if not segment:
            raise InvalidRequest(f"object key {key!r} has an empty path segment")
        if segment.startswith("."):
            raise InvalidRequest(f"object key {key!r} has a segment starting with '.'")
    return key


def check_prefix(prefix: str) -> str:
    """A list prefix is a key prefix: empty, or a key possibly ending in '/'."""
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") and len(prefix) > 1 else prefix)
    return prefix


def check_range(offset: int, length: int | None) -> None:
    if offset < 0 or (length is not None and length < 0):
        raise InvalidRequest(f"invalid byte range: offset {offset}, length {length}")


class ObjectStore(abc.ABC):
    """Immutable whole-object store (see the module docstring for the contract every backend keeps).

    Thread-safety: every method may be called from any number of threads at once.
    """

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> ObjectInfo:
        """Store ``data`` under ``key`` atomically (replacing any object there) and describe it."""

    @abc.abstractmethod
    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes ``[offset, offset + length)`` of the object (to its end when length is None)."""

    @abc.abstractmethod
    def list(self, *, prefix: str = "", older_than: float | None = None) -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order; only those modified before ``older_than``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error."""

    def delete_many(self, keys: Sequence[str]) -> dict[str, LowtideError]:
        """Delete every key (missing ones are not errors); the keys that failed, with why.
        A backend overrides this where it can do better than one ``delete`` per key."""
        failures: dict[str, LowtideError] = {}
        for key in keys:
            try:
                self.delete(key)
            except LowtideError as exc:
                failures[key] = exc
        return failures

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """The object's description, or None if there is none under ``key``."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release connections; the store is unusable afterwards."""
