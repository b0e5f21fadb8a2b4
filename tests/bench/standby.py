"""Warm standby takeover (issue 32 "Must show": standby takeover time; docs/design/diskless.md
#warm-standby): how long after a kill -9 of a diskless shard's leader its warm standby answers the
first CommitFile.

A local cluster of its own: 3 replicas, 2 coordinator processes, each the warm standby of the
other's shard (``ClusterConfig.coordinator_standbys``: a 1.5 s lease, which etcd keeps 2 s, its
shortest). Each round commits a few files to shard 0 wherever the registry says it is led (as a
broker does), kills -9 the leading process, and times from the kill until a CommitFile through
the registry is answered with offsets; then starts the killed process again and waits for it to be
healthy. The median and the worst of the rounds are reported against the issue's 2 s target, with
the standby's lag (its trailing metadata on a standby FindBatches) just before the kill. Reports;
never asserts.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path

import grpc

from lowtide.coordinator.leadership import read_shards, read_standbys
from lowtide.coordinator.servicer import STANDBY_READ
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.localcluster.kinds import STANDBY_LEASE_MS
from lowtide_pb import coordinator_pb2 as pb
from lowtide_pb import coordinator_pb2_grpc
from tests.bench.common import Figure, say

SHARD = 0
RETRIABLE = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "REQUEST_TIMED_OUT")
TARGET_S = 2.0


def _commit_request(key: str, topic_id: bytes) -> pb.DisklessCommitFileRequest:
    return pb.DisklessCommitFileRequest(object_key=key, object_format=1, file_size=1000, owner_ids=[SHARD],
                                        uploader_broker_id=0, batches=[pb.DisklessCommitBatch(
                                            magic=2, topic_id=topic_id, partition_index=0, byte_offset=i * 100,
                                            size=100, base_offset=0, last_offset=9, batch_max_timestamp=1_000,
                                            timestamp_type=0, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                            last_sequence=-1) for i in range(10)])


class _Shard:
    """Calls the shard where the registry says it is led, retrying what a broker retries."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.store = cluster.metadata_store()  # the registry, from its image (closed by the cluster)
        self.channels: dict[str, grpc.Channel] = {}

    def stub(self, address: str) -> coordinator_pb2_grpc.DisklessCoordinatorStub:
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return coordinator_pb2_grpc.DisklessCoordinatorStub(self.channels[address])

    def leader_owner(self) -> str:
        return read_shards(self.store)[SHARD].owner

    def call(self, method: str, request, *, timeout_s: float = 60.0):
        deadline = time.monotonic() + timeout_s
        while True:
            entry = read_shards(self.store).get(SHARD)
            try:
                if entry is None:
                    raise RuntimeError("shard 0 is not registered")
                return getattr(self.stub(entry.grpc), method)(request, timeout=5)
            except (grpc.RpcError, RuntimeError) as exc:
                name = (exc.details() or "").split(":", 1)[0] if isinstance(exc, grpc.RpcError) else ""
                transient = isinstance(exc, RuntimeError) or name in RETRIABLE or \
                    exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not transient or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def standby_lag_ms(self, topic_id: bytes) -> int | None:
        """The standby's lag as it states it (trailing metadata of a standby FindBatches)."""
        for address in read_standbys(self.store, SHARD).values():
            try:
                _reply, call = self.stub(address).FindBatches.with_call(pb.DisklessFindBatchesRequest(
                    fetch_max_bytes=1 << 20, max_batches_per_partition=100, topics=[pb.DisklessFindBatchesTopic(
                        topic_id=topic_id, partitions=[pb.DisklessFindBatchesPartition(
                            partition_index=0, offset=0, max_partition_fetch_bytes=1 << 20)])]),
                    timeout=5, metadata=[(STANDBY_READ, "1")])
            except grpc.RpcError:
                continue  # the leader's own process (not standing by now), or a killed one
            lag = dict(call.trailing_metadata()).get("lowtide-standby-lag-ms")
            if lag is not None:  # None: that standby leads the shard now (it answered as the leader)
                return int(lag)
        return None

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


def standby_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    rounds = 3 if quick else 7
    config = ClusterConfig(data_dir=data_dir, replicas=3, coordinators=2, orphan_scanners=0,
                           coordinator_standbys=True)
    cluster = LocalCluster(config)
    say("standby: starting a cluster of 3 replicas and 2 coordinators standing by for each other")
    cluster.up(detach=True)
    shard = _Shard(cluster)
    takeovers: list[float] = []
    lags: list[int] = []
    try:
        topic_id = uuid.uuid4().bytes
        reply = shard.call("CreatePartitions", pb.DisklessCreatePartitionsRequest(topics=[
            pb.DisklessCreatablePartitions(topic_id=topic_id, name="standby-bench", num_partitions=1,
                                           partition_indexes=[0])]))
        assert reply.topics[0].error_code == 0, reply
        for n in range(rounds):
            for i in range(5):
                shard.call("CommitFile", _commit_request(f"wal/standby-{n}-{i}", topic_id))
            time.sleep(0.3)  # the standby long-polls every 100 ms: let it catch up as it would in service
            lag = shard.standby_lag_ms(topic_id)
            if lag is not None:
                lags.append(lag)
            owner = shard.leader_owner()
            process = "coordinator-" + owner.split("-")[1]
            killed = time.monotonic()
            cluster.kill(process)
            got = shard.call("CommitFile", _commit_request(f"wal/standby-{n}-after", topic_id))
            took = time.monotonic() - killed
            assert all(b.error_code == 0 for b in got.batches), got
            takeovers.append(took)
            say(f"standby: round {n + 1}/{rounds}: {process} killed, first CommitFile answered after {took:.2f} s "
                f"(by {shard.leader_owner()})")
            cluster.start_service(process)
            time.sleep(1.0)  # its standby shards catch up before the next kill
    finally:
        shard.close()
        cluster.down(timeout_s=10)
    median = statistics.median(takeovers)
    params = {"rounds": rounds, "lease_ms": STANDBY_LEASE_MS, "samples_s": [round(t, 3) for t in takeovers]}
    return [
        Figure(key="standby_takeover_s", name="warm standby takeover after kill -9, first CommitFile answered",
               value=median, unit="s", target=f"<= {TARGET_S:g} s", target_value=TARGET_S, better="lower",
               params=params,
               note=f"median of {rounds}; worst {max(takeovers):.2f} s; lease {STANDBY_LEASE_MS} ms, "
                    f"standby lag before the kill {max(lags) if lags else '?'} ms at most").judge(),
    ]
