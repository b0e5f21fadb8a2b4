"""Faults on a ``LocalCluster`` of real processes, one at a time, each healed before the next.

Fault kinds:

``kill_restart``     kill -9 of a replica, down for a while (sometimes past its session timeout),
                     then started again with the same argv, port and data directory.
``pause_resume``     SIGSTOP of a replica (a hung broker: alive, answering nothing), then SIGCONT.
``pause_leader``     the same, aimed at the current leader of a partition of the workload topic.
``leader_pause_follower_restart``
                     SIGSTOP of a partition's leader while one of its followers is killed -9 and
                     restarted (the follower comes back while it cannot reach its leader; the pause
                     often outlasts the session timeout, so the controller elects a new leader).
``redis_restart``    redis-server stopped (SIGTERM: its AOF is flushed) and started again on the
                     same port with the same data directory.
``etcd_kill_restart`` kill -9 of one member of the 3-member metadata store (its leader half the
                     time), then started again with its data (the store keeps a quorum).
``etcd_pause``       SIGSTOP of one etcd member (its leader half the time), then SIGCONT.
``etcd_and_leader_kill``
                     kill -9 of the etcd leader and of a partition's replica leader at once: an
                     election of the store while the controller must elect a partition leader.
``reassign``         partition reassignment (KIP-455): a partition of the workload topic moves off
                     one of its replicas (the leader as likely as any: leadership is handed over in
                     the completing write, and the removed replica deletes its copy), then back onto
                     it (a fresh copy from the leader's log start offset, joining the ISR when
                     caught up). Later faults may hit the copy while it runs.

Diskless runs (``DISKLESS_FAULT_KINDS``) add the coordinator shards, whose state is their metadata
log on the replicas (the replica faults above, aimed at the leaders of ``__diskless_metadata``):

``coordinator_kill_restart``
                     kill -9 of a diskless coordinator shard (its SQLite applier child sees EOF and
                     exits), then started again: it rebuilds from its snapshot and metadata log.
``coordinator_pause``
                     SIGSTOP of a shard; a long pause lets its leader lease lapse (1.5 s: the chaos
                     cluster's coordinators are warm standbys of each other's shards, so the other
                     process takes the shard over), and on SIGCONT it is a zombie: fenced by the
                     coordinator epoch, it must change neither the metadata log nor any answer.

Slow disk is not injected: it needs root and a block-device delay (dm-delay) or a FUSE layer under a
replica's data directory, neither of which a local cluster on a shared machine can count on.

``RandomNemesis`` draws kinds, targets and durations from ``random.Random(seed)``, so a seed
reproduces the sequence of faults (not their exact timing). Every fault is logged when it starts and
when it is healed, and kept in ``faults``. ``heal()`` undoes whatever is still in effect.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from lowtide.localcluster import LocalCluster
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.store import MetadataStore
from lowtide.rpc.channels import open_channel
from lowtide_pb import admin_pb2, admin_pb2_grpc

log = logging.getLogger("chaos.nemesis")

FAULT_KINDS = ("kill_restart", "pause_resume", "pause_leader", "leader_pause_follower_restart", "redis_restart",
               "etcd_kill_restart", "etcd_pause", "etcd_and_leader_kill", "reassign")
# Diskless topics have no replicas to move: their faults are the replica faults on the shards'
# metadata log plus the shards themselves.
DISKLESS_FAULT_KINDS = (*FAULT_KINDS[:-1], "coordinator_kill_restart", "coordinator_pause")


@dataclass
class Fault:
    kind: str
    target: str
    started: float
    duration_s: float
    healed: float = 0.0
    detail: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.target} for {self.duration_s:.1f}s{(' ' + self.detail) if self.detail else ''}"


@dataclass
class Nemesis:
    """Single faults on ``cluster``; tracks what is broken so ``heal`` can undo it."""

    cluster: LocalCluster
    say: Callable[[str], None] = field(default=lambda m: log.info(m))
    faults: list[Fault] = field(default_factory=list)
    paused: set[str] = field(default_factory=set)
    stopped: set[str] = field(default_factory=set)
    # partition -> its replica set before a ``reassign`` fault; heal() puts every one back.
    moved: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _begin(self, kind: str, target: str, duration_s: float, detail: str = "") -> Fault:
        fault = Fault(kind, target, time.monotonic(), duration_s, detail=detail)
        self.faults.append(fault)
        self.say(f"nemesis: {fault.describe()}")
        return fault

    def _end(self, fault: Fault) -> None:
        fault.healed = time.monotonic()
        self.say(f"nemesis: healed {fault.kind} {fault.target} after {fault.healed - fault.started:.1f}s")

    # -- single faults -------------------------------------------------------------------------
    def kill(self, name: str) -> None:
        with self._lock:
            self.cluster.kill(name, signal.SIGKILL)
            self.stopped.add(name)

    def start(self, name: str) -> None:
        with self._lock:
            self.cluster.start_service(name)
            self.stopped.discard(name)

    def pause(self, name: str) -> None:
        with self._lock:
            self.cluster.pause(name)
            self.paused.add(name)

    def resume(self, name: str) -> None:
        with self._lock:
            self.cluster.resume(name)
            self.paused.discard(name)

    def stop_redis(self) -> None:
        with self._lock:
            self.cluster.stop_service("redis", timeout_s=10)
            self.stopped.add("redis")

    def start_redis(self) -> None:
        with self._lock:
            self.cluster.start_service("redis")
            self.stopped.discard("redis")

    def kill_restart(self, name: str, down_s: float, *, sleep: Callable[[float], object] = time.sleep,
                     kind: str = "kill_restart") -> Fault:
        fault = self._begin(kind, name, down_s)
        self.kill(name)
        sleep(down_s)
        self.start(name)
        self._end(fault)
        return fault

    def kill_restart_together(self, names: list[str], down_s: float, *,
                              sleep: Callable[[float], object] = time.sleep, kind: str = "kill_restart") -> Fault:
        fault = self._begin(kind, "+".join(names), down_s)
        for name in names:
            self.kill(name)
        sleep(down_s)
        for name in names:
            self.start(name)
        self._end(fault)
        return fault

    def pause_resume(self, name: str, paused_s: float, *, sleep: Callable[[float], object] = time.sleep,
                     kind: str = "pause_resume", detail: str = "") -> Fault:
        fault = self._begin(kind, name, paused_s, detail)
        self.pause(name)
        sleep(paused_s)
        self.resume(name)
        self._end(fault)
        return fault

    def pause_leader_restart_follower(self, leader: str, follower: str, paused_s: float, down_s: float, *,
                                      sleep: Callable[[float], object] = time.sleep, detail: str = "") -> Fault:
        fault = self._begin("leader_pause_follower_restart", f"{leader}+{follower}", paused_s,
                            f"({follower} down {down_s:.1f}s{', ' + detail if detail else ''})")
        began = time.monotonic()
        self.pause(leader)
        self.kill(follower)
        sleep(down_s)
        self.start(follower)
        sleep(max(0.0, paused_s - (time.monotonic() - began)))
        self.resume(leader)
        self._end(fault)
        return fault

    def restart_redis(self, down_s: float, *, sleep: Callable[[float], object] = time.sleep) -> Fault:
        fault = self._begin("redis_restart", "redis", down_s)
        self.stop_redis()
        sleep(down_s)
        self.start_redis()
        self._end(fault)
        return fault

    def reassign(self, topic: str, partition: int, replicas: tuple[int, ...]) -> None:
        """AlterPartitionReassignments to ``replicas`` (retried while Redis or the front door are
        settling after an earlier fault)."""
        tls = self.cluster.client_tls
        stub = admin_pb2_grpc.AdminStub(open_channel(self.cluster.bootstrap, tls))
        request = admin_pb2.AlterPartitionReassignmentsRequest(partitions=[admin_pb2.PartitionReassignment(
            topic=topic, partition=partition, replicas=list(replicas))])
        last: object = None
        for _ in range(20):
            try:
                result = stub.AlterPartitionReassignments(request, timeout=10).results[0]
                if result.error_code == 0:
                    return
                last = f"{result.error_code} {result.error_message}"
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.5)
        raise RuntimeError(f"reassigning {topic}-{partition} to {list(replicas)} failed: {last}")

    def move_away_and_back(self, topic: str, partition: int, original: tuple[int, ...], removed: int,
                           away_s: float, *, sleep: Callable[[float], object] = time.sleep) -> Fault:
        fault = self._begin("reassign", f"{topic}-{partition}", away_s,
                            f"(off replica-{removed} and back, from {list(original)})")
        self.moved.setdefault((topic, partition), original)
        self.reassign(topic, partition, tuple(r for r in original if r != removed))
        sleep(away_s)
        self.reassign(topic, partition, original)
        self._end(fault)
        return fault

    def heal(self) -> None:
        """Resume every paused process and start every stopped one (redis first); put every moved
        partition back on its replica set (the copy finishes while the run settles)."""
        for name in sorted(self.paused):
            try:
                self.resume(name)
            except Exception as exc:  # noqa: BLE001 - it may have died meanwhile; start it below
                self.say(f"nemesis: resume {name} failed: {exc}")
                self.paused.discard(name)
                self.stopped.add(name)
        for name in sorted(self.stopped, key=lambda n: n != "redis"):
            if not self.cluster.is_running(name):
                self.start(name)
            self.stopped.discard(name)
        for (topic, partition), original in sorted(self.moved.items()):
            self.reassign(topic, partition, original)

    def counts(self) -> Counter[str]:
        return Counter(f.kind for f in self.faults)


class RandomNemesis:
    """Random single faults until ``stop_event`` is set (see module doc). Durations straddle the
    session timeout, so some faults only slow the cluster and some make the controller re-elect."""

    def __init__(self, nemesis: Nemesis, *, seed: int, topic: str, partitions: int,
                 session_timeout_ms: int, kinds: tuple[str, ...] = FAULT_KINDS,
                 quiet_s: tuple[float, float] = (1.0, 4.0)) -> None:
        self.nemesis = nemesis
        self.rng = random.Random(seed)
        self.topic = topic
        self.partitions = partitions
        self.session_s = session_timeout_ms / 1000
        self.kinds = kinds
        self.quiet_s = quiet_s
        self.error: BaseException | None = None

    def _replicas(self) -> list[str]:
        return [s.name for s in self.nemesis.cluster.services("replica")]

    def _coordinators(self) -> list[str]:
        return [s.name for s in self.nemesis.cluster.services("coordinator")]

    def _leader_of(self, partition: int) -> str | None:
        store = MetadataStore.from_url(self.nemesis.cluster.metadata_url)
        try:
            leader = store.partition_state(self.topic, partition).leader
        except Exception:  # noqa: BLE001 - store hiccup: pick at random instead
            return None
        finally:
            store.close()
        return f"replica-{leader}" if leader >= 0 else None

    def _replicas_of(self, partition: int) -> tuple[int, ...]:
        """The partition's target replica set (a move an earlier fault began counts as done)."""
        if (self.topic, partition) in self.nemesis.moved:
            return self.nemesis.moved[(self.topic, partition)]
        store = MetadataStore.from_url(self.nemesis.cluster.metadata_url)
        try:
            return store.partition_state(self.topic, partition).target_replicas
        except Exception:  # noqa: BLE001 - store hiccup: no move this time
            return ()
        finally:
            store.close()

    def _etcd_members(self) -> list[str]:
        return [s.name for s in self.nemesis.cluster.services("etcd")]

    def _etcd_target(self) -> str:
        """An etcd member: its leader half the time (found by asking each member's status)."""
        members = self.nemesis.cluster.services("etcd")
        if self.rng.random() < 0.5:
            for entry in members:
                client = EtcdClient([entry.grpc])
                try:
                    status = client.status(entry.grpc, timeout_s=1.0)
                    if status.leader and status.leader == status.member:
                        return entry.name
                except Exception:  # noqa: BLE001 - a member down or paused: try the next
                    continue
                finally:
                    client.close()
        return self.rng.choice([e.name for e in members])

    def step(self, stop_event: threading.Event) -> Fault:
        rng = self.rng
        kind = rng.choice(self.kinds)
        sleep = stop_event.wait  # a stop request cuts a fault short (it is still healed)
        if kind == "redis_restart":
            return self.nemesis.restart_redis(rng.uniform(0.3, 2.5), sleep=sleep)
        duration = rng.uniform(0.5, 2.3 * self.session_s)
        if kind.startswith("etcd") and len(self._etcd_members()) < 3:
            kind = "kill_restart"  # one member: a fault would take the whole store away
        if kind == "etcd_kill_restart":
            return self.nemesis.kill_restart(self._etcd_target(), duration, sleep=sleep, kind=kind)
        if kind == "etcd_pause":
            return self.nemesis.pause_resume(self._etcd_target(), duration, sleep=sleep, kind=kind)
        if kind == "etcd_and_leader_kill":
            partition = rng.randrange(self.partitions)
            leader = self._leader_of(partition) or rng.choice(self._replicas())
            return self.nemesis.kill_restart_together([self._etcd_target(), leader], duration, sleep=sleep,
                                                      kind=kind)
        if kind in ("coordinator_kill_restart", "coordinator_pause"):
            target = rng.choice(self._coordinators())
            if kind == "coordinator_kill_restart":
                return self.nemesis.kill_restart(target, duration, sleep=sleep, kind=kind)
            return self.nemesis.pause_resume(target, duration, sleep=sleep, kind=kind)
        if kind == "pause_leader":
            partition = rng.randrange(self.partitions)
            target = self._leader_of(partition) or rng.choice(self._replicas())
            return self.nemesis.pause_resume(target, duration, sleep=sleep, kind="pause_leader",
                                             detail=f"(leader of {self.topic}-{partition})")
        if kind == "reassign":
            partition = rng.randrange(self.partitions)
            original = self._replicas_of(partition)
            if len(original) < 2:
                return self.nemesis.pause_resume(rng.choice(self._replicas()), duration, sleep=sleep)
            return self.nemesis.move_away_and_back(self.topic, partition, original, rng.choice(original),
                                                   rng.uniform(0.5, 5.0), sleep=sleep)
        if kind == "leader_pause_follower_restart":
            partition = rng.randrange(self.partitions)
            leader = self._leader_of(partition) or rng.choice(self._replicas())
            follower = rng.choice([r for r in self._replicas() if r != leader])
            return self.nemesis.pause_leader_restart_follower(leader, follower, duration, rng.uniform(0.1, 1.0),
                                                              sleep=sleep, detail=f"leader of {self.topic}-{partition}")
        target = rng.choice(self._replicas())
        if kind == "kill_restart":
            return self.nemesis.kill_restart(target, duration, sleep=sleep)
        return self.nemesis.pause_resume(target, duration, sleep=sleep)

    def run(self, stop_event: threading.Event) -> None:
        try:
            while not stop_event.wait(self.rng.uniform(*self.quiet_s)):
                self.step(stop_event)
        except BaseException as exc:  # noqa: BLE001 - reported by the runner
            self.error = exc
            self.nemesis.say(f"nemesis: failed: {exc!r}")
