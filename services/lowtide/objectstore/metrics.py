"""Prometheus metrics of object storage, around any backend:

    lowtide_objectstore_requests_total{backend,operation,result}   result: ok | error
    lowtide_objectstore_bytes_total{backend,operation}             bytes put / got
    lowtide_objectstore_request_seconds{backend,operation}         histogram
    lowtide_objectstore_objects_listed_total{backend}
    lowtide_objectstore_objects_deleted_in_bulk_total{backend}     objects removed by delete_many

``operation`` is put, get, list, delete, delete_many (one call for many keys; "error" when any
key failed) or head; ``backend`` local or s3. A listing is timed from
its first to its last object (it streams), and counted once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from prometheus_client import Counter, Histogram

from lowtide.errors import LowtideError
from lowtide.objectstore.base import ObjectInfo, ObjectStore

_LABELS = ["backend", "operation"]
REQUESTS = Counter("lowtide_objectstore_requests", "Object store requests", [*_LABELS, "result"])
BYTES = Counter("lowtide_objectstore_bytes", "Bytes written to (put) or read from (get) object storage", _LABELS)
SECONDS = Histogram("lowtide_objectstore_request_seconds", "Object store request duration", _LABELS,
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
DELETED = Counter("lowtide_objectstore_objects_deleted_in_bulk", "Objects removed by delete_many calls",
                  ["backend"])
LISTED = Counter("lowtide_objectstore_objects_listed", "Objects returned by listings", ["backend"])


class InstrumentedObjectStore(ObjectStore):
    """Counts and times every call of ``inner`` (same contract, same thread-safety as ``inner``)."""

    def __init__(self, inner: ObjectStore, *, backend: str) -> None:
        self.inner = inner
        self.backend = backend

    def __repr__(self) -> str:
        return f"Instrumented({self.inner!r})"

    def __getattr__(self, name: str):
        # Backend specifics (a local store's root, an S3 store's config and create_bucket) stay
        # reachable through the wrapper.
        return getattr(self.inner, name)

    def _observe(self, operation: str, began: float, ok: bool, size: int = 0) -> None:
        SECONDS.labels(self.backend, operation).observe(time.perf_counter() - began)
        REQUESTS.labels(self.backend, operation, "ok" if ok else "error").inc()
        if size:
            BYTES.labels(self.backend, operation).inc(size)

    def put(self, key: str, data: bytes | memoryview) -> ObjectInfo:
        began, ok = time.perf_counter(), False
        try:
            info = self.inner.put(key, data)
            ok = True
            return info
        finally:
            self._observe("put", began, ok, len(data) if ok else 0)

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        began, ok, data = time.perf_counter(), False, b""
        try:
            data = self.inner.get(key, offset=offset, length=length)
            ok = True
            return data
        finally:
            self._observe("get", began, ok, len(data))

    def list(self, *, prefix: str = "", older_than: float | None = None) -> Iterator[ObjectInfo]:
        began, ok, count = time.perf_counter(), False, 0
        try:
            for info in self.inner.list(prefix=prefix, older_than=older_than):
                count += 1
                yield info
            ok = True
        finally:
            LISTED.labels(self.backend).inc(count)
            self._observe("list", began, ok)

    def delete(self, key: str) -> None:
        began, ok = time.perf_counter(), False
        try:
            self.inner.delete(key)
            ok = True
        finally:
            self._observe("delete", began, ok)

    def delete_many(self, keys: Sequence[str]) -> dict[str, LowtideError]:
        began, failures = time.perf_counter(), None
        try:
            failures = self.inner.delete_many(keys)
            return failures
        finally:
            self._observe("delete_many", began, failures is not None and not failures)
            if failures is not None:
                DELETED.labels(self.backend).inc(len(keys) - len(failures))

    def head(self, key: str) -> ObjectInfo | None:
        began, ok = time.perf_counter(), False
        try:
            info = self.inner.head(key)
            ok = True
            return info
        finally:
            self._observe("head", began, ok)

    def close(self) -> None:
        self.inner.close()
