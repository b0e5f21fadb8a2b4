"""Fixtures for auth tests: a real Redis client and store per test (the DB is flushed per test)."""

from __future__ import annotations

import pytest
import redis as redis_lib

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore


@pytest.fixture
def redis_client(redis_url: str):
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(redis_client) -> AclStore:
    return AclStore(redis=redis_client)


class ManualClock:
    """A clock tests move by hand, so cache expiry is deterministic."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def authorizer(store: AclStore, clock: ManualClock) -> Authorizer:
    return Authorizer(store=store, enabled=True, clock=clock)
