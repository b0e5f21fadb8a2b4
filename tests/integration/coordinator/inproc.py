"""A diskless coordinator shard run in the test's process (so a test can look inside it: the
garbage collector, its applier process) over a real metadata log: ``__diskless_metadata-0`` on
three real replica processes, and a real redis-server for the lease. The fixtures are in this
package's conftest; the request helpers are here."""

from __future__ import annotations

import uuid

from lowtide.coordinator.service import ShardService
from lowtide.messages.coordinator import CommitBatch, CommitFileRequest, CreatablePartitions, CreatePartitionsRequest

PARTITIONS = 20


def commit_request(topic_id: bytes, n: int) -> CommitFileRequest:
    """File ``n`` of the topic (key ``wal/<topic id>-<n>``): 100 batches of 10 records over its partitions."""
    return CommitFileRequest(
        object_key=f"wal/{topic_id.hex()}-{n:08d}", object_format=1, file_size=100 * 1024, owner_ids=[0], batches=[
            CommitBatch(magic=2, request_id=i, topic_id=topic_id, partition_index=i % PARTITIONS,
                        byte_offset=i * 1024, size=1024, base_offset=0, last_offset=9, batch_max_timestamp=n,
                        timestamp_type=0, producer_id=-1, producer_epoch=-1, base_sequence=-1, last_sequence=-1)
            for i in range(100)])


def commit_file(service: ShardService, topic_id: bytes, n: int) -> None:
    request = commit_request(topic_id, n)
    response = service.mutate(lambda core: core.commit_file(request), timeout_ms=30_000)
    assert all(b.error_code == 0 for b in response.batches), response.batches[0]


def create_topic(service: ShardService, name: str) -> bytes:
    topic_id = uuid.uuid4().bytes
    created = service.mutate(lambda core: core.create_partitions(CreatePartitionsRequest(topics=[
        CreatablePartitions(topic_id=topic_id, name=name, num_partitions=PARTITIONS)])), timeout_ms=30_000)
    assert created.topics[0].error_code == 0
    return topic_id
