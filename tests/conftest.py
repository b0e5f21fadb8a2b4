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


# The longest modules (minutes each: Spark programs, the demo, the one-minute fault runs; see the
# slowest tests make test prints) are handed to the workers first, so the suite does not end with
# three workers idle while a fourth runs one of them (longest-first scheduling; --dist loadscope
# hands out modules in collection order). Keep it in step with that list; order within a module,
# and of every other module, is unchanged.
LONGEST_FIRST = (
    "tests/integration/spark/test_jobs.py",
    "tests/integration/cli/test_honest_cli.py",
    "tests/integration/cli/test_demo_and_retention.py",
    "tests/chaos/test_nemesis_short.py",
    "tests/integration/kafka/test_spark_kafka_connector.py",
    "tests/integration/spark/test_auto_register.py",
    "tests/integration/diskless/test_diskless_topics.py",
    "tests/integration/kafka/test_kafka_scram.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: everything else keeps its order


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
