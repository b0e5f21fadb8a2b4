"""An internal topic's spec, its creation on first need, and how its users reach a leader.

Every internal topic is created by whichever server needs it first (a front door's first offset
commit, a coordinator shard's start); several may race, and the metadata store's create is atomic,
so the loser reads the winner's topic (``TopicAlreadyExists``). How the topic is created differs by
user (the front door goes through its topic admin, which picks the replication factor and checks
the config; a coordinator assigns the replicas itself: it may not import the front door), so the
creating call is a parameter; reading the store, the race and the log line are here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from lowtide.errors import TopicAlreadyExists, UnknownTopicOrPartition
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InternalTopicSpec:
    """What an internal topic is created with: its name, partition count and topic config (immutable)."""

    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)


# Creates the topic of a spec (the store or the topic admin); raises TopicAlreadyExists on a lost race.
Creator = Callable[[InternalTopicSpec], TopicInfo]


def ensure_topic(store: MetadataStore, spec: InternalTopicSpec,
                 create: Creator | None) -> tuple[TopicInfo | None, bool]:
    """The topic's info and whether this call created it; ``(None, False)`` when it is missing and
    ``create`` is None. Errors of ``create`` other than a lost race are raised as they are."""
    try:
        return store.topic(spec.name), False
    except UnknownTopicOrPartition:
        if create is None:
            return None, False
    try:
        info = create(spec)
    except TopicAlreadyExists:  # another server won the race: its topic is the one
        return store.topic(spec.name), False
    log.info("created %s", spec.name, extra={"fields": {
        "partitions": info.partitions, "replication_factor": info.replication_factor}})
    return info, True


class InternalTopic:
    """An internal topic whose partition count a user caches: created on first need.

    Contract: ``partition_count(create=True)`` returns the topic's partition count, creating the
    topic if it is missing (``on_created`` then runs once, in the creating call, after the count is
    cached, so it may append to the topic); ``create=False`` returns None while it is missing. The
    count is read from the store once and cached: internal topics never gain partitions.

    Thread-safety: thread-safe; a lock guards the cached count, never held during I/O (two callers
    may both look the topic up; only the store's atomic create decides who creates it).
    """

    def __init__(self, *, spec: InternalTopicSpec, store: MetadataStore, create: Creator,
                 on_created: Callable[[TopicInfo], None] | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self._store = store
        self._create = create
        self._on_created = on_created
        self._lock = threading.Lock()
        self._partitions: int | None = None  # None: not known to exist (yet)

    def partition_count(self, *, create: bool = True) -> int | None:
        """The topic's partition count (class doc)."""
        with self._lock:
            if self._partitions is not None:
                return self._partitions
        info, created = ensure_topic(self._store, self.spec, self._create if create else None)
        if info is None:
            return None
        self.note_partitions(info.partitions)
        if created and self._on_created is not None:
            self._on_created(info)
        return info.partitions

    def note_partitions(self, partitions: int) -> None:
        """Record the partition count a reader found in the store."""
        with self._lock:
            self._partitions = partitions


class LeaderRouter(Protocol):
    """Where a partition of an internal topic is led, as an appender or reader asks it.

    ``cached_leader`` must not block (an appender on an event loop asks it before each append);
    ``find_leader`` may (a metadata store lookup) and raises the LowtideError that says why there
    is no leader now; ``forget_leader`` drops what a failed call proved stale.

    Thread-safety: an implementation is called from any thread that appends or reads.
    """

    def cached_leader(self, partition: int) -> str | None: ...

    def find_leader(self, partition: int, *, refresh: bool) -> str: ...

    def forget_leader(self, partition: int) -> None: ...
