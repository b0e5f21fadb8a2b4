"""Fixtures shared by every test: real processes, never mocks."""

from __future__ import annotations

import os
import shutil

import pytest
import redis as redis_lib

from lowtide.common.procs import PORT_RANGE_ENV, start_redis

# Each pytest-xdist worker ("gw0", "gw1", ...) picks ports from its own range, below the kernel's
# ephemeral range: parallel workers never race for a port (lowtide.common.procs.find_free_port).
WORKER_PORT_BASE = 10_000
WORKER_PORT_SPAN = 2_000


def pytest_configure(config: pytest.Config) -> None:
    # A skip must name the missing tool; CI installs every tool so nothing skips there.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        index = int(worker[2:])
        lo = WORKER_PORT_BASE + index * WORKER_PORT_SPAN
        # Set before any fixture runs; inherited by every process the tests start.
        os.environ[PORT_RANGE_ENV] = f"{lo}-{lo + WORKER_PORT_SPAN - 1}"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A real redis-server on a free loopback port for the whole session."""
    if shutil.which("redis-server") is None and not shutil.which("/usr/bin/redis-server"):
        pytest.skip("redis-server is not installed (apt-get install redis-server; make setup does it)")
    proc = start_redis(tmp_path_factory.mktemp("redis"), appendonly=False)
    yield proc
    proc.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """A clean Redis database for one test."""
    client = redis_lib.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url
