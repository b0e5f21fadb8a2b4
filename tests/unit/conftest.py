"""Fixtures shared by the unit tests of the front door, the client and the CLI: a real etcd for
the metadata (``metadata_url``, ``store``) and a real Redis (``redis_url``, ``redis_client``), an
in-process front door, and real replica server processes (``replica_set``, see
``tests/unit/frontdoor/harness``)."""

from __future__ import annotations

import pytest
import redis as redis_lib

from lowtide.metadata.store import MetadataStore
from tests.unit.frontdoor.harness import ReplicaSet, start_front_door


@pytest.fixture
def metadata_url(request, redis_url, metadata_url) -> str:
    """The etcd the in-process services and ``store`` use: the replicas' own when the module points
    ``redis_url`` at ``replica_set.clean()`` (which emptied both of the last test's data), else the
    session's etcd (tests/conftest.py)."""
    if "replica_set" in request.fixturenames:
        replicas = request.getfixturevalue("replica_set")
        if redis_url == replicas.redis_url:
            return replicas.metadata_url
    return metadata_url


@pytest.fixture
def store(metadata_url):
    """A metadata store on ``metadata_url`` under the default root: the one in-process front doors
    of the same test use."""
    s = MetadataStore.from_url(metadata_url)
    yield s
    s.close()


@pytest.fixture
def redis_client(redis_url):
    """A client of ``redis_url``, for what is still kept in Redis (tokens, SCRAM credentials, the old
    group offsets layout, purgatories)."""
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def front_door_factory(redis_url, metadata_url):
    running = []

    def start(**config):
        fd = start_front_door(redis_url, metadata_url, **config)
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
    """Real replica server processes (brokers 0 and 1) with an etcd and a Redis of their own, started
    once per session; a module that uses them points ``redis_url`` at ``replica_set.clean()`` (and
    ``metadata_url`` follows)."""
    with ReplicaSet.started(tmp_path_factory.mktemp("replicas"), count=2) as replicas:
        yield replicas
