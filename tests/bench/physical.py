"""Physical references, measured in the same run as the figures they scale.

* Sequential disk write bandwidth: one file of ``size`` bytes written in 1 MiB blocks on the
  filesystem of the cluster's data directory, fsync at the end; the time includes the fsync.
* Sequential disk read bandwidth: the same file read back in 1 MiB blocks. The page cache is
  dropped first (``/proc/sys/vm/drop_caches``, needs root) or, failing that, the file's pages are
  evicted with ``posix_fadvise(DONTNEED)``; the result says which, and whether the read was cold.
* Loopback gRPC round trip: ``grpc.health.v1.Health/Check`` (an empty unary call) against a
  running replica, p50/p99 of raw samples after a warm-up.
* Machine speed (``common.machine_speed``): the CPU of a fixed Python workload and of a message
  round trip between two processes, at the start of the run; the CPU-per-unit figures carry the
  same reference taken beside them, since the VM's speed drifts between minutes.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.bench.common import Figure, MiB, machine_speed, percentile, say

BLOCK = MiB


def _drop_caches(path: Path) -> str:
    """Evict ``path`` from the page cache; returns the method that worked ("" when none did)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return "fadvise_dontneed"
    except (OSError, AttributeError):
        return ""


def _cached_fraction(path: Path) -> float | None:
    """Fraction of ``path``'s pages in the page cache (mincore via mmap is not exposed in Python;
    use fincore from util-linux when present), None when unknown."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", str(path)],
                             capture_output=True, text=True, timeout=10, check=True).stdout.split()
        return int(out[0]) / max(1, int(out[1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def disk_bandwidth(directory: Path, size: int) -> list[Figure]:
    """Sequential write (with fsync) and read bandwidth of a ``size``-byte file in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bench-disk.tmp"
    block = os.urandom(BLOCK)
    blocks = size // BLOCK
    say(f"disk: writing {size // MiB} MiB in 1 MiB blocks to {directory} (fsync at the end)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        began = time.perf_counter()
        try:
            for _ in range(blocks):
                os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - began
        write_mbs = blocks * BLOCK / write_s / 1e6
        method = _drop_caches(path)
        cached = _cached_fraction(path)
        say(f"disk: write {write_mbs:.0f} MB/s; reading back (cache eviction: {method or 'none'}, "
            f"cached before read: {cached if cached is not None else 'unknown'})")
        buf = bytearray(BLOCK)
        fd = os.open(path, os.O_RDONLY)
        began = time.perf_counter()
        total = 0
        try:
            while True:
                n = os.readv(fd, [buf])
                if n <= 0:
                    break
                total += n
        finally:
            os.close(fd)
        read_s = time.perf_counter() - began
    finally:
        path.unlink(missing_ok=True)
    read_mbs = total / read_s / 1e6
    cold = bool(method) and (cached is None or cached < 0.05)
    say(f"disk: read {read_mbs:.0f} MB/s ({'cold' if cold else 'warm'})")
    params = {"bytes": blocks * BLOCK, "block": BLOCK, "dir": str(directory), "fsync": "at end, timed"}
    return [
        Figure(key="disk_write_mbs", name="sequential disk write (1 MiB blocks, fsync at end)",
               value=write_mbs, unit="MB/s", params=params),
        Figure(key="disk_read_mbs", name=f"sequential disk read ({'cold' if cold else 'warm'} cache)",
               value=read_mbs, unit="MB/s",
               params={**params, "cache_eviction": method or "none", "cached_fraction_before": cached,
                       "cold": cold}),
    ]


def checkpoint_write_latency(directory: Path, calls: int) -> list[Figure]:
    """p50/p99 of a crash-safe small-file replace as the checkpoint files do it: write ``.tmp``,
    fsync it, rename over the target, fsync the directory. A DeleteRecords that makes the LSO
    durable before acknowledging pays at least one of these on the leader and one per follower."""
    directory.mkdir(parents=True, exist_ok=True)
    target, tmp = directory / "bench-ckpt", directory / "bench-ckpt.tmp"
    payload = b"0\n1\nbench 0 123456\n"
    samples = []
    for i in range(calls + 10):
        began = time.perf_counter()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        if i >= 10:
            samples.append(time.perf_counter() - began)
    target.unlink(missing_ok=True)
    p50, p99 = percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3
    say(f"disk: small-file replace with 2 fsyncs p50 {p50:.3f} ms, p99 {p99:.3f} ms over {calls}")
    params = {"calls": calls, "steps": "write .tmp, fsync, rename, fsync dir", "dir": str(directory)}
    return [Figure(key="fsync_replace_p50_ms", name="checkpoint-style file replace (2 fsyncs) p50", value=p50,
                   unit="ms", params=params),
            Figure(key="fsync_replace_p99_ms", name="checkpoint-style file replace (2 fsyncs) p99", value=p99,
                   unit="ms", params=params)]


def grpc_rtt(address: str, calls: int, warmup: int = 200) -> list[Figure]:
    """p50/p99 of ``calls`` sequential Health/Check round trips to ``address``."""
    channel = grpc.insecure_channel(address)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        req = health_pb2.HealthCheckRequest(service="")
        for _ in range(warmup):
            stub.Check(req, timeout=5)
        samples = []
        for _ in range(calls):
            began = time.perf_counter()
            stub.Check(req, timeout=5)
            samples.append(time.perf_counter() - began)
    finally:
        channel.close()
    p50, p99 = percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3
    say(f"grpc: empty-call round trip p50 {p50:.3f} ms, p99 {p99:.3f} ms over {calls} calls")
    params = {"call": "grpc.health.v1.Health/Check", "target": address, "calls": calls, "warmup": warmup}
    return [Figure(key="grpc_rtt_p50_ms", name="loopback gRPC empty call round trip p50", value=p50, unit="ms",
                   params=params),
            Figure(key="grpc_rtt_p99_ms", name="loopback gRPC empty call round trip p99", value=p99, unit="ms",
                   params=params)]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def git_commit(repo: Path) -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _disk_of(directory: Path) -> str:
    """Device, filesystem type and model of the filesystem holding ``directory``."""
    try:
        out = subprocess.run(["df", "--output=source,fstype,size", str(directory)], capture_output=True,
                             text=True, timeout=10, check=True).stdout.splitlines()[-1].split()
        source, fstype, size = out[0], out[1], out[2]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"
    dev = Path(source).name
    base = dev.rstrip("0123456789") if not dev.startswith("nvme") else dev.split("p")[0]
    rotational = _read(f"/sys/block/{base}/queue/rotational").strip()
    model = _read(f"/sys/block/{base}/device/model").strip()
    kind = {"0": "non-rotational", "1": "rotational"}.get(rotational, "")
    size_gib = int(size) * 1024 / 2**30 if size.isdigit() else 0
    return ", ".join(x for x in (f"{source} ({fstype}, {size_gib:.0f} GiB)", model, kind) if x)


def machine_info(data_dir: Path, repo: Path, mode: str) -> dict[str, Any]:
    """CPU model, cores, RAM, disk, kernel, Python, date, mode and git commit of this run."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal:")), 0)
    return {
        "host": socket.gethostname(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "disk": _disk_of(data_dir),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "mode": mode,
        "git_commit": git_commit(repo),
        "data_dir": str(data_dir),
    }


def speed_reference() -> list[Figure]:
    """This run's machine speed (``common.machine_speed``), for reading its CPU figures."""
    speed = machine_speed()
    say(f"machine speed: Python reference {speed['python_ms']:.0f} ms CPU, process round trip "
        f"{speed['round_trip_us']:.0f} µs CPU")
    return [Figure(key="speed_python_ms", name="machine speed: fixed Python workload, CPU", value=speed["python_ms"],
                   unit="ms", note="tests.bench.common._python_workload, best of 3; lower is faster"),
            Figure(key="speed_round_trip_us", name="machine speed: message round trip between two processes, CPU",
                   value=speed["round_trip_us"], unit="µs",
                   note="64 bytes each way over a socket pair, both processes' CPU in the loop (the echo side a "
                        "spawned interpreter since session 40, no longer a fork), best of 3; lower is faster")]
