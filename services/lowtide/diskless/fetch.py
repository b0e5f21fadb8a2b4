"""Diskless fetch on a broker (KIP-1164): FindBatches on the shards, ranged reads of WAL files.

One round of a Fetch::

    FindBatches(partition, offset, byte budgets) on each shard concerned (may be slightly stale)
      -> per partition: LSO, HW and the batches from the one holding ``offset``, within budget
         (READ_COMMITTED: below the last stable offset, with the aborted transactions overlapping
         them, which the client drops as it does a classic partition's)
    bytes of each batch: the range cache, else one ranged GET per run of adjacent batches of the
      same object (coalesced), whose batches then enter the cache
    BaseOffset of each batch := the offset the coordinator assigned (8 bytes per batch, outside
      the CRC; see wal.py)

A consumer fetch with nothing to return waits for new data up to ``max_wait_ms``: it wakes at once
when this broker commits to one of its partitions and otherwise asks the shards again every
``fetch_poll_ms`` (another broker's commit is only seen that way), so waiting is bounded in time
and in calls. Nothing below the LSO is served: the shard answers OFFSET_OUT_OF_RANGE for it, and a
batch whose object is gone (deleted after the grace period) ends the partition's answer there.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lowtide.client.diskless import DisklessCoordinatorClient
from lowtide.diskless.topics import shard_of, topic_id_bytes
from lowtide.diskless.wal import rewrite_base_offsets
from lowtide.errors import KafkaStorageError, LowtideError
from lowtide.messages.coordinator import READ_COMMITTED, FoundBatch, FoundPartition
from lowtide.messages.replica import FetchedPartition, FetchPosition
from lowtide.metadata.model import TopicInfo
from lowtide.objectstore import ObjectStore
from lowtide.objectstore.base import ObjectNotFound

DEFAULT_RESPONSE_MAX_BYTES = 50 * 1024 * 1024


class RangeCache:
    """LRU of WAL file byte ranges, keyed (object key, byte offset), bounded by total bytes.

    Objects never change once written, so an entry is valid until evicted. Thread-safe.
    """

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str, offset: int, size: int) -> bytes | None:
        with self._lock:
            data = self._entries.get((key, offset))
            if data is None or len(data) != size:
                self.misses += 1
                return None
            self._entries.move_to_end((key, offset))
            self.hits += 1
            return data

    def put(self, key: str, offset: int, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop((key, offset), None)
            if old is not None:
                self._size -= len(old)
            self._entries[(key, offset)] = data
            self._size += len(data)
            while self._size > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._size -= len(evicted)


class CommitSignal:
    """Wakes parked diskless fetches when this broker committed to a partition. Thread-safe."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._generation = 0

    def notify(self) -> None:
        with self._cv:
            self._generation += 1
            self._cv.notify_all()

    @property
    def generation(self) -> int:
        return self._generation

    def wait(self, generation: int, timeout: float) -> None:
        with self._cv:
            if self._generation == generation:
                self._cv.wait(timeout)


@dataclass(frozen=True, slots=True)
class DisklessFetchItem:
    info: TopicInfo
    position: FetchPosition


class DisklessFetcher:
    """Reads diskless partitions for consumer fetches.

    Contract: ``fetch`` returns one ``FetchedPartition`` per item, in order (records = whole
    batches with their assigned base offsets, at most about ``max_bytes`` but always the first
    batch; ``log_end_offset`` = HW, ``leader_epoch`` -1), after at most ``max_wait_ms`` when nothing
    is there, or at once on an error or cancellation. Thread-safety: thread-safe.
    """

    def __init__(self, *, store: ObjectStore, coordinators: DisklessCoordinatorClient, cache: RangeCache,
                 signal: CommitSignal, poll_ms: int = 100) -> None:
        self.store = store
        self.coordinators = coordinators
        self.cache = cache
        self.signal = signal
        self.poll_s = poll_ms / 1000
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        self.signal.notify()

    def fetch(self, items: Sequence[DisklessFetchItem], *, max_wait_ms: int, min_bytes: int, max_bytes: int,
              cancelled: Callable[[], bool] = lambda: False, isolation_level: int = 0) -> list[FetchedPartition]:
        deadline = time.monotonic() + max(0, max_wait_ms) / 1000
        budget = max_bytes if max_bytes > 0 else DEFAULT_RESPONSE_MAX_BYTES
        while True:
            generation = self.signal.generation
            outcomes, size, errored = self._read_once(items, budget, isolation_level)
            left = deadline - time.monotonic()
            if size >= max(1, min_bytes) or errored or left <= 0 or self._stop.is_set() or cancelled():
                return outcomes
            self.signal.wait(generation, min(self.poll_s, left))

    def _read_once(self, items: Sequence[DisklessFetchItem], budget: int,
                   isolation_level: int = 0) -> tuple[list[FetchedPartition], int, bool]:
        by_shard: dict[int, list[int]] = {}
        outcomes: list[FetchedPartition | None] = [None] * len(items)
        for i, it in enumerate(items):
            try:
                by_shard.setdefault(shard_of(it.info, it.position.partition), []).append(i)
            except LowtideError as exc:
                outcomes[i] = FetchedPartition(topic=it.position.topic, partition=it.position.partition, error=exc)
        size = 0
        errored = any(o is not None for o in outcomes)
        for shard, indexes in by_shard.items():
            positions = [(topic_id_bytes(items[i].info), items[i].position.partition, items[i].position.fetch_offset,
                          items[i].position.max_bytes) for i in indexes]
            try:
                found = self.coordinators.find_batches(shard, positions, fetch_max_bytes=max(1, budget - size),
                                                       isolation_level=isolation_level)
                if len(found) != len(indexes):
                    raise KafkaStorageError(f"shard {shard} answered {len(found)} of {len(indexes)} partitions")
            except LowtideError as exc:
                errored = True
                for i in indexes:
                    outcomes[i] = FetchedPartition(topic=items[i].position.topic,
                                                   partition=items[i].position.partition, error=exc)
                continue
            by_key = {(f.topic_id, f.partition): f for f in found}
            for i, (topic_id, partition, _, _) in zip(indexes, positions, strict=True):
                f = by_key.get((topic_id, partition))
                outcome = self._materialise(items[i].position, f, committed=isolation_level == READ_COMMITTED)
                errored = errored or outcome.error is not None
                size += len(outcome.records)
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None], size, errored

    def _materialise(self, position: FetchPosition, found: FoundPartition | None, *,
                     committed: bool = False) -> FetchedPartition:
        topic, partition = position.topic, position.partition
        if found is None:
            return FetchedPartition(topic=topic, partition=partition,
                                    error=KafkaStorageError("the coordinator did not answer for this partition"))
        offsets = {"high_watermark": found.high_watermark, "log_start_offset": found.log_start_offset,
                   "log_end_offset": found.high_watermark}
        if committed:  # as a classic leader answers READ_COMMITTED: the LSO and the aborted list
            offsets.update(last_stable_offset=found.last_stable_offset,
                           aborted_transactions=found.aborted_transactions)
        if found.error is not None:
            return FetchedPartition(topic=topic, partition=partition, error=found.error, **offsets)
        try:
            records = self._read_batches(found.batches)
        except ObjectNotFound:
            # Deleted under us (past the grace period): the LSO moved past these batches.
            return FetchedPartition(topic=topic, partition=partition, **offsets)
        return FetchedPartition(topic=topic, partition=partition, records=records, **offsets)

    def _read_batches(self, batches: Sequence[FoundBatch]) -> bytes:
        if not batches:
            return b""
        parts: list[bytes | None] = [self.cache.get(b.object_key, b.byte_offset, b.byte_size) for b in batches]
        run: list[int] = []
        for i, b in enumerate(batches):
            if parts[i] is not None:
                continue
            if run:
                prev = batches[run[-1]]
                if prev.object_key != b.object_key or prev.byte_offset + prev.byte_size != b.byte_offset:
                    self._fill(batches, run, parts)
                    run = []
            run.append(i)
        if run:
            self._fill(batches, run, parts)
        out = bytearray(b"".join(parts))  # type: ignore[arg-type]
        placements = []
        position = 0
        for b in batches:
            placements.append((position, b.base_offset))
            position += b.byte_size
        rewrite_base_offsets(out, placements)
        return bytes(out)

    def _fill(self, batches: Sequence[FoundBatch], run: list[int], parts: list[bytes | None]) -> None:
        """One ranged GET for adjacent batches of one object; each batch then enters the cache."""
        first, last = batches[run[0]], batches[run[-1]]
        length = last.byte_offset + last.byte_size - first.byte_offset
        data = self.store.get(first.object_key, offset=first.byte_offset, length=length)
        if len(data) != length:
            raise KafkaStorageError(f"{first.object_key}: read {len(data)} of {length} bytes")
        for i in run:
            b = batches[i]
            start = b.byte_offset - first.byte_offset
            parts[i] = chunk = data[start:start + b.byte_size]
            self.cache.put(b.object_key, b.byte_offset, chunk)
