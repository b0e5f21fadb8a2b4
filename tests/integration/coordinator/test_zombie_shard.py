"""Zombie shards and warm standbys (docs/design/diskless.md#fencing-by-epoch, #warm-standby).

* In-process: a leader whose lease check still passes (a process paused between its clock check
  and its append) is fenced by the replica on epoch alone once a successor opened its epoch: its
  CommitFile answers NOT_COORDINATOR, the log gets nothing of it.
* In-process, a leader stopped between the replicas' acknowledgment of its append and its handling
  of it, resumed after a successor took over: NOT_COORDINATOR, not offsets (issue 51); and one
  whose lapsed lease is granted again starts a new term before it answers anything.
* Real processes (a local cluster whose coordinators stand by for each other's shards): SIGSTOP the
  leader of shard 0 past its lease (once every thread of it is stopped: SIGSTOP is asynchronous),
  the standby takes over and commits, SIGCONT the old one with a CommitFile in flight: its old term
  changes neither the log nor any answer. What the clients saw goes through
  the chaos suite's history checker, and every record after the takeover carries the new epoch.
* kill -9 of a shard's leader: the standby answers the first CommitFile within a bound (the time is
  printed; the bench's "standby" section measures it).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest

from lowtide.client.replica import ReplicaClient
from lowtide.coordinator.leadership import ShardLease, read_epoch, read_shards, read_standbys
from lowtide.coordinator.metadata_log import METADATA_TOPIC, MetadataLog
from lowtide.coordinator.records import EpochStarted, decode_entry
from lowtide.coordinator.service import FOLLOWER, LEADER, ShardConfig, ShardService
from lowtide.coordinator.servicer import STANDBY_READ
from lowtide.errors import CoordinatorLoadInProgress, NotCoordinator
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.metadata.store import MetadataStore
from lowtide.rpc.channels import ChannelPool
from lowtide.rpc.framed.callers import ListenerCaller
from lowtide.rpc.steps import Blocking
from lowtide_pb import coordinator_pb2 as pb
from lowtide_pb import coordinator_pb2_grpc
from tests.chaos.checker import FinalRead, History, ReadObs, check
from tests.integration import support as s
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
from tests.integration.coordinator.inproc import commit_request as file_request

TAKEOVER_BOUND_S = 10.0  # generous: the design's figure is ~2 s (1.5 s lease); printed, not timed


# ---- in process: the epoch fence at the replica ----------------------------------------------------


class _PausedClockLease(ShardLease):
    """A real shard lease whose holder's clock check always passes: the process paused between
    ``valid()`` and its append, so it still believes in a lease etcd gave to another."""

    def valid(self) -> bool:
        return True


def _expire(lease: ShardLease) -> None:
    """What etcd does to the lease of a holder that stopped renewing it: revoke it, and with it the
    shard's leader record (at once, rather than after its TTL)."""
    lease.section.revoke_lease(lease.lease_id)


def _service(cluster: LocalCluster, store: MetadataStore, channels, tmp, *, lease_ms: int,
             paused_clock: bool) -> ShardService:
    owner = f"test-{uuid.uuid4().hex[:8]}"
    config = ShardConfig(shard=0, shards=1, data_dir=tmp / owner, owner=owner, advertised_grpc="127.0.0.1:1",
                         lease_ms=lease_ms, lease_margin_ms=1000)
    lease_type = _PausedClockLease if paused_clock else ShardLease
    return ShardService(
        config=config, lease=lease_type(metadata=store, shard=0, owner=owner, lease_ms=lease_ms, margin_ms=1000),
        metadata_log=MetadataLog(shard=0, shards=1, store=store,
                                 replicas=ReplicaClient(channels=channels, metadata=[]), request_timeout_ms=10_000),
        metadata=store)


def _await(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_deposed_leader_whose_lease_check_still_passes_is_fenced_by_epoch_at_the_replica(replicas_only, tmp_path):
    store = replicas_only.metadata_store()
    channels = ChannelPool()
    # A renews every 40 s: between renewals nothing but the log can tell it that it was deposed.
    zombie = _service(replicas_only, store, channels, tmp_path, lease_ms=120_000, paused_clock=True)
    successor = _service(replicas_only, store, channels, tmp_path, lease_ms=6_000, paused_clock=False)
    zombie.start()
    try:
        _await(lambda: zombie.status == LEADER, "the first shard process did not lead")
        topic_id = create_topic(zombie, f"zombie-{uuid.uuid4().hex[:8]}")
        commit_file(zombie, topic_id, 0)
        zombie_epoch = zombie._epoch
        # Its lease expires in etcd (the process is "paused"); the successor takes the shard.
        _expire(zombie.lease)
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


# ---- in process: a leader stopped between its append and its answer --------------------------------


class _PausableLease(ShardLease):
    """A real shard lease whose holder's lease thread can be stopped (``pause``) and let go
    (``resume``) as SIGSTOP and SIGCONT would stop it; its clock runs on meanwhile, as
    CLOCK_MONOTONIC does through a SIGSTOP, so ``valid()`` lapses while it is stopped."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._gate = threading.Condition()
        self._paused = False

    def acquire_or_renew(self) -> bool:
        with self._gate:
            while self._paused:
                self._gate.wait()
            return super().acquire_or_renew()

    def pause(self) -> None:
        with self._gate:  # once a renewal under way has ended
            self._paused = True

    def resume(self) -> None:
        with self._gate:
            self._paused = False
            self._gate.notify_all()


class _HeldAnswers(MetadataLog):
    """A metadata log whose appends, while ``hold`` is set, land (acks=all: the replicas have
    acknowledged them) but reach the shard only once ``release`` is set: a process stopped between
    the replicas' acknowledgment and its handling of it. ``landed`` is set once one did."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.hold, self.landed, self.release = threading.Event(), threading.Event(), threading.Event()

    def append_steps(self, batches, **kwargs):
        base = yield from super().append_steps(batches, **kwargs)
        if self.hold.is_set():
            self.landed.set()
            yield Blocking(self.release.wait)
        return base


def _stoppable(cluster: LocalCluster, store: MetadataStore, channels, tmp) -> ShardService:
    """A shard process whose lease thread and answers the test stops (1.5 s lease, as the local
    cluster's standbys have: renewed every 0.5 s, valid for 1.25 s after a renewal)."""
    owner = f"stoppable-{uuid.uuid4().hex[:8]}"
    config = ShardConfig(shard=0, shards=1, data_dir=tmp / owner, owner=owner, advertised_grpc="127.0.0.1:1",
                         lease_ms=1500, lease_margin_ms=250)
    return ShardService(
        config=config, lease=_PausableLease(metadata=store, shard=0, owner=owner, lease_ms=1500, margin_ms=250),
        metadata_log=_HeldAnswers(shard=0, shards=1, store=store,
                                  replicas=ReplicaClient(channels=channels, metadata=[]), request_timeout_ms=10_000),
        metadata=store)


def _stop_quietly(*services: ShardService) -> None:
    for service in services:
        if not service._stop.is_set():
            if isinstance(service.log, _HeldAnswers):
                service.log.release.set()
            if isinstance(service.lease, _PausableLease):
                service.lease.resume()
            service.stop()


def test_a_leader_stopped_with_its_append_acknowledged_answers_not_coordinator_once_resumed(replicas_only, tmp_path):
    """The window of issue 51: the append lands and the replicas acknowledge it, the process stops
    before it handles the acknowledgment, its lease runs out, a successor takes over (reading the
    record: it is in the log), and on SIGCONT the acknowledgment is handled before the lease thread
    runs. Its answer must be NOT_COORDINATOR, not offsets: the shard is no longer its to answer for."""
    store = replicas_only.metadata_store()
    channels = ChannelPool()
    zombie = _stoppable(replicas_only, store, channels, tmp_path)
    successor = _service(replicas_only, store, channels, tmp_path, lease_ms=6_000, paused_clock=False)
    zombie.start()
    try:
        _await(lambda: zombie.status == LEADER, "the first shard process did not lead")
        topic_id = create_topic(zombie, f"acked-late-{uuid.uuid4().hex[:8]}")
        commit_file(zombie, topic_id, 0)
        zombie_epoch = zombie._epoch
        request = file_request(topic_id, 1)
        zombie.log.hold.set()
        waiter = zombie.submit(lambda core: core.commit_file(request))
        assert zombie.log.landed.wait(30), "the append did not land"
        # SIGSTOP: its lease thread stops; the lease expires in etcd; a successor takes over.
        zombie.lease.pause()
        _expire(zombie.lease)
        successor.start()
        _await(lambda: successor.status == LEADER, "the successor did not lead")
        assert successor._epoch > zombie_epoch
        commit_file(successor, topic_id, 2)
        _await(lambda: not zombie.lease.valid(), "the stopped process's lease check did not lapse")
        assert zombie.status == LEADER  # its lease thread has not run since: nothing told it yet

        # SIGCONT: the acknowledgment is handled first.
        zombie.log.release.set()
        assert waiter.done.wait(30), "no answer"
        assert waiter.error is not None, f"the zombie answered offsets: {waiter.response.batches[:2]}"
        assert isinstance(waiter.error, NotCoordinator), waiter.error
        zombie.lease.resume()
        _await(lambda: zombie.status == FOLLOWER, "the resumed process did not step down")
        # The record is the new leader's (in the log it read before opening its epoch), so the
        # broker, which keeps the file after a retriable error, leaves it to the new leader.
        assert successor.read(lambda core: core.state.file_exists(request.object_key))
    finally:
        _stop_quietly(successor, zombie)
        channels.close()


def test_a_leader_whose_lease_lapsed_and_is_granted_again_serves_nothing_of_its_old_term(replicas_only, tmp_path):
    """A process stopped past its lease whose next renewal is granted again (the lease was free
    by then: the successor that held it meanwhile is gone) starts a new term, with a new epoch
    and the successor's records, before it answers anything: its old term's state is stale."""
    store = replicas_only.metadata_store()
    channels = ChannelPool()
    zombie = _stoppable(replicas_only, store, channels, tmp_path)
    successor = _service(replicas_only, store, channels, tmp_path, lease_ms=6_000, paused_clock=False)
    zombie.start()
    try:
        _await(lambda: zombie.status == LEADER, "the first shard process did not lead")
        topic_id = create_topic(zombie, f"regranted-{uuid.uuid4().hex[:8]}")
        commit_file(zombie, topic_id, 0)
        zombie.lease.pause()
        _expire(zombie.lease)
        successor.start()
        _await(lambda: successor.status == LEADER, "the successor did not lead")
        commit_file(successor, topic_id, 1)
        successor_epoch = successor._epoch
        successor.stop()  # releases the lease: the zombie's next renewal takes it
        _await(lambda: not zombie.lease.valid(), "the stopped process's lease check did not lapse")
        zombie.lease.resume()

        key = file_request(topic_id, 1).object_key
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"the process did not lead again: {zombie.status_detail}"
            try:
                known = zombie.read(lambda core: core.state.file_exists(key))
            except (NotCoordinator, CoordinatorLoadInProgress):
                time.sleep(0.02)
                continue
            assert known, f"answered from its old term (epoch {zombie._epoch}), without the successor's commit"
            break
        assert zombie._epoch > successor_epoch
        commit_file(zombie, topic_id, 2)
    finally:
        _stop_quietly(successor, zombie)
        channels.close()


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
        self.store = cluster.metadata_store()  # the registry, from its image (closed by the cluster)
        self.shard = shard
        self.history = history
        self.channels: dict[str, grpc.Channel] = {}

    def stub(self, address: str) -> coordinator_pb2_grpc.DisklessCoordinatorStub:
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return coordinator_pb2_grpc.DisklessCoordinatorStub(self.channels[address])

    def leader(self) -> tuple[str, str]:
        entry = read_shards(self.store)[self.shard]
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
        self.acked(key, reply, started=started)

    def acked(self, key: str, reply, *, started: float) -> None:
        """Record a CommitFile of ``commit_request(key, batches=2, records=5)`` answered ``reply``."""
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


def _await_stopped(pid: int, timeout_s: float = 30.0) -> None:
    """Until every thread of ``pid`` is stopped (state T in /proc/PID/task/*/stat): SIGSTOP is
    asynchronous, a process runs on after kill() returned until one of its threads takes it."""
    def states() -> list[str]:
        found = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                found.append(stat.read_text().rpartition(")")[2].split()[0])
            except (OSError, IndexError):  # a thread that has just exited
                continue
        return found

    _await(lambda: (found := states()) != [] and all(state in "TtZX" for state in found),
           f"process {pid} did not stop", timeout_s=timeout_s)


def _zombie_answer(client: _Client, key: str, answer: dict, successor_end: int) -> None:
    """What the resumed process answered (``answer``: its ``reply`` or ``error``, ``started``): a
    retriable refusal; or, from a new term of its own only, a CommitFile's offsets past
    ``successor_end`` (recorded as acknowledged) or a FindBatches that has the successor's commits."""
    if "error" in answer:
        assert answer["error"] in RETRIABLE, answer
        return
    reply = answer["reply"]
    if isinstance(reply, pb.DisklessFindBatchesResponse):
        assert reply.topics[0].partitions[0].high_watermark >= successor_end, f"answered from its old state: {reply}"
        return
    assert all(b.assigned_base_offset >= successor_end for b in reply.batches), \
        f"the zombie answered offsets: {reply}"
    client.acked(key, reply, started=answer["started"])


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


def _metadata_log_bounds(cluster: LocalCluster) -> tuple[int, int]:
    """(log start, log end) of shard 0's metadata log, as its leader replica has them."""
    leader = s.leader_of(cluster, METADATA_TOPIC, 0)
    info = s.describe(cluster, leader, METADATA_TOPIC, 0)
    return info.log_start_offset, info.log_end_offset


def _hand_shard_0_back_to_coordinator_0(cluster: LocalCluster, client: _Client) -> None:
    """Each run (``--repeat``) starts as the first: coordinator-0 leads shard 0 and coordinator-1
    stands by for it. After a run the standby in coordinator-1 leads; stopping coordinator-1 frees
    the lease (coordinator-0's own shard, following, takes it), and started again it stands by."""
    if client.leader()[1].startswith("coordinator-0-"):
        return
    before = set(read_standbys(client.store, 0))
    cluster.stop_service("coordinator-1")
    _await(lambda: client.leader()[1].startswith("coordinator-0-"), "coordinator-0 did not take shard 0 back")
    cluster.start_service("coordinator-1")
    # The new process's standby only (a new owner id): the stopped one's record goes as it stops,
    # but this process's image may show it a moment longer.
    _await(lambda: (now := set(read_standbys(client.store, 0))) and not now & before
           and all(o.startswith("coordinator-1-") for o in now),
           "coordinator-1 did not stand by for shard 0 again")


def test_a_paused_shard_woken_after_a_standby_took_over_changes_neither_the_log_nor_any_answer(
        standby_cluster, tmp_path):
    cluster = standby_cluster
    history = History()
    client = _Client(cluster, 0, history)
    # Object keys of this run's own (``--repeat``: the scenario runs again on the same cluster).
    wal = f"wal-{uuid.uuid4().hex[:8]}"
    _hand_shard_0_back_to_coordinator_0(cluster, client)
    try:
        topic_id = _create(client, f"zombie-t-{wal}")
        for n in range(3):
            client.commit(topic_id, f"{wal}/before-{n}")
        client.read(topic_id)
        old_address, old_owner = client.leader()
        assert old_owner.startswith("coordinator-0-"), old_owner
        # A warm standby of shard 0 (in coordinator-1) answers from its copy when asked for that.
        standby = read_standbys(client.store, 0)
        assert standby and all(o.startswith("coordinator-1-") for o in standby), standby
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

        epoch_before = read_epoch(client.store, 0)
        # Where this run's records begin in the metadata log (its start moves up as snapshots cover
        # older records: after many runs, offset 0 is long gone).
        _, end_before = _metadata_log_bounds(cluster)
        cluster.pause("coordinator-0")
        # kill() returns once SIGSTOP is queued; the process runs on until one of its threads takes
        # it (up to hundreds of ms on a loaded 2-core machine), and a CommitFile sent meanwhile was
        # answered by a leader not yet stopped: an honest answer, once taken for a zombie's.
        _await_stopped(cluster.service("coordinator-0").pid)
        in_flight: dict[str, object] = {}

        def zombie_commit() -> None:
            in_flight["started"] = history.now()
            try:
                in_flight["reply"] = client.stub(old_address).CommitFile(
                    commit_request(f"{wal}/zombie-in-flight", topic_id, batches=2, records=5), timeout=60)
            except grpc.RpcError as exc:
                in_flight["error"] = kafka_name(exc) or exc.code().name

        sender = threading.Thread(target=zombie_commit, daemon=True)
        sender.start()
        try:
            _await(lambda: client.leader()[1] != old_owner, "no standby took shard 0 over", timeout_s=30)
            successor_epoch = read_epoch(client.store, 0)
            for n in range(3):
                client.commit(topic_id, f"{wal}/after-{n}")
                client.read(topic_id)
            time.sleep(0.5)
        finally:
            cluster.resume("coordinator-0")
        sender.join(30)
        assert not sender.is_alive(), "the CommitFile in flight got no answer"
        # Neither it nor anything after it is answered from the old term: NOT_COORDINATOR. Only a
        # new term of the same process could answer (the standby's own lease lapsed meanwhile on
        # a loaded machine, and the lease went back to coordinator-0), then from the whole log:
        # offsets past the successor's commits, and the history checks them as any leader's.
        successor_end = 30 + 3 * 10
        _zombie_answer(client, f"{wal}/zombie-in-flight", in_flight, successor_end)
        for n, method, request in ((2, "CommitFile", commit_request(f"{wal}/zombie-2", topic_id, batches=2, records=5)),
                                   (3, "FindBatches", _find_request(topic_id))):
            answer: dict[str, object] = {"started": history.now()}
            try:
                answer["reply"] = getattr(client.stub(old_address), method)(request, timeout=10)
            except grpc.RpcError as exc:
                answer["error"] = kafka_name(exc) or exc.code().name
            _zombie_answer(client, f"{wal}/zombie-{n}", answer, successor_end)
        for n in range(2):
            client.commit(topic_id, f"{wal}/later-{n}")
        client.final(topic_id)

        violations = check(history)
        assert violations == [], "\n".join(map(str, violations))
        final_keys = {r[1].split("/")[1] for r in history.finals[("t", 0)].records}
        acked_keys = {a.ids[0].split("/")[1] for a in history.produces}
        assert {k for k in final_keys if k.startswith("zombie")} <= acked_keys, final_keys

        # Every record after the takeover's EpochStarted is of the new epoch (none of the zombie's).
        log = metadata_log(cluster, 0)
        start, _ = _metadata_log_bounds(cluster)
        try:
            decoded = [(e.offset, *decode_entry(e.value)) for e in log.read_to_end(max(start, end_before))]
        finally:
            log.replicas.close()
        takeover = [(o, epoch) for o, epoch, r in decoded if isinstance(r, EpochStarted) and epoch > epoch_before]
        if start <= end_before:
            assert takeover, "the successor opened no epoch in the log"
            opened_at, new_epoch = takeover[0]
        else:  # a snapshot covered the takeover meanwhile: every record left is of its epoch or newer
            assert successor_epoch > epoch_before
            opened_at, new_epoch = start - 1, successor_epoch
        assert all(epoch >= new_epoch for o, epoch, _ in decoded if o > opened_at), \
            [(o, epoch) for o, epoch, _ in decoded if o > opened_at and epoch < new_epoch]
        # Rebuilt from the newest snapshot once the log below it is gone (after many runs).
        assert served_state(cluster, 0, tmp_path) == rebuilt_state(cluster, 0, tmp_path, from_snapshot=start > 0)
    finally:
        client.close()


def test_a_standby_takes_over_a_killed_shard_and_answers_a_commit_file(standby_cluster):
    cluster = standby_cluster
    history = History()
    client = _Client(cluster, 1, history)
    wal = f"wal-{uuid.uuid4().hex[:8]}"  # this run's own object keys (--repeat)
    topic_id = _create(client, f"takeover-t-{wal}")
    client.commit(topic_id, f"{wal}/takeover-0")
    _address, owner = client.leader()
    process = "coordinator-" + owner.split("-")[1]
    try:
        killed = time.monotonic()
        cluster.kill(process)
        client.commit(topic_id, f"{wal}/takeover-1")
        took = time.monotonic() - killed
        print(f"standby takeover: first CommitFile answered {took:.2f} s after kill -9 of {process}")
        assert client.leader()[1] != owner
        assert took < TAKEOVER_BOUND_S
        # The standby serves brokers' framed CommitFile too: the registry names its own listener.
        framed = read_shards(client.store)[1].framed
        assert framed and framed not in {e.framed for k, e in read_shards(client.store).items() if k != 1}
        caller = ListenerCaller(tls=None, metadata=())
        try:
            started = history.now()
            reply = pb.DisklessCommitFileResponse.FromString(caller.call(
                framed, "CommitFile", commit_request(f"{wal}/takeover-2", topic_id, batches=2, records=5,
                                                     owners=(1,)).SerializeToString(), timeout_s=30))
        finally:
            caller.close()
        assert [b.error_code for b in reply.batches] == [0, 0]
        for i, b in enumerate(reply.batches):
            history.produce_acked("t", 0, b.assigned_base_offset,
                                  [f"{wal}/takeover-2/{i * 100}/{r}" for r in range(5)], started=started)
        client.final(topic_id)
        assert check(history) == []
    finally:
        client.close()
        cluster.start_service(process)
