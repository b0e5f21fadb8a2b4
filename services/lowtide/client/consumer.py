"""``Consumer``: fetches RecordBatch v2 batches from the leaders and decodes them on the client.

Positions: an explicit ``seek`` wins; otherwise, with a ``group_id``, the group's committed offset;
otherwise (or when nothing is committed) ``auto_offset_reset`` (earliest = the log start offset,
latest = the high watermark). A leader returns whole batches, so the first one may start before the
requested offset: records below the position are skipped. Fetching below the log start offset is
OFFSET_OUT_OF_RANGE: raised when the position was set by ``seek`` (the caller asked for deleted
data), reset by ``auto_offset_reset`` when it came from a commit or an earlier reset.

Isolation (Kafka's isolation.level): ``read_uncommitted`` (default) reads up to the high watermark,
transactional records included, aborted or not. ``read_committed`` reads up to the last stable
offset (nothing of an undecided transaction, nor anything after it) and drops, per batch as bytes,
the batches of the aborted transactions the leader lists with its answer (Kafka's algorithm: a
producer's batches from an aborted transaction's first offset on are dropped until a control batch
of that producer ends it). Control batches (transaction markers) never surface as records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from lowtide.client.admin import OffsetSpec, open_connections
from lowtide.errors import (
    InvalidRequest,
    LeaderNotAvailable,
    LowtideError,
    OffsetOutOfRange,
)
from lowtide.messages import TopicPartition
from lowtide.messages.replica import ISOLATION_LEVELS, READ_COMMITTED, FetchedPartition, FetchPosition
from lowtide.record import iter_batches
from lowtide.record.columns import BinaryColumn, Columns, columnize
from lowtide.record.columns import head as head_columns
from lowtide.tls.config import ClientTls

MiB = 1 << 20
_NO_END = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def column_cells(column: BinaryColumn, count: int) -> list[bytes | None]:
    """Row values of the first ``count`` rows of a binary column (None where its validity bit is clear)."""
    ends = memoryview(column.offsets).cast("i").tolist()
    data = bytes(column.data)
    cells: list[bytes | None] = [data[ends[i]:ends[i + 1]] for i in range(count)]
    if column.validity is not None:
        valid = bytes(column.validity)
        for i in range(count):
            if not (valid[i >> 3] >> (i & 7)) & 1:
                cells[i] = None
    return cells


def records_from_columns(columns: Columns, *, topic: str, partition: int) -> list[ConsumerRecord]:
    """ConsumerRecords of a ``columnize`` result (timestamps back in milliseconds)."""
    n = columns.count
    if not n:
        return []
    offsets = memoryview(columns.offsets).cast("q").tolist()
    stamps = [us // 1000 for us in memoryview(columns.timestamps_us).cast("q").tolist()]
    keys = column_cells(columns.keys, n)
    values = column_cells(columns.values, n)
    h = columns.headers
    if h is None or not h.count:
        return [ConsumerRecord(topic, partition, o, ts, k, v) for o, ts, k, v in zip(offsets, stamps, keys, values,
                                                                                     strict=True)]
    bounds = memoryview(h.list_offsets).cast("i").tolist()
    names = [name.decode() if name is not None else "" for name in column_cells(h.keys, h.count)]
    payloads = column_cells(h.values, h.count)
    pairs = list(zip(names, payloads, strict=True))
    return [ConsumerRecord(topic, partition, o, ts, k, v, tuple(pairs[bounds[i]:bounds[i + 1]]))
            for i, (o, ts, k, v) in enumerate(zip(offsets, stamps, keys, values, strict=True))]


def drop_aborted(records: bytes, aborted: Sequence[tuple[int, int]]) -> tuple[bytes, int]:
    """``records`` (whole batches) without the batches of aborted transactions (module docstring),
    and the next offset after the last whole batch examined (-1 if none). Per batch, as bytes."""
    pending = sorted(aborted, key=lambda a: a[1])
    index = 0
    active: set[int] = set()  # producers inside an aborted transaction here
    keep: list[tuple[int, int]] = []
    end = -1
    dropped = False
    for header, pos in iter_batches(records):
        while index < len(pending) and pending[index][1] <= header.last_offset:
            active.add(pending[index][0])
            index += 1
        end = header.next_offset
        pid = header.producer_id
        if header.is_control:
            active.discard(pid)  # the marker ends that producer's transaction
        elif header.is_transactional and pid in active:
            dropped = True
            continue
        keep.append((pos, pos + header.size_in_bytes))
    if not dropped:
        return records, end
    view = memoryview(records)
    return b"".join(view[a:b] for a, b in keep), end


class Consumer:
    """Reads assigned partitions from their leaders (module doc has the position rules).

    No group membership protocol: partitions are assigned by the caller (``assign``/``subscribe``),
    the group only stores committed offsets. Not thread-safe: one consumer per thread.
    """

    def __init__(self, bootstrap: str, *, group_id: str | None = None, metadata: Sequence[tuple[str, str]] = (),
                 auto_offset_reset: str = "earliest", max_wait_ms: int = 500, min_bytes: int = 1,
                 max_bytes: int = 50 * MiB, partition_max_bytes: int = MiB, request_timeout_s: float = 30.0,
                 isolation_level: str = "read_uncommitted", tls: ClientTls | None = None) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise InvalidRequest(f"auto_offset_reset must be earliest or latest, got {auto_offset_reset!r}")
        if isolation_level not in ISOLATION_LEVELS:
            raise InvalidRequest(f"isolation_level must be read_uncommitted or read_committed, got {isolation_level!r}")
        self.isolation_level = ISOLATION_LEVELS[isolation_level]
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.partition_max_bytes = partition_max_bytes
        self.request_timeout_s = request_timeout_s
        self._channels, self.admin, self.replicas, self.cluster = open_connections(bootstrap, metadata=metadata,
                                                                                   tls=tls)
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._explicit: set[TopicPartition] = set()  # positions the caller chose with seek()
        self._pool: ThreadPoolExecutor | None = None
        # leader address -> (its Fetch in flight, the position each partition was fetched from)
        self._inflight: dict[str, tuple[Future, dict[TopicPartition, int]]] = {}

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for future, _ in self._inflight.values():
            future.cancel()
        self._inflight.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._channels.close()

    # -- assignment and positions ------------------------------------------------------------
    def subscribe(self, topic: str) -> list[TopicPartition]:
        """Assign every partition of ``topic`` (added to the current assignment)."""
        self.cluster.add_topics([topic])
        meta = self.cluster.refresh().topic(topic)
        self.assign([*self._assigned, *((topic, p.partition) for p in meta.partitions)])
        return list(self._assigned)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        assigned = list(dict.fromkeys(partitions))
        self.cluster.add_topics(sorted({t for t, _ in assigned}))
        self._assigned = assigned
        self._positions = {tp: o for tp, o in self._positions.items() if tp in assigned}
        self._explicit &= set(assigned)

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self._assigned:
            raise InvalidRequest(f"{tp[0]}-{tp[1]} is not assigned to this consumer")
        self._positions[tp] = offset
        self._explicit.add(tp)

    def seek_to(self, spec: int, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Seek to an OffsetSpec (EARLIEST/LATEST/MAX_TIMESTAMP) or a timestamp, via ListOffsets."""
        for tp, offset in self._list_offsets(list(partitions or self._assigned), spec).items():
            self.seek(tp, offset)

    def position(self, tp: TopicPartition) -> int:
        if tp not in self._positions:
            self._initialize_positions([tp])
        return self._positions[tp]

    def _list_offsets(self, partitions: list[TopicPartition], spec: int) -> dict[TopicPartition, int]:
        answers = self.admin.list_offsets({tp: spec for tp in partitions}, isolation_level=self.isolation_level)
        out = {}
        for tp in partitions:
            answer = answers.get(tp)
            if answer is None or answer.error is not None:
                raise answer.error if answer is not None else LeaderNotAvailable(f"no offset for {tp[0]}-{tp[1]}")
            out[tp] = answer.offset
        return out

    def _initialize_positions(self, partitions: list[TopicPartition]) -> None:
        missing = list(partitions)
        if self.group_id and missing:
            committed = self.admin.fetch_offsets(self.group_id, missing)
            for tp in list(missing):
                c = committed.get(tp)
                if c is not None and c.error is None and c.offset >= 0:
                    self._positions[tp] = c.offset
                    missing.remove(tp)
        if missing:
            spec = OffsetSpec.EARLIEST if self.auto_offset_reset == "earliest" else OffsetSpec.LATEST
            self._positions.update(self._list_offsets(missing, spec))

    # -- fetching ----------------------------------------------------------------------------
    def poll(self, *, max_wait_ms: int | None = None, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records that are ready, in offset order per partition; [] when nothing arrived within
        ``max_wait_ms``.

        One Fetch per leader is kept in flight across polls (as Kafka's consumer does): a poll
        returns as soon as one leader answers with records, so a caught-up partition long-polling on
        one leader never holds back data another leader already sent. A fetch answer for a
        partition whose position moved meanwhile (seek, a rewind by ``max_records``) is dropped.
        """
        records: list[ConsumerRecord] = []
        for (topic, partition), columns in self._gather(max_wait_ms, with_headers=True):
            records.extend(records_from_columns(columns, topic=topic, partition=partition))
        if max_records is not None and len(records) > max_records:
            # Rewind each partition to its first record not handed out, so the next poll returns it.
            for r in records[max_records:]:
                tp = (r.topic, r.partition)
                self._positions[tp] = min(self._positions[tp], r.offset)
            records = records[:max_records]
        return records

    def poll_columns(self, *, max_wait_ms: int | None = None, with_headers: bool = False,
                     max_records: int | None = None) -> list[tuple[TopicPartition, Columns]]:
        """The batch-level poll for bulk readers: per partition with new records, its records as
        columns (``lowtide.record.columns.Columns``: offsets, timestamps, keys and values each one
        buffer plus offsets), cut from the fetched batches in C. No Python object per record; the
        positions advance past everything returned, as with ``poll`` (``max_records`` too: what is
        cut off is returned by the next poll)."""
        out = self._gather(max_wait_ms, with_headers=with_headers)
        if max_records is None:
            return out
        kept: list[tuple[TopicPartition, Columns]] = []
        left = max_records
        for tp, columns in out:
            if left < columns.count:
                cut = head_columns(columns, left)
                self._positions[tp] = min(self._positions[tp], cut.next_offset)
                if not cut.count:
                    continue
                columns = cut
            kept.append((tp, columns))
            left -= columns.count
        return kept

    def _gather(self, max_wait_ms: int | None, *, with_headers: bool) -> list[tuple[TopicPartition, Columns]]:
        if not self._assigned:
            return []
        uninitialized = [tp for tp in self._assigned if tp not in self._positions]
        if uninitialized:
            self._initialize_positions(uninitialized)
        wait_ms = self.max_wait_ms if max_wait_ms is None else max_wait_ms
        self._send_fetches(wait_ms)
        deadline = time.monotonic() + wait_ms / 1000 + 0.05
        out: list[tuple[TopicPartition, Columns]] = []
        refresh = False
        while self._inflight:
            done = [address for address, (future, _) in self._inflight.items() if future.done()]
            if not done:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                wait([f for f, _ in self._inflight.values()], timeout=remaining, return_when=FIRST_COMPLETED)
                continue
            for address in done:
                future, fetched = self._inflight.pop(address)
                response = future.result()
                if isinstance(response, LowtideError):
                    refresh = True
                    continue
                for result in response:
                    tp = (result.topic, result.partition)
                    if self._positions.get(tp) != fetched.get(tp):
                        continue  # the position moved while this answer was on its way
                    columns, stale = self._absorb(result, with_headers=with_headers)
                    refresh |= stale
                    if columns is not None and columns.count:
                        out.append((tp, columns))
            if out or time.monotonic() >= deadline:
                break
            self._send_fetches(wait_ms)  # the answered leaders had nothing: ask them again
        if refresh:
            self.cluster.refresh()
        return out

    def _send_fetches(self, wait_ms: int) -> None:
        """One Fetch to every leader of the assignment that has none in flight."""
        busy = {tp for _, fetched in self._inflight.values() for tp in fetched}
        snapshot = self.cluster.snapshot()
        by_address: dict[str, list[TopicPartition]] = {}
        for tp in self._assigned:
            if tp in busy or tp not in self._positions:
                continue
            try:
                by_address.setdefault(snapshot.leader_address(*tp), []).append(tp)
            except LeaderNotAvailable:
                self.cluster.refresh()
        if not by_address:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fetch")
        for address, tps in by_address.items():
            if address in self._inflight:
                continue
            fetched = {tp: self._positions[tp] for tp in tps}
            self._inflight[address] = (self._pool.submit(self._fetch, address, fetched, wait_ms), fetched)

    def _fetch(self, address: str, fetched: dict[TopicPartition, int],
               wait_ms: int) -> list[FetchedPartition] | LowtideError:
        """One Fetch (on a pool thread: it reads only its arguments, never the consumer's state)."""
        positions = [FetchPosition(topic=t, partition=p, fetch_offset=offset, max_bytes=self.partition_max_bytes)
                     for (t, p), offset in fetched.items()]
        try:
            return self.replicas.fetch(address, positions, max_wait_ms=wait_ms, min_bytes=self.min_bytes,
                                       max_bytes=self.max_bytes, deadline_s=wait_ms / 1000 + self.request_timeout_s,
                                       isolation_level=self.isolation_level)
        except LowtideError as err:
            if err.retriable:
                return err
            raise

    def _absorb(self, result: FetchedPartition, *, with_headers: bool) -> tuple[Columns | None, bool]:
        """One partition's answer as columns (positions advanced past it), and whether the metadata
        needs a refresh."""
        tp = (result.topic, result.partition)
        if tp not in self._positions:
            return None, False
        error = result.error
        if error is not None:
            if isinstance(error, OffsetOutOfRange) and tp not in self._explicit:
                self._positions.pop(tp)  # re-initialize from auto_offset_reset on the next poll
                if self.group_id:
                    spec = OffsetSpec.EARLIEST if self.auto_offset_reset == "earliest" else OffsetSpec.LATEST
                    self._positions.update(self._list_offsets([tp], spec))
                return None, False
            if error.invalid_metadata:
                return None, True  # the leader moved or is unknown: refresh, fetch again
            raise error
        position = self._positions[tp]
        # The records are cut out of the fetched batches in C (record/_columns.c), one call for the
        # whole answer; only ``poll`` makes Python objects of them.
        records, end = result.records, -1
        if self.isolation_level == READ_COMMITTED and result.aborted_transactions:
            records, end = drop_aborted(records, result.aborted_transactions)
        columns = columnize(records, min_offset=position, max_offset=_NO_END, with_headers=with_headers)
        # ``end``: past batches dropped at the tail, which ``columns`` never saw.
        self._positions[tp] = max(position, columns.next_offset, end)
        return columns, False

    # -- committing --------------------------------------------------------------------------
    def commit(self, offsets: dict[TopicPartition, int] | None = None, *, timeout_s: float | None = None) -> None:
        """Commit ``offsets`` (default: the current positions) for the group; raise the first error.

        Retriable errors (COORDINATOR_NOT_AVAILABLE while ``__consumer_offsets`` is created or a
        replica restarts, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT...) are retried for the failed
        partitions only, with backoff, until ``timeout_s`` (default: the request timeout), as
        Kafka's ``commitSync`` does until ``default.api.timeout.ms``.
        """
        if not self.group_id:
            raise InvalidRequest("commit needs a consumer created with group_id")
        offsets = dict(self._positions) if offsets is None else offsets
        deadline = time.monotonic() + (self.request_timeout_s if timeout_s is None else timeout_s)
        backoff = 0.1
        while offsets:
            failed = {tp: error for tp, error in self.admin.commit_offsets(self.group_id, offsets).items()
                      if error is not None}
            for tp, error in failed.items():
                if not error.retriable or time.monotonic() + backoff > deadline:
                    raise type(error)(f"commit of {tp[0]}-{tp[1]} failed: {error.message}")
            offsets = {tp: offsets[tp] for tp in failed}
            if offsets:
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        if not self.group_id:
            raise InvalidRequest("committed offsets need a consumer created with group_id")
        return {tp: c.offset for tp, c in self.admin.fetch_offsets(self.group_id, list(partitions)).items()}
