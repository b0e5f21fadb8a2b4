"""Fixtures for purgatory tests: a real Redis client, a manual clock, and purgatories closed after
each test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis as redis_lib

from lowtide.purgatory import Purgatory

from .helpers import ManualClock


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis_lib.Redis]:
    client = redis_lib.Redis.from_url(redis_url, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def operation_name() -> str:
    """A unique operation label per test, so metric values of other tests never leak in."""
    return f"TestOp-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clock() -> ManualClock:
    """The time of every purgatory ``make_purgatory`` builds: it moves only when the test says so."""
    return ManualClock()


@pytest.fixture
def make_purgatory(redis_client: redis_lib.Redis, operation_name: str,
                   clock: ManualClock) -> Iterator[Callable[..., Purgatory]]:
    created: list[Purgatory] = []

    def make(*, owner: str = "replica-0", reaper_interval_ms: int = 1000, name: str | None = None,
             redis: redis_lib.Redis | None = None, start: bool = True) -> Purgatory:
        purgatory = Purgatory(name=name or operation_name, redis=redis or redis_client, owner=owner,
                              reaper_interval_ms=reaper_interval_ms, clock=clock.now)
        if start:
            purgatory.start()
        created.append(purgatory)
        return purgatory

    yield make
    for purgatory in created:
        purgatory.close()
