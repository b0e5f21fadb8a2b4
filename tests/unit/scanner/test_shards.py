"""The orphan scan finds the coordinator shards in the shard registry the shard leaders write
(lowtide.coordinator.leadership) in the cluster metadata, on a real etcd: the scanner reads the
records by name (it may not import the coordinator package), so this pins the two together."""

from __future__ import annotations

import pytest

from lowtide.coordinator.leadership import ShardAddress, register_shard, shards_section
from lowtide.rpc.channels import ChannelPool
from lowtide.scanner.scan import ScanFailure
from lowtide.scanner.shards import discover_shards, read_shard_addresses


def test_the_scan_finds_the_shards_the_leaders_registered_and_refuses_while_one_is_missing(metadata_store):
    register_shard(metadata_store, ShardAddress(shard=0, grpc="h:1", metrics="", owner="a"))
    register_shard(metadata_store, ShardAddress(shard=2, grpc="h:3", metrics="", owner="c"))
    shards_section(metadata_store).put("1/leader", b"b")  # a lease held, no address yet: still missing
    assert {k: a.grpc for k, a in read_shard_addresses(metadata_store).items()} == {0: "h:1", 2: "h:3"}
    channels = ChannelPool()
    try:
        with pytest.raises(ScanFailure) as missing:
            discover_shards(metadata_store, expected=0, channels=channels, metadata=(), timeout_s=1)
        assert missing.value.reason == "shards_missing" and "[1]" in str(missing.value)
        register_shard(metadata_store, ShardAddress(shard=1, grpc="h:2", metrics="", owner="b"))
        views = discover_shards(metadata_store, expected=3, channels=channels, metadata=(), timeout_s=1)
        assert [(v.address.shard, v.address.grpc) for v in views] == [(0, "h:1"), (1, "h:2"), (2, "h:3")]
        with pytest.raises(ScanFailure, match="3 of 4"):
            discover_shards(metadata_store, expected=4, channels=channels, metadata=(), timeout_s=1)
    finally:
        channels.close()
