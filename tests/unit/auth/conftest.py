"""Fixtures for auth tests: an ACL store on a real etcd (a root of its own per test,
``metadata_store``), another metadata store on the same root (``reopen``: what another process, or
a restarted one, reads), and a real Redis (``redis_client``, flushed per test) to show that emptying
Redis loses none of the security state."""

from __future__ import annotations

import pytest
import redis as redis_lib

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.metadata.store import MetadataStore


@pytest.fixture
def redis_client(redis_url: str):
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(metadata_store: MetadataStore) -> AclStore:
    return AclStore(metadata=metadata_store)


@pytest.fixture
def reopen(etcd_server, metadata_store: MetadataStore):
    """``reopen()`` -> a new MetadataStore on the test's root: its image is loaded from etcd, as
    another process, or this one restarted, would load it."""
    opened: list[MetadataStore] = []

    def open_store() -> MetadataStore:
        opened.append(MetadataStore.from_url(f"etcd://{etcd_server.endpoint}", root=metadata_store.root))
        return opened[-1]

    yield open_store
    for s in opened:
        s.close()


@pytest.fixture
def authorizer(store: AclStore) -> Authorizer:
    return Authorizer(store=store, enabled=True)
