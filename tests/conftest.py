"""Fixtures shared by every test: real processes, never mocks."""

from __future__ import annotations

import shutil

import pytest
import redis as redis_lib

from lowtide.common.procs import start_redis


def pytest_configure(config: pytest.Config) -> None:
    # A skip must name the missing tool; CI installs every tool so nothing skips there.
    pass


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
