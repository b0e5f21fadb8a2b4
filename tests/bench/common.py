"""Shared pieces of the benchmark suite: figures, percentiles, progress, the cluster under test.

Everything here talks raw gRPC (``lowtide_pb`` stubs) to the services, so a figure measures the
servers and the wire, not a client library's bookkeeping. The cluster is a ``LocalCluster`` of
real processes (redis-server, replicas, frontdoor) started detached and always torn down.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from lowtide.errors import error_class_for_code
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.record import encode_batch, iter_batches
from lowtide.rpc.channels import open_channel
from lowtide_pb import admin_pb2, admin_pb2_grpc, common_pb2, replica_pb2, replica_pb2_grpc

MiB = 1024 * 1024
KiB = 1024
_T0 = time.monotonic()


def say(message: str) -> None:
    """Progress line on stderr, stamped with seconds since the suite started."""
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ figures

@dataclass
class Figure:
    """One reported number.

    ``target`` is the human text of a target of docs/testing.md#targets (None when the figure has no target of its own);
    ``target_value`` with ``better`` ("lower" | "higher" | "flat") decides ``status``:
    "pass", "falls short", "not built yet", "error" or "info" (no target). ``ratio`` is the value
    divided by ``ratio_ref`` (described in ``ratio_of``) when a physical reference fits.
    """

    key: str
    name: str
    value: float | None
    unit: str
    target: str | None = None
    target_value: float | None = None
    better: str | None = None
    status: str = "info"
    ratio: float | None = None
    ratio_of: str | None = None
    ratio_target: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def judge(self) -> Figure:
        """Set ``status`` from value/ratio against the target (ratio wins when it has a target)."""
        if self.status in ("not built yet", "error"):
            return self
        if self.value is None:
            self.status = "error"
            return self
        if self.ratio_target is not None and self.ratio is not None:
            self.status = "pass" if self.ratio >= self.ratio_target else "falls short"
        elif self.target_value is not None and self.better == "lower":
            self.status = "pass" if self.value <= self.target_value else "falls short"
        elif self.target_value is not None and self.better == "higher":
            self.status = "pass" if self.value >= self.target_value else "falls short"
        elif self.target_value is not None and self.better == "flat":
            self.status = "pass" if abs(self.value) <= self.target_value else "falls short"
        else:
            self.status = "info"
        return self

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def placeholder(key: str, name: str, unit: str, target: str, issue: str) -> Figure:
    """A §11 figure whose feature is not built yet: shown in the table with value null."""
    return Figure(key=key, name=name, value=None, unit=unit, target=target, status="not built yet",
                  note=f"not built yet ({issue})")


def failed(key: str, name: str, unit: str, target: str | None, error: BaseException | str) -> Figure:
    return Figure(key=key, name=name, value=None, unit=unit, target=target, status="error",
                  note=f"error: {error}"[:300])


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of raw samples; NaN when there are none."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean in milliseconds of samples given in seconds."""
    if not samples_s:
        return {"n": 0}
    return {"n": len(samples_s), "p50_ms": percentile(samples_s, 50) * 1e3, "p90_ms": percentile(samples_s, 90) * 1e3,
            "p99_ms": percentile(samples_s, 99) * 1e3, "max_ms": max(samples_s) * 1e3,
            "mean_ms": sum(samples_s) / len(samples_s) * 1e3}


# ------------------------------------------------------------------------------------------ batches

def build_batch(batch_bytes: int, record_size: int = KiB) -> tuple[bytes, int]:
    """One RecordBatch v2 of ``record_size``-byte values totalling about ``batch_bytes``; (batch, records).

    Built once and re-sent: the leader assigns offsets (base offset and leader epoch are outside
    the CRC), so the same bytes are a valid new batch every time.
    """
    # ~11 bytes of per-record framing (varints, attributes) at 1 KiB; stay under batch_bytes so a
    # "1 MiB" batch fits Kafka's default max.message.bytes (1 MiB + 12).
    count = max(1, (batch_bytes - 61) // (record_size + 16))
    value = (b"lowtide-bench-" * (record_size // 14 + 1))[:record_size]
    return encode_batch([value] * count), count


def next_offset_after(records: bytes) -> int | None:
    """The offset after the last batch in ``records`` (per batch, header only); None when empty."""
    last = None
    for header, _pos in iter_batches(records):
        last = header
    return None if last is None else last.next_offset


# ------------------------------------------------------------------------------------------ process

def rss_bytes(pid: int) -> int | None:
    """VmRSS of ``pid`` from /proc/PID/status, in bytes (None when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float | None:
    """CPU time of ``pid`` (utime + stime, all its threads) from /proc/PID/stat, in ms (None when
    the process is gone). Resolution is one clock tick (``SC_CLK_TCK``, usually 10 ms)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the ")" closing the command name (which may hold spaces): state is field 3,
    # utime field 14, stime field 15.
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * 1000.0 / _CLK_TCK


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: cpu_ms(pid) for name, pid in pids.items()}


def cpu_per_unit(before: dict[str, float | None], after: dict[str, float | None], units: float) -> dict[str, float]:
    """``{process name: CPU ms per unit}`` between two ``cpu_snapshot``s (over the processes
    measured at both ends), plus ``"sum"``; empty when there are no units."""
    if units <= 0:
        return {}
    out = {n: (after[n] - b) / units for n, b in before.items() if b is not None and after.get(n) is not None}
    if out:
        out["sum"] = sum(out.values())
    return out


def cpu_per_mib(before: dict[str, float | None], after: dict[str, float | None], nbytes: int) -> dict[str, float]:
    """``cpu_per_unit`` per MiB of ``nbytes``; empty when nothing was produced."""
    return cpu_per_unit(before, after, nbytes / MiB)


def cpu_figures(key: str, name: str, per_process: dict[str, float], params: dict[str, Any]) -> list[Figure]:
    """One ms/MiB figure per process of ``per_process`` (from ``cpu_per_mib``) and one for the sum;
    keys ``{key}_{process}_ms_mib``, names ``{name}: {process}``."""
    figs = []
    procs = sorted(n for n in per_process if n != "sum")
    for n in [*procs, "sum"]:
        if n not in per_process:
            continue
        label = f"sum of {len(procs)} processes" if n == "sum" else n
        figs.append(Figure(key=f"{key}_{n}_ms_mib", name=f"{name}: {label}", value=per_process[n], unit="ms/MiB",
                           params=params))
    return figs


# The machine-speed reference (``machine_speed``): a fixed amount of the kind of work the hot paths
# do, timed in CPU. Session 31 saw every CPU figure move by a quarter between minutes on the same
# code (the VM's share of its host); a CPU figure is read against the reference taken beside it.
SPEED_PYTHON_ITERATIONS = 200_000
SPEED_ROUND_TRIPS = 5_000


def _python_workload() -> int:
    """Tuples, dict inserts and lookups: what a check, an apply or a request parse spends its time on."""
    table: dict[tuple[int, int], tuple[int, int, int]] = {}
    hits = 0
    for i in range(SPEED_PYTHON_ITERATIONS):
        table[(i & 1023, i)] = (i, i + 1, i * 2)
        hits += (i & 1023, i - 1) in table
    return hits


# The echoing side of ``_round_trips``: another interpreter (not a fork: a fork of a process with
# gRPC threads can die in gRPC's poller, which once failed two bench sections), timing its own loop.
_ECHO = """
import socket, struct, sys, time
s = socket.socket(fileno=int(sys.argv[1]))
s.sendall(b"r")
began = time.process_time()
for _ in range(int(sys.argv[2])):
    s.sendall(s.recv(64))
s.sendall(struct.pack("!d", time.process_time() - began))
"""


def _round_trips(count: int) -> float:
    """CPU seconds of both processes for ``count`` 64-byte round trips over a socket pair (one
    process each side): a send, a wake-up of the other process and a receive, twice."""
    parent, child = socket.socketpair()
    echo = subprocess.Popen([sys.executable, "-c", _ECHO, str(child.fileno()), str(count)],
                            pass_fds=(child.fileno(),))
    child.close()
    try:
        if parent.recv(1) != b"r":
            raise RuntimeError("the echo process did not start")
        message = b"x" * 64
        began = time.process_time()
        for _ in range(count):
            parent.sendall(message)
            parent.recv(64)
        mine = time.process_time() - began
        theirs = struct.unpack("!d", parent.recv(8))[0]
    finally:
        parent.close()
        echo.wait(timeout=30)
    return mine + theirs


def machine_speed(repeat: int = 3) -> dict[str, float]:
    """This minute's machine speed, best of ``repeat``: ``python_ms``, the CPU of a fixed Python
    workload (``_python_workload``), and ``round_trip_us``, the CPU of one message round trip between
    two processes (``_round_trips``). Lower is faster; compare a CPU figure with the reference taken
    beside it, not with a figure of another day."""
    python_s = []
    for _ in range(repeat):
        began = time.process_time()
        _python_workload()
        python_s.append(time.process_time() - began)
    trips = [_round_trips(SPEED_ROUND_TRIPS) for _ in range(repeat)]
    return {"python_ms": min(python_s) * 1e3, "round_trip_us": min(trips) / SPEED_ROUND_TRIPS * 1e6}


def dir_log_bytes(path: Path) -> dict[str, int]:
    """``{file name: size}`` of the segment files (``*.log*``) in one partition directory."""
    out: dict[str, int] = {}
    try:
        with os.scandir(path) as it:
            for entry in it:
                if ".log" in entry.name:
                    try:
                        out[entry.name] = entry.stat().st_size
                    except FileNotFoundError:
                        pass
    except FileNotFoundError:
        pass
    return out


def settle_disk(*, max_dirty_mib: float = 32.0, timeout_s: float = 60.0) -> float:
    """Write back the page cache's dirty data before a section starts; returns the seconds it took.

    A section that writes gigabytes (the transport ceiling, the cleaner, produce) leaves them to the
    kernel's writeback, which would otherwise land in the next section's fsyncs: the DeleteRecords
    latencies (a fsync'd checkpoint each) would measure the previous section's disk traffic."""
    began = time.monotonic()
    os.sync()
    while time.monotonic() - began < timeout_s and _dirty_mib() > max_dirty_mib:
        time.sleep(0.1)
    return time.monotonic() - began


def _dirty_mib() -> float:
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    except OSError:
        return 0.0
    kib = sum(int(fields.get(k, "0 kB").split()[0]) for k in ("Dirty", "Writeback"))
    return kib / 1024


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


# ------------------------------------------------------------------------------------------ cluster

class Bench:
    """The cluster under test plus raw stubs to its front door and replicas. Not thread-safe for
    ``close``; the stub methods are (gRPC channels are)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap
        self.tls = cluster.client_tls  # the admin's certificate on a TLS cluster, else None (plaintext)
        self._channels: dict[str, grpc.Channel] = {}
        self.admin = admin_pb2_grpc.AdminStub(self.channel(self.bootstrap))
        self.replicas = {s.index: s for s in cluster.services("replica")}
        self._addr_by_broker: dict[int, str] = {}

    def channel(self, address: str) -> grpc.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address, self.tls)
        return ch

    def replica_stub(self, address: str) -> replica_pb2_grpc.ReplicaStub:
        return replica_pb2_grpc.ReplicaStub(self.channel(address))

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    # -- admin ------------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, rf: int, config: dict[str, str] | None = None) -> None:
        resp = self.admin.CreateTopics(admin_pb2.CreateTopicsRequest(topics=[admin_pb2.TopicSpec(
            name=name, partitions=partitions, replication_factor=rf, config=dict(config or {}))]), timeout=120)
        for r in resp.topics:
            if r.error_code:
                raise RuntimeError(f"CreateTopics {name}: {common_pb2.ErrorCode.Name(r.error_code)} {r.error_message}")
        self.wait_leaders(name, partitions)

    def delete_topic(self, name: str) -> None:
        try:
            self.admin.DeleteTopics(admin_pb2.DeleteTopicsRequest(names=[name]), timeout=60)
        except grpc.RpcError as exc:
            say(f"DeleteTopics {name} failed: {exc.code().name}")

    def metadata(self, topic: str) -> admin_pb2.MetadataResponse:
        return self.admin.Metadata(admin_pb2.MetadataRequest(topics=[topic]), timeout=30)

    def leaders(self, topic: str) -> dict[int, str]:
        """``{partition: leader gRPC address}`` (raises while a partition has no leader)."""
        md = self.metadata(topic)
        brokers = {b.id: f"{b.host}:{b.port}" for b in md.brokers}
        self._addr_by_broker.update(brokers)
        out: dict[int, str] = {}
        for t in md.topics:
            if t.error_code:
                raise RuntimeError(f"metadata {topic}: {common_pb2.ErrorCode.Name(t.error_code)} {t.error_message}")
            for p in t.partitions:
                if p.leader < 0 or p.leader not in brokers:
                    raise RuntimeError(f"{topic}-{p.partition} has no leader")
                out[p.partition] = brokers[p.leader]
        return out

    def replica_sets(self, topic: str) -> dict[int, list[int]]:
        md = self.metadata(topic)
        return {p.partition: list(p.replicas) for t in md.topics for p in t.partitions}

    def wait_leaders(self, topic: str, partitions: int, timeout_s: float = 60.0) -> None:
        def ready() -> bool:
            try:
                return len(self.leaders(topic)) == partitions
            except (RuntimeError, grpc.RpcError):
                return False
        wait_until(ready, timeout_s, f"leaders of {topic}")

    def describe_logs(self, address: str, topic: str | None = None) -> list[replica_pb2.LogInfo]:
        resp = self.replica_stub(address).DescribeLogs(replica_pb2.DescribeLogsRequest(), timeout=30)
        return [log for log in resp.logs if topic is None or log.topic == topic]

    def wait_replicated(self, topic: str, timeout_s: float = 60.0) -> None:
        """Until every replica of every partition of ``topic`` has LEO == HW == leader LEO."""
        addrs = [s.grpc for s in self.replicas.values()]

        def caught_up() -> bool:
            leo: dict[int, set[int]] = {}
            for addr in addrs:
                for log in self.describe_logs(addr, topic):
                    leo.setdefault(log.partition, set()).update({log.log_end_offset, log.high_watermark})
            return bool(leo) and all(len(v) == 1 for v in leo.values())
        wait_until(caught_up, timeout_s, f"replicas of {topic} to catch up", interval_s=0.1)

    def produce_once(self, address: str, topic: str, items: dict[int, bytes], acks: int = -1,
                     retry_s: float = 30.0) -> None:
        """One Produce to ``address`` with one record set per partition; raises on any error.

        Partitions the replica does not host yet (a topic just created: the replicas learn of it
        asynchronously) or does not lead yet are retried for ``retry_s``."""
        deadline = time.monotonic() + retry_s
        pending = dict(items)
        while pending:
            req = replica_pb2.ProduceRequest(acks=acks, timeout_ms=30000, partitions=[
                replica_pb2.ProducePartition(topic=topic, partition=p, records=r) for p, r in pending.items()])
            resp = self.replica_stub(address).Produce(req, timeout=60)
            retry: dict[int, bytes] = {}
            for r in resp.partitions:
                if r.error_code and error_class_for_code(r.error_code).retriable and time.monotonic() < deadline:
                    retry[r.partition] = pending[r.partition]
                elif r.error_code:
                    raise RuntimeError(f"Produce {topic}-{r.partition}: {common_pb2.ErrorCode.Name(r.error_code)} "
                                       f"{r.error_message}")
            pending = retry
            if pending:
                time.sleep(0.05)

    def produce_all(self, topic: str, items: dict[int, bytes], acks: int = -1) -> None:
        """Produce ``{partition: records}`` grouped into one request per leader."""
        by_leader: dict[str, dict[int, bytes]] = {}
        for p, addr in self.leaders(topic).items():
            if p in items:
                by_leader.setdefault(addr, {})[p] = items[p]
        for addr, part in by_leader.items():
            self.produce_once(addr, topic, part, acks=acks)

    def list_offsets(self, address: str, topic: str, partition: int, ts: int) -> int:
        resp = self.replica_stub(address).ListOffsets(common_pb2.ListOffsetsRequest(partitions=[
            common_pb2.ListOffsetsPartition(topic=topic, partition=partition, timestamp=ts)]), timeout=30)
        r = resp.partitions[0]
        if r.error_code:
            raise RuntimeError(f"ListOffsets {topic}-{partition}: {common_pb2.ErrorCode.Name(r.error_code)}")
        return r.offset

    def delete_records_frontdoor(self, items: Sequence[tuple[str, int, int]],
                                 timeout_ms: int = 30000) -> common_pb2.DeleteRecordsResponse:
        req = common_pb2.DeleteRecordsRequest(timeout_ms=timeout_ms, partitions=[
            common_pb2.DeleteRecordsPartition(topic=t, partition=p, offset=o) for t, p, o in items])
        return self.admin.DeleteRecords(req, timeout=timeout_ms / 1000 + 10)

    def delete_records_replica(self, address: str, items: Sequence[tuple[str, int, int]],
                               timeout_ms: int = 30000) -> common_pb2.DeleteRecordsResponse:
        req = common_pb2.DeleteRecordsRequest(timeout_ms=timeout_ms, partitions=[
            common_pb2.DeleteRecordsPartition(topic=t, partition=p, offset=o) for t, p, o in items])
        return self.replica_stub(address).DeleteRecords(req, timeout=timeout_ms / 1000 + 10)


def check_delete(resp: common_pb2.DeleteRecordsResponse) -> None:
    """Raise on the first per-partition error of a DeleteRecords response."""
    for r in resp.partitions:
        if r.error_code:
            raise RuntimeError(f"DeleteRecords {r.topic}-{r.partition}: "
                               f"{common_pb2.ErrorCode.Name(r.error_code)} {r.error_message}")


@contextmanager
def running_cluster(data_dir: Path, replicas: int = 3, replica_config: dict[str, str] | None = None, *,
                    tls: bool = False, extra_env: dict[str, str] | None = None) -> Iterator[Bench]:
    """Start a detached ``LocalCluster`` in ``data_dir``, yield a ``Bench`` on it, always tear down.
    ``tls``: every gRPC port TLS, mutual between services (``ClusterConfig(tls=True)``); the
    ``Bench`` dials it with the cluster's admin certificate. ``extra_env``: added to every
    service's environment (``LOWTIDE_*`` flags)."""
    config = ClusterConfig(data_dir=data_dir, replicas=replicas, coordinators=0, orphan_scanners=0,
                           replica_config=dict(replica_config or {}), tls=tls, extra_env=dict(extra_env or {}))
    cluster = LocalCluster(config)
    say(f"starting a local cluster ({replicas} replicas{', TLS' if tls else ''}) in {data_dir}")
    began = time.monotonic()
    try:
        cluster.up(detach=True, progress=lambda m: say(f"  cluster: {m}"))
    except BaseException:
        cluster.down(timeout_s=10.0)
        raise
    say(f"cluster up in {time.monotonic() - began:.1f}s, bootstrap {cluster.bootstrap}")
    bench = Bench(cluster)
    try:
        yield bench
    finally:
        bench.close()
        say("stopping the cluster")
        cluster.down(timeout_s=10.0)
