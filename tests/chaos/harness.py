"""Shared plumbing of the chaos suite: starting a local cluster with fast failure detection, and a
``ChaosEnv`` of clients and helpers over it (leaders, DescribeLogs, produce/read with payload ids).

Schedules stay fast with a 3 s broker session timeout and a 3 s ISR lag limit (short settings keep a
fault's effects, a session expiry or an ISR shrink, within a few seconds).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from lowtide.client import Admin, OffsetSpec
from lowtide.client.replica import ReplicaClient
from lowtide.errors import LowtideError, NetworkException
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.localcluster.control import tail_file
from lowtide.messages.replica import FetchPosition, LogDescription, ProducedPartition
from lowtide.metadata.model import PartitionState
from lowtide.metadata.store import MetadataStore
from lowtide.record import decode_batches, encode_batch
from tests import waiting
from tests.chaos.checker import FinalRead, History, decode_id, encode_value

SESSION_TIMEOUT_MS = 3000
LAG_TIME_MS = 3000
BASE_REPLICA_CONFIG = {"segment.bytes": "262144", "replica.lag.time.max.ms": str(LAG_TIME_MS)}
LOG_TAIL_LINES = 60


def redis_available() -> bool:
    return shutil.which("redis-server") is not None or os.path.exists("/usr/sbin/redis-server")


def start_cluster(data_dir: Path, *, replicas: int = 3, replica_config: dict[str, str] | None = None,
                  session_timeout_ms: int = SESSION_TIMEOUT_MS, auth_enabled: bool = False,
                  extra_env: dict[str, str] | None = None,
                  register: Callable[[LocalCluster], None] | None = None,
                  coordinator_standbys: bool = False, metadata_members: int = 3) -> LocalCluster:
    """A running local cluster (detached). ``register`` sees it before ``up`` so a caller can stop
    a half-started one. ``coordinator_standbys``: each coordinator process the warm standby of the
    other shards (a paused or killed shard is taken over, and a paused one wakes as a zombie).
    The metadata store has 3 etcd members, so the nemesis can kill or pause one (the etcd faults)."""
    config = ClusterConfig(data_dir=data_dir, replicas=replicas, frontdoors=1,
                           replica_config={**BASE_REPLICA_CONFIG, **(replica_config or {})},
                           auth_enabled=auth_enabled, session_timeout_ms=session_timeout_ms,
                           extra_env=dict(extra_env or {}), coordinator_standbys=coordinator_standbys,
                           metadata_members=metadata_members)
    cluster = LocalCluster(config)
    if register is not None:
        register(cluster)
    cluster.up(detach=True)
    return cluster


def log_tails(cluster: LocalCluster, lines: int = LOG_TAIL_LINES) -> str:
    out = []
    try:
        services = cluster.services()
    except Exception:  # noqa: BLE001 - never got as far as a plan
        return ""
    for entry in services:
        out.append(f"\n----- {entry.name} (pid {entry.pid}) {entry.log} -----\n")
        out.append(tail_file(entry.log, lines=lines))
    return "".join(out)


def cluster_json(cluster: LocalCluster) -> dict:
    return json.loads((cluster.data_dir / "cluster.json").read_text())


def wait_until(predicate, *, timeout_s: float = 20.0, what: str = "condition", interval_s: float = 0.05) -> None:
    waiting.wait_until(predicate, timeout_s=timeout_s, interval_s=interval_s, what=what,
                       retry_on=(LowtideError, AssertionError, OSError))


class SoftChecks:
    """Collects failed expectations so one run reports every broken promise of a schedule."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def expect(self, ok: object, message: str) -> bool:
        if not ok:
            self.failures.append(message)
        return bool(ok)

    def verify(self) -> None:
        if self.failures:
            raise AssertionError("\n".join(f"[{i + 1}] {m}" for i, m in enumerate(self.failures)))


class ChaosEnv:
    """Clients over one cluster. Thread-safe (the clients and the metadata store are)."""

    def __init__(self, cluster: LocalCluster, *, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.cluster = cluster
        self.metadata = tuple(metadata)
        self.admin = Admin(cluster.bootstrap, metadata=self.metadata, timeout_s=15.0)
        self.replicas = ReplicaClient(metadata=self.metadata)
        self.store = MetadataStore.from_url(cluster.metadata_url)

    def close(self) -> None:
        self.admin.close()
        self.replicas.close()
        try:
            self.store.close()
        except Exception:  # noqa: BLE001
            pass

    # -- where things are ----------------------------------------------------------------------
    def address(self, broker_id: int) -> str:
        return self.cluster.service(f"replica-{broker_id}").grpc

    def state(self, topic: str, partition: int = 0) -> PartitionState:
        return self.store.partition_state(topic, partition)

    def leader(self, topic: str, partition: int = 0) -> int:
        return self.state(topic, partition).leader

    def live_brokers(self) -> set[int]:
        return set(self.store.live_broker_ids())

    def describe(self, broker_id: int, topic: str, partition: int = 0, *, timeout_s: float = 5.0) -> LogDescription:
        logs = self.replicas.describe_logs(self.address(broker_id), [(topic, partition)], timeout_s=timeout_s).logs
        if not logs:
            raise AssertionError(f"{topic}-{partition} is not hosted on replica {broker_id}")
        return logs[0]

    def forget(self, broker_id: int) -> None:
        """Drop the cached channel to a replica (after a kill: skip gRPC's reconnect backoff)."""
        self.replicas.channels.forget(self.address(broker_id))

    # -- topics --------------------------------------------------------------------------------
    def create_topic(self, name: str, *, partitions: int = 1, rf: int = 3,
                     config: dict[str, str] | None = None) -> None:
        self.admin.create_topic(name, partitions=partitions, replication_factor=rf,
                                config={"min.insync.replicas": "2", **(config or {})})

        def hosted() -> bool:
            for p in range(partitions):
                st = self.state(name, p)
                if st.leader < 0:
                    return False
                for r in st.replicas:
                    if self.describe(r, name, p).role not in ("leader", "follower"):
                        return False
            return True

        wait_until(hosted, what=f"{name} hosted on every replica")

    def create_diskless_topic(self, name: str, *, partitions: int = 1) -> None:
        """A diskless topic (issue 13), ready once Metadata names a produce gateway for every
        partition and each answers ListOffsets (its shard is serving)."""
        self.admin.create_topic(name, partitions=partitions, diskless=True)

        def ready() -> bool:
            meta = self.admin.describe_cluster([name]).topic(name)
            if len(meta.partitions) != partitions or any(p.leader < 0 for p in meta.partitions):
                return False
            return self.diskless_served(name, partitions)

        wait_until(ready, timeout_s=60, what=f"diskless topic {name} served by its coordinator shards")

    def diskless_served(self, name: str, partitions: int) -> bool:
        """Whether every partition of diskless topic ``name`` answers ListOffsets (its shard serves)."""
        answers = self.admin.list_offsets({(name, p): OffsetSpec.LATEST for p in range(partitions)})
        return all(a.error is None for a in answers.values())

    # -- produce and read ----------------------------------------------------------------------
    def produce(self, topic: str, partition: int, ids: Sequence[str], *, history: History | None = None,
                leader: int | None = None, timeout_ms: int = 5000, pad: int = 100,
                records: bytes | None = None) -> ProducedPartition:
        """One acks=all Produce of ``ids`` (or of raw ``records``) to the leader; recorded in
        ``history`` when acknowledged."""
        lid = self.leader(topic, partition) if leader is None else leader
        data = records if records is not None else encode_batch([encode_value(i, pad=pad) for i in ids])
        started = time.monotonic()
        [res] = self.replicas.produce(self.address(lid), [(topic, partition, data)], acks=-1, timeout_ms=timeout_ms,
                                      deadline_s=timeout_ms / 1000 + 5)
        if res.error is None and history is not None and records is None:
            history.produce_acked(topic, partition, res.base_offset, ids, started=started)
        return res

    def produce_acked(self, topic: str, partition: int, ids: Sequence[str], *, history: History,
                      timeout_s: float = 20.0) -> int:
        """Produce until acknowledged (new attempt on a retriable error); returns the base offset."""
        deadline = time.monotonic() + timeout_s
        last: LowtideError | None = None
        while time.monotonic() < deadline:
            try:
                res = self.produce(topic, partition, ids, history=history)
            except LowtideError as err:
                res, last = None, err
            if res is not None:
                if res.error is None:
                    return res.base_offset
                last = res.error
            if last is not None and not last.retriable:
                raise last
            time.sleep(0.1)
        raise AssertionError(f"produce to {topic}-{partition} not acknowledged in {timeout_s}s: {last!r}")

    def read_from(self, broker_id: int, topic: str, partition: int, start: int, *, epoch: int = -1,
                  end: int | None = None, timeout_s: float = 10.0
                  ) -> tuple[int, int, list[tuple[int, bytes | None]]]:
        """Consumer reads from ``broker_id`` from ``start`` to its HW (or ``end``): (LSO, HW, records)."""
        return self.read_at(self.address(broker_id), topic, partition, start, epoch=epoch, end=end,
                            timeout_s=timeout_s)

    def read_at(self, address: str, topic: str, partition: int, start: int, *, epoch: int = -1,
                end: int | None = None, timeout_s: float = 10.0) -> tuple[int, int, list[tuple[int, bytes | None]]]:
        """``read_from`` the replica at ``address``."""
        out: list[tuple[int, bytes | None]] = []
        offset = start
        lso = hw = -1
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            [r] = self.replicas.fetch(address, [FetchPosition(
                topic=topic, partition=partition, fetch_offset=offset, max_bytes=1 << 20,
                current_leader_epoch=epoch)], max_wait_ms=0, deadline_s=10)
            if r.error is not None:
                raise r.error
            lso, hw = r.log_start_offset, r.high_watermark
            got = [(rec.offset, rec.value) for _h, recs in decode_batches(r.records) for rec in recs
                   if rec.offset >= offset]
            out += got
            if got:
                offset = got[-1][0] + 1
            if not got or offset >= (hw if end is None else min(hw, end)):
                return lso, hw, out
        raise AssertionError(f"reading {topic}-{partition} from replica {address} took over {timeout_s}s")

    def final_read(self, history: History, topic: str, partition: int, *, timeout_s: float = 30.0) -> FinalRead:
        """The full read of a healed partition from its leader, recorded as the history's final read.
        Waits (bounded) until the leader's HW covers every acknowledged offset."""
        acked_end = _acked_end(history, topic, partition)
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while True:
            try:
                st = self.state(topic, partition)
                if st.leader >= 0:
                    info = self.describe(st.leader, topic, partition)
                    if info.role == "leader" and (info.high_watermark >= acked_end or time.monotonic() > deadline):
                        at = time.monotonic()
                        return _record_final(history, topic, partition, at, self.read_from(
                            st.leader, topic, partition, info.log_start_offset, epoch=st.leader_epoch))
            except (LowtideError, AssertionError) as exc:
                last = exc
                if isinstance(exc, NetworkException):
                    for r in range(len(self.cluster.services("replica"))):
                        self.forget(r)
            if time.monotonic() > deadline + 15:
                raise AssertionError(f"no final read of {topic}-{partition}: {last!r}")
            time.sleep(0.2)

    def final_read_diskless(self, history: History, topic: str, partition: int, *,
                            timeout_s: float = 30.0) -> FinalRead:
        """``final_read`` for a diskless partition: its offsets come from its coordinator shard
        (ListOffsets through the front door), its records from whichever replica Metadata names
        (any replica serves any diskless partition). Waits (bounded) until the HW covers every
        acknowledged offset."""
        acked_end = _acked_end(history, topic, partition)
        tp = (topic, partition)
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while True:
            try:
                latest = self.admin.list_offsets({tp: OffsetSpec.LATEST})[tp]
                if latest.error is not None:
                    raise latest.error
                if latest.offset >= acked_end or time.monotonic() > deadline:
                    at = time.monotonic()
                    earliest = self.admin.list_offsets({tp: OffsetSpec.EARLIEST})[tp]
                    if earliest.error is not None:
                        raise earliest.error
                    address = self.admin.describe_cluster([topic]).leader_address(topic, partition)
                    return _record_final(history, topic, partition, at,
                                         self.read_at(address, topic, partition, earliest.offset))
            except (LowtideError, AssertionError) as exc:
                last = exc
            if time.monotonic() > deadline + 15:
                raise AssertionError(f"no final read of {topic}-{partition}: {last!r}")
            time.sleep(0.2)


def _acked_end(history: History, topic: str, partition: int) -> int:
    """One past the highest acknowledged offset of the partition (0: none)."""
    return max((a.base_offset + len(a.ids) for a in history.produces
                if (a.topic, a.partition) == (topic, partition)), default=0)


def _record_final(history: History, topic: str, partition: int, at: float,
                  read: tuple[int, int, list[tuple[int, bytes | None]]]) -> FinalRead:
    """A full read (LSO, HW, records) recorded as the history's final read of the partition."""
    lso, hw, recs = read
    final = FinalRead(topic, partition, log_start_offset=lso, high_watermark=hw,
                      records=tuple((o, decode_id(v)) for o, v in recs), at=at)
    history.final(final)
    return final


def ids_for(prefix: str, start: int, count: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(start, start + count)]


def fmt_violations(violations: Iterable[object], limit: int = 12) -> str:
    items = list(violations)
    text = "\n".join(f"  {v}" for v in items[:limit])
    if len(items) > limit:
        text += f"\n  ... and {len(items) - limit} more"
    return text
