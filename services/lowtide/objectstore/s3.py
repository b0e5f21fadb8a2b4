"""Object storage on an S3-compatible service (AWS S3, MinIO, moto's server...): ``s3://bucket/prefix``.

Client: boto3/botocore. Why boto3 and not obstore: botocore is the reference S3 client (AWS keeps
it, every S3-compatible server including moto's and MinIO is tested against it), it is pure Python
wheels that install anywhere pip does, and it has the two things this backend needs built in:
retries with exponential backoff and jitter on transient errors (connection errors, timeouts,
throttling, HTTP 5xx: its ``standard`` retry mode) and separate connect/read timeouts. obstore
(Rust, via pyo3) is faster per call, but a WAL file is one put and a few ranged gets of megabytes,
so per-call overhead does not matter here, and boto3 is also what the moto test server speaks.

Keys: object ``k`` is stored as ``<prefix>k`` in the bucket (prefix normalised to end in ``/``);
keys follow the same rules as on the local backend (``base.check_key``). Path-style addressing is
used with an explicit endpoint (``http://127.0.0.1:PORT/bucket/key``), so a loopback server needs
no DNS for bucket sub-domains. Errors: a missing key is ObjectNotFound; anything still failing
after the retries is ObjectStoreUnavailable (KAFKA_STORAGE_ERROR, retriable).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from lowtide.errors import InvalidRequest, LowtideError
from lowtide.objectstore.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    check_key,
    check_prefix,
    check_range,
)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
DELETE_OBJECTS_MAX = 1000  # keys per DeleteObjects request (S3's limit)


@dataclass(frozen=True, kw_only=True)
class S3Config:
    """Where and how to reach the bucket. Credentials left None come from boto3's usual chain
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws, instance metadata)."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    # Total attempts per call (first try included) in botocore's "standard" retry mode.
    max_attempts: int = 5
    max_pool_connections: int = 32

    @classmethod
    def from_url(cls, url: str, **overrides: object) -> S3Config:
        """``s3://bucket[/prefix][?endpoint=http://host:port&region=r]`` as a config."""
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise InvalidRequest(f"not an s3://bucket[/prefix] URL: {url!r}")
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        fields: dict[str, object] = {"bucket": parsed.netloc, "prefix": parsed.path.strip("/")}
        if "endpoint" in query:
            fields["endpoint_url"] = query["endpoint"]
        if "region" in query:
            fields["region"] = query["region"]
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3ObjectStore(ObjectStore):
    """One bucket (and key prefix) of an S3-compatible service.

    Thread-safety: a botocore client is thread-safe; all threads share this one (and its pool).
    """

    def __init__(self, config: S3Config) -> None:
        self.config = config
        self._prefix = config.prefix.strip("/") + "/" if config.prefix.strip("/") else ""
        if self._prefix:
            check_prefix(self._prefix)
        self._client = boto3.session.Session().client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region,
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_access_key,
            config=Config(
                retries={"mode": "standard", "max_attempts": config.max_attempts},
                connect_timeout=config.connect_timeout_s,
                read_timeout=config.read_timeout_s,
                max_pool_connections=config.max_pool_connections,
                s3={"addressing_style": "path" if config.endpoint_url else "auto"},
            ),
        )

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self.config.bucket!r}, prefix={self._prefix!r})"

    def create_bucket(self) -> None:
        """Create the bucket if it does not exist (for local test servers; production buckets are
        provisioned outside)."""
        try:
            self._client.create_bucket(Bucket=self.config.bucket)
        except ClientError as exc:
            if _error_code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise ObjectStoreUnavailable(f"create bucket {self.config.bucket}: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreUnavailable(f"create bucket {self.config.bucket}: {exc}") from exc

    def put(self, key: str, data: bytes | memoryview) -> ObjectInfo:
        full = self._prefix + check_key(key)
        body = bytes(data)
        try:
            self._client.put_object(Bucket=self.config.bucket, Key=full, Body=body)
        except (ClientError, BotoCoreError) as exc:
            raise ObjectStoreUnavailable(f"put {key}: {exc}") from exc
        # PutObject answers no Last-Modified; the local clock is close enough for the caller,
        # and list/head report the store's own time.
        return ObjectInfo(key, len(body), time.time())

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        check_range(offset, length)
        full = self._prefix + check_key(key)
        if length == 0:
            info = self.head(key)
            if info is None:
                raise ObjectNotFound(f"no object {key}")
            if offset > info.size:
                raise InvalidRequest(f"offset {offset} is past the end of {key} ({info.size} bytes)")
            return b""
        byte_range = f"bytes={offset}-" if length is None else f"bytes={offset}-{offset + length - 1}"
        try:
            response = self._client.get_object(Bucket=self.config.bucket, Key=full, Range=byte_range)
            return response["Body"].read()
        except ClientError as exc:
            code = _error_code(exc)
            if code in _NOT_FOUND:
                raise ObjectNotFound(f"no object {key}") from exc
            if code == "InvalidRange" or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                # S3 refuses a range starting at or after the end; the interface gives b"" at the end.
                info = self.head(key)
                if info is None:
                    raise ObjectNotFound(f"no object {key}") from exc
                if offset == info.size:
                    return b""
                raise InvalidRequest(f"offset {offset} is past the end of {key} ({info.size} bytes)") from exc
            raise ObjectStoreUnavailable(f"get {key}: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreUnavailable(f"get {key}: {exc}") from exc

    def list(self, *, prefix: str = "", older_than: float | None = None) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        strip = len(self._prefix)
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.config.bucket, Prefix=self._prefix + prefix):
                for item in page.get("Contents", ()):
                    modified = item["LastModified"].timestamp()
                    if older_than is None or modified < older_than:
                        yield ObjectInfo(item["Key"][strip:], int(item["Size"]), modified)
        except (ClientError, BotoCoreError) as exc:
            raise ObjectStoreUnavailable(f"list {prefix!r}: {exc}") from exc

    def delete(self, key: str) -> None:
        full = self._prefix + check_key(key)
        try:
            self._client.delete_object(Bucket=self.config.bucket, Key=full)
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND:
                return
            raise ObjectStoreUnavailable(f"delete {key}: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreUnavailable(f"delete {key}: {exc}") from exc

    def delete_many(self, keys: Sequence[str]) -> dict[str, LowtideError]:
        failures: dict[str, LowtideError] = {}
        checked = []
        for key in keys:
            try:
                checked.append(check_key(key))
            except LowtideError as exc:
                failures[key] = exc
        strip = len(self._prefix)
        for start in range(0, len(checked), DELETE_OBJECTS_MAX):
            chunk = checked[start:start + DELETE_OBJECTS_MAX]
            try:
                # Quiet: the answer lists only the keys that failed (a missing key is not one).
                response = self._client.delete_objects(Bucket=self.config.bucket, Delete={
                    "Objects": [{"Key": self._prefix + key} for key in chunk], "Quiet": True})
            except (ClientError, BotoCoreError) as exc:
                failures.update((key, ObjectStoreUnavailable(f"delete {key}: {exc}")) for key in chunk)
                continue
            for error in response.get("Errors", ()):
                if error.get("Code") in _NOT_FOUND:
                    continue
                key = error.get("Key", "")[strip:]
                failures[key] = ObjectStoreUnavailable(f"delete {key}: {error.get('Code')}: {error.get('Message')}")
        return failures

    def head(self, key: str) -> ObjectInfo | None:
        full = self._prefix + check_key(key)
        try:
            response = self._client.head_object(Bucket=self.config.bucket, Key=full)
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND:
                return None
            raise ObjectStoreUnavailable(f"head {key}: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreUnavailable(f"head {key}: {exc}") from exc
        return ObjectInfo(key, int(response["ContentLength"]), response["LastModified"].timestamp())

    def close(self) -> None:
        self._client.close()
