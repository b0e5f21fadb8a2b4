"""Fixtures of the in-process shard tests (inproc.py)."""

from __future__ import annotations

import time
import uuid

import pytest

from lowtide.client.replica import ReplicaClient
from lowtide.coordinator.leadership import ShardLease
from lowtide.coordinator.metadata_log import MetadataLog
from lowtide.coordinator.service import LEADER, ShardConfig, ShardService
from lowtide.localcluster import ClusterConfig
from lowtide.rpc.channels import ChannelPool
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster


@pytest.fixture(scope="module")
def replicas_only(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("inproc"), replicas=3, coordinators=0,
                           orphan_scanners=0, replica_config=dict(DEFAULT_REPLICA_CONFIG))
    yield from running_cluster(request, config)


@pytest.fixture
def shard(request, replicas_only, tmp_path):
    store = replicas_only.metadata_store()  # the cluster's one store in this process
    channels = ChannelPool()
    # Parametrize ``shard`` indirectly with a dict to change ShardConfig fields.
    config = ShardConfig(shard=0, shards=1, data_dir=tmp_path / "shard-0", owner=f"test-{uuid.uuid4().hex[:8]}",
                         advertised_grpc="127.0.0.1:1", **getattr(request, "param", {}))
    service = ShardService(
        config=config, lease=ShardLease(metadata=store, shard=0, owner=config.owner, lease_ms=6000, margin_ms=1000),
        metadata_log=MetadataLog(shard=0, shards=1, store=store,
                                 replicas=ReplicaClient(channels=channels, metadata=[]), request_timeout_ms=10_000),
        metadata=store)
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
