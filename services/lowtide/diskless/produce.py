"""Diskless produce on a broker (KIP-1164): many producers' batches -> one WAL file -> commits.

Flow of one Produce of a diskless partition::

    request thread   validate the batches (as on classic topics); refuse the request while
                     ``max_waiting_requests`` (48) others wait (see ``_enqueue``); under one
                     lock, append every item of the request to the open file and close it at
                     once when fewer than ``files_in_flight`` (1) files are between close and
                     answer, or when it holds diskless.buffer.max.bytes (8 MiB); wait for the
                     items' outcomes (up to the request's timeout)
    upload pool      joins a closed file's batches into one object and puts it (a file closed
                     by size or interval uploads while the one ahead of it still does)
    committer thread per file, in close order: wait for its upload; CommitFile to every shard
                     concerned in parallel (each gets only its own batches; the owner list is
                     those shards, randomly permuted); resolve every item with its assigned base
                     offset or its error (idempotence errors included) -- only now is a
                     producer answered; then the file's slot is free: close the open file if it
                     holds anything
    flusher thread   closes the open file diskless.commit.interval.ms (250) after its first
                     batch, however many files are in flight: the longest a batch lingers

Why close on a free slot (group commit), not on a timer: a producer is answered only once its file
commits, and a file costs one upload and one CommitFile per shard whatever it holds. Closed only by
the interval (or at 8 MiB), a file made every producer with one request in flight wait a whole
interval per request, however idle the broker: 16 closed-loop producers of 256 KiB reached 0.13 x
classic produce. Closing as soon as a slot is free makes an idle broker's latency one upload plus
one commit; under load, batches gather in the open file while the files in flight upload and
commit, so a file grows with the load and the cost per byte falls with it -- as Kafka's producer
lingers only while its max.in.flight requests are under way. One slot by default: each file costs
CPU (the CommitFile, the shard's metadata-log append, the applies) and on the 2-core bench machine
CPU is what runs out, so fewer, larger files win; with 2 slots the next file uploads while the
previous one commits, but the same bytes go in twice as many files and 16 closed-loop producers got
22-53 MB/s against 43-62 with one (tests/bench/diskless_scaling.py, same runs). Raise it where the
object store's latency, not CPU, bounds a broker (S3). A file reaching diskless.buffer.max.bytes
closes even with no slot free (a file's size stays bounded; the producers' requests in flight bound
the memory), and the interval bounds the linger when commits are slow.

Transactions (docs/design/diskless.md#transactions): a transactional batch goes in like any other,
flagged TXN_DATA in the CommitFile (read from its header's attributes), and the shard starts the
producer's transaction in the partition at its offset. A transaction marker (``write_markers``: the
replica's WriteTxnMarkers for a diskless partition) is a control batch built here, buffered and
committed the same way, flagged TXN_COMMIT / TXN_ABORT: so it lies in a WAL file like any batch and a
fetch serves its bytes as a classic log's control batch. Clients' control batches stay refused.

Files commit in close order so an idempotent producer's consecutive requests reach its shard in
sequence order even when they went into different files; a request's items are added under one
lock so that its partitions' batches stay in one file (a request is not split into files, one per
item, by the free slots). A file no shard can have recorded (every shard's call failed before it
could append: no registered leader, or a non-retriable rejection) is deleted on the spot; after
an uncertain failure (timeout, leader change) the file is left: if a shard recorded it, the shard
owns it; if none did, the orphan scanner removes it. Batches stay bytes from end to end:
validation is ``validate_batches`` (C record walk), layout is a list of byte strings joined once,
in the upload thread (not under the lock the request threads take).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from lowtide.client.diskless import DisklessCoordinatorClient
from lowtide.diskless.topics import shard_of, topic_id_bytes
from lowtide.diskless.wal import WalFileBuilder, new_object_key
from lowtide.errors import (
    CoordinatorNotAvailable,
    InvalidRecord,
    KafkaStorageError,
    LowtideError,
    MessageTooLarge,
    RequestTimedOut,
)
from lowtide.messages.coordinator import TXN_ABORT, TXN_COMMIT, TXN_DATA, TXN_NONE, BatchToCommit, CommitResult
from lowtide.metadata.model import TopicInfo
from lowtide.objectstore import ObjectStore
from lowtide.record import BatchHeader, validate_batches
from lowtide.record.control import build_marker_batch

log = logging.getLogger(__name__)
DEFAULT_MAX_MESSAGE_BYTES = 1048588


@dataclass(frozen=True, kw_only=True)
class DisklessConfig:
    """A broker's diskless settings (Kafka-style names in the flags: diskless.commit.interval.ms,
    diskless.buffer.max.bytes). ``files_in_flight``: files closed and not yet answered before the
    open file waits for a slot (see the module doc)."""

    broker_id: int
    commit_interval_ms: int = 250
    buffer_max_bytes: int = 8 * 1024 * 1024
    files_in_flight: int = 1
    # Below the replica's gRPC handler threads (--max-workers, 64): see DisklessProducer.produce.
    max_waiting_requests: int = 48
    commit_timeout_s: float = 30.0
    upload_threads: int = 2
    cache_max_bytes: int = 64 * 1024 * 1024
    fetch_poll_ms: int = 100


@dataclass(frozen=True, slots=True)
class DisklessAppend:
    """Where a produced item landed: its first batch's assigned offset and the partition's LSO."""

    base_offset: int
    log_start_offset: int
    log_append_time: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferState:
    """What the produce buffer holds now, and why its files closed so far (for tests and gauges).

    ``closed``: files closed per reason -- "slot" (a slot was free), "size" (buffer.max.bytes),
    "interval" (commit.interval.ms), "stop"; ``items_closed``: produce items in those files;
    ``waiting_requests``: produce calls waiting for their files now; ``refused_requests``: calls
    refused so far because ``max_waiting_requests`` were waiting.
    """

    files_in_flight: int
    waiting_requests: int
    refused_requests: int
    buffered_items: int
    buffered_bytes: int
    closed: dict[str, int]
    items_closed: int


@dataclass(eq=False)
class _Item:
    """One produced (topic, partition, batches) waiting in a file."""

    info: TopicInfo
    partition: int
    shard: int
    headers: list[BatchHeader]
    records: bytes
    marker: int = TXN_NONE              # TXN_COMMIT / TXN_ABORT: the item is one transaction marker
    position: int = -1                  # byte offset of its first batch in the file
    outcome: DisklessAppend | LowtideError | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _File:
    key: str
    builder: WalFileBuilder = field(default_factory=WalFileBuilder)
    items: list[_Item] = field(default_factory=list)
    opened: float = field(default_factory=time.monotonic)
    upload: Future | None = None
    data: bytes = b""                   # the file's bytes once uploaded (kept for the fetch cache)


CommittedListener = Callable[[str, list[tuple[str, int, int, int, bytes]]], None]


class DisklessProducer:
    """Buffers produced batches of diskless partitions into WAL files and commits them.

    Contract: ``produce(items, timeout_ms)`` returns one ``DisklessAppend | LowtideError`` per item,
    in order, once the item's file is committed (or REQUEST_TIMED_OUT after ``timeout_ms``: it may
    still commit); while ``max_waiting_requests`` calls are waiting, a further one is refused at
    once with KAFKA_STORAGE_ERROR (retriable), nothing of it written.
    ``on_committed(object_key, [(topic, partition, position, size, data)])`` is told of the bytes
    of every accepted batch (the fetch cache and parked fetches use it).
    Thread-safety: ``produce`` may be called from any number of threads; ``stop`` once.
    """

    def __init__(self, *, config: DisklessConfig, store: ObjectStore, coordinators: DisklessCoordinatorClient,
                 on_committed: CommittedListener | None = None) -> None:
        if config.files_in_flight < 1:
            raise ValueError(f"files_in_flight must be at least 1, got {config.files_in_flight}")
        self.config = config
        self.store = store
        self.coordinators = coordinators
        self.on_committed = on_committed
        # One lock for the open file, the count in flight and the committer's queue: a close takes
        # the file, counts it and queues it in one step, so the queue order is the close order.
        self._lock = threading.Condition()
        self._open: _File | None = None
        self._in_flight = 0
        self._waiting = 0                # produce calls waiting for their items' files
        self._refused = 0
        self._queue: deque[_File] = deque()
        self._closed = {"slot": 0, "size": 0, "interval": 0, "stop": 0}
        self._items_closed = 0
        self._stop = threading.Event()
        self._uploads = ThreadPoolExecutor(max_workers=config.upload_threads, thread_name_prefix="diskless-upload")
        self._commits = ThreadPoolExecutor(max_workers=4, thread_name_prefix="diskless-commit")
        self._threads = [threading.Thread(target=self._flush_loop, name="diskless-flusher", daemon=True),
                         threading.Thread(target=self._commit_loop, name="diskless-committer", daemon=True)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Flush what is buffered, finish the queued commits (bounded), then stop."""
        with self._lock:
            self._close_open_locked("stop")
            self._stop.set()
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=self.config.commit_timeout_s)
        self._uploads.shutdown(wait=False, cancel_futures=True)
        self._commits.shutdown(wait=False, cancel_futures=True)

    def buffer_state(self) -> BufferState:
        with self._lock:
            file = self._open
            return BufferState(files_in_flight=self._in_flight, waiting_requests=self._waiting,
                               refused_requests=self._refused, buffered_items=len(file.items) if file else 0,
                               buffered_bytes=file.builder.size if file else 0, closed=dict(self._closed),
                               items_closed=self._items_closed)

    # ---- request side ------------------------------------------------------------------------
    def produce(self, items: Sequence[tuple[TopicInfo, int, bytes]], *,
                timeout_ms: int) -> list[DisklessAppend | LowtideError]:
        out: list[DisklessAppend | LowtideError | _Item] = []
        for info, partition, records in items:
            try:
                out.append(self._validate(info, partition, records))
            except LowtideError as exc:
                out.append(exc)
        return self._submit(out, timeout_ms=timeout_ms)

    def write_markers(self, items: Sequence[tuple[TopicInfo, int]], *, producer_id: int, producer_epoch: int,
                      commit: bool, coordinator_epoch: int, timeout_ms: int) -> list[DisklessAppend | LowtideError]:
        """Write one COMMIT (``commit``) or ABORT marker of the producer's transaction to each
        diskless partition, committed like produced batches; one answer per item, in order. A
        partition with no ongoing transaction of the producer (a retry) answers success with base
        offset -1, nothing written; an epoch older than the producer's is INVALID_PRODUCER_EPOCH."""
        batch = build_marker_batch(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                                   coordinator_epoch=coordinator_epoch, timestamp_ms=int(time.time() * 1000))
        headers = validate_batches(batch)
        out: list[DisklessAppend | LowtideError | _Item] = []
        for info, partition in items:
            try:
                out.append(_Item(info=info, partition=partition, shard=shard_of(info, partition), headers=headers,
                                 records=batch, marker=TXN_COMMIT if commit else TXN_ABORT))
            except LowtideError as exc:
                out.append(exc)
        return self._submit(out, timeout_ms=timeout_ms)

    def _submit(self, out: list[DisklessAppend | LowtideError | _Item], *,
                timeout_ms: int) -> list[DisklessAppend | LowtideError]:
        accepted = [entry for entry in out if isinstance(entry, _Item)]
        if not accepted:
            return [entry for entry in out if not isinstance(entry, _Item)]  # errors only
        try:
            self._enqueue(accepted)
        except LowtideError as exc:
            return [exc if isinstance(entry, _Item) else entry for entry in out]
        try:
            return self._await(out, timeout_ms=timeout_ms)
        finally:
            with self._lock:
                self._waiting -= 1

    @staticmethod
    def _await(out: list[DisklessAppend | LowtideError | _Item], *,
               timeout_ms: int) -> list[DisklessAppend | LowtideError]:
        deadline = time.monotonic() + max(1, timeout_ms) / 1000
        results: list[DisklessAppend | LowtideError] = []
        for entry in out:
            if not isinstance(entry, _Item):
                results.append(entry)
                continue
            if not entry.done.wait(max(0.0, deadline - time.monotonic())) or entry.outcome is None:
                results.append(RequestTimedOut(f"{entry.info.name}-{entry.partition}: the WAL file was not "
                                               f"committed within {timeout_ms} ms (it may still be)"))
            else:
                results.append(entry.outcome)
        return results

    def _validate(self, info: TopicInfo, partition: int, records: bytes) -> _Item:
        shard = shard_of(info, partition)
        headers = validate_batches(records)
        if any(h.is_control for h in headers):
            raise InvalidRecord(f"control batches are not allowed from clients ({info.name}-{partition})")
        limit = int(info.config.get("max.message.bytes", DEFAULT_MAX_MESSAGE_BYTES))
        for h in headers:
            if h.size_in_bytes > limit:
                raise MessageTooLarge(f"batch of {h.size_in_bytes} bytes exceeds max.message.bytes {limit} "
                                      f"of {info.name}-{partition}")
        return _Item(info=info, partition=partition, shard=shard, headers=headers, records=records)

    def _enqueue(self, items: list[_Item]) -> None:
        with self._lock:
            # Checked under the lock stop() closes under: no item joins a file after the last close.
            if self._stop.is_set():
                raise KafkaStorageError("this broker is shutting down")
            # A waiting request holds one of the replica's gRPC handler threads until its file
            # commits, and the commit waits for the shard's metadata-log append, a Produce to some
            # replica that needs a handler thread there. Were every thread of that replica taken
            # by waiting diskless produces (closed-loop producers drift to the slowest broker),
            # nothing would commit until the requests timed out (30 s). So beyond the bound a
            # request is refused at once, retriably; nothing of it was written.
            if self._waiting >= self.config.max_waiting_requests:
                self._refused += 1
                raise KafkaStorageError(f"{self._waiting} produce requests are already waiting for diskless "
                                        f"commits on this broker; retry")
            self._waiting += 1
            for item in items:
                if self._open is None:
                    self._open = _File(key=new_object_key())
                    self._lock.notify_all()  # the flusher times the new file's interval
                file = self._open
                item.position = file.builder.add(item.records)
                file.items.append(item)
                if file.builder.size >= self.config.buffer_max_bytes:
                    self._close_open_locked("size")
            if self._in_flight < self.config.files_in_flight:
                self._close_open_locked("slot")

    # ---- closing files ---------------------------------------------------------------------------
    def _close_open_locked(self, reason: str) -> None:
        file, self._open = self._open, None
        if file is None or not file.items:
            return
        self._in_flight += 1
        self._closed[reason] += 1
        self._items_closed += len(file.items)
        file.upload = self._uploads.submit(self._upload, file)
        self._queue.append(file)
        self._lock.notify_all()

    def _upload(self, file: _File) -> None:
        data = file.builder.build()
        self.store.put(file.key, data)
        file.data = data  # read by the committer after upload.result(): the future orders it

    def _flush_loop(self) -> None:
        interval = self.config.commit_interval_ms / 1000
        with self._lock:
            while not self._stop.is_set():
                file = self._open
                if file is None:
                    self._lock.wait(0.5)
                    continue
                left = file.opened + interval - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                if self._open is file:
                    self._close_open_locked("interval")

    # ---- committer -------------------------------------------------------------------------------
    def _commit_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stop.is_set():
                    self._lock.wait(0.5)
                if not self._queue:
                    return
                file = self._queue.popleft()
            try:
                self._commit(file)
            except Exception as exc:  # noqa: BLE001 - never leave a producer waiting
                log.exception("diskless commit failed")
                self._resolve_all(file, KafkaStorageError(f"commit of {file.key} failed: {exc}"))
            with self._lock:
                # The file's slot is free: what gathered meanwhile goes now, as one file.
                self._in_flight -= 1
                if self._in_flight < self.config.files_in_flight:
                    self._close_open_locked("slot")

    def _resolve_all(self, file: _File, error: LowtideError) -> None:
        for item in file.items:
            if item.outcome is None:
                item.outcome = error
            item.done.set()

    def _commit(self, file: _File) -> None:
        assert file.upload is not None
        try:
            file.upload.result(timeout=self.config.commit_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the store's errors and timeouts alike
            error = exc if isinstance(exc, LowtideError) else KafkaStorageError(f"upload of {file.key}: {exc}")
            self._resolve_all(file, error)
            self._delete_quietly(file.key)  # a partial upload is invisible, but a complete one may not be
            return
        by_shard: dict[int, list[tuple[_Item, int, BatchHeader, BatchToCommit]]] = {}
        for item in file.items:
            topic_id = topic_id_bytes(item.info)
            position = item.position
            for index, h in enumerate(item.headers):
                size = h.size_in_bytes
                by_shard.setdefault(item.shard, []).append((item, index, h, BatchToCommit(
                    topic_id=topic_id, partition=item.partition, byte_offset=position, size=size,
                    base_offset=h.base_offset, last_offset=h.base_offset + h.last_offset_delta,
                    max_timestamp=h.max_timestamp, timestamp_type=h.timestamp_type, producer_id=h.producer_id,
                    producer_epoch=h.producer_epoch if h.producer_id >= 0 else -1,
                    base_sequence=h.base_sequence if h.producer_id >= 0 else -1,
                    last_sequence=(h.base_sequence + h.last_offset_delta) % (2**31)
                    if h.producer_id >= 0 and item.marker == TXN_NONE else -1,
                    txn_kind=item.marker or (TXN_DATA if h.is_transactional else TXN_NONE))))
                position += size
        owners = list(by_shard)
        random.shuffle(owners)
        size = len(file.data)

        def commit_to(shard: int) -> list[CommitResult]:
            return self.coordinators.commit_file(
                shard, object_key=file.key, file_size=size, owner_ids=owners,
                batches=[b for _, _, _, b in by_shard[shard]], uploader_broker_id=self.config.broker_id,
                timeout_s=self.config.commit_timeout_s)

        futures = {shard: self._commits.submit(commit_to, shard) for shard in owners}
        certain_failures = 0
        committed: list[tuple[str, int, int, int, bytes]] = []
        data = file.data
        for shard, future in futures.items():
            entries = by_shard[shard]
            try:
                results = future.result()
                if len(results) != len(entries):
                    raise KafkaStorageError(f"shard {shard} answered {len(results)} results for {len(entries)} batches")
            except Exception as exc:  # noqa: BLE001
                error = exc if isinstance(exc, LowtideError) else KafkaStorageError(str(exc))
                if isinstance(exc, CoordinatorNotAvailable) or not error.retriable:
                    certain_failures += 1
                for item, _, _, _ in entries:
                    item.outcome = item.outcome if isinstance(item.outcome, LowtideError) else error
                continue
            for (item, index, _h, batch), result in zip(entries, results, strict=True):
                if isinstance(item.outcome, LowtideError):
                    continue
                if result.error is not None:
                    item.outcome = result.error
                    continue
                if index == 0:
                    item.outcome = DisklessAppend(base_offset=result.base_offset,
                                                  log_start_offset=result.log_start_offset,
                                                  log_append_time=result.log_append_time)
                if not result.is_duplicate:
                    committed.append((item.info.name, item.partition, batch.byte_offset, batch.size,
                                      data[batch.byte_offset:batch.byte_offset + batch.size]))
        if certain_failures == len(owners):
            self._delete_quietly(file.key)
        if committed and self.on_committed is not None:
            try:
                self.on_committed(file.key, committed)
            except Exception:  # noqa: BLE001 - a cache refresh must not fail a commit
                log.exception("diskless on_committed listener failed")
        self._resolve_all(file, KafkaStorageError("no result for this batch"))

    def _delete_quietly(self, key: str) -> None:
        try:
            self.store.delete(key)
        except Exception as exc:  # noqa: BLE001 - the orphan scanner removes it later
            log.warning("could not delete uncommitted WAL file", extra={"fields": {"key": key, "error": str(exc)}})

