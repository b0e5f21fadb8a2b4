"""Reading ``__consumer_offsets`` up to its high watermarks, with the I/O handed in.

The front door (group APIs) and the replicas (consumed retention) both keep a fold per partition
and bring it up to date the same way; that loop is the internal topics' runtime's
(``lowtide.internal_topics.read.FoldReader``: route, fetch at each fold's position, fold, repeat
while positions move; OFFSET_OUT_OF_RANGE restarts a partition from the leader's log start with an
empty fold). What is ``__consumer_offsets``' own is here: its record codec
(``decode_offset_records``) and its fold (``PartitionOffsets``), and the queries over the folds.
Only the routing and the fetch call differ between the two users (the front door's router vs the
replica's metadata; the same ``ReplicaClient``), so those are the two callables it takes; it
imports no server code.
"""

from __future__ import annotations

from lowtide.groups.state import (
    CommittedEntry,
    ConsumerRecord,
    OffsetRecord,
    PartitionOffsets,
    TopicCommit,
    TxnMarker,
    commits_by_topics,
    decode_offset_records,
)
from lowtide.internal_topics.read import Fetched, Fetcher, FoldReader, Router

# One partition of a fetch answer, as the tail needs it (the runtime's type, under its old name).
FetchedOffsets = Fetched

__all__ = ["FetchedOffsets", "Fetcher", "OffsetsTail", "Router"]


def _decode(records: bytes, from_offset: int) -> list[OffsetRecord | ConsumerRecord | TxnMarker]:
    return decode_offset_records(records, from_offset=from_offset)


class OffsetsTail(FoldReader[PartitionOffsets, "OffsetRecord | ConsumerRecord | TxnMarker"]):
    """Per-partition folds of ``__consumer_offsets`` and the loop that reads them up to date.

    Contract: ``read_to_high_watermark`` (``FoldReader``'s) returns, for every asked partition it
    could not bring up to its leader's high watermark, the reason; an empty dict means every one
    was read up to the HW its leader reported during this call. ``apply`` folds records a writer
    got acknowledged.

    Thread-safety: thread-safe; the folds are guarded by one lock, never held during I/O.
    """

    def __init__(self) -> None:
        super().__init__(new_fold=lambda partition: PartitionOffsets(partition=partition), decode=_decode)

    # -- reads of the folded state ---------------------------------------------------------------
    def entries(self, *, group: str | None = None) -> list[CommittedEntry]:
        with self._lock:
            return [e for part in self._folds.values() for e in part.entries()
                    if group is None or e.key.group == group]

    def commits_by_topics(self, topics: set[str]) -> dict[str, dict[str, dict[int, TopicCommit]]]:
        """``{topic: {group: {partition: commit}}}`` for the given topics."""
        with self._lock:
            return commits_by_topics(self._folds.values(), topics)

    def pending_keys(self, *, group: str) -> set[tuple[str, int]]:
        """(topic, partition) of ``group`` with offsets of an undecided transaction."""
        with self._lock:
            return {(k.topic, k.partition) for part in self._folds.values() for k in part.pending_keys()
                    if k.group == group}

    def consumer_records(self, *, group: str | None = None) -> list[ConsumerRecord]:
        """The live KIP-848 consumer group records (of ``group``, or all), in log order."""
        with self._lock:
            return sorted((r for part in self._folds.values() for r in part.consumer_records(group)),
                          key=lambda r: r.log_offset)
