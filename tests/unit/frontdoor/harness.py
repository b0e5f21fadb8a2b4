"""Test harness of the front door: a real in-process Admin gRPC server on a real etcd (metadata)
and Redis, and real replica server processes (``ReplicaSet``) for the tests that need leaders.

The replicas are the real ``lowtide serve replica`` processes a local cluster runs, started once per
session (``replica_set`` in ``tests/unit/conftest.py``) with an etcd and a Redis of their own;
``clean()`` empties them of the previous test's data between tests, so the start-up is paid once.
Faults are real too: a replica process is paused (SIGSTOP) or killed, and leadership moves by the
same compare-and-set the controller makes. What the replicas were asked is read from their own
gRPC server metrics (``calls``), what they hold from their own Fetch and DescribeLogs answers.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
import redis as redis_lib
from prometheus_client.parser import text_string_to_metric_families

from lowtide.frontdoor.server import FrontDoorConfig, FrontDoorParts, build_front_door
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.localcluster.kinds import KINDS
from lowtide.log.filenames import parse_partition_dir
from lowtide.metadata.model import BrokerInfo
from lowtide.metadata.store import MetadataStore
from lowtide.record import BatchBuilder, BatchHeader, Record, decode_batches
from lowtide.rpc.interceptor import ErrorInterceptor
from lowtide_pb import common_pb2, replica_pb2, replica_pb2_grpc
from tests.waiting import wait_until

SESSION_MS = 60_000
# The replicas' broker session: short, so a killed or paused replica stops counting as live within
# a test's patience, long enough that a loaded machine does not expire a healthy one.
REPLICA_SESSION_MS = 3000
WAIT_S = 20.0


def start_grpc_server(register: Callable[[grpc.Server], None]) -> tuple[grpc.Server, str]:
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), interceptors=[ErrorInterceptor()])
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def register_broker(store: MetadataStore, broker_id: int, address: str = "127.0.0.1:1") -> None:
    host, _, port = address.rpartition(":")
    store.register_broker(BrokerInfo(id=broker_id, host=host, port=int(port)), incarnation=uuid.uuid4().hex,
                          session_timeout_ms=SESSION_MS)


def kill_broker(store: MetadataStore, broker_id: int) -> None:
    """Make a broker not live, as an expired session would: etcd deletes its liveness key."""
    store.client.delete(store._k("alive", broker_id))
    wait_until(lambda: broker_id not in store.live_broker_ids(), what=f"broker {broker_id} no longer live")


@dataclass
class ReplicaSet:
    """Real replica server processes (broker ids 0..count-1) and their etcd and Redis, as a local
    cluster without the other services. Contract: ``clean()`` before each test; a test that kills or pauses
    a replica brings it back (``killed``/``paused`` do) so the next test finds every broker live."""

    cluster: LocalCluster
    count: int
    # Restarts of killed replicas run in the background (a start takes seconds); ``clean`` waits.
    _restarts: list[tuple[threading.Thread, list[BaseException]]] = field(default_factory=list)

    @classmethod
    @contextmanager
    def started(cls, data_dir: Path, *, count: int = 2) -> Iterator[ReplicaSet]:
        config = ClusterConfig(data_dir=data_dir, replicas=count, coordinators=0, orphan_scanners=0,
                               session_timeout_ms=REPLICA_SESSION_MS,
                               replica_config={"replica.lag.time.max.ms": "3000",
                                               "replica.fetch.wait.max.ms": "100"})
        cluster = LocalCluster(config, kinds=[k for k in KINDS if k.kind == "replica"])
        replicas = None
        try:
            cluster.up(detach=True)
            replicas = cls(cluster=cluster, count=count)
            yield replicas
        finally:
            if replicas is not None:
                replicas.finish_restarts()
            cluster.down(timeout_s=10.0)

    @property
    def redis_url(self) -> str:
        return self.cluster.redis_url

    @property
    def metadata_url(self) -> str:
        return self.cluster.metadata_url

    @contextmanager
    def metadata(self) -> Iterator[MetadataStore]:
        """A store on the replicas' etcd, loaded now (so current), closed after the block."""
        store = MetadataStore.from_url(self.metadata_url)
        try:
            yield store
        finally:
            store.close()

    def address(self, broker_id: int) -> str:
        return self.cluster.service(f"replica-{broker_id}").grpc

    def _redis(self) -> redis_lib.Redis:
        return redis_lib.Redis.from_url(self.redis_url)

    # -- between tests ---------------------------------------------------------------------------
    def clean(self) -> str:
        """Delete every topic (the replicas drop their partitions, as on a real deletion) and every
        other metadata key but the cluster id and the replicas' registrations, and empty the Redis;
        returns the Redis URL (``metadata_url`` is the etcd's)."""
        self.finish_restarts()
        with self.metadata() as store:
            for name in store.topics():
                store.delete_topic(name)
            wait_until(lambda: not any(self.hosted(b) for b in range(self.count)), timeout_s=WAIT_S,
                       what="the replicas to drop the deleted topics' partitions")
            for broker_id, info in store.brokers().items():
                if broker_id >= self.count:  # one a test registered itself
                    store.client.delete(store._k("brokers", broker_id))
                    store.client.delete(store._k("alive", broker_id))
                elif info.address != self.address(broker_id):
                    store.client.delete(store._k("alive", broker_id))  # a test overwrote it: the replica re-registers
            keep = {store.cluster_id_key,
                    *(store._k(region, b) for region in ("brokers", "alive") for b in range(self.count))}
            for kv in store.client.get_prefix(store.root)[0]:
                if kv.key not in keep:  # deleted-topic records, broker configs, a test's own keys
                    store.client.delete(kv.key)
            wait_until(lambda: store.live_broker_ids(list(range(self.count))) == set(range(self.count)),
                       timeout_s=WAIT_S, what="every replica to be registered live")
        client = self._redis()
        try:
            client.flushdb()  # the metadata is in etcd: nothing in Redis outlives a test
        finally:
            client.close()
        return self.redis_url

    def hosted(self, broker_id: int) -> list[tuple[str, int]]:
        """The partitions whose directories replica ``broker_id`` has on disk."""
        out = []
        for entry in os.scandir(self.cluster.service(f"replica-{broker_id}").data_dir):
            try:
                out.append(parse_partition_dir(entry.name))
            except Exception:  # checkpoint files and the like
                continue
        return out

    # -- what a replica was asked and holds ------------------------------------------------------
    def calls(self, broker_id: int, method: str) -> int:
        """How many ``Replica/<method>`` calls replica ``broker_id`` has started since it started."""
        url = self.cluster.service(f"replica-{broker_id}").metrics_url
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (sample.name == "lowtide_grpc_server_started_total"
                        and sample.labels.get("grpc_method") == method
                        and sample.labels.get("grpc_service", "").endswith(".Replica")):
                    total += sample.value
        return int(total)

    def _stub(self, broker_id: int) -> tuple[grpc.Channel, replica_pb2_grpc.ReplicaStub]:
        channel = grpc.insecure_channel(self.address(broker_id))
        return channel, replica_pb2_grpc.ReplicaStub(channel)

    def describe(self, broker_id: int, topic: str, partition: int) -> replica_pb2.LogInfo | None:
        """Replica ``broker_id``'s DescribeLogs entry for the partition (None: not hosted)."""
        channel, stub = self._stub(broker_id)
        try:
            answer = stub.DescribeLogs(replica_pb2.DescribeLogsRequest(
                partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)]), timeout=5)
        finally:
            channel.close()
        return next((i for i in answer.logs if (i.topic, i.partition) == (topic, partition)), None)

    def leader_of(self, topic: str, partition: int) -> int:
        with self.metadata() as store:
            return store.partition_state(topic, partition).leader

    def fetch_all(self, topic: str, partition: int) -> list[tuple[BatchHeader, list[Record]]]:
        """Every record batch the partition's leader serves, from its log start offset to its high
        watermark (whole batches, as a consumer's Fetch gets them)."""
        leader = self.leader_of(topic, partition)
        info = self.describe(leader, topic, partition)
        offset, out = (info.log_start_offset if info is not None else 0), []
        channel, stub = self._stub(leader)
        try:
            while True:
                result = stub.Fetch(replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, partitions=[
                    replica_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)]),
                    timeout=5).partitions[0]
                assert result.error_code == 0, result
                got = decode_batches(result.records)
                if not got:
                    return out
                out.extend(got)
                offset = got[-1][0].next_offset
        finally:
            channel.close()

    def records(self, topic: str, partition: int) -> list[Record]:
        """The records the partition's leader serves, in offset order."""
        return [r for _, records in self.fetch_all(topic, partition) for r in records]

    def produce(self, topic: str, partition: int, values: list[bytes]) -> int:
        """Append ``values`` as one batch at the partition's leader (acks=all, no front door, so no
        authorization in the way); returns the base offset."""
        builder = BatchBuilder()
        for value in values:
            builder.append(timestamp_ms=int(time.time() * 1000), key=None, value=value)
        channel, stub = self._stub(self.leader_of(topic, partition))
        try:
            result = stub.Produce(replica_pb2.ProduceRequest(acks=-1, timeout_ms=5000, partitions=[
                replica_pb2.ProducePartition(topic=topic, partition=partition, records=builder.build())]),
                timeout=10).partitions[0]
        finally:
            channel.close()
        assert result.error_code == 0, result
        return result.base_offset

    def wait_for_leaders(self, topic: str) -> None:
        """Return once every partition of ``topic`` is led by the replica its metadata names, and
        every other replica of it hosts it: a topic written to the metadata store directly (as the
        tests do) is served only after the replicas reconcile."""
        with self.metadata() as store:
            states = store.partition_states(topic)
        assert states, f"topic {topic} has no partitions"

        def served() -> bool:
            for s in states:
                for b in s.replicas:
                    if b >= self.count:
                        continue  # a broker the test registered itself
                    info = self.describe(b, topic, s.partition)
                    if info is None or (b == s.leader and info.role != "leader"):
                        return False
            return True

        wait_until(served, timeout_s=WAIT_S, what=f"the replicas to serve {topic}")

    @contextmanager
    def config_adopted(self, broker_id: int, topic: str) -> Iterator[None]:
        """Wait, after the block changed ``topic``'s config in etcd, until replica ``broker_id``
        says (its "topic config changed" log line) that it applies the new config."""
        log_path = Path(self.cluster.service(f"replica-{broker_id}").log)
        start = log_path.stat().st_size
        yield

        def adopted() -> bool:
            with log_path.open("rb") as f:
                f.seek(start)
                return any(b"topic config changed" in line and f'"{topic}-'.encode() in line for line in f)

        wait_until(adopted, timeout_s=WAIT_S, what=f"replica {broker_id} to adopt {topic}'s new config")

    # -- real faults -----------------------------------------------------------------------------
    @contextmanager
    def paused(self, broker_id: int) -> Iterator[None]:
        """Replica ``broker_id`` stopped (SIGSTOP: alive, answering nothing) inside the block."""
        name = f"replica-{broker_id}"
        self.cluster.pause(name)
        try:
            yield
        finally:
            self.cluster.resume(name)

    @contextmanager
    def killed(self, broker_id: int) -> Iterator[None]:
        """Replica ``broker_id`` killed (SIGKILL) inside the block; after it the replica starts
        again (same data and ports) in the background, and ``clean`` waits until it is back."""
        name = f"replica-{broker_id}"
        self.cluster.kill(name, signal.SIGKILL)
        try:
            yield
        finally:
            errors: list[BaseException] = []

            def restart() -> None:
                try:
                    self.cluster.start_service(name)
                except BaseException as exc:  # raised again by finish_restarts, in the test's thread
                    errors.append(exc)

            thread = threading.Thread(target=restart, name=f"restart-{name}", daemon=True)
            thread.start()
            self._restarts.append((thread, errors))

    def finish_restarts(self) -> None:
        """Wait for the background restarts of ``killed``; raise the first one's failure."""
        restarts, self._restarts = self._restarts, []
        for thread, errors in restarts:
            thread.join()
            if errors:
                raise errors[0]


def move_leader(store: MetadataStore, topic: str, partition: int, *, to: int) -> None:
    """Elect ``to`` as the partition's leader (the ISR shrunk to it), with the compare-and-set the
    controller makes when the old leader fails."""
    state = store.partition_state(topic, partition)
    store.compare_and_set_partition(state, replace(state, leader=to, leader_epoch=state.leader_epoch + 1, isr=(to,)))


@dataclass
class RunningFrontDoor:
    address: str
    parts: FrontDoorParts
    server: grpc.Server

    @property
    def store(self) -> MetadataStore:
        return self.parts.store

    def catch_up(self) -> None:
        """Make this front door's metadata image show every change etcd has committed (ACLs and
        tokens a test wrote through its own store reach it by etcd's watch, a moment later, as a
        change made through another front door would in production)."""
        assert self.parts.store.sync(timeout_s=10.0), "the front door's metadata image did not catch up"

    def stop(self) -> None:
        self.server.stop(0)
        self.parts.close()


def start_front_door(redis_url: str, metadata_url: str, **config) -> RunningFrontDoor:
    parts = build_front_door(FrontDoorConfig(redis_url=redis_url, metadata_url=metadata_url, **config))
    server, address = start_grpc_server(parts.register)
    return RunningFrontDoor(address=address, parts=parts, server=server)
