"""``Producer``: encodes RecordBatch v2 batches on the client and appends them at the leaders.

Partitioning (Kafka's): a keyed record goes to ``toPositive(murmur2(key)) % partitions``; unkeyed
records fill ~``batch_bytes`` batches that go round-robin over the partitions, one batch at a time
(Kafka's sticky partitioner, per batch). An explicit ``partition`` wins.

Batch size: ``batch_bytes`` (Kafka's batch.size), capped per topic so that a batch fits what the
leader accepts: at most the topic's ``max.message.bytes`` (MESSAGE_TOO_LARGE above it) and half its
``segment.bytes`` (RECORD_LIST_TOO_LARGE above the whole of it; half, so a segment holds more than
one batch), as the topic's metadata gives them. ``compression_type`` (Kafka's compression.type:
none, gzip, lz4 or zstd) compresses each batch; the size is counted before compression.

Sending: per leader, several partitions share one Produce request (up to ``request_bytes``), and up
to ``max_in_flight`` requests run at once across leaders and partitions. A partition never has two
requests in flight, so its batches are appended in the order they were built.
Retries follow the errors' behaviour attributes: a ``retriable`` error (NOT_LEADER_OR_FOLLOWER,
LEADER_NOT_AVAILABLE, an unreachable leader, NOT_ENOUGH_REPLICAS...) refreshes the metadata and
retries until ``delivery_timeout_ms``, except REQUEST_TIMED_OUT: an acks=all append that timed out
may already be in the log, so it is raised rather than written twice. MESSAGE_TOO_LARGE and
RECORD_LIST_TOO_LARGE (limits the metadata does not show: broker-wide defaults, a config changed
since) split the partition's largest batch and retry, as Kafka's producer splits a batch it was
refused: every batch of that request above half the largest is cut into batches at most that big,
in order, and later batches of the topic are built no bigger. A batch of one record cannot be split:
its error is raised. Every other error is raised.

Transactions (``transactional_id``, Kafka's transactional producer; acks must be all):
``init_transactions()`` gets the producer id and epoch (fencing any older producer of the id),
``begin_transaction()`` opens one, every send first adds its new partitions to it
(AddPartitionsToTxn), batches carry the transactional bit, the producer id/epoch and per-partition
base sequences, and ``commit_transaction()`` / ``abort_transaction()`` end it (``transactions.py``).
"""

from __future__ import annotations

import random
import struct
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from lowtide.client.admin import open_connections
from lowtide.client.partitioner import partition_for_key
from lowtide.client.transactions import TransactionManager
from lowtide.clock import now_ms
from lowtide.errors import (
    InvalidRequest,
    InvalidRequiredAcks,
    LeaderNotAvailable,
    LowtideError,
    MessageTooLarge,
    NotLeaderOrFollower,
    RecordListTooLarge,
    RequestTimedOut,
    UnknownTopicOrPartition,
)
from lowtide.messages.replica import ProducedPartition
from lowtide.record import (
    BATCH_HEADER_SIZE,
    TRANSACTIONAL_MASK,
    BatchBuilder,
    Compression,
    crc32c,
    decode_batch,
    read_header,
)
from lowtide.record.compression import BY_NAME, decompress
from lowtide.tls.config import ClientTls

MiB = 1 << 20
COMPRESSION_BY_NAME: Mapping[str, Compression] = BY_NAME  # Kafka's compression.type values
MIN_BATCH_BYTES = 1024


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """Where one batch landed: records ``base_offset .. base_offset + record_count - 1``."""

    topic: str
    partition: int
    base_offset: int
    record_count: int


@dataclass
class ProduceReport:
    records: int = 0
    bytes: int = 0  # key + value payload bytes
    batches: int = 0
    appends: list[BatchAppend] = field(default_factory=list)

    def base_offsets(self) -> dict[int, list[int]]:
        """Partition -> base offsets of its batches, in append order."""
        out: dict[int, list[int]] = {}
        for a in self.appends:
            out.setdefault(a.partition, []).append(a.base_offset)
        return out


@dataclass(slots=True)
class _Batch:
    data: bytes
    count: int


class Producer:
    """Produces to lowtide (module doc has the partitioning and retry rules).

    ``produce_values`` is synchronous: it returns once every batch is acknowledged per ``acks``.
    ``send``/``flush`` buffer single records and produce them on ``flush``. Not thread-safe: use one
    producer per thread (each runs its own small pool of in-flight requests).
    """

    def __init__(self, bootstrap: str, *, acks: int = -1, compression_type: str = "none", batch_bytes: int = MiB,
                 request_bytes: int = 4 * MiB, max_in_flight: int = 8, linger_ms: int = 0,
                 request_timeout_ms: int = 30_000, delivery_timeout_ms: int = 120_000,
                 metadata: Sequence[tuple[str, str]] = (), transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000, tls: ClientTls | None = None) -> None:
        if acks not in (-1, 0, 1):
            raise InvalidRequiredAcks(f"acks must be -1 (all), 0 or 1, got {acks}")
        if transactional_id is not None and acks != -1:
            raise InvalidRequiredAcks(f"a transactional producer needs acks=-1 (all), got {acks}")
        if compression_type not in COMPRESSION_BY_NAME:
            raise InvalidRequest(f"compression.type must be one of {', '.join(COMPRESSION_BY_NAME)}, "
                                 f"got {compression_type!r}")
        self.acks = acks
        self.compression = COMPRESSION_BY_NAME[compression_type]
        self.batch_bytes = max(MIN_BATCH_BYTES, batch_bytes)
        self.request_bytes = max(self.batch_bytes, request_bytes)
        self.max_in_flight = max(1, max_in_flight)
        self.linger_ms = linger_ms
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self._channels, self.admin, self.replicas, self.cluster = open_connections(bootstrap, metadata=metadata,
                                                                                   tls=tls)
        self._pool = ThreadPoolExecutor(max_workers=self.max_in_flight, thread_name_prefix="produce")
        self._rng = random.Random()
        self._buffer: dict[tuple[str, int | None], list[tuple[bytes | None, bytes | None]]] = {}
        self._buffered_bytes = 0
        # Topic -> batch size a leader refused (halved): limits its metadata did not show.
        self._refused_limits: dict[str, int] = {}
        self.transactions = (TransactionManager(self.admin, transactional_id=transactional_id,
                                                transaction_timeout_ms=transaction_timeout_ms)
                             if transactional_id is not None else None)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._channels.close()

    # -- transactions ------------------------------------------------------------------------
    def init_transactions(self) -> None:
        """Kafka's initTransactions: a producer id and a new epoch for the transactional id."""
        self._transactions().init()

    def begin_transaction(self) -> None:
        self._transactions().begin()

    def commit_transaction(self) -> None:
        """Send what ``send`` buffered, then commit: every record of the transaction becomes
        visible to read_committed consumers at once."""
        self.flush()
        self._transactions().end(commit=True)

    def abort_transaction(self) -> None:
        """Drop what ``send`` buffered and abort: read_committed consumers never see the records."""
        self._buffer, self._buffered_bytes = {}, 0
        self._transactions().end(commit=False)

    def _transactions(self) -> TransactionManager:
        if self.transactions is None:
            raise InvalidRequest("this producer has no transactional_id")
        return self.transactions

    # -- buffered single records -------------------------------------------------------------
    def send(self, topic: str, value: bytes | None, *, key: bytes | None = None, partition: int | None = None) -> None:
        """Buffer one record; it is produced by ``flush`` (or once a few batches are buffered)."""
        self._buffer.setdefault((topic, partition), []).append((key, value))
        self._buffered_bytes += len(value or b"") + len(key or b"")
        if self._buffered_bytes >= self.request_bytes:
            self.flush()

    def flush(self) -> ProduceReport:
        buffer, self._buffer, self._buffered_bytes = self._buffer, {}, 0
        report = ProduceReport()
        for (topic, partition), items in buffer.items():
            part = self.produce_values(topic, [v for _, v in items], keys=[k for k, _ in items], partition=partition)
            report.records += part.records
            report.bytes += part.bytes
            report.batches += part.batches
            report.appends += part.appends
        return report

    # -- the fast path -----------------------------------------------------------------------
    def produce_values(self, topic: str, values: Sequence[bytes | None], *,
                       keys: Sequence[bytes | None] | None = None, partition: int | None = None,
                       timestamp_ms: int | None = None) -> ProduceReport:
        """Produce ``values`` (with optional parallel ``keys``) and wait for the acknowledgements."""
        if keys is not None and len(keys) != len(values):
            raise InvalidRequest(f"{len(keys)} keys for {len(values)} values")
        self.cluster.add_topics([topic])
        meta = self.cluster.snapshot().topic(topic)
        partitions = len(meta.partitions)
        if partition is not None and not 0 <= partition < partitions:
            raise UnknownTopicOrPartition(f"partition {topic}-{partition} does not exist")
        batches = self.build_batches(values, keys=keys, partitions=partitions, partition=partition,
                                     timestamp_ms=timestamp_ms, batch_bytes=self.batch_bytes_for(topic), topic=topic)
        report = ProduceReport(records=len(values), batches=sum(len(b) for b in batches.values()),
                               bytes=sum(len(v) for v in values if v) + sum(len(k) for k in keys or () if k))
        report.appends = self.send_batches(topic, batches)
        return report

    def produce_encoded(self, topic: str, batches: Mapping[int, Sequence[bytes]]) -> list[BatchAppend]:
        """Append already-encoded RecordBatch v2 batches (any base offset; the leader assigns offsets)
        to each partition, in order, and wait for the acknowledgements (the Spark sink's path: its
        batches are built from Arrow columns in C, not record by record)."""
        self.cluster.add_topics([topic])
        partitions = len(self.cluster.snapshot().topic(topic).partitions)
        bad = [p for p in batches if not 0 <= p < partitions]
        if bad:
            raise UnknownTopicOrPartition(f"partition {topic}-{bad[0]} does not exist ({partitions} partitions)")
        txn = self.transactions
        if txn is not None:  # stamped with our producer fields, in order, as build_batches would
            return self.send_batches(topic, {p: [self._stamped(topic, p, b) for b in bs] for p, bs in batches.items()})
        return self.send_batches(topic, {p: [_Batch(b, read_header(b).record_count) for b in bs]
                                         for p, bs in batches.items()})

    def _stamped(self, topic: str, partition: int, batch: bytes) -> _Batch:
        txn = self._transactions()
        count = read_header(batch).record_count
        return _Batch(stamp_producer(batch, producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                                     base_sequence=txn.next_sequence((topic, partition), count)), count)

    def batch_bytes_for(self, topic: str) -> int:
        """The batch size for ``topic``: ``batch_bytes`` capped by the topic's limits (module doc)."""
        meta = self.cluster.snapshot().topic(topic)
        limit = batch_bytes_for_topic(meta.config, self.batch_bytes)
        return min(limit, self._refused_limits.get(topic, limit))

    def build_batches(self, values: Sequence[bytes | None], *, keys: Sequence[bytes | None] | None,
                      partitions: int, partition: int | None = None,
                      timestamp_ms: int | None = None, batch_bytes: int | None = None,
                      topic: str | None = None) -> dict[int, list[_Batch]]:
        """Encode the records into batches of at most ~``batch_bytes`` (default: the producer's)
        per partition (client-side, per record); a transactional producer's batches carry its
        producer fields and the next sequences of ``topic``'s partitions."""
        txn = self.transactions
        if txn is not None and topic is None:
            raise InvalidRequest("a transactional producer builds batches for a named topic")
        ts = timestamp_ms if timestamp_ms is not None else now_ms()
        out: dict[int, list[_Batch]] = {}
        builders: dict[int, BatchBuilder] = {}
        sticky = partition if partition is not None else self._rng.randrange(partitions)
        limit = _records_room(batch_bytes or self.batch_bytes, self.compression)
        if partition is None and keys is None and partitions > 1:
            # A bulk call of unkeyed records is spread evenly: each batch is at most an equal share
            # of the total, so every partition gets some (as Kafka's 16 KiB sticky batches would).
            total = sum(len(v) + 8 for v in values if v is not None) + len(values)
            limit = min(limit, max(4096, -(-total // partitions) + 64))

        def seal(p: int) -> None:
            builder = builders.pop(p)
            data = builder.build()
            if txn is not None:  # the sequence is known once the batch's record count is
                data = stamp_producer(data, producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                                      base_sequence=txn.next_sequence((topic, p), builder.record_count))
            out.setdefault(p, []).append(_Batch(data, builder.record_count))

        for i, value in enumerate(values):
            key = keys[i] if keys is not None else None
            if partition is not None:
                p = partition
            elif key is not None:
                p = partition_for_key(key, partitions)
            else:
                p = sticky
            builder = builders.get(p)
            if builder is not None and builder.size_estimate + len(value or b"") + len(key or b"") > limit:
                seal(p)
                if partition is None and key is None:
                    sticky = p = (sticky + 1) % partitions  # next unkeyed batch goes to the next partition
                builder = builders.get(p)
            if builder is None:
                builder = builders[p] = BatchBuilder(compression=self.compression)
            builder.append(timestamp_ms=ts, key=key, value=value)
        for p in list(builders):
            seal(p)
        return out

    def send_batches(self, topic: str, batches: dict[int, list[_Batch]]) -> list[BatchAppend]:
        """Append each partition's batches in order at its leader (module doc: pipelining, retries)."""
        if self.transactions is not None:
            self.transactions.add_partitions((topic, p) for p, bs in batches.items() if bs)
        queues = {p: deque(bs) for p, bs in batches.items() if bs}
        appends: list[BatchAppend] = []
        in_flight: set[int] = set()
        futures: dict[Future, list[tuple[int, list[_Batch]]]] = {}
        deadline = time.monotonic() + self.delivery_timeout_ms / 1000
        backoff_until = 0.0
        try:
            while any(queues.values()) or futures:
                if time.monotonic() >= backoff_until:
                    for address, request in self._plan_requests(topic, queues, in_flight,
                                                                self.max_in_flight - len(futures)):
                        for p, _ in request:
                            in_flight.add(p)
                        futures[self._pool.submit(self._produce, address, topic, request)] = request
                if not futures:
                    if time.monotonic() > deadline:
                        raise LeaderNotAvailable(f"{topic}: no leader to produce to before the delivery timeout")
                    time.sleep(0.05)
                    self.cluster.refresh()
                    continue
                done, _ = wait(list(futures), timeout=0.1, return_when=FIRST_COMPLETED)
                for future in done:
                    request = futures.pop(future)
                    retry = self._settle(topic, request, future, queues, appends, in_flight)
                    if retry:
                        if time.monotonic() > deadline:
                            raise retry
                        self.cluster.refresh()
                        backoff_until = time.monotonic() + 0.05
        finally:
            for future in futures:
                future.cancel()
        return appends

    def _plan_requests(self, topic: str, queues: dict[int, deque], in_flight: set[int],
                       slots: int) -> list[tuple[str, list[tuple[int, list[_Batch]]]]]:
        if slots <= 0:
            return []
        snapshot = self.cluster.snapshot()
        by_address: dict[str, list[int]] = {}
        missing = False
        for p, q in queues.items():
            if q and p not in in_flight:
                try:
                    by_address.setdefault(snapshot.leader_address(topic, p), []).append(p)
                except LeaderNotAvailable:
                    missing = True
        if missing:
            self.cluster.refresh()
        requests = []
        for address, parts in by_address.items():
            request: list[tuple[int, list[_Batch]]] = []
            size = 0
            share = max(self.batch_bytes, self.request_bytes // len(parts))
            for p in parts:
                taken, taken_bytes = [], 0
                q = queues[p]
                while q and (not taken or taken_bytes + len(q[0].data) <= share):
                    taken_bytes += len(q[0].data)
                    taken.append(q.popleft())
                if request and size + taken_bytes > self.request_bytes:
                    requests.append((address, request))
                    request, size = [], 0
                request.append((p, taken))
                size += taken_bytes
            if request:
                requests.append((address, request))
        # Requests beyond the free slots go back to their queues, in order, for the next round.
        for _, request in requests[slots:]:
            for p, taken in request:
                queues[p].extendleft(reversed(taken))
        return requests[:slots]

    def _produce(self, address: str, topic: str, request: list[tuple[int, list[_Batch]]]) -> list[ProducedPartition]:
        # The leader epoch we believe current goes along: a deposed leader answers
        # FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH instead of appending (both refresh metadata).
        partitions = self.cluster.snapshot().topics.get(topic)
        epochs = ({(topic, pm.partition): pm.leader_epoch for pm in partitions.partitions}
                  if partitions is not None else {})
        return self.replicas.produce(
            address, [(topic, p, b"".join(b.data for b in taken)) for p, taken in request], acks=self.acks,
            timeout_ms=self.request_timeout_ms, deadline_s=self.request_timeout_ms / 1000 + 5, leader_epochs=epochs)

    def _settle(self, topic: str, request: list[tuple[int, list[_Batch]]], future: Future, queues: dict[int, deque],
                appends: list[BatchAppend], in_flight: set[int]) -> LowtideError | None:
        """Record the outcome of one request; requeue retriable partitions; raise fatal errors."""
        retry: LowtideError | None = None
        try:
            results = {r.partition: r for r in future.result()}
        except LowtideError as err:
            if not _should_retry(err):
                raise
            results, retry = {}, err
        for p, taken in request:
            in_flight.discard(p)
            r = results.get(p)
            if r is None:
                error = retry or NotLeaderOrFollower(f"the leader sent no result for {topic}-{p}")
            else:
                error = r.error
            if error is None:
                offset = r.base_offset
                for batch in taken:
                    appends.append(BatchAppend(topic=topic, partition=p, base_offset=offset, record_count=batch.count))
                    offset += batch.count
            elif _should_retry(error):
                queues[p].extendleft(reversed(taken))
                retry = error
            elif isinstance(error, (MessageTooLarge, RecordListTooLarge)):
                # Split, requeue in order and send again at once: no backoff, no metadata refresh.
                limit, smaller = split_refused(taken, error)
                self._refused_limits[topic] = min(limit, self._refused_limits.get(topic, limit))
                queues[p].extendleft(reversed(smaller))
            else:
                if self.transactions is not None:
                    self.transactions.fail(error)
                raise error
        return retry


def _should_retry(error: LowtideError) -> bool:
    # A timed-out acks=all append may already be in the log: resending could write it twice.
    return error.retriable and not isinstance(error, RequestTimedOut)


def stamp_producer(batch: bytes, *, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """``batch`` (one RecordBatch v2) with the transactional bit, ``producer_id``, ``producer_epoch``
    and ``base_sequence`` written into its header and the CRC-32C recomputed (fields: batch.py)."""
    out = bytearray(batch)
    attributes = struct.unpack_from(">h", out, 21)[0] | TRANSACTIONAL_MASK
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">qhi", out, 43, producer_id, producer_epoch, base_sequence)
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[21:]))
    return bytes(out)


def batch_bytes_for_topic(config: Mapping[str, str], wanted: int) -> int:
    """``wanted`` capped by the topic's ``max.message.bytes`` and half its ``segment.bytes`` when
    its config sets them (at least MIN_BATCH_BYTES)."""
    limits = [wanted]
    for key, share in (("max.message.bytes", 1), ("segment.bytes", 2)):
        try:
            limits.append(int(config[key]) // share)
        except (KeyError, ValueError):
            pass
    return max(MIN_BATCH_BYTES, min(limits))


def _records_room(batch_bytes: int, compression: int) -> int:
    """Bytes of key + value payload a batch of ``batch_bytes`` takes before it is sealed: the header
    and the records' own fields (counted by ``size_estimate``) come off, and with a codec its worst
    case growth on incompressible data (under 0.4%: LZ4 4 bytes per 64 KiB block, zstd 3 per 128
    KiB, deflate 5 per 16 KiB stored block, plus their headers)."""
    room = batch_bytes - BATCH_HEADER_SIZE
    if compression:
        room -= 64 + batch_bytes // 256
    return max(room, 1)


def split_batch(batch: _Batch, max_bytes: int) -> list[_Batch]:
    """Re-encode ``batch`` as consecutive batches of at most ~``max_bytes`` each, counted before
    compression (the same records in order, keys, values, headers and timestamps kept, the same codec
    and producer fields; the base sequence follows the records), at least two when it has two
    records or more."""
    header, records = decode_batch(batch.data)
    if len(records) < 2:
        return [batch]
    sizes = [len(r.key or b"") + len(r.value or b"") + sum(len(k) + len(v or b"") for k, v in r.headers)
             for r in records]
    # Never one piece: a batch refused as a whole is cut at least in half.
    room = min(_records_room(max_bytes, header.compression), -(-(_uncompressed_size(batch) - BATCH_HEADER_SIZE) // 2))
    out: list[_Batch] = []
    builder: BatchBuilder | None = None
    for i, record in enumerate(records):
        if builder is not None and builder.size_estimate + sizes[i] > room + BATCH_HEADER_SIZE:
            out.append(_Batch(builder.build(), builder.record_count))
            builder = None
        if builder is None:
            builder = BatchBuilder(compression=header.compression, producer_id=header.producer_id,
                                   producer_epoch=header.producer_epoch,
                                   base_sequence=header.base_sequence + i if header.base_sequence >= 0 else -1,
                                   is_transactional=header.is_transactional, timestamp_type=header.timestamp_type)
        builder.append(timestamp_ms=record.timestamp, key=record.key, value=record.value, headers=record.headers)
    if builder is not None:
        out.append(_Batch(builder.build(), builder.record_count))
    return out


def split_refused(taken: Sequence[_Batch], error: LowtideError) -> tuple[int, list[_Batch]]:
    """A partition's batches the leader refused as too large, split (module doc): returns the new
    batch size limit (half the largest batch, counted before compression like ``batch_bytes``, so a
    compressed batch is halved too) and the batches to send instead, in order. Raises ``error``
    (its message saying so) when the largest batch holds a single record."""
    sizes = [_uncompressed_size(b) for b in taken]
    largest = max(range(len(taken)), key=sizes.__getitem__)
    if taken[largest].count < 2:
        raise type(error)(f"{error.message} (a batch of a single record, {len(taken[largest].data)} bytes with "
                          f"its batch header: it cannot be split)") from error
    limit = max(MIN_BATCH_BYTES, sizes[largest] // 2)
    out: list[_Batch] = []
    for batch, size in zip(taken, sizes, strict=True):
        out.extend(split_batch(batch, limit) if size > limit else [batch])
    return limit, out


def _uncompressed_size(batch: _Batch) -> int:
    """Bytes of ``batch`` with its records uncompressed (what ``batch_bytes`` counts)."""
    header = read_header(batch.data)
    if not header.compression:
        return len(batch.data)
    return BATCH_HEADER_SIZE + len(decompress(header.compression, memoryview(batch.data)[BATCH_HEADER_SIZE:]))
