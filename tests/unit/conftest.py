"""Fixtures shared by the unit tests of the front door, the client and the CLI: a real Redis
(``redis_url``), an in-process front door, and in-test replicas on real gRPC ports (see
``tests/unit/frontdoor/harness`` for why)."""

from __future__ import annotations

import pytest

from lowtide.metadata.store import MetadataStore
from tests.unit.frontdoor.harness import start_front_door, start_stub_replica


@pytest.fixture
def store(redis_url):
    s = MetadataStore.from_url(redis_url)
    yield s
    s.redis.close()


@pytest.fixture
def front_door_factory(redis_url):
    running = []

    def start(**config):
        fd = start_front_door(redis_url, **config)
        running.append(fd)
        return fd

    yield start
    for fd in running:
        fd.stop()


@pytest.fixture
def front_door(front_door_factory):
    return front_door_factory()


@pytest.fixture
def stub_replicas():
    """Factory of in-test Replica servers: returns (servicer, address)."""
    servers = []

    def start():
        stub, server, address = start_stub_replica()
        servers.append(server)
        return stub, address

    yield start
    for server in servers:
        server.stop(0)
