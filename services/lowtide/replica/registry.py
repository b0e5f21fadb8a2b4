"""The partitions hosted by one replica server, the live brokers it counts, and the wake-ups of
requests parked on those partitions.

Every other piece of the replica (request paths, follower fetchers, DeleteRecords, housekeeping,
reconciliation) shares one ``PartitionRegistry`` instead of reaching into each other's fields.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from lowtide.errors import UnknownTopicOrPartition
from lowtide.messages import TopicPartition
from lowtide.metadata.model import PartitionState
from lowtide.replica.partition import FOLLOWER, LEADER, REPLICAS_CHANGED, Partition


class Waiters:
    """Per-partition wake-ups for parked fetches and acks=all produces.

    Contract: a waiter registers one Event under every partition it waits on (``waiting``); a
    change to a partition sets the events registered under it (``notify``), so an append wakes
    only the waiters of that partition (a process-wide Condition woke every parked request on every
    append). A waiter clears its event *before* re-reading its condition, so a change that lands
    between the read and the wait is never lost.

    Thread-safety: thread-safe; events are set outside the internal lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[TopicPartition, set[threading.Event]] = {}
        # Watchers see every notified key (None = all): a leader's fetch sessions, which stay
        # registered for as long as they live instead of once per parked round (fetch_session.py).
        # A tuple, replaced on change: notify reads it without the lock.
        self._watchers: tuple[Any, ...] = ()

    @contextmanager
    def waiting(self, keys: list[TopicPartition], event: Any = None) -> Iterator[Any]:
        """Register one event under ``keys`` for the duration of the block: ``event`` (anything
        with ``set()``, e.g. a wake-up that resumes a request on an event loop) or a new
        ``threading.Event``."""
        event = event if event is not None else threading.Event()
        self.register(keys, event)
        try:
            yield event
        finally:
            self.unregister(keys, event)

    def register(self, keys: list[TopicPartition], event: Any) -> None:
        """``waiting`` without the context manager, for the hot paths (a parked fetch, an acks=all
        wait): match each with one ``unregister`` of the same keys and event."""
        with self._lock:
            by_key = self._by_key
            for k in keys:
                events = by_key.get(k)
                if events is None:
                    by_key[k] = {event}
                else:
                    events.add(event)

    def unregister(self, keys: list[TopicPartition], event: Any) -> None:
        with self._lock:
            by_key = self._by_key
            for k in keys:
                events = by_key.get(k)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del by_key[k]

    def watch(self, watcher: Any) -> None:
        """Call ``watcher.changed(keys)`` on every ``notify`` from now on (``keys`` a list, or None
        for all), until ``unwatch``. It runs on the notifying thread: it must be quick."""
        with self._lock:
            self._watchers = (*self._watchers, watcher)

    def unwatch(self, watcher: Any) -> None:
        with self._lock:
            self._watchers = tuple(w for w in self._watchers if w is not watcher)

    def notify(self, keys: Iterable[TopicPartition] | None) -> None:
        """Set the events waiting on ``keys``; None wakes every waiter."""
        watchers = self._watchers
        if watchers and keys is not None and not isinstance(keys, list):
            keys = list(keys)  # read twice: by the events and by the watchers
        with self._lock:
            if keys is None:
                events = {e for evs in self._by_key.values() for e in evs}
            else:
                events = {e for k in keys for e in self._by_key.get(k, ())}
        for e in events:
            e.set()
        for w in watchers:
            w.changed(keys)


class OffsetWaiters:
    """Per-partition wake-ups for requests waiting until the HW passes an offset of theirs
    (acks=all produces): an HW move wakes only those it satisfied.

    Why: a producer pipelining small requests keeps several waiting on one partition, and a
    round of follower fetches that moves the HW past some of them used to wake every one, the
    rest only to wait again; each of those wake-ups is a thread switch, which on a small VM costs
    more than the check itself (issue 32).

    Contract: ``waiting([(key, offset)], event)`` registers ``event`` for the block; ``passed(key,
    hw)`` sets the events registered under ``key`` with ``offset < hw``. Other wake-ups
    (leadership, the ISR, stopping) still come through ``Waiters`` on the partition's key.
    Thread-safety: thread-safe; events are set outside the internal lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[TopicPartition, list[tuple[int, threading.Event]]] = {}

    @contextmanager
    def waiting(self, offsets: list[tuple[TopicPartition, int]], event: threading.Event) -> Iterator[None]:
        entries = self.register(offsets, event)
        try:
            yield
        finally:
            self.unregister(entries)

    def register(self, offsets: list[tuple[TopicPartition, int]], event: Any) -> list:
        """``waiting`` without the context manager: returns what ``unregister`` takes back."""
        entries = [(key, (offset, event)) for key, offset in offsets]
        with self._lock:
            for key, entry in entries:
                self._by_key.setdefault(key, []).append(entry)
        return entries

    def unregister(self, entries: list) -> None:
        with self._lock:
            for key, entry in entries:
                waiting = self._by_key.get(key)
                if waiting is not None:
                    try:
                        waiting.remove(entry)
                    except ValueError:
                        pass
                    if not waiting:
                        del self._by_key[key]

    def passed(self, key: TopicPartition, hw: int) -> None:
        with self._lock:
            waiting = self._by_key.get(key)
            events = [event for offset, event in waiting if offset < hw] if waiting else ()
        for event in events:
            event.set()


@dataclass
class AssignmentChanges:
    """What ``PartitionRegistry.apply_assignment`` changed: partitions whose role or leader epoch
    changed (with the new role), partitions led here whose replica set changed under the same
    epoch (``resized``: a reassignment step; the leader tracks other followers now), and
    partitions no longer assigned here (already unhosted; their logs are still open, for the
    caller to delete)."""

    became: list[tuple[Partition, str]] = field(default_factory=list)
    removed: list[Partition] = field(default_factory=list)
    resized: list[Partition] = field(default_factory=list)


class PartitionRegistry:
    """The partitions this replica hosts, keyed by (topic, partition), and the live-broker set.

    Contract:

    * ``get`` raises UNKNOWN_TOPIC_OR_PARTITION for a partition not hosted here; ``find`` returns
      None instead (for paths where a missing partition is not an error of the caller).
    * The hosted set changes only through ``apply_assignment`` (the metadata said so), atomically
      with respect to other assignments and ``close_logs``.
    * ``live_brokers`` is the set the low watermark is computed over (Kafka counts replicas on live
      brokers, not only the ISR); ``update_live_brokers`` says whether it changed.
    * ``notify``/``waiting`` wake requests parked on partitions (see ``Waiters``).

    Thread-safety: thread-safe. Lookups (``get``/``find``) read the map without the lock (a dict
    read is atomic and they are on every produce and fetch); listings copy it under the lock.
    """

    def __init__(self, *, broker_id: int) -> None:
        self.broker_id = broker_id
        self._parts: dict[TopicPartition, Partition] = {}
        # Reentrant: an open_partition callback may list the registry while an assignment runs.
        self._lock = threading.RLock()
        self._live_brokers: frozenset[int] = frozenset()
        self._live_lock = threading.Lock()
        self._waiters = Waiters()
        # Moves whenever an assignment changed what is hosted or any hosted partition's role,
        # leader or leader epoch: a follower fetcher lists its partitions again only then.
        self.version = 0

    # -- lookups --------------------------------------------------------------------------------
    def get(self, topic: str, partition: int) -> Partition:
        """The hosted partition, or raise UnknownTopicOrPartition."""
        p = self._parts.get((topic, partition))
        if p is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} is not hosted on replica {self.broker_id}")
        return p

    def find(self, topic: str, partition: int) -> Partition | None:
        """The hosted partition, or None."""
        return self._parts.get((topic, partition))

    def all(self) -> list[Partition]:
        """Every hosted partition (a snapshot)."""
        with self._lock:
            return list(self._parts.values())

    def leading(self) -> list[Partition]:
        """The hosted partitions this replica leads."""
        return [p for p in self.all() if p.role == LEADER]

    def following(self, leader_id: int) -> list[Partition]:
        """The hosted partitions this replica follows from ``leader_id``."""
        return [p for p in self.all() if p.role == FOLLOWER and p.leader_id == leader_id]

    # -- assignment -----------------------------------------------------------------------------
    def apply_assignment(self, states: Mapping[TopicPartition, PartitionState], *,
                         open_partition: Callable[[TopicPartition], Partition]) -> AssignmentChanges:
        """Host exactly the partitions of ``states`` and apply each state.

        ``open_partition`` builds a partition not hosted yet. Partitions not in ``states`` are
        unhosted and returned in ``removed``; the caller deletes their logs.
        """
        changes = AssignmentChanges()
        with self._lock:
            hosted_before = len(self._parts)
            for tp, st in states.items():
                p = self._parts.get(tp)
                if p is None:
                    p = self._parts[tp] = open_partition(tp)
                role = p.apply_state(st)
                if role == REPLICAS_CHANGED:
                    changes.resized.append(p)
                elif role:
                    changes.became.append((p, role))
            gone = [tp for tp in self._parts if tp not in states]
            changes.removed = [self._parts.pop(tp) for tp in gone]
            if changes.became or changes.removed or changes.resized or len(self._parts) != hosted_before:
                self.version += 1
        return changes

    def close_logs(self, *, threads: int = 1) -> None:
        """Close every hosted log (clean shutdown) on up to ``threads`` threads (each close writes
        a producer snapshot: fsyncs, which run in parallel); no assignment runs meanwhile."""
        with self._lock:
            logs = [p.log for p in self._parts.values()]
            if threads < 2 or len(logs) < 2:
                for plog in logs:
                    plog.close()
                return
            with ThreadPoolExecutor(max_workers=min(threads, len(logs)), thread_name_prefix="log-close") as pool:
                for future in [pool.submit(plog.close) for plog in logs]:
                    future.result()

    # -- live brokers ---------------------------------------------------------------------------
    @property
    def live_brokers(self) -> frozenset[int]:
        return self._live_brokers

    def update_live_brokers(self, live: Iterable[int]) -> bool:
        """Adopt the brokers holding a live session; returns whether the set changed."""
        live = frozenset(live)
        with self._live_lock:
            if live == self._live_brokers:
                return False
            self._live_brokers = live
            return True

    # -- wake-ups -------------------------------------------------------------------------------
    def notify(self, keys: Iterable[TopicPartition] | None = None) -> None:
        """Wake requests parked on these partitions (data, HW, LSO or leadership changed); None = all."""
        self._waiters.notify(keys)

    def watch(self, watcher: Any) -> None:
        """See every notified key from now on (``Waiters.watch``)."""
        self._waiters.watch(watcher)

    def unwatch(self, watcher: Any) -> None:
        self._waiters.unwatch(watcher)

    def waiting(self, keys: list[TopicPartition], event: Any = None) -> AbstractContextManager[Any]:
        """Context manager: an event set whenever one of ``keys`` is notified (``event`` if given,
        see ``Waiters.waiting``)."""
        return self._waiters.waiting(keys, event)

    def register_waiter(self, keys: list[TopicPartition], event: Any) -> None:
        """``waiting`` without the context manager (``Waiters.register``); undo with ``unregister_waiter``."""
        self._waiters.register(keys, event)

    def unregister_waiter(self, keys: list[TopicPartition], event: Any) -> None:
        self._waiters.unregister(keys, event)
