"""A local cluster's readiness check of a coordinator shard, on a real etcd: it reads the shard's
lease holder and registered address in the metadata store (by record name: localcluster may not
import the coordinator package), so this pins it to what lowtide.coordinator.leadership writes."""

from __future__ import annotations

from lowtide.coordinator.leadership import ShardAddress, ShardLease, register_shard
from lowtide.localcluster import ClusterConfig, InstanceContext
from lowtide.localcluster.kinds import _is_coordinator_leading


def test_a_coordinator_is_ready_once_its_lease_holder_has_registered_its_address(metadata_store, tmp_path):
    ctx = InstanceContext(config=ClusterConfig(data_dir=tmp_path), index=0, data_dir=None, redis_url="",
                          metadata=metadata_store)
    assert not _is_coordinator_leading(0, ctx)  # nobody leads shard 0
    register_shard(metadata_store, ShardAddress(shard=0, grpc="h:1", metrics="", owner="coordinator-0-old"))
    assert not _is_coordinator_leading(0, ctx)  # an address left by a former leader, no lease held
    lease = ShardLease(metadata=metadata_store, shard=0, owner="coordinator-0-new", lease_ms=4000, margin_ms=500)
    assert lease.acquire_or_renew()
    assert not _is_coordinator_leading(0, ctx)  # leading, still loading: not registered yet
    assert register_shard(metadata_store, ShardAddress(shard=0, grpc="h:2", metrics="", owner="coordinator-0-new"),
                          check_lease=True)
    assert _is_coordinator_leading(0, ctx)
    assert not _is_coordinator_leading(1, ctx)
    lease.release()
    assert not _is_coordinator_leading(0, ctx)
