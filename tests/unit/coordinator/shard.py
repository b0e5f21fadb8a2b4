"""A coordinator shard for tests: the real domain core over a real SQLite file, with its metadata
log kept as the list of encoded record values (what ``__diskless_metadata-k`` would hold), so
every record a test applies went through the byte encoding and back."""

from __future__ import annotations

import uuid
from pathlib import Path

from lowtide.coordinator.core import CoordinatorCore, Decision
from lowtide.coordinator.records import decode_record, encode_record
from lowtide.coordinator.state import CoordinatorState
from lowtide.messages.coordinator import (
    CommitBatch,
    CommitFileRequest,
    CreatablePartitions,
    CreatePartitionsRequest,
)


class Clock:
    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now


class Shard:
    def __init__(self, directory: Path, *, coordinator_id: int = 0, clock: Clock | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.clock = clock or Clock()
        self.state = CoordinatorState(directory / "state.sqlite", coordinator_id=coordinator_id)
        self.core = CoordinatorCore(self.state, clock=self.clock)
        self.log: list[bytes] = []
        self.appended = 0  # log entries appended but not yet applied start here

    def append(self, decision: Decision) -> Decision:
        """Append a decision's records to the log (not applied yet: they stay pending)."""
        self.log.extend(encode_record(r) for r in decision.records)
        return decision

    def replicate(self) -> None:
        """The high watermark passed every appended record: apply them in log order."""
        while self.appended < len(self.log):
            self.core.apply(decode_record(self.log[self.appended]), self.appended)
            self.appended += 1

    def run(self, decision: Decision):
        self.append(decision)
        self.replicate()
        return decision.response

    def close(self) -> None:
        self.state.close()


def topic_id(name: str) -> bytes:
    return uuid.uuid5(uuid.NAMESPACE_DNS, name).bytes


def create_topic(shard: Shard, name: str, partitions: int = 1) -> bytes:
    tid = topic_id(name)
    response = shard.run(shard.core.create_partitions(CreatePartitionsRequest(
        topics=[CreatablePartitions(topic_id=tid, name=name, num_partitions=partitions)])))
    assert response.topics[0].error_code == 0, response
    return tid


def batch(tid: bytes, partition: int = 0, *, records: int = 1, byte_offset: int = 0, size: int = 100,
          max_ts: int = 1_000, ts_type: int = 0, producer_id: int = -1, epoch: int = -1,
          seq: int = -1) -> CommitBatch:
    return CommitBatch(magic=2, request_id=0, topic_id=tid, partition_index=partition, byte_offset=byte_offset,
                       size=size, base_offset=0, last_offset=records - 1, batch_max_timestamp=max_ts,
                       timestamp_type=ts_type, producer_id=producer_id, producer_epoch=epoch,
                       base_sequence=seq, last_sequence=seq + records - 1 if seq >= 0 else -1)


def commit(key: str, batches: list[CommitBatch], *, owners: tuple[int, ...] = (0,)) -> CommitFileRequest:
    """A CommitFile of ``batches`` laid out back to back in the file (their byte offsets set)."""
    placed, at = [], 0
    for b in batches:
        placed.append(b._replace(byte_offset=at))
        at += b.size
    return CommitFileRequest(object_key=key, object_format=1, file_size=at, owner_ids=owners, batches=placed,
                             uploader_broker_id=7)
