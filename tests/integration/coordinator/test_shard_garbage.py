"""A shard's request path leaves nothing for the cyclic garbage collector: every object a
CommitFile creates (its batches, results, record, waiter, group) is freed by reference counting
as soon as it is answered and applied. What the cyclic collector must find instead, it frees in
gen-1/gen-2 collections that hold the GIL for milliseconds (tens of them under load, ~350
objects per 100-batch file): every request in flight then waits, which is the CommitFile p99.

The shard runs in this test's process (so the test can ask the collector what it found) over a
real metadata log: ``__diskless_metadata-0`` on three real replica processes, a real redis-server
for the lease; no coordinator process competes for the shard.
"""

from __future__ import annotations

import gc
import time
import uuid

import pytest
import redis as redis_lib

from lowtide.client.replica import ReplicaClient
from lowtide.coordinator.leadership import ShardLease
from lowtide.coordinator.messages import CommitBatch, CommitFileRequest, CreatablePartitions, CreatePartitionsRequest
from lowtide.coordinator.metadata_log import MetadataLog
from lowtide.coordinator.service import LEADER, ShardConfig, ShardService
from lowtide.errors import OutOfOrderSequenceNumber
from lowtide.localcluster import ClusterConfig
from lowtide.metadata.store import MetadataStore
from lowtide.record import encode_batch
from lowtide.rpc.channels import ChannelPool
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

PARTITIONS = 20


@pytest.fixture(scope="module")
def replicas_only(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("garbage"), replicas=3, coordinators=0,
                           orphan_scanners=0, replica_config=dict(DEFAULT_REPLICA_CONFIG))
    yield from running_cluster(request, config)


@pytest.fixture
def shard(replicas_only, tmp_path):
    redis = redis_lib.Redis.from_url(replicas_only.redis_url)
    channels = ChannelPool()
    config = ShardConfig(shard=0, shards=1, data_dir=tmp_path / "shard-0", owner=f"test-{uuid.uuid4().hex[:8]}",
                         advertised_grpc="127.0.0.1:1")
    service = ShardService(
        config=config, lease=ShardLease(redis=redis, shard=0, owner=config.owner, lease_ms=6000, margin_ms=1000),
        metadata_log=MetadataLog(shard=0, shards=1, store=MetadataStore(redis=redis),
                                 replicas=ReplicaClient(channels=channels, metadata=[]), request_timeout_ms=10_000),
        redis=redis)
    service.start()
    try:
        deadline = time.monotonic() + 60
        while service.status != LEADER:
            assert time.monotonic() < deadline, f"the shard did not lead: {service.status} ({service.status_detail})"
            time.sleep(0.05)
        yield service
    finally:
        service.stop()
        channels.close()
        redis.close()


def _commit(service: ShardService, topic_id: bytes, n: int) -> None:
    request = CommitFileRequest(
        object_key=f"wal/{topic_id.hex()}-{n:08d}", object_format=1, file_size=100 * 1024, owner_ids=[0], batches=[
            CommitBatch(magic=2, request_id=i, topic_id=topic_id, partition_index=i % PARTITIONS,
                        byte_offset=i * 1024, size=1024, base_offset=0, last_offset=9, batch_max_timestamp=n,
                        timestamp_type=0, producer_id=-1, producer_epoch=-1, base_sequence=-1, last_sequence=-1)
            for i in range(100)])
    response = service.mutate(lambda core: core.commit_file(request), timeout_ms=30_000)
    assert all(b.error_code == 0 for b in response.batches), response.batches[0]


def _topic(service: ShardService, name: str) -> bytes:
    topic_id = uuid.uuid4().bytes
    created = service.mutate(lambda core: core.create_partitions(CreatePartitionsRequest(topics=[
        CreatablePartitions(topic_id=topic_id, name=name, num_partitions=PARTITIONS)])), timeout_ms=30_000)
    assert created.topics[0].error_code == 0
    return topic_id


def test_committed_files_leave_no_cyclic_garbage_in_the_shard(shard):
    topic_id = _topic(shard, "garbage")
    for n in range(5):  # warm-up: connections, caches, the metadata partition
        _commit(shard, topic_id, n)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage, to be looked at
    try:
        for n in range(5, 45):
            _commit(shard, topic_id, n)
        # A read waits until every answered commit is applied: the groups are through the applier.
        assert shard.read(lambda core: core.state.count_batches()) == 45 * 100
        gc.collect()
        found = [o for o in gc.garbage if type(o).__module__.startswith("lowtide.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    kinds = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in found})
    assert not found, f"{len(found)} lowtide objects were freed only by the cyclic collector: {kinds}"


def test_a_refused_conditional_append_leaves_no_cyclic_garbage(shard):
    """With two appends in flight the second is routinely refused (the first had not landed yet)
    and sent again: the refusal must not tie its traceback's frames, and the group they hold, into
    a cycle."""
    _commit(shard, _topic(shard, "refused"), 0)  # the metadata log is not empty: offset 0 is taken
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        with pytest.raises(OutOfOrderSequenceNumber):
            shard.log.append(encode_batch([b"never appended"], producer_id=1, producer_epoch=0), expected_end_offset=0)
        gc.collect()
        found = [o for o in gc.garbage if isinstance(o, BaseException) or type(o).__module__.startswith("lowtide.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not found, f"freed only by the cyclic collector: {sorted({type(o).__qualname__ for o in found})}"
