"""ListOffsets and DeleteRecords of diskless partitions (KIP-1164): both answered by the
partition's coordinator shard, whoever is asked. The front door (its Admin service) and every
replica (the "leader" a Kafka client sends these to) call this one implementation.

A partition's shard is fixed at topic creation (``TopicInfo.diskless_shards``); the requests of
one call are grouped by shard and the shards asked in parallel. The low watermark of a diskless
partition is its shard's log start offset. Errors: per partition, as the shard answered; a shard
that cannot be reached fails only its own partitions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor

from lowtide.client.diskless import DisklessCoordinatorClient
from lowtide.diskless.topics import shard_of, topic_id_bytes
from lowtide.errors import LowtideError, UnknownTopicId
from lowtide.messages import TopicPartition
from lowtide.messages.replica import DeleteRecordsResult, PartitionOffset
from lowtide.metadata.model import TopicInfo

# (key, topic id, partition, timestamp or offset) of one partition asked of a shard
_Entry = tuple[TopicPartition, bytes, int, int]


def each_shard(pool: Executor, shards: Iterable[int],
               fn: Callable[[int], LowtideError | None]) -> dict[int, LowtideError | None]:
    """Run ``fn(shard)`` for every shard in parallel; per shard, the error it returned or raised."""
    def run(shard: int) -> LowtideError | None:
        try:
            return fn(shard)
        except LowtideError as exc:
            return exc
    futures = {s: pool.submit(run, s) for s in sorted(set(shards))}
    return {s: f.result() for s, f in futures.items()}


class DisklessOffsets:
    """ListOffsets / DeleteRecords of diskless partitions. Thread-safe (stateless; the client and
    the executor are thread-safe)."""

    def __init__(self, *, coordinators: DisklessCoordinatorClient, pool: Executor) -> None:
        self._coordinators = coordinators
        self._pool = pool

    @staticmethod
    def _by_shard(items: Mapping[TopicPartition, int], infos: Mapping[TopicPartition, TopicInfo],
                  failed: dict) -> dict[int, list[_Entry]]:
        groups: dict[int, list[_Entry]] = {}
        for key, value in items.items():
            try:
                shard = shard_of(infos[key], key[1])
            except LowtideError as exc:
                failed[key] = exc
                continue
            groups.setdefault(shard, []).append((key, topic_id_bytes(infos[key]), key[1], value))
        return groups

    def list_offsets(self, timestamps: Mapping[TopicPartition, int], infos: Mapping[TopicPartition, TopicInfo],
                     *, isolation_level: int = 0) -> dict[TopicPartition, PartitionOffset]:
        """``timestamps``: the ListOffsets timestamp (or OffsetSpec) of each diskless partition;
        READ_COMMITTED (1): latest is the last stable offset."""
        failed: dict[TopicPartition, LowtideError] = {}
        groups = self._by_shard(timestamps, infos, failed)
        out = {k: PartitionOffset(topic=k[0], partition=k[1], error=e) for k, e in failed.items()}

        def ask(shard: int) -> None:
            entries = groups[shard]
            answers = self._coordinators.list_offsets(shard, [(t, p, ts) for _, t, p, ts in entries],
                                                      isolation_level=isolation_level)
            by = {(a.topic_id, a.partition): a for a in answers}
            for key, tid, p, _ in entries:
                a = by.get((tid, p))
                out[key] = PartitionOffset(topic=key[0], partition=p, error=a.error if a else UnknownTopicId(
                    "no answer"), offset=a.offset if a and a.error is None else -1,
                    timestamp=a.timestamp if a and a.error is None else -1)
        for shard, error in each_shard(self._pool, groups, ask).items():
            for key, _, p, _ in groups[shard]:
                if error is not None:
                    out[key] = PartitionOffset(topic=key[0], partition=p, error=error)
        return out

    def delete_records(self, offsets: Mapping[TopicPartition, int], infos: Mapping[TopicPartition, TopicInfo],
                       *, timeout_ms: int) -> dict[TopicPartition, DeleteRecordsResult]:
        """``offsets``: delete before this offset (-1: the high watermark) in each diskless partition."""
        failed: dict[TopicPartition, LowtideError] = {}
        groups = self._by_shard(offsets, infos, failed)
        out = {k: DeleteRecordsResult(topic=k[0], partition=k[1], error=e) for k, e in failed.items()}

        def delete(shard: int) -> None:
            entries = groups[shard]
            answers = self._coordinators.delete_records(shard, [(t, p, o) for _, t, p, o in entries],
                                                        timeout_s=max(0.1, timeout_ms / 1000))
            by = {(a.topic_id, a.partition): a for a in answers}
            for key, tid, p, _ in entries:
                a = by.get((tid, p))
                out[key] = DeleteRecordsResult(topic=key[0], partition=p, error=a.error if a else UnknownTopicId(
                    "no answer"), low_watermark=a.offset if a and a.error is None else -1)
        for shard, error in each_shard(self._pool, groups, delete).items():
            for key, _, p, _ in groups[shard]:
                if error is not None:
                    out[key] = DeleteRecordsResult(topic=key[0], partition=p, error=error)
        return out
