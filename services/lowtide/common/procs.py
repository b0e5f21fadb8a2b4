"""Local processes: free ports, waiting for a port, a real redis-server and real etcd members.

Used by ``lowtide cluster up`` and by test fixtures: both start the same real processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


class MissingToolError(RuntimeError):
    """A required external program is not installed; the message says how to get it."""


# LOWTIDE_PORT_RANGE="LO-HI": find_free_port picks only from these ports. The parallel test suite
# gives each pytest-xdist worker its own range below the kernel's ephemeral range (32768-60999 by
# default), so one worker's pick can neither be taken by another worker's pick nor by a port the
# kernel hands out for an outgoing connection or a bind to port 0 between our pick and the bind.
PORT_RANGE_ENV = "LOWTIDE_PORT_RANGE"
_next_port: dict[tuple[int, int], int] = {}
_port_lock = threading.Lock()


# Without LOWTIDE_PORT_RANGE (a `lowtide cluster up` from a shell, the contract check) ports come from
# just below the kernel's ephemeral range too. A port picked inside that range can be handed out by the
# kernel before our service binds it: a replica's replication listener binds port 0 at start, and every
# outgoing connection takes an ephemeral port; CI once saw a later replica fail "Failed to bind to
# address 127.0.0.1:37099" that way. 26000 and up stays clear of the test workers' ranges (tests/conftest.py).
DEFAULT_PORT_FLOOR = 26_000
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def _default_port_range() -> tuple[int, int] | None:
    try:
        with open(EPHEMERAL_RANGE_FILE, encoding="ascii") as f:
            ephemeral_lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    hi = ephemeral_lo - 1
    return (DEFAULT_PORT_FLOOR, hi) if hi - DEFAULT_PORT_FLOOR >= 1000 else None


def _port_range() -> tuple[int, int] | None:
    spec = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not spec:
        return _default_port_range()
    try:
        lo, hi = (int(part) for part in spec.split("-", 1))
    except ValueError:
        raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected LO-HI, e.g. 20000-21999") from None
    if not 1024 <= lo < hi <= 65535:
        raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected 1024 <= LO < HI <= 65535")
    return lo, hi


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as the services' own listeners: a TIME_WAIT leftover does not block them.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now: the next bindable port of LOWTIDE_PORT_RANGE (by default the
    ports just below the kernel's ephemeral range; where there is no room there, the kernel picks),
    walked in turn from a start that depends on the pid (so a test process and the CLI child it
    starts do not walk the same ports), never the same port twice in a row from one process even
    before anything binds it."""
    bounds = _port_range()
    if bounds is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    lo, hi = bounds
    size = hi - lo + 1
    with _port_lock:
        cursor = _next_port.get(bounds, (os.getpid() * 7919) % size)
        for step in range(size):
            port = lo + (cursor + step) % size
            if _bindable(host, port):
                _next_port[bounds] = (cursor + step + 1) % size
                return port
    raise OSError(f"no free port in {PORT_RANGE_ENV}={lo}-{hi}")


def wait_for_port(host: str, port: int, *, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s}s") from None
            time.sleep(0.02)


def require_tool(name: str, hint: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if not path:
        raise MissingToolError(f"'{name}' is not installed: {hint}")
    return path


def stop_child(proc: subprocess.Popen | None, pid: int, *, timeout_s: float) -> None:
    """SIGTERM a server we started (``proc``, or a detached one by ``pid``); wait for our own child
    up to ``timeout_s``, then SIGKILL it. A detached one is only signalled."""
    pid = proc.pid if proc is not None else pid
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if proc is not None:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class ServerProcess:
    """A server process we started: ``proc`` while it is our child (None for a detached one
    known by ``pid`` alone), and its pid. Keyword-only, so each kind of server lists its own
    fields first."""

    proc: subprocess.Popen | None = field(default=None, kw_only=True)
    pid: int = field(default=0, kw_only=True)

    def stop(self, *, timeout_s: float = 5.0) -> None:
        stop_child(self.proc, self.pid, timeout_s=timeout_s)


@dataclass
class RedisProcess(ServerProcess):
    """A redis-server child process on a loopback port, with its data in ``data_dir``."""

    port: int
    data_dir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def start_redis(data_dir: Path | str, *, port: int | None = None, detach: bool = False,
                appendonly: bool = True, tls: tuple[Path, Path, Path] | None = None) -> RedisProcess:
    """Start a real redis-server bound to 127.0.0.1 and wait until it accepts connections.

    ``tls`` = (certificate, key, CA): the port speaks only TLS (redis-server's ``tls-port``, no
    plaintext port); client certificates are optional (``tls-auth-clients optional``), so clients
    need only the CA (``rediss://...?ssl_ca_certs=CA``)."""
    exe = require_tool("redis-server", "install it with 'apt-get install redis-server' (make setup does this)")
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or find_free_port()
    args = [
        exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir),
        "--save", "", "--appendonly", "yes" if appendonly else "no",
        "--appendfsync", "everysec", "--protected-mode", "no",
        "--logfile", str(data_dir / "redis.log"),
        # keyspace notifications are not needed; keep redis quiet and predictable
        "--daemonize", "no",
    ]
    if tls is not None:
        cert, key, ca = tls
        args[args.index("--port") + 1] = "0"
        args += ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                 "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "optional"]
    # The child writes through its own copy of the descriptor; ours is closed once it is started.
    with open(data_dir / "redis.stdout", "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=detach)
    wait_for_port("127.0.0.1", port, timeout_s=10)
    return RedisProcess(port=port, data_dir=data_dir, proc=proc, pid=proc.pid)


@dataclass
class EtcdMember(ServerProcess):
    """One etcd member child process: its client endpoint (``host:port``) and data directory."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


def etcd_member_argv(*, name: str, data_dir: Path, client_port: int, peer_port: int,
                     initial_cluster: str, new: bool = True, cluster_token: str = "lowtide",
                     tls: tuple[Path, Path, Path] | None = None) -> list[str]:
    """etcd's command line for one member on loopback (``initial_cluster``: ``name=peerURL,...``).

    Tuned for one machine: a 100 ms heartbeat and 1 s election (etcd's defaults), snapshots every
    10,000 entries, transactions large enough for a topic of many partitions, and automatic
    compaction of history older than an hour, so a long-running local cluster's store does not grow
    without bound. ``new=False`` joins an existing cluster (a member replaced after losing its disk).
    ``tls`` = (certificate, key, CA): client and peer ports speak
    mutual TLS only."""
    exe = require_tool("etcd", "install it with 'apt-get install etcd-server' (make setup does this)")
    scheme = "https" if tls is not None else "http"
    args = [exe, "--name", name, "--data-dir", str(data_dir),
            "--listen-client-urls", f"{scheme}://127.0.0.1:{client_port}",
            "--advertise-client-urls", f"{scheme}://127.0.0.1:{client_port}",
            "--listen-peer-urls", f"{scheme}://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"{scheme}://127.0.0.1:{peer_port}",
            "--initial-cluster", initial_cluster, "--initial-cluster-token", cluster_token,
            "--initial-cluster-state", "new" if new else "existing",
            "--snapshot-count", "10000", "--auto-compaction-mode", "periodic",
            # A topic's partitions are created in one transaction (one key each): etcd's default
            # limits (128 operations, 1.5 MiB) would cap a topic at 128 partitions.
            "--max-txn-ops", "100000", "--max-request-bytes", str(32 << 20),
            "--auto-compaction-retention", "1h", "--logger", "zap", "--log-outputs", "stderr"]
    if tls is not None:
        cert, key, ca = tls
        args += ["--cert-file", str(cert), "--key-file", str(key), "--trusted-ca-file", str(ca),
                 "--client-cert-auth", "--peer-cert-file", str(cert), "--peer-key-file", str(key),
                 "--peer-trusted-ca-file", str(ca), "--peer-client-cert-auth"]
    return args


def start_etcd(data_dir: Path | str, *, members: int = 1, ports: Sequence[tuple[int, int]] | None = None,
               detach: bool = False, tls: tuple[Path, Path, Path] | None = None,
               timeout_s: float = 20.0) -> list[EtcdMember]:
    """Start a real etcd cluster of ``members`` processes on loopback and wait until each serves.

    Member i keeps its data in ``data_dir/etcd-i`` and logs to ``data_dir/etcd-i.log``. ``ports``
    gives each member's (client, peer) ports (a restart keeps its addresses); free ones otherwise.
    A member whose data directory exists restarts with its data (etcd ignores the initial-cluster
    flags then)."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    chosen = list(ports) if ports is not None else [(find_free_port(), find_free_port()) for _ in range(members)]
    scheme = "https" if tls is not None else "http"
    initial = ",".join(f"etcd-{i}={scheme}://127.0.0.1:{peer}" for i, (_, peer) in enumerate(chosen))
    started = []
    for i, (client_port, peer_port) in enumerate(chosen):
        member_dir = data_dir / f"etcd-{i}"
        argv = etcd_member_argv(name=f"etcd-{i}", data_dir=member_dir, client_port=client_port,
                                peer_port=peer_port, initial_cluster=initial, tls=tls)
        with open(data_dir / f"etcd-{i}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=detach)
        started.append(EtcdMember(name=f"etcd-{i}", client_port=client_port, peer_port=peer_port,
                                  data_dir=member_dir, proc=proc, pid=proc.pid))
    for member in started:
        wait_for_port("127.0.0.1", member.client_port, timeout_s=timeout_s)
    return started
