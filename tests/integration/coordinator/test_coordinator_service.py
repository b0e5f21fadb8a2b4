"""The diskless coordinator as a running service (issue 13): real coordinator, replica, front door
and redis-server processes, called over gRPC as the replicas will call it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.client.diskless import DisklessCoordinatorClient
from lowtide.common.procs import find_free_port
from lowtide.coordinator.leadership import read_epoch, read_shards
from lowtide.coordinator.records import CommittedBatch, FileCommitted, encode_record
from lowtide.diskless.topics import ShardDirectory
from lowtide.errors import LowtideError
from lowtide.localcluster import ClusterConfig
from lowtide.messages.commit_wire import pack_batches, unpack_results
from lowtide.messages.coordinator import BatchToCommit
from lowtide.objectstore import open_object_store
from lowtide.record import encode_batch
from lowtide.rpc.framed.callers import ListenerCaller
from lowtide_pb import common_pb2, coordinator_pb2_grpc
from lowtide_pb import coordinator_pb2 as pb
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.coordinator.dc import (
    RETRIABLE,
    call_retrying,
    commit_request,
    create_partitions,
    delete_records,
    describe_files,
    find_batches,
    kafka_name,
    list_offset,
    metadata_log,
    new_topic_id,
    rebuilt_state,
    served_state,
    shard_stub,
)

GRACE_MS = 3000
CLAIM_AFTER_MS = 2000
GRPCURL = Path(__file__).resolve().parents[3] / ".tools" / "bin" / "grpcurl"


@pytest.fixture(scope="module")
def dc_cluster(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("dc"), replicas=3, coordinators=2,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG),
                           extra_env={"LOWTIDE_FILE_DELETE_GRACE_MS": str(GRACE_MS),
                                      "LOWTIDE_FILE_CLAIM_AFTER_MS": str(CLAIM_AFTER_MS),
                                      "LOWTIDE_FILE_LIFETIME_INTERVAL_MS": "200"})
    yield from running_cluster(request, config)


def test_a_file_committed_to_a_shard_is_found_listed_and_deleted_through_it(dc_cluster):
    dc = shard_stub(dc_cluster, 0)
    tid = new_topic_id()
    create_partitions(dc, tid, "roundtrip", [0, 1])

    first = call_retrying(dc.CommitFile, commit_request("wal/rt-1", tid, batches=3, records=10))
    second = call_retrying(dc.CommitFile, commit_request("wal/rt-2", tid, batches=2, records=5, max_ts=5_000))
    assert [b.assigned_base_offset for b in first.batches] == [0, 10, 20]
    assert [b.assigned_base_offset for b in second.batches] == [30, 35]
    assert all(b.error_code == 0 for b in [*first.batches, *second.batches])

    found = find_batches(dc, tid, 0, 12)
    assert [(b.object_key, b.base_offset, b.last_offset, b.byte_offset) for b in found.batches] == [
        ("wal/rt-1", 10, 19, 100), ("wal/rt-1", 20, 29, 200), ("wal/rt-2", 30, 34, 0), ("wal/rt-2", 35, 39, 100)]
    assert (found.log_start_offset, found.high_watermark) == (0, 40)
    assert list_offset(dc, tid, 0, -1).offset == 40
    assert list_offset(dc, tid, 0, -2).offset == 0
    assert (list_offset(dc, tid, 0, -3).timestamp, list_offset(dc, tid, 0, -3).offset) == (5_001, 39)
    assert list_offset(dc, tid, 0, 5_000).offset == 30

    deleted = delete_records(dc, tid, 0, 25)
    assert (deleted.error_code, deleted.low_watermark) == (0, 25)
    assert list_offset(dc, tid, 0, -2).offset == 25
    after = find_batches(dc, tid, 0, 25)
    assert [b.base_offset for b in after.batches] == [20, 30, 35] and after.log_start_offset == 25
    below = find_batches(dc, tid, 0, 10)
    assert below.error_code == 1  # OFFSET_OUT_OF_RANGE
    assert list_offset(dc, tid, 1, -1).offset == 0


def test_a_packed_commit_gets_the_offsets_a_listed_one_would_and_its_errors_by_index(dc_cluster):
    dc = shard_stub(dc_cluster, 0)
    tid = new_topic_id()
    create_partitions(dc, tid, "packed", [0])
    listed = commit_request("wal/packed-1", tid, batches=2, records=10).batches
    rows = [(b.magic, i, b.topic_id, b.partition_index, b.byte_offset, b.size, b.base_offset, b.last_offset,
             b.batch_max_timestamp, b.timestamp_type, b.producer_id, b.producer_epoch, b.base_sequence,
             b.last_sequence) for i, b in enumerate(listed)]
    rows.append(rows[0][:3] + (7,) + rows[0][4:])  # a partition this shard does not have
    packed = pb.DisklessCommitFileRequest(object_key="wal/packed-1", object_format=1, file_size=300, owner_ids=[0],
                                          uploader_broker_id=0, packed_batches=pack_batches(rows))

    reply = call_retrying(dc.CommitFile, packed)
    assert not reply.batches
    assert [(code, base) for code, base, *_ in unpack_results(reply.packed_results)] == [(0, 0), (0, 10), (3, -1)]
    assert [m.index for m in reply.error_messages] == [2] and "partition 7" in reply.error_messages[0].message
    after = call_retrying(dc.CommitFile, commit_request("wal/packed-2", tid, records=5))
    assert after.batches[0].assigned_base_offset == 20

    both = pb.DisklessCommitFileRequest(object_key="wal/packed-3", object_format=1, file_size=300, owner_ids=[0],
                                        uploader_broker_id=0, packed_batches=pack_batches(rows[:1]), batches=listed[:1])
    with pytest.raises(grpc.RpcError) as refused:
        call_retrying(dc.CommitFile, both)
    assert kafka_name(refused.value) == "INVALID_REQUEST"
    cut = pb.DisklessCommitFileRequest(object_key="wal/packed-4", object_format=1, file_size=300, owner_ids=[0],
                                       uploader_broker_id=0, packed_batches=pack_batches(rows[:1])[:-1])
    with pytest.raises(grpc.RpcError) as refused:
        call_retrying(dc.CommitFile, cut)
    assert kafka_name(refused.value) == "INVALID_REQUEST"
    assert list_offset(dc, tid, 0, -1).offset == 25


def test_a_retried_commit_is_a_duplicate_with_the_original_offsets_and_changes_nothing(dc_cluster, tmp_path):
    dc = shard_stub(dc_cluster, 0)
    tid = new_topic_id()
    create_partitions(dc, tid, "idempotent", [0])
    producer = {"producer_id": 4242, "epoch": 3}
    call_retrying(dc.CommitFile, commit_request("wal/idem-1", tid, batches=2, records=4, first_sequence=0, **producer))
    original = call_retrying(dc.CommitFile, commit_request("wal/idem-2", tid, batches=1, records=4, first_sequence=8,
                                                           **producer))
    assert original.batches[0].assigned_base_offset == 8 and not original.batches[0].is_duplicate
    before = served_state(dc_cluster, 0, tmp_path)

    retried = call_retrying(dc.CommitFile, commit_request("wal/idem-2", tid, batches=1, records=4, first_sequence=8,
                                                          **producer))
    assert (retried.batches[0].assigned_base_offset, retried.batches[0].is_duplicate) == (8, True)
    assert served_state(dc_cluster, 0, tmp_path) == before

    # The same batch inside another upload of it (the broker retried with a new file).
    again = call_retrying(dc.CommitFile, commit_request("wal/idem-2b", tid, batches=1, records=4, first_sequence=8,
                                                        **producer))
    assert (again.batches[0].assigned_base_offset, again.batches[0].is_duplicate) == (8, True)
    fenced = call_retrying(dc.CommitFile, commit_request("wal/idem-3", tid, records=4, first_sequence=12,
                                                         producer_id=4242, epoch=2))
    assert kafka_error(fenced) == "INVALID_PRODUCER_EPOCH"
    gap = call_retrying(dc.CommitFile, commit_request("wal/idem-4", tid, records=4, first_sequence=20, **producer))
    assert kafka_error(gap) == "OUT_OF_ORDER_SEQUENCE_NUMBER"

    after = served_state(dc_cluster, 0, tmp_path)
    for table in ("partitions", "batches", "producers"):
        assert after[table] == before[table], table
    # Files none of whose batches was accepted are recorded only to be deleted (no object leaks).
    new_files = [row for row in after["files"] if row not in before["files"]]
    assert sorted(r[1] for r in new_files) == ["wal/idem-2b", "wal/idem-3", "wal/idem-4"]
    assert all(r[8] == "deletable" and r[9] == 0 for r in new_files)
    assert list_offset(dc, tid, 0, -1).offset == 12


def test_an_append_by_a_deposed_coordinator_makes_the_shard_reload_and_its_stale_epoch_is_ignored(
        dc_cluster, tmp_path):
    dc = shard_stub(dc_cluster, 0)
    tid = new_topic_id()
    create_partitions(dc, tid, "fenced", [0])
    first = call_retrying(dc.CommitFile, commit_request("wal/fence-1", tid, batches=2, records=10))
    assert [b.assigned_base_offset for b in first.batches] == [0, 10]

    # A coordinator that lost the lease without noticing yet appends what its own check decided,
    # offsets 20..29 of the partition, under a writer id of its own and the epoch it led in (one
    # below the serving leader's), straight to __diskless_metadata-0 (the replica takes it: a
    # writer id the replica has not seen before is not fenced there).
    store = dc_cluster.metadata_store()
    store.sync()
    epoch = read_epoch(store, 0)
    deposed = FileCommitted(object_key="wal/fence-deposed", object_format=1, file_size=100, uploader_broker_id=0,
                            committed_at_ms=time.time_ns() // 1_000_000, owner_ids=(0,),
                            batches=(CommittedBatch(tid, 0, 2, 0, 100, 20, 29, 0, 1_000, 0, -1, -1, -1, -1),))
    log = metadata_log(dc_cluster, 0)
    try:
        log.append(encode_batch([encode_record(deposed, epoch=epoch - 1)], timestamp_ms=0, producer_id=424242,
                                producer_epoch=0))
    finally:
        log.replicas.close()

    # The shard's next append expects the log to end after its own last batch: refused, so the
    # request fails retriably and the shard reads the log again. The deposed record is in the log
    # but older than the shard's epoch: every applier skips it, so its offsets 20.. are given again.
    with pytest.raises(grpc.RpcError) as refused:
        dc.CommitFile(commit_request("wal/fence-2", tid, batches=1, records=5), timeout=10)
    assert kafka_name(refused.value) in RETRIABLE
    retried = call_retrying(dc.CommitFile, commit_request("wal/fence-2", tid, batches=1, records=5))
    assert [(b.error_code, b.assigned_base_offset) for b in retried.batches] == [(0, 20)]
    assert [(b.object_key, b.base_offset) for b in find_batches(dc, tid, 0, 0).batches] == [
        ("wal/fence-1", 0), ("wal/fence-1", 10), ("wal/fence-2", 20)]
    assert served_state(dc_cluster, 0, tmp_path) == rebuilt_state(dc_cluster, 0, tmp_path)


def test_a_commit_or_delete_once_answered_is_seen_by_the_very_next_find_batches(dc_cluster):
    # Answers leave when the metadata log has the records, before the SQLite apply: a read that
    # follows an answer must still see it (and nothing below a new log start offset). A wide file
    # (200 batches over 50 partitions) makes each apply long enough that a read not waiting for it
    # would overtake it.
    dc = shard_stub(dc_cluster, 0)
    tid = new_topic_id()
    partitions = list(range(50))
    create_partitions(dc, tid, "read-after-answer", partitions)
    for round_ in range(15):
        reply = call_retrying(dc.CommitFile, pb.DisklessCommitFileRequest(
            object_key=f"wal/raa-{round_}", object_format=1, file_size=200 * 100, owner_ids=[0],
            uploader_broker_id=0, batches=[pb.DisklessCommitBatch(
                magic=2, topic_id=tid, partition_index=i % 50, byte_offset=i * 100, size=100, base_offset=0,
                last_offset=9, batch_max_timestamp=1_000, timestamp_type=0, producer_id=-1, producer_epoch=-1,
                base_sequence=-1, last_sequence=-1) for i in range(200)]))
        last = reply.batches[-1]
        assert last.error_code == 0
        found = find_batches(dc, tid, 49, last.assigned_base_offset)
        assert [b.base_offset for b in found.batches] == [last.assigned_base_offset], round_
        assert found.high_watermark == last.assigned_base_offset + 10

        deleted = delete_records(dc, tid, 49, last.assigned_base_offset)
        assert (deleted.error_code, deleted.low_watermark) == (0, last.assigned_base_offset)
        after = find_batches(dc, tid, 49, last.assigned_base_offset)
        assert after.log_start_offset == last.assigned_base_offset, round_
        assert find_batches(dc, tid, 49, last.assigned_base_offset - 10).error_code == 1  # OFFSET_OUT_OF_RANGE


def kafka_error(reply: pb.DisklessCommitFileResponse) -> str:
    return common_pb2.ErrorCode.Name(reply.batches[0].error_code)


def test_a_second_process_for_a_led_shard_answers_not_coordinator(dc_cluster, tmp_path):
    leader = dc_cluster.service("coordinator-0")
    port = _free_port()
    env = {**os.environ, "LOWTIDE_OBJECT_STORE": dc_cluster.object_store_url}
    proc = subprocess.Popen([sys.executable, "-m", "lowtide.cli.main", "serve", "coordinator", "--shard", "0",
                             "--data-dir", str(tmp_path / "standby"), "--grpc-addr", f"127.0.0.1:{port}",
                             "--metadata-url", dc_cluster.metadata_url,
                             "--redis-url", dc_cluster.redis_url, "--log-format", "text"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        _wait_serving(channel)
        standby = coordinator_pb2_grpc.DisklessCoordinatorStub(channel)
        for method, request in ((standby.CommitFile, commit_request("wal/nc", new_topic_id())),
                                (standby.FindBatches, pb.DisklessFindBatchesRequest(fetch_max_bytes=1,
                                                                                    max_batches_per_partition=1)),
                                (standby.DescribeFiles, pb.DisklessDescribeFilesRequest())):
            with pytest.raises(grpc.RpcError) as caught:
                method(request, timeout=5)
            assert kafka_name(caught.value) == "NOT_COORDINATOR"
        # The leader is unaffected and still registered.
        call_retrying(shard_stub(dc_cluster, 0).DescribeFiles, pb.DisklessDescribeFilesRequest())
        assert leader.grpc in _registered(dc_cluster)
    finally:
        # A graceful stop, as Kubernetes gives one (its default grace is 30 s): on a loaded machine
        # the standby's etcd watch alone may take up to 10 s to end (metadata/etcd.py Watch.stop).
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_file_whose_batches_are_all_deleted_is_removed_after_the_grace_period_across_a_handover(dc_cluster):
    store = open_object_store(dc_cluster.object_store_url)
    key = "wal/handover-1"
    store.put(key, b"x" * 400)
    shard0, shard1 = shard_stub(dc_cluster, 0), shard_stub(dc_cluster, 1)
    tid = new_topic_id()
    create_partitions(shard0, tid, "handover", [0])
    create_partitions(shard1, tid, "handover", [1])
    # One WAL file with batches of both shards' partitions; shard 0 owns it first, then shard 1.
    for dc, partition in ((shard0, 0), (shard1, 1)):
        reply = call_retrying(dc.CommitFile, commit_request(key, tid, partition=partition, batches=2, owners=(0, 1)))
        assert all(b.error_code == 0 for b in reply.batches)

    assert delete_records(shard1, tid, 1, -1).low_watermark == 20  # shard 1 is done, but does not own it yet
    time.sleep(0.6)
    assert store.head(key) is not None
    assert describe_files(shard1, [key]).files[0].known
    assert delete_records(shard0, tid, 0, -1).low_watermark == 20  # shard 0 hands it to shard 1
    handed = time.monotonic()

    while describe_files(shard0, [key]).files[0].known:  # its row goes once shard 1 took the file
        assert time.monotonic() - handed < 10, "shard 0 never handed the file over"
        time.sleep(0.05)
    assert store.head(key) is not None
    while store.head(key) is not None:
        assert time.monotonic() - handed < GRACE_MS / 1000 + 10, "the file was never deleted"
        time.sleep(0.05)
    gone_after = time.monotonic() - handed
    assert gone_after >= GRACE_MS / 1000 - 0.5, f"deleted {gone_after:.2f}s after the handover: before the grace"
    deadline = time.monotonic() + 10
    while describe_files(shard1, [key]).files[0].known:
        assert time.monotonic() < deadline, "shard 1 kept the row of a deleted file"
        time.sleep(0.05)


def test_a_file_committed_to_a_later_owner_only_is_claimed_by_it_and_deleted(dc_cluster):
    # The broker's CommitFile reached shard 1 but never shard 0, the first owner: shard 0 will
    # never hand the file over, so shard 1 claims it once the commit can no longer be in flight.
    store = open_object_store(dc_cluster.object_store_url)
    partial, shared = "wal/partial-1", "wal/shared-1"
    store.put(partial, b"p" * 300)
    store.put(shared, b"s" * 300)
    shard0, shard1 = shard_stub(dc_cluster, 0), shard_stub(dc_cluster, 1)
    tid = new_topic_id()
    create_partitions(shard0, tid, "partial", [0])
    create_partitions(shard1, tid, "partial", [1])
    reply = call_retrying(shard1.CommitFile, commit_request(partial, tid, partition=1, batches=1, owners=(0, 1)))
    assert all(b.error_code == 0 for b in reply.batches)
    committed = time.monotonic()
    # A file both shards recorded, whose first owner keeps a live batch: never claimed.
    for dc, partition in ((shard0, 0), (shard1, 1)):
        reply = call_retrying(dc.CommitFile, commit_request(shared, tid, partition=partition, batches=1, owners=(0, 1)))
        assert all(b.error_code == 0 for b in reply.batches)
    assert delete_records(shard1, tid, 1, -1).low_watermark == 20  # both files are done with on shard 1

    while store.head(partial) is not None:
        assert time.monotonic() - committed < (CLAIM_AFTER_MS + GRACE_MS) / 1000 + 15, "the partial file stayed"
        time.sleep(0.1)
    gone_after = time.monotonic() - committed
    assert gone_after >= (CLAIM_AFTER_MS + GRACE_MS) / 1000 - 0.5, f"deleted {gone_after:.2f}s after the commit"
    deadline = time.monotonic() + 10
    while describe_files(shard1, [partial]).files[0].known:
        assert time.monotonic() < deadline, "shard 1 kept the row of the deleted partial file"
        time.sleep(0.05)
    # The shared file: shard 0 knows it, so shard 1 waits for the handover, however long.
    assert store.head(shared) is not None
    assert describe_files(shard1, [shared]).files[0].known
    assert describe_files(shard0, [shared]).files[0].has_live_batches


def test_reflection_lists_the_coordinator_service_and_health_is_serving(dc_cluster):
    address = dc_cluster.service("coordinator-1").grpc
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
    assert health.Check(health_pb2.HealthCheckRequest(service="lowtide.v1.DisklessCoordinator"),
                        timeout=5).status == health_pb2.HealthCheckResponse.SERVING
    if not GRPCURL.exists():
        pytest.skip("grpcurl is not built (make tools)")
    listed = subprocess.run([str(GRPCURL), "-plaintext", address, "list"], capture_output=True, text=True,
                            timeout=30, check=True).stdout.split()
    assert "lowtide.v1.DisklessCoordinator" in listed


def _registered(cluster) -> set[str]:
    store = cluster.metadata_store()
    store.sync()
    return {address.grpc for address in read_shards(store).values()}


def _free_port() -> int:
    return find_free_port()


def _wait_serving(channel: grpc.Channel, timeout_s: float = 30.0) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "the second coordinator never became healthy"
        time.sleep(0.1)


def test_a_commit_over_the_framed_listener_is_answered_as_over_grpc_and_other_calls_are_refused(dc_cluster):
    dc = shard_stub(dc_cluster, 0)
    tid = new_topic_id()
    create_partitions(dc, tid, "framed", [0])
    shards = read_shards(dc_cluster.metadata_store())
    address = shards[0].framed
    assert address and address != shards[0].grpc
    caller = ListenerCaller(tls=None, metadata=())
    try:
        def commit(request: pb.DisklessCommitFileRequest) -> pb.DisklessCommitFileResponse:
            return pb.DisklessCommitFileResponse.FromString(
                caller.call(address, "CommitFile", request.SerializeToString(), timeout_s=30))

        listed = commit(commit_request("wal/framed-1", tid, batches=3, records=10))
        assert [(b.error_code, b.assigned_base_offset) for b in listed.batches] == [(0, 0), (0, 10), (0, 20)]
        over_grpc = call_retrying(dc.CommitFile, commit_request("wal/framed-2", tid, records=5))
        assert over_grpc.batches[0].assigned_base_offset == 30
        idempotent = commit_request("wal/framed-3", tid, batches=2, records=5, producer_id=77, epoch=0,
                                    first_sequence=0)
        first, again = commit(idempotent), commit(idempotent)
        assert [b.assigned_base_offset for b in first.batches] == [35, 40]
        assert [(b.assigned_base_offset, b.is_duplicate) for b in again.batches] == [(35, True), (40, True)]

        for method, body, refused in (
                ("FindBatches", pb.DisklessFindBatchesRequest().SerializeToString(), "INVALID_REQUEST"),
                ("CommitFile", b"\xff\xff\xff", "INVALID_REQUEST")):
            with pytest.raises(LowtideError) as caught:
                caller.call(address, method, body, timeout_s=10)
            assert caught.value.name == refused, caught.value
    finally:
        caller.close()
    assert list_offset(dc, tid, 0, -1).offset == 45

    # The broker's client sends CommitFile there once the registry names the listener.
    directory = ShardDirectory(store=dc_cluster.metadata_store())
    client = DisklessCoordinatorClient(lookup=directory.lookup, framed_lookup=directory.lookup_framed)
    try:
        results = client.commit_file(0, object_key="wal/framed-4", file_size=100, owner_ids=[0], uploader_broker_id=0,
                                     batches=[BatchToCommit(topic_id=tid, partition=0, byte_offset=0, size=100,
                                                            base_offset=0, last_offset=9, max_timestamp=1_000,
                                                            timestamp_type=0)])
    finally:
        client.close()
    assert [(r.error, r.base_offset) for r in results] == [(None, 45)]

    # Counted by transport and outcome (the dashboard's CommitFile rate: gRPC's metrics miss these).
    scrape = urllib.request.urlopen(f"http://{dc_cluster.service('coordinator-0').metrics_addr}/metrics",
                                    timeout=10).read().decode()

    def counted(transport: str, error: str) -> float:
        prefix = f'lowtide_coordinator_commit_requests_total{{error="{error}",shard="0",transport="{transport}"}} '
        return sum(float(line[len(prefix):]) for line in scrape.splitlines() if line.startswith(prefix))

    assert counted("framed", "NONE") == 4 and counted("framed", "INVALID_REQUEST") == 2
    assert counted("grpc", "NONE") >= 1
