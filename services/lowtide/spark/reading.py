"""Executor side of a read: one offset range of one partition, fetched from its leader as Arrow.

``read_range`` runs inside a Spark task (a Python worker): it opens its own channels (nothing
unpicklable travels from the driver), fetches whole record batches from the partition's leader
and yields one Arrow batch per Fetch answer, cut to ``[start, end)`` in C.

Deletion under a reader (KIP-107): a Fetch below the log start offset answers OFFSET_OUT_OF_RANGE.
With ``fail_on_data_loss`` the task fails with a message naming the partition and the offsets that
are gone; without it the read continues at the log start offset (or ends, when that is past
``end``). A leader change (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, unavailable) refreshes the
metadata and retries. A read never waits forever: no progress for ``timeout_ms`` fails the task
with REQUEST_TIMED_OUT naming the partition and position.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from lowtide.client.admin import OffsetSpec, open_connections
from lowtide.errors import LeaderNotAvailable, LowtideError, OffsetOutOfRange, RequestTimedOut
from lowtide.messages.replica import FetchPosition
from lowtide.record.columns import columnize
from lowtide.spark.arrow import to_record_batch
from lowtide.spark.options import Connection
from lowtide.spark.planning import OffsetRange, data_loss_message

# A long-poll wait per Fetch: short, since the range's end is at or below the HW it was planned
# against and only a leader change can make a task wait at all.
_FETCH_WAIT_MS = 200


@dataclass(frozen=True)
class ReadSettings:
    include_headers: bool = False
    fail_on_data_loss: bool = True
    fetch_max_bytes: int = 8 << 20
    timeout_ms: int = 60_000


class RangeReader:
    """Fetches ranges from leaders over one channel pool. Not thread-safe; one per task."""

    def __init__(self, connection: Connection, settings: ReadSettings) -> None:
        self.settings = settings
        self._channels, self.admin, self.replicas, self.cluster = open_connections(
            connection.bootstrap, metadata=connection.call_metadata(), tls=connection.tls)

    def close(self) -> None:
        self._channels.close()

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
        s = self.settings
        tp = (rng.topic, rng.partition)
        self.cluster.add_topics([rng.topic])
        position = rng.start
        last_progress = time.monotonic()
        while position < rng.end:
            if time.monotonic() - last_progress > s.timeout_ms / 1000:
                raise RequestTimedOut(f"reading {rng.topic}-{rng.partition}: no progress at offset {position} for "
                                      f"{s.timeout_ms} ms (range {rng.start}..{rng.end - 1})")
            try:
                address = self.cluster.snapshot().leader_address(*tp)
                result = self.replicas.fetch(
                    address, [FetchPosition(topic=rng.topic, partition=rng.partition, fetch_offset=position,
                                            max_bytes=s.fetch_max_bytes)],
                    max_wait_ms=_FETCH_WAIT_MS, max_bytes=s.fetch_max_bytes, deadline_s=_FETCH_WAIT_MS / 1000 + 30)[0]
            except LowtideError as err:
                if not err.retriable:
                    raise
                self._back_off()
                continue
            error = result.error
            if isinstance(error, OffsetOutOfRange):
                log_start = self._log_start(rng, result.log_start_offset)
                if position < log_start:
                    if s.fail_on_data_loss:
                        raise OffsetOutOfRange(data_loss_message(rng.topic, rng.partition, wanted=position,
                                                                 log_start=log_start))
                    position = log_start
                    last_progress = time.monotonic()
                    continue
                self._back_off()  # above the HW: a new leader whose HW has not caught up yet
                continue
            if error is not None:
                if not error.retriable:
                    raise type(error)(f"reading {rng.topic}-{rng.partition} at {position}: {error.message}")
                self._back_off()
                continue
            if not result.records:
                continue
            columns = columnize(result.records, min_offset=position, max_offset=rng.end,
                                with_headers=s.include_headers)
            if columns.count:
                yield to_record_batch(columns, topic=rng.topic, partition=rng.partition)
            if columns.next_offset > position:
                position = columns.next_offset
                last_progress = time.monotonic()

    def _log_start(self, rng: OffsetRange, reported: int) -> int:
        if reported >= 0:
            return reported
        answer = self.admin.list_offsets({(rng.topic, rng.partition): OffsetSpec.EARLIEST})[(rng.topic, rng.partition)]
        if answer.error is not None:
            raise answer.error
        return answer.offset

    def _back_off(self) -> None:
        time.sleep(0.05)
        try:
            self.cluster.refresh()
        except LeaderNotAvailable:
            pass
        except LowtideError as err:
            if not err.retriable:
                raise
