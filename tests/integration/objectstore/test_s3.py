"""The S3 backend against a real S3-compatible server process on loopback (moto's server mode,
``python -m moto.server``), started by the fixture below; skipped, naming moto, if it is missing."""

from __future__ import annotations

import time

import pytest

from lowtide.common.procs import find_free_port
from lowtide.objectstore import ObjectNotFound, ObjectStoreUnavailable, open_object_store
from lowtide.objectstore.s3 import S3Config, S3ObjectStore
from tests import s3server
from tests.unit.objectstore.contract import ObjectStoreContract

pytestmark = pytest.mark.integration

CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing"}


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    if not s3server.is_available():
        pytest.skip(s3server.MISSING)
    with s3server.moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


_bucket_counter = iter(range(1_000_000))


@pytest.fixture
def store(s3_endpoint):
    # A fresh bucket per test: the contract's tests expect an empty store.
    config = S3Config(bucket=f"lowtide-{next(_bucket_counter)}", prefix="cluster-a", endpoint_url=s3_endpoint,
                      **CREDENTIALS)
    s = S3ObjectStore(config)
    s.create_bucket()
    yield s
    s.close()


class TestS3ObjectStoreContract(ObjectStoreContract):
    pass


def test_keys_live_under_the_configured_prefix_in_the_bucket(store, s3_endpoint):
    store.put("wal/1", b"abc")
    whole_bucket = S3ObjectStore(S3Config(bucket=store.config.bucket, endpoint_url=s3_endpoint, **CREDENTIALS))
    assert [i.key for i in whole_bucket.list()] == ["cluster-a/wal/1"]
    assert whole_bucket.get("cluster-a/wal/1") == b"abc"


def test_list_pages_through_more_keys_than_one_response_holds(store):
    # ListObjectsV2 returns at most 1,000 keys per page.
    for i in range(1_050):
        store.put(f"many/{i:05d}", b"")
    keys = [i.key for i in store.list(prefix="many/")]
    assert keys == [f"many/{i:05d}" for i in range(1_050)]


def test_an_s3_url_with_an_endpoint_opens_the_s3_backend(s3_endpoint):
    s = open_object_store(f"s3://url-bucket/p?endpoint={s3_endpoint}", **CREDENTIALS)
    assert isinstance(s.inner, S3ObjectStore) and s.config.prefix == "p"
    s.create_bucket()
    s.put("k", b"v")
    assert s.get("k", offset=0, length=1) == b"v"


def test_a_missing_bucket_reads_as_a_storage_error_not_a_missing_object(s3_endpoint):
    s = S3ObjectStore(S3Config(bucket="no-such-bucket", endpoint_url=s3_endpoint, max_attempts=1, **CREDENTIALS))
    with pytest.raises(ObjectStoreUnavailable):
        s.put("k", b"v")
    with pytest.raises((ObjectStoreUnavailable, ObjectNotFound)):
        s.get("k")


def test_an_unreachable_endpoint_fails_after_the_retries_within_the_timeouts():
    port = find_free_port()  # nothing listens here
    s = S3ObjectStore(S3Config(bucket="b", endpoint_url=f"http://127.0.0.1:{port}", max_attempts=3,
                               connect_timeout_s=0.5, read_timeout_s=0.5, **CREDENTIALS))
    started = time.monotonic()
    with pytest.raises(ObjectStoreUnavailable) as info:
        s.head("k")
    assert info.value.retriable
    assert time.monotonic() - started < 15
