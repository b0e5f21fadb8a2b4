"""Object storage for diskless topics' WAL files: one interface, a local-directory and an S3 backend.

``open_object_store(url)``: ``file:///abs/dir`` (or a plain path) is the local backend,
``s3://bucket/prefix?endpoint=http://host:port&region=r`` the S3 one (boto3 is imported only then).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from lowtide.errors import InvalidRequest
from lowtide.objectstore.base import ObjectInfo, ObjectNotFound, ObjectStore, ObjectStoreUnavailable
from lowtide.objectstore.local import LocalObjectStore

__all__ = ["ObjectInfo", "ObjectNotFound", "ObjectStore", "ObjectStoreUnavailable", "LocalObjectStore",
           "open_object_store"]


def open_object_store(url: str, *, instrumented: bool = True, **s3_overrides: object) -> ObjectStore:
    """The store a URL names, counted and timed in lowtide_objectstore_* metrics unless
    ``instrumented=False``; INVALID_REQUEST for an unknown scheme or a relative file URL."""
    store = _open_backend(url, **s3_overrides)
    if not instrumented:
        return store
    from lowtide.objectstore.metrics import InstrumentedObjectStore

    return InstrumentedObjectStore(store, backend="local" if isinstance(store, LocalObjectStore) else "s3")


def _open_backend(url: str, **s3_overrides: object) -> ObjectStore:
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme else url
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise InvalidRequest(f"file URL with a host: {url!r}")
        if not Path(path).is_absolute():
            raise InvalidRequest(f"object store path must be absolute: {url!r}")
        return LocalObjectStore(path)
    if parsed.scheme == "s3":
        from lowtide.objectstore.s3 import S3Config, S3ObjectStore

        return S3ObjectStore(S3Config.from_url(url, **s3_overrides))
    raise InvalidRequest(f"unknown object store scheme {parsed.scheme!r} (file:// or s3://)")
