"""Zombie shards and warm standbys (docs/design/diskless.md#fencing-by-epoch, #warm-standby).

* In-process: a leader whose lease check still passes (a process paused between its clock check
  and its append) is fenced by the replica on epoch alone once a successor opened its epoch: its
  CommitFile answers NOT_COORDINATOR, the log gets nothing of it.
* Real processes (a local cluster whose coordinators stand by for each other's shards): SIGSTOP the
  leader of shard 0 past its lease, the standby takes over and commits, SIGCONT the old one with a
  CommitFile in flight: it changes neither the log nor any answer. What the clients saw goes through
  the chaos suite's history checker, and every record after the takeover carries the new epoch.
* kill -9 of a shard's leader: the standby answers the first CommitFile within a bound (the time is
  printed; the bench's "standby" section measures it).
"""

from __future__ import annotations

import threading
import time
import uuid

import grpc
import pytest
import redis as redis_lib

from lowtide.client.framed import ListenerCaller
from lowtide.client.replica import ReplicaClient
from lowtide.coordinator.leadership import ShardLease, epoch_key, leader_key, read_shards, read_standbys
from lowtide.coordinator.metadata_log import MetadataLog
from lowtide.coordinator.records import EpochStarted, decode_entry
from lowtide.coordinator.service import FOLLOWER, LEADER, ShardConfig, ShardService
from lowtide.coordinator.servicer import STANDBY_READ
from lowtide.errors import NotCoordinator
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.metadata.store import MetadataStore
from lowtide.rpc.channels import ChannelPool
from lowtide_pb import coordinator_pb2 as pb
from lowtide_pb import coordinator_pb2_grpc
from tests.chaos.checker import FinalRead, History, ReadObs, check
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.coordinator.dc import (
    RETRIABLE,
    commit_request,
    kafka_name,
    metadata_log,
    new_topic_id,
    rebuilt_state,
    served_state,
)
from tests.integration.coordinator.inproc import commit_file, create_topic

TAKEOVER_BOUND_S = 10.0  # generous: the design's figure is ~2 s (1.5 s lease); printed, not timed


# ---- in process: the epoch fence at the replica ----------------------------------------------------


class _PausedClockLease(ShardLease):
    """A real Redis lease whose holder's clock check always passes: the process paused between
    ``valid()`` and its append, so it still believes in a lease Redis gave to another."""

    def valid(self) -> bool:
        return True


def _service(cluster: LocalCluster, redis, channels, tmp, *, lease_ms: int, paused_clock: bool) -> ShardService:
    owner = f"test-{uuid.uuid4().hex[:8]}"
    config = ShardConfig(shard=0, shards=1, data_dir=tmp / owner, owner=owner, advertised_grpc="127.0.0.1:1",
                         lease_ms=lease_ms, lease_margin_ms=1000)
    lease_type = _PausedClockLease if paused_clock else ShardLease
    return ShardService(
        config=config, lease=lease_type(redis=redis, shard=0, owner=owner, lease_ms=lease_ms, margin_ms=1000),
        metadata_log=MetadataLog(shard=0, shards=1, store=MetadataStore(redis=redis),
                                 replicas=ReplicaClient(channels=channels, metadata=[]), request_timeout_ms=10_000),
        redis=redis)


def _await(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_deposed_leader_whose_lease_check_still_passes_is_fenced_by_epoch_at_the_replica(replicas_only, tmp_path):
    redis = redis_lib.Redis.from_url(replicas_only.redis_url)
    channels = ChannelPool()
    # A renews every 40 s: between renewals nothing but the log can tell it that it was deposed.
    zombie = _service(replicas_only, redis, channels, tmp_path, lease_ms=120_000, paused_clock=True)
    successor = _service(replicas_only, redis, channels, tmp_path, lease_ms=6_000, paused_clock=False)
    zombie.start()
    try:
        _await(lambda: zombie.status == LEADER, "the first shard process did not lead")
        topic_id = create_topic(zombie, "zombie")
        commit_file(zombie, topic_id, 0)
        zombie_epoch = zombie._epoch
        # Its lease expires in Redis (the process is "paused"); the successor takes the shard.
        redis.delete(leader_key(0))
        successor.start()
        _await(lambda: successor.status == LEADER, "the successor did not lead")
        assert successor._epoch > zombie_epoch
        assert zombie.status == LEADER  # still believes it leads: its lease check passes
        end_before = metadata_log(replicas_only, 0).read(0).log_end_offset

        with pytest.raises(NotCoordinator, match="fenced by a newer leader"):
            commit_file(zombie, topic_id, 1)
        assert zombie.status == FOLLOWER
        with pytest.raises(NotCoordinator):
            zombie.read(lambda core: core.state.applied_offset)
        assert metadata_log(replicas_only, 0).read(0).log_end_offset == end_before  # nothing of it landed

        commit_file(successor, topic_id, 1)  # the successor goes on
        entries = list(metadata_log(replicas_only, 0).read_to_end(0))
        decoded = [(e.offset, *decode_entry(e.value)) for e in entries]
        opened = max(o for o, epoch, r in decoded if isinstance(r, EpochStarted) and epoch == successor._epoch)
        assert all(epoch == successor._epoch for o, epoch, _ in decoded if o >= opened)
    finally:
        successor.stop()
        zombie.stop()
        channels.close()
        redis.close()


# ---- real processes: SIGSTOP / SIGCONT, kill -9 ------------------------------------------------------


@pytest.fixture(scope="module")
def standby_cluster(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("standby"), replicas=3, coordinators=2,
                           orphan_scanners=0, coordinator_standbys=True,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG))
    yield from running_cluster(request, config)


class _Client:
    """Calls shard ``shard`` wherever the registry says it is led, as a broker does, recording
    what it was answered in a chaos ``History`` (topic "t", partition 0; a record's id is
    ``file/byte offset/index``)."""

    def __init__(self, cluster: LocalCluster, shard: int, history: History) -> None:
        self.redis = redis_lib.Redis.from_url(cluster.redis_url)
        self.shard = shard
        self.history = history
        self.channels: dict[str, grpc.Channel] = {}

    def stub(self, address: str) -> coordinator_pb2_grpc.DisklessCoordinatorStub:
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return coordinator_pb2_grpc.DisklessCoordinatorStub(self.channels[address])

    def leader(self) -> tuple[str, str]:
        entry = read_shards(self.redis)[self.shard]
        return entry.grpc, entry.owner

    def call(self, method: str, request, *, timeout_s: float = 60.0):
        deadline = time.monotonic() + timeout_s
        while True:
            address, _owner = self.leader()
            try:
                return getattr(self.stub(address), method)(request, timeout=10)
            except grpc.RpcError as exc:
                if time.monotonic() > deadline or (kafka_name(exc) not in RETRIABLE
                                                   and exc.code() != grpc.StatusCode.UNAVAILABLE):
                    raise
                self.history.error(kafka_name(exc) or exc.code().name)
                time.sleep(0.05)

    def commit(self, topic_id: bytes, key: str) -> None:
        started = self.history.now()
        reply = self.call("CommitFile", commit_request(key, topic_id, batches=2, records=5, owners=(self.shard,)))
        for b in reply.batches:
            assert b.error_code == 0, b
        for i, b in enumerate(reply.batches):
            self.history.produce_acked("t", 0, b.assigned_base_offset, [f"{key}/{i * 100}/{r}" for r in range(5)],
                                       started=started)

    def read(self, topic_id: bytes) -> None:
        started = self.history.now()
        reply = self.call("FindBatches", _find_request(topic_id))
        part = reply.topics[0].partitions[0]
        self.history.read(ReadObs("t", 0, started=started, ended=self.history.now(), fetch_offset=0,
                                  records=_records(part), log_start_offset=part.log_start_offset,
                                  high_watermark=part.high_watermark))

    def final(self, topic_id: bytes) -> None:
        part = self.call("FindBatches", _find_request(topic_id)).topics[0].partitions[0]
        self.history.final(FinalRead("t", 0, part.log_start_offset, part.high_watermark, _records(part),
                                     at=self.history.now()))

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.redis.close()


def _find_request(topic_id: bytes) -> pb.DisklessFindBatchesRequest:
    return pb.DisklessFindBatchesRequest(fetch_max_bytes=1 << 20, max_batches_per_partition=10_000, topics=[
        pb.DisklessFindBatchesTopic(topic_id=topic_id, partitions=[pb.DisklessFindBatchesPartition(
            partition_index=0, offset=0, max_partition_fetch_bytes=1 << 20)])])


def _records(part) -> tuple[tuple[int, str], ...]:
    return tuple((b.base_offset + r, f"{b.object_key}/{b.byte_offset}/{r}")
                 for b in part.batches for r in range(b.last_offset - b.base_offset + 1))


def _create(client: _Client, name: str) -> bytes:
    topic_id = new_topic_id()
    reply = client.call("CreatePartitions", pb.DisklessCreatePartitionsRequest(topics=[
        pb.DisklessCreatablePartitions(topic_id=topic_id, name=name, num_partitions=1, partition_indexes=[0])]))
    assert reply.topics[0].error_code == 0, reply
    return topic_id


def test_a_paused_shard_woken_after_a_standby_took_over_changes_neither_the_log_nor_any_answer(
        standby_cluster, tmp_path):
    cluster = standby_cluster
    history = History()
    client = _Client(cluster, 0, history)
    try:
        topic_id = _create(client, "zombie-t")
        for n in range(3):
            client.commit(topic_id, f"wal/before-{n}")
        client.read(topic_id)
        old_address, old_owner = client.leader()
        assert old_owner.startswith("coordinator-0-"), old_owner
        # A warm standby of shard 0 (in coordinator-1) answers from its copy when asked for that.
        standby = read_standbys(client.redis, 0)
        assert standby and all(o.startswith("coordinator-1-") for o in standby)
        stand_address = next(iter(standby.values()))
        deadline = time.monotonic() + 30
        while True:
            try:
                reply, call = client.stub(stand_address).FindBatches.with_call(
                    _find_request(topic_id), timeout=10, metadata=[(STANDBY_READ, "1")])
            except grpc.RpcError:
                # NOT_COORDINATOR until the standby has caught up once (slow on a loaded machine)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            trailers = dict(call.trailing_metadata())
            if reply.topics[0].partitions[0].high_watermark == 30 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert reply.topics[0].partitions[0].high_watermark == 30
        print(f"standby FindBatches: applied offset {trailers['lowtide-standby-applied-offset']}, "
              f"lag {trailers['lowtide-standby-lag-ms']} ms")
        with pytest.raises(grpc.RpcError) as not_asked:  # a broker (not asking) never gets a standby's answer
            client.stub(stand_address).FindBatches(_find_request(topic_id), timeout=10)
        assert kafka_name(not_asked.value) == "NOT_COORDINATOR"

        epoch_before = int(client.redis.get(epoch_key(0)))
        cluster.pause("coordinator-0")
        in_flight: dict[str, object] = {}

        def zombie_commit() -> None:
            try:
                in_flight["reply"] = client.stub(old_address).CommitFile(
                    commit_request("wal/zombie-in-flight", topic_id, batches=2, records=5), timeout=60)
            except grpc.RpcError as exc:
                in_flight["error"] = kafka_name(exc) or exc.code().name

        sender = threading.Thread(target=zombie_commit, daemon=True)
        sender.start()
        try:
            _await(lambda: client.leader()[1] != old_owner, "no standby took shard 0 over", timeout_s=30)
            for n in range(3):
                client.commit(topic_id, f"wal/after-{n}")
                client.read(topic_id)
            time.sleep(0.5)
        finally:
            cluster.resume("coordinator-0")
        sender.join(30)
        assert "reply" not in in_flight, f"the zombie answered offsets: {in_flight['reply']}"
        assert in_flight.get("error") == "NOT_COORDINATOR", in_flight
        # Once awake it answers nothing from its old state either.
        for method, request in (("CommitFile", commit_request("wal/zombie-2", topic_id)),
                                ("FindBatches", _find_request(topic_id))):
            with pytest.raises(grpc.RpcError) as refused:
                getattr(client.stub(old_address), method)(request, timeout=10)
            assert kafka_name(refused.value) == "NOT_COORDINATOR", method
        for n in range(2):
            client.commit(topic_id, f"wal/later-{n}")
        client.final(topic_id)

        violations = check(history)
        assert violations == [], "\n".join(map(str, violations))
        final_keys = {r[1].split("/")[1] for r in history.finals[("t", 0)].records}
        assert not any(k.startswith("zombie") for k in final_keys)

        # Every record after the takeover's EpochStarted is of the new epoch (none of the zombie's).
        log = metadata_log(cluster, 0)
        try:
            decoded = [(e.offset, *decode_entry(e.value)) for e in log.read_to_end(0)]
        finally:
            log.replicas.close()
            log.store.redis.close()
        takeover = [(o, epoch) for o, epoch, r in decoded if isinstance(r, EpochStarted) and epoch > epoch_before]
        assert takeover, "the successor opened no epoch in the log"
        opened_at, new_epoch = takeover[0]
        assert all(epoch >= new_epoch for o, epoch, _ in decoded if o > opened_at), \
            [(o, epoch) for o, epoch, _ in decoded if o > opened_at and epoch < new_epoch]
        assert served_state(cluster, 0, tmp_path) == rebuilt_state(cluster, 0, tmp_path)
    finally:
        client.close()


def test_a_standby_takes_over_a_killed_shard_and_answers_a_commit_file(standby_cluster):
    cluster = standby_cluster
    history = History()
    client = _Client(cluster, 1, history)
    topic_id = _create(client, "takeover-t")
    client.commit(topic_id, "wal/takeover-0")
    _address, owner = client.leader()
    process = "coordinator-" + owner.split("-")[1]
    try:
        killed = time.monotonic()
        cluster.kill(process)
        client.commit(topic_id, "wal/takeover-1")
        took = time.monotonic() - killed
        print(f"standby takeover: first CommitFile answered {took:.2f} s after kill -9 of {process}")
        assert client.leader()[1] != owner
        assert took < TAKEOVER_BOUND_S
        # The standby serves brokers' framed CommitFile too: the registry names its own listener.
        framed = read_shards(client.redis)[1].framed
        assert framed and framed not in {e.framed for k, e in read_shards(client.redis).items() if k != 1}
        caller = ListenerCaller(tls=None, metadata=())
        try:
            started = history.now()
            reply = pb.DisklessCommitFileResponse.FromString(caller.call(
                framed, "CommitFile", commit_request("wal/takeover-2", topic_id, batches=2, records=5,
                                                     owners=(1,)).SerializeToString(), timeout_s=30))
        finally:
            caller.close()
        assert [b.error_code for b in reply.batches] == [0, 0]
        for i, b in enumerate(reply.batches):
            history.produce_acked("t", 0, b.assigned_base_offset,
                                  [f"wal/takeover-2/{i * 100}/{r}" for r in range(5)], started=started)
        client.final(topic_id)
        assert check(history) == []
    finally:
        client.close()
        cluster.start_service(process)
