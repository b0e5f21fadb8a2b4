"""A replica started before Redis waits for it (as every pod of a Kubernetes release starts at once)
instead of exiting, and serves once Redis answers; past --redis-wait-seconds it gives up, naming
the error."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.common.procs import find_free_port, start_redis
from tests import waiting


def start_replica(tmp_path: Path, redis_port: int, *, wait_s: float, metadata_url: str) -> tuple[subprocess.Popen, str]:
    addr = f"127.0.0.1:{find_free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lowtide.cli.main", "serve", "replica", "--id", "0",
         "--data-dir", str(tmp_path / "data"), "--grpc-addr", addr,
         "--metadata-url", metadata_url,
         "--redis-url", f"redis://127.0.0.1:{redis_port}/0", "--redis-wait-seconds", str(wait_s)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, addr


def serving(addr: str) -> bool:
    with grpc.insecure_channel(addr) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_replica_started_before_redis_serves_once_redis_is_up(tmp_path: Path, metadata_url: str) -> None:
    redis_port = find_free_port()
    proc, addr = start_replica(tmp_path, redis_port, wait_s=60, metadata_url=metadata_url)
    lines: list[str] = []
    # Collect the replica's output as it comes: Redis starts only once the replica said it waits
    # (its start-up takes seconds on a busy machine; a fixed sleep could start Redis too early).
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    redis = None
    try:
        waiting.wait_until(lambda: any("waiting for Redis" in line for line in lines) or proc.poll() is not None,
                           timeout_s=120, interval_s=0.1, what="the replica saying it waits for Redis")
        assert proc.poll() is None, "".join(lines)
        assert not serving(addr)
        redis = start_redis(tmp_path / "redis", port=redis_port)
        waiting.wait_until(lambda: serving(addr), timeout_s=30, what="replica SERVING after Redis came up")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        if redis:
            redis.stop()
    assert any("waiting for Redis" in line for line in lines)


def test_a_replica_gives_up_on_redis_after_the_wait(tmp_path: Path, metadata_url: str) -> None:
    proc, _ = start_replica(tmp_path, find_free_port(), wait_s=1, metadata_url=metadata_url)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0
    assert "waiting for Redis" in out and "Connection refused" in out
