"""A DisklessProducer's surroundings for unit tests, real but in the test's process: coordinator
shards that are the real domain core over real SQLite files (``tests.unit.coordinator.shard``),
called through the same ``commit_file`` signature as ``DisklessCoordinatorClient`` minus gRPC, and
a real local object store whose puts a test can hold (``GatedStore``) to keep files in flight."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from lowtide.errors import error_or_none
from lowtide.messages.coordinator import BatchToCommit, CommitBatch, CommitFileRequest, CommitResult
from lowtide.metadata.model import TopicInfo
from lowtide.objectstore.local import LocalObjectStore
from tests.unit.coordinator.shard import Shard, create_topic


class InProcessShards:
    """Shard k is ``shards[k]``; each CommitFile runs the core's check and applies it at once (the
    replication of the metadata log is another module's test). Thread-safe: one call at a time."""

    def __init__(self, directory: Path, *, count: int = 1) -> None:
        self.shards = [Shard(directory / f"shard-{k}", coordinator_id=k) for k in range(count)]
        self.calls: list[tuple[int, str, int]] = []  # (shard, object key, batches), in call order
        self._lock = threading.Lock()

    def create_topic(self, name: str, *, partitions: int) -> TopicInfo:
        """A diskless topic whose partition p is on shard p mod count."""
        count = len(self.shards)
        ids = {create_topic(shard, name, partitions) for shard in self.shards}
        [tid] = ids
        return TopicInfo(name=name, topic_id=tid.hex(), partitions=partitions, replication_factor=1, diskless=True,
                         diskless_shards=[p % count for p in range(partitions)])

    def commit_file(self, shard: int, *, object_key: str, file_size: int, owner_ids: Sequence[int],
                    batches: Sequence[BatchToCommit], uploader_broker_id: int,
                    timeout_s: float = 30.0) -> list[CommitResult]:
        request = CommitFileRequest(
            object_key=object_key, object_format=1, file_size=file_size, owner_ids=list(owner_ids),
            uploader_broker_id=uploader_broker_id, batches=[CommitBatch(
                magic=2, request_id=i, topic_id=b.topic_id, partition_index=b.partition, byte_offset=b.byte_offset,
                size=b.size, base_offset=b.base_offset, last_offset=b.last_offset,
                batch_max_timestamp=b.max_timestamp, timestamp_type=b.timestamp_type, producer_id=b.producer_id,
                producer_epoch=b.producer_epoch, base_sequence=b.base_sequence, last_sequence=b.last_sequence)
                for i, b in enumerate(batches)],
            txn_kinds=bytes(b.txn_kind for b in batches) if any(b.txn_kind for b in batches) else b"")
        with self._lock:
            self.calls.append((shard, object_key, len(batches)))
            target = self.shards[shard]
            response = target.run(target.core.commit_file(request))
        return [CommitResult(error_or_none(r.error_code, r.error_message or "") if r.error_code else None,
                             r.assigned_base_offset, r.log_append_time, r.log_start_offset, r.is_duplicate)
                for r in response.batches]

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


class GatedStore(LocalObjectStore):
    """A local object store whose puts wait until ``gate`` is set (open by default), so a test can
    keep files in flight; ``started`` lists the keys whose put began, in order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.gate.set()
        self.started: list[str] = []
        self._started_lock = threading.Lock()

    def put(self, key, data):
        with self._started_lock:
            self.started.append(key)
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        return super().put(key, data)
