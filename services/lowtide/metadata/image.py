"""The cluster metadata image: a process-local copy of every metadata key in etcd, kept current by
one watch, from which every metadata read of the process is served.

Why an image: Kafka's brokers answer Metadata, route Produce and Fetch, and check leadership from
their metadata cache, and keep doing so while the controller is away. lowtide does the same: with
etcd unreachable, a replica or front door answers from the image it has (docs/design/metadata.md);
only changes wait for the store. It also makes reads free on the request path (no round trip) and
costs one watch per process however many partitions there are.

Consistency:

* The watch applies etcd's changes in revision order; ``revision`` is the store revision the image
  reflects (every change up to it is in, none after).
* ``wait_for(revision)``: a writer waits for its own write to reach the image before it returns,
  so a process reads its own writes.
* ``sync()``: asks etcd for its current revision (a linearizable read) and waits until the image
  has caught up, or confirms by a count that nothing under its prefix changed since; used where a
  miss must not be answered from a stale copy (a topic created a moment ago by another process).
  With etcd unreachable it answers from the image at once.
* Listeners (``listen``) are called after each applied batch, with the keys that changed, on a
  thread of their own (``metadata-listeners``), never on the watch thread: a listener that waits
  for a lock held by a thread that waits for the image (a leader's ISR change catching up with
  etcd) would otherwise stall the image until that wait timed out. Batches that arrive while the
  listeners run are handed over together.

Thread-safety: reads may come from any thread; the image is a dict changed in place under a lock
and read without one (a reader sees a key either before or after a change, never half of it;
CPython's dict.get and list(dict.items()) are atomic).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable

from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.etcd import EtcdClient, KeyValue, Watch, WatchEvent

# Above every character a key holds: ``prefix + _LAST_CHAR`` bounds the keys under ``prefix``.
_LAST_CHAR = "\U0010ffff"

log = logging.getLogger(__name__)

Listener = Callable[[list[str]], None]


class MetadataImage:
    """Every key under ``prefix`` with its value and mod revision (module doc: consistency)."""

    def __init__(self, client: EtcdClient, *, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.entries: dict[str, KeyValue] = {}
        # The keys of ``entries``, sorted, for ``under``: replaced (never changed in place) when a
        # key comes or goes, so a reader bisects a consistent list without a lock. A scan of every
        # entry per prefix read cost an idle replica at 10,000 partitions a fifth of its CPU.
        self._keys: list[str] = []
        self.revision = 0
        # The revision of the last change applied from the store (a load or a watched change); the
        # image holds exactly the prefix as etcd had it then. ``revision`` may be ahead of it by
        # progress: revisions known to bring no change under the prefix.
        self.applied_revision = 0
        self.loaded = threading.Event()
        self._listeners: list[Listener] = []
        self._guard: tuple[str, bytes, Callable[[str], None]] | None = None
        # Changed keys waiting for the listener thread (see the module doc).
        self._pending_lock = threading.Lock()
        self._pending_ready = threading.Condition(self._pending_lock)
        self._pending_keys: list[str] = []
        self._dispatcher: threading.Thread | None = None
        self._watch: Watch | None = None
        self._start_lock = threading.Lock()
        self._started = False
        self._load_thread: threading.Thread | None = None
        self._stopped = threading.Event()
        # When the image last heard from etcd (a load, a change or a progress notice).
        self.confirmed_at = 0.0

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, *, timeout_s: float = 10.0, wait: bool = True) -> None:
        """Load the image and start following changes (idempotent). With ``wait`` it raises
        ``MetadataStoreUnavailable`` if the first load did not succeed within ``timeout_s``."""
        with self._start_lock:
            if not self._started:
                self._started = True
                self._load_thread = threading.Thread(target=self._first_load, name="metadata-image-load",
                                                     daemon=True)
                self._load_thread.start()
        if wait and not self.loaded.wait(timeout_s):
            raise MetadataStoreUnavailable(f"metadata store ({self._client.url}) did not answer within "
                                           f"{timeout_s:.0f}s: no metadata to serve")

    def _first_load(self) -> None:
        delay = 0.05
        while not self._stopped.is_set():
            try:
                revision = self._reload()
                break
            except MetadataStoreUnavailable as exc:
                log.warning("loading the metadata image failed, retrying: %s", exc)
                self._stopped.wait(delay)
                delay = min(1.0, delay * 2)
            except ValueError:  # the client was closed under the load (the store closed): stop
                if self._stopped.is_set():
                    return
                raise
        else:
            return
        if self._stopped.is_set():
            return
        watch = self._client.watch_prefix(self._prefix, start_revision=revision + 1, on_events=self._apply,
                                          on_reset=self._reload, on_progress=self._progress, name="metadata-watch")
        with self._start_lock:
            self._watch = watch
        if self._stopped.is_set():  # stopped while the watch was being made
            watch.stop()

    def reload(self) -> None:
        """Load every key again and follow from there (``Watch.reload``)."""
        with self._start_lock:
            watch = self._watch
        if watch is not None:
            watch.reload()

    def stop(self) -> None:
        """Stop following etcd; returns once no thread of the image can call the client (the
        caller may close it then)."""
        self._stopped.set()
        with self._pending_lock:
            self._pending_ready.notify_all()
        if self._load_thread is not None:
            self._load_thread.join(timeout=5.0)
        with self._start_lock:
            watch = self._watch
        if watch is not None:
            watch.stop()

    def guard(self, key: str, value: bytes, *, on_lost: Callable[[str], None]) -> None:
        """Refuse any change that deletes ``key`` or gives it another value (the cluster id): such
        a batch is not applied, and ``on_lost(problem)`` is called instead (it fail-stops)."""
        self._guard = (key, value, on_lost)

    def _guard_problem(self, key: str, value: bytes | None) -> str:
        guard = self._guard
        if guard is None or key != guard[0] or value == guard[1]:
            return ""
        if value is None:
            return "the metadata store lost the cluster id (emptied)"
        return f"the metadata store's cluster id changed to {value.decode(errors='replace')}"

    def connected(self) -> bool:
        return self._watch is not None and self._watch.connected.is_set()

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # -- reading ----------------------------------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        return self.entries.get(key)

    def under(self, prefix: str) -> list[KeyValue]:
        """The entries whose key starts with ``prefix``, in key order."""
        keys, entries = self._keys, self.entries
        lo = bisect.bisect_left(keys, prefix)
        hi = bisect.bisect_left(keys, prefix + _LAST_CHAR, lo)
        return [kv for k in keys[lo:hi] if (kv := entries.get(k)) is not None]

    def wait_for(self, revision: int, *, timeout_s: float = 5.0) -> bool:
        """Wait until the image reflects ``revision``; False if it did not within ``timeout_s``."""
        return self._wait_until(lambda: self.revision >= revision, deadline=time.monotonic() + timeout_s)

    def sync(self, *, timeout_s: float = 2.0) -> bool:
        """Catch up with etcd's current revision (module doc); False when etcd did not answer.

        The store's revision also moves for keys outside the image's prefix, which the watch never
        delivers, so an image behind the store's revision may well be current. It is when, read
        in one linearizable transaction, the prefix holds as many keys as the image and none
        written after the last change the image applied. etcd's requested progress notices would
        say so without a count, but the etcd Debian ships (3.4.23) may send one ahead of changes
        still queued for the watch (etcd-io/etcd#15220), and an ACL removal then missed a binding
        added a moment before. A watch that brings no change within the time left is on a member
        that stopped answering: it moves to another."""
        deadline = time.monotonic() + timeout_s
        try:
            revision = self._client.revision(timeout_s=timeout_s)
        except MetadataStoreUnavailable:
            return False
        # Mostly the image is current or a change is a moment away: no need to count the prefix
        # (etcd reads every key under it for that).
        if self._wait_applied(revision, deadline=min(deadline, time.monotonic() + 0.05)):
            return True
        while True:
            with self._changed:
                applied, keys = self.applied_revision, len(self.entries)
            try:
                revision, held, changed = self._client.prefix_state(
                    self._prefix, changed_after=applied, timeout_s=max(0.05, deadline - time.monotonic()))
            except MetadataStoreUnavailable:
                return False
            if applied >= revision or (held == keys and not changed):
                self._progress(revision)
                return True
            # Behind: changes are on their way down the watch. Look again once one arrives.
            if not self._wait_applied(applied + 1, deadline=deadline):
                break
        if self._watch is not None:
            log.warning("metadata watch is behind etcd (revision %d < %d); following another member",
                        self.applied_revision, revision)
            self._watch.reconnect()
        return False

    def _wait_applied(self, revision: int, *, deadline: float) -> bool:
        return self._wait_until(lambda: self.applied_revision >= revision, deadline=deadline)

    def _wait_until(self, reached: Callable[[], bool], *, deadline: float) -> bool:
        """Wait under the image's lock until ``reached()`` (looked at again on every change);
        False if it was not by ``deadline`` (time.monotonic)."""
        with self._changed:
            while not reached():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def _progress(self, revision: int) -> None:
        with self._changed:
            if revision > self.revision:
                self.revision = revision
                self._changed.notify_all()
            self.confirmed_at = time.monotonic()

    # -- applying ---------------------------------------------------------------------------------
    def _reload(self) -> int:
        kvs, revision = self._client.get_prefix(self._prefix)
        entries = {kv.key: kv for kv in kvs}
        if self._guard is not None:
            kv = entries.get(self._guard[0])
            problem = self._guard_problem(self._guard[0], kv.value if kv is not None else None)
            if problem:
                self._guard[2](problem)
                return self.revision
        with self._changed:
            old = self.entries
            changed = [k for k in entries.keys() | old.keys() if old.get(k) != entries.get(k)]
            self.entries = entries
            self._keys = sorted(entries)
            # Lower only when the store went back (restored from a backup: Watch._run); a
            # version that moves either way still tells caches to look again.
            self.revision = revision
            self.applied_revision = revision
            self.confirmed_at = time.monotonic()
            self._changed.notify_all()
        self.loaded.set()
        self._notify(changed)
        return revision

    def _apply(self, events: list[WatchEvent], revision: int) -> None:
        if self._guard is not None:
            for e in events:
                problem = self._guard_problem(e.key, None if e.deleted else e.value)
                if problem:
                    self._guard[2](problem)
                    return  # never applied: nothing acts on a store that forgot the cluster
        # In place: a reader's dict.get or list(dict.items()) is atomic, and copying the whole image
        # per change would cost O(partitions) per ISR change.
        with self._changed:
            entries = self.entries
            keys: list[str] | None = None  # a new sorted key list, once a key comes or goes
            for e in events:
                if e.deleted:
                    if entries.pop(e.key, None) is not None:
                        keys = list(self._keys) if keys is None else keys
                        del keys[bisect.bisect_left(keys, e.key)]
                else:
                    old = entries.get(e.key)
                    if old is None:
                        keys = list(self._keys) if keys is None else keys
                        bisect.insort(keys, e.key)
                    entries[e.key] = KeyValue(key=e.key, value=e.value, mod_revision=e.revision,
                                              create_revision=old.create_revision if old else e.revision,
                                              version=(old.version + 1) if old else 1, lease=e.lease)
            if keys is not None:
                self._keys = keys
            self.revision = max(self.revision, revision)
            self.applied_revision = max(self.applied_revision, revision)
            self.confirmed_at = time.monotonic()
            self._changed.notify_all()
        self._notify([e.key for e in events])

    def _notify(self, keys: list[str]) -> None:
        if not keys or not self._listeners:
            return
        with self._pending_lock:
            self._pending_keys.extend(keys)
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch, name="metadata-listeners", daemon=True)
                self._dispatcher.start()
            self._pending_ready.notify()

    def _dispatch(self) -> None:
        while not self._stopped.is_set():
            with self._pending_lock:
                while not self._pending_keys and not self._stopped.is_set():
                    self._pending_ready.wait(1.0)
                keys, self._pending_keys = self._pending_keys, []
            if not keys:
                continue
            for listener in list(self._listeners):
                try:
                    listener(keys)
                except Exception:
                    log.exception("a metadata listener failed")
