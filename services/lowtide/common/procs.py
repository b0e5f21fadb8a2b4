"""Local processes: free ports, waiting for a port, and a real redis-server.

Used by ``lowtide cluster up`` and by test fixtures: both start the same real processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


class MissingToolError(RuntimeError):
    """A required external program is not installed; the message says how to get it."""


def find_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


@dataclass
class RedisProcess:
    """A redis-server child process on a loopback port, with its data in ``data_dir``."""

    port: int
    data_dir: Path
    proc: subprocess.Popen | None = None
    pid: int = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, *, timeout_s: float = 5.0) -> None:
        pid = self.proc.pid if self.proc else self.pid
        if not pid:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if self.proc is not None:
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_redis(data_dir: Path | str, *, port: int | None = None, detach: bool = False,
                appendonly: bool = True) -> RedisProcess:
    """Start a real redis-server bound to 127.0.0.1 and wait until it accepts connections."""
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
    # The child writes through its own copy of the descriptor; ours is closed once it is started.
    with open(data_dir / "redis.stdout", "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=detach)
    wait_for_port("127.0.0.1", port, timeout_s=10)
    return RedisProcess(port=port, data_dir=data_dir, proc=proc, pid=proc.pid)
