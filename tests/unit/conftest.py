"""Fixtures shared by the unit tests of the front door, the client and the CLI: a real Redis
(``redis_url``), an in-process front door, and real replica server processes (``replica_set``,
see ``tests/unit/frontdoor/harness``)."""

from __future__ import annotations

import pytest

from lowtide.metadata.store import MetadataStore
from tests.unit.frontdoor.harness import ReplicaSet, start_front_door


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


@pytest.fixture(scope="session")
def replica_set(tmp_path_factory):
    """Real replica server processes (brokers 0 and 1) with a Redis of their own, started once per
    session; a module that uses them points ``redis_url`` at ``replica_set.clean()``."""
    with ReplicaSet.started(tmp_path_factory.mktemp("replicas"), count=2) as replicas:
        yield replicas
