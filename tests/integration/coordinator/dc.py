"""Test helpers for a running diskless coordinator shard: its gRPC stub, request builders, and the
two states compared by the crash tests (the shard's own SQLite file, copied with the backup API
while it runs, and a state rebuilt from scratch from ``__diskless_metadata-K`` on the replicas)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from lowtide.client.replica import ReplicaClient
from lowtide.coordinator.leadership import read_shards
from lowtide.coordinator.metadata_log import MetadataLog
from lowtide.coordinator.records import decode_entry
from lowtide.coordinator.snapshots import latest_snapshot, restore_snapshot
from lowtide.coordinator.state import CoordinatorState, snapshot_offset
from lowtide.localcluster import LocalCluster
from lowtide_pb import coordinator_pb2 as pb
from lowtide_pb import coordinator_pb2_grpc

RETRIABLE = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "REQUEST_TIMED_OUT")


def shard_stub(cluster: LocalCluster, shard: int) -> coordinator_pb2_grpc.DisklessCoordinatorStub:
    channel = grpc.insecure_channel(cluster.service(f"coordinator-{shard}").grpc)
    return coordinator_pb2_grpc.DisklessCoordinatorStub(channel)


def kafka_name(exc: grpc.RpcError) -> str:
    return (exc.details() or "").split(":", 1)[0]


def call_retrying(method: Callable, request: Any, *, timeout_s: float = 30.0,
                  metadata: list[tuple[str, str]] | None = None) -> Any:
    """Call until the shard answers (it may still be loading right after a start)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return method(request, timeout=10, metadata=metadata)
        except grpc.RpcError as exc:
            if time.monotonic() > deadline or (kafka_name(exc) not in RETRIABLE
                                               and exc.code() != grpc.StatusCode.UNAVAILABLE):
                raise
            time.sleep(0.1)


def new_topic_id() -> bytes:
    return uuid.uuid4().bytes


def create_partitions(stub, topic_id: bytes, name: str, indexes: list[int]) -> None:
    reply = call_retrying(stub.CreatePartitions, pb.DisklessCreatePartitionsRequest(topics=[
        pb.DisklessCreatablePartitions(topic_id=topic_id, name=name, num_partitions=len(indexes),
                                       partition_indexes=indexes)]))
    assert reply.topics[0].error_code == 0, reply


def commit_request(key: str, topic_id: bytes, *, partition: int = 0, batches: int = 1, records: int = 10,
                   size: int = 100, owners: tuple[int, ...] = (0,), producer_id: int = -1, epoch: int = -1,
                   first_sequence: int = -1, max_ts: int = 1_000) -> pb.DisklessCommitFileRequest:
    """A CommitFile of ``batches`` batches of ``records`` records each, back to back in the file."""
    out = []
    for i in range(batches):
        seq = first_sequence + i * records if producer_id >= 0 else -1
        out.append(pb.DisklessCommitBatch(
            magic=2, topic_id=topic_id, partition_index=partition, byte_offset=i * size, size=size, base_offset=0,
            last_offset=records - 1, batch_max_timestamp=max_ts + i, timestamp_type=0, producer_id=producer_id,
            producer_epoch=epoch, base_sequence=seq, last_sequence=seq + records - 1 if seq >= 0 else -1))
    return pb.DisklessCommitFileRequest(object_key=key, object_format=1, file_size=batches * size,
                                        owner_ids=list(owners), batches=out, uploader_broker_id=0)


def find_batches(stub, topic_id: bytes, partition: int, offset: int, *, max_bytes: int = 1 << 20):
    reply = call_retrying(stub.FindBatches, pb.DisklessFindBatchesRequest(
        fetch_max_bytes=max_bytes, max_batches_per_partition=10_000, topics=[pb.DisklessFindBatchesTopic(
            topic_id=topic_id, partitions=[pb.DisklessFindBatchesPartition(
                partition_index=partition, offset=offset, max_partition_fetch_bytes=max_bytes)])]))
    return reply.topics[0].partitions[0]


def list_offset(stub, topic_id: bytes, partition: int, timestamp: int):
    reply = call_retrying(stub.ListOffsets, pb.DisklessListOffsetsRequest(topics=[pb.DisklessListOffsetsTopic(
        topic_id=topic_id, partitions=[pb.DisklessListOffsetsPartition(partition_index=partition,
                                                                       timestamp=timestamp)])]))
    return reply.topics[0].partitions[0]


def delete_records(stub, topic_id: bytes, partition: int, offset: int):
    reply = call_retrying(stub.DeleteRecords, pb.DisklessDeleteRecordsRequest(topics=[pb.DisklessDeleteRecordsTopic(
        topic_id=topic_id, partitions=[pb.DisklessDeleteRecordsPartition(partition_index=partition,
                                                                         offset=offset)])]))
    return reply.topics[0].partitions[0]


def describe_files(stub, keys: list[str], *, timeout_s: float = 30.0) -> pb.DisklessDescribeFilesResponse:
    return call_retrying(stub.DescribeFiles, pb.DisklessDescribeFilesRequest(
        files=[pb.DisklessDescribeFileEntry(object_key=k) for k in keys]), timeout_s=timeout_s)


# ---- the two states ---------------------------------------------------------------------------------
def leader_state_file(cluster: LocalCluster, shard: int) -> tuple[str, Path]:
    """The gRPC address and SQLite file of the process leading ``shard`` (the shard registry says
    which): coordinator-K's own for shard K, or, after a warm standby in coordinator-P took it
    over, coordinator-P's ``standby-K`` copy. Without standbys: always coordinator-K's."""
    own = cluster.service(f"coordinator-{shard}")
    leader = read_shards(cluster.metadata_store()).get(shard)
    if leader is None or leader.grpc == own.grpc or not leader.owner.startswith("coordinator-"):
        return own.grpc, Path(own.data_dir) / "state.sqlite"
    process = leader.owner.split("-")[1]  # owner ids are "coordinator-<its --shard>-<random>"
    return leader.grpc, Path(cluster.service(f"coordinator-{process}").data_dir) / f"standby-{shard}" / "state.sqlite"


def served_state(cluster: LocalCluster, shard: int, tmp: Path) -> dict[str, list[tuple]]:
    """The running shard's tables, row for row (a consistent copy made with SQLite's backup API),
    once every answered request is applied: the shard answers a request when the metadata log has
    its records and applies them to SQLite right after, and a read through it waits for that."""
    deadline = time.monotonic() + 60
    while True:  # the shard's leader, asked again if the lease moved meanwhile (a loaded machine)
        address, source = leader_state_file(cluster, shard)
        try:
            with grpc.insecure_channel(address) as channel:
                describe_files(coordinator_pb2_grpc.DisklessCoordinatorStub(channel), [], timeout_s=5)
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
    copy = tmp / f"served-{shard}-{time.monotonic_ns()}.sqlite"
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    state = CoordinatorState(copy, coordinator_id=shard)
    try:
        return state.dump()
    finally:
        state.close()



def settled_state(cluster: LocalCluster, shard: int, tmp: Path) -> dict[str, list[tuple]]:
    """The served tables once two reads a moment apart agree (no snapshot or worker step running)."""
    last = None
    for _ in range(50):
        now = served_state(cluster, shard, tmp)
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    raise AssertionError("the coordinator's state never settled")

def metadata_log(cluster: LocalCluster, shard: int) -> MetadataLog:
    """The shard's metadata log on the cluster's one store in this process (closed by the cluster's
    ``down()``, never by the caller: close only ``log.replicas``)."""
    return MetadataLog(shard=shard, shards=shard + 1, store=cluster.metadata_store(),
                       replicas=ReplicaClient())


def newest_local_snapshot(cluster: LocalCluster, shard: int) -> Path | None:
    """The newest snapshot of ``shard`` on any coordinator's disk: its own process's, or a warm
    standby's (``standby-K/`` of another process), which takes them while it leads the shard."""
    dirs = [Path(cluster.service(f"coordinator-{shard}").data_dir) / "snapshots"]
    dirs += [Path(s.data_dir) / f"standby-{shard}" / "snapshots" for s in cluster.services("coordinator")]
    found = [p for p in map(latest_snapshot, dirs) if p is not None]
    return max(found, key=snapshot_offset, default=None)


def rebuilt_state(cluster: LocalCluster, shard: int, tmp: Path, *, from_snapshot: bool = False) -> dict:
    """A state built from scratch: every entry of the metadata partition applied to an empty
    database (or, ``from_snapshot``, to a copy of the shard's newest snapshot: what is left once
    the log below it was deleted)."""
    path = tmp / f"rebuilt-{shard}-{time.monotonic_ns()}.sqlite"
    if from_snapshot:
        newest = newest_local_snapshot(cluster, shard)
        assert newest is not None, f"no snapshot of shard {shard} was taken"
        state = restore_snapshot(newest, path, coordinator_id=shard)
    else:
        state = CoordinatorState(path, coordinator_id=shard)
    log = metadata_log(cluster, shard)
    try:
        start = state.applied_offset + 1
        read = log.read(start)
        assert read.log_start_offset <= start, f"the log starts at {read.log_start_offset}, past {start}"
        # Epochs included: a fenced leader's record in the log is skipped, as the shard skips it.
        state.apply_all((record, e.offset, epoch) for e in log.read_to_end(start)
                        for epoch, record in [decode_entry(e.value)])
        return state.dump()
    finally:
        state.close()
        log.replicas.close()
