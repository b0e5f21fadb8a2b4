"""Process and health primitives of the local-cluster supervisor.

All functions are stateless and thread-safe. Pids come from cluster.json, possibly written by
another (long gone) process, so every signal is preceded by an ownership check: the pid must still
be alive and its command line must carry the service's address, so a recycled pid is never hit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.metadata.store import etcd_member_health
from lowtide.purgatory.connection import redis_ready
from lowtide.rpc.channels import ChannelPool
from lowtide.tls.config import ClientTls

SERVING = "SERVING"
UNREACHABLE = "UNREACHABLE"
STOPPED = "STOPPED"


def read_cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def is_pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live (not zombie) process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    # Field 3 (after the parenthesised command name) is the state; a zombie has exited already --
    # unless only its main thread has: a killed multi-threaded process shows its leader as "Z" while
    # the other threads still exit, and its descriptors (a listening port) close with the last one.
    # A restart bound in that window failed with EADDRINUSE.
    if stat.rpartition(")")[2].split()[0] == "Z" and not _has_other_threads(pid):
        reap_if_child(pid)
        return False
    return True


def _has_other_threads(pid: int) -> bool:
    try:
        return any(tid != str(pid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return False


def reap_if_child(pid: int) -> None:
    # A detached child of *this* process stays a zombie until reaped; reap it so the pid goes away.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def is_owned(pid: int, address: str) -> bool:
    """True when ``pid``'s command line names ``address`` (``host:port``) — it is our service.

    Services carry ``--grpc-addr host:port``; redis-server retitles itself ``redis-server host:port``
    but shows ``--port N`` before it does, so both forms count.
    """
    cmdline = read_cmdline(pid)
    if cmdline is None:
        return not Path("/proc").is_dir()  # without procfs there is nothing to check against
    port = address.rpartition(":")[2]
    return (bool(address) and address in cmdline) or (bool(port) and f"--port {port} " in cmdline + " ")


def is_service_running(pid: int, address: str) -> bool:
    return is_pid_alive(pid) and is_owned(pid, address)


def send_signal(pid: int, sig: int) -> bool:
    """Signal ``pid``; False when it no longer exists."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def wait_until_stopped(pid: int, *, timeout_s: float = 2.0) -> bool:
    """After SIGSTOP: wait until every thread of ``pid`` is stopped (state T in /proc). kill()
    returns once the signal is queued; a thread running on another core goes on for a moment, so
    a request sent right after could still be answered. False if not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            states = [(Path(f"/proc/{pid}/task") / tid / "stat").read_text().rsplit(")", 1)[1].split()[0]
                      for tid in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return False  # gone (or not Linux): nothing left to wait for
        if all(state in ("T", "t") for state in states):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def wait_for_exit(pid: int, *, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    """Wait until ``pid`` is gone; True if it went within ``timeout_s``."""
    if proc is not None:
        try:
            proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout_s
    while is_pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def terminate(pid: int, *, address: str, timeout_s: float, proc: subprocess.Popen | None = None) -> str:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns what happened:
    ``"not running"``, ``"stopped"`` (exited on SIGTERM) or ``"killed"``."""
    if not is_service_running(pid, address):
        if proc is not None:
            proc.poll()
        return "not running"
    send_signal(pid, signal.SIGTERM)
    # A paused (SIGSTOP) process would hold the SIGTERM pending forever; let it run to handle it.
    send_signal(pid, signal.SIGCONT)
    if wait_for_exit(pid, timeout_s=timeout_s, proc=proc):
        return "stopped"
    send_signal(pid, signal.SIGKILL)
    wait_for_exit(pid, timeout_s=5.0, proc=proc)
    return "killed"


def tail_file(path: Path | str, *, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError as exc:
        return f"(no log: {exc})"


def check_grpc_health(address: str, *, timeout_s: float = 1.0, tls: ClientTls | None = None) -> str:
    """``grpc.health.v1.Health/Check(service="")`` at ``address`` (over TLS with ``tls``): the
    status name, or UNREACHABLE."""
    with ChannelPool.oneshot(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError:
            return UNREACHABLE
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def check_etcd_health(endpoint: str, *, timeout_s: float = 1.0, tls: ClientTls | None = None) -> str:
    """SERVING once the etcd member at ``endpoint`` answers (over mutual TLS with ``tls``: a
    ``--tls`` cluster's members refuse anything else) and its cluster has a leader."""
    return etcd_member_health(endpoint, timeout_s=timeout_s, tls=tls)


def check_redis_health(url: str, *, timeout_s: float = 1.0) -> str:
    """SERVING once the redis-server answers and has loaded its AOF (a restarted one answers PING
    while it loads, and -LOADING to reads)."""
    return SERVING if redis_ready(url, timeout_s=timeout_s) else UNREACHABLE
