"""The orphan scan's view of the diskless coordinator shards, over gRPC (``scan.ShardView``).

Shards are found in the shard registry each shard leader writes in the cluster metadata
(``coordinator.leadership``; read here by record name, the scanner may not import the coordinator
package)::

    shards/{K}/address   {"grpc": "host:port", "metrics": ..., "owner": ..., "since_ms": ...}

Every scan reads it afresh from the process's metadata image (``discover_shards``). The scan
refuses to start (deletes nothing) when a shard is missing: fewer shards registered than
``expected`` (``--shards``), or a gap in the numbering (shards are the partitions 0..N-1 of
``__diskless_metadata``, so with ``expected`` 0 the highest registered shard implies all below
it). A file only a missing shard knows would otherwise look like an orphan.

Each failure is a ``ScanFailure`` whose reason is a metric label: ``not_coordinator`` (the address
registered is a process that lost the shard's lease: a handover is under way), ``shard_unavailable``
(unreachable, timed out, still loading), ``shard_error`` (any other error, or a per-file error in
a DescribeFiles answer), ``shards_missing``, ``registry_unavailable`` (the metadata store never
answered this process: no image to read).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from lowtide.client.diskless_files import describe_files
from lowtide.errors import (
    CoordinatorLoadInProgress,
    CoordinatorNotAvailable,
    LowtideError,
    MetadataStoreUnavailable,
    NetworkException,
    NotCoordinator,
    RequestTimedOut,
)
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore
from lowtide.rpc.channels import ChannelPool
from lowtide.scanner.scan import ScanFailure

# The metadata section of the shard registry, and the record naming shard K's leader's address in it.
SHARD_REGISTRY = "shards"
_ADDRESS = "address"
_UNAVAILABLE = (NetworkException, RequestTimedOut, CoordinatorLoadInProgress, CoordinatorNotAvailable)


@dataclass(frozen=True)
class ShardAddress:
    shard: int
    grpc: str


def _failure(name: str, exc: LowtideError) -> ScanFailure:
    if isinstance(exc, NotCoordinator):
        reason = "not_coordinator"
    elif isinstance(exc, _UNAVAILABLE):
        reason = "shard_unavailable"
    else:
        reason = "shard_error"
    return ScanFailure(reason, f"{name}: {exc.name}: {exc.message}")


class GrpcShardView:
    """One shard as the scan sees it: DescribeFiles over gRPC, with the scanner's own token.

    Contract: ``known_files`` returns the asked keys the shard knows, or raises ``ScanFailure``;
    it never returns a partial answer (a per-file error fails the whole batch).
    Thread-safety: stateless apart from the shared, thread-safe channel pool.
    """

    def __init__(self, address: ShardAddress, *, channels: ChannelPool, metadata: Sequence[tuple[str, str]],
                 timeout_s: float) -> None:
        self.address = address
        self.name = f"coordinator-{address.shard}@{address.grpc}"
        self.channels = channels
        self.metadata = list(metadata)
        self.timeout_s = timeout_s

    def _describe(self, keys: Sequence[str]):
        try:
            answer = describe_files(self.channels, self.address.grpc, keys, metadata=self.metadata,
                                    timeout_s=self.timeout_s)
        except LowtideError as exc:
            raise _failure(self.name, exc) from exc
        if answer.errors:
            key, error = next(iter(answer.errors.items()))
            raise ScanFailure("shard_error", f"{self.name}: {len(answer.errors)} file(s) not described, "
                                             f"first {key}: {error.name}: {error.message}")
        return answer

    def oldest_file_created_ms(self) -> int | None:
        return self._describe(()).oldest_file_created_ms

    def known_files(self, keys: Sequence[str]) -> set[str]:
        return set(self._describe(keys).known)


def read_shard_addresses(store: MetadataStore) -> dict[int, ShardAddress]:
    """Every registered shard's address; ``ScanFailure('registry_unavailable')`` when the metadata
    store never answered (the image is read otherwise: with etcd away, as it last was)."""
    try:
        records = section(store, SHARD_REGISTRY).items()
    except MetadataStoreUnavailable as exc:
        raise ScanFailure("registry_unavailable", f"shard registry ({SHARD_REGISTRY}/ in the metadata store): "
                                                  f"{exc.message}") from exc
    out = {}
    for name, entry in records.items():
        shard, _, what = name.partition("/")
        if what == _ADDRESS and shard.isdigit():
            out[int(shard)] = ShardAddress(shard=int(shard), grpc=json.loads(entry.value)["grpc"])
    return dict(sorted(out.items()))


def discover_shards(store: MetadataStore, *, expected: int, channels: ChannelPool,
                    metadata: Sequence[tuple[str, str]], timeout_s: float) -> list[GrpcShardView]:
    """Views of shards 0..N-1, N = max(expected, highest registered + 1); ``ScanFailure('shards_missing')``
    when any of them has not registered."""
    addresses = read_shard_addresses(store)
    count = max(expected, max(addresses, default=-1) + 1)
    if count == 0:
        raise ScanFailure("shards_missing", "no coordinator shard is registered: nobody can vouch for any file")
    missing = [k for k in range(count) if k not in addresses]
    if missing:
        raise ScanFailure("shards_missing", f"{len(addresses)} of {count} coordinator shards registered; "
                                            f"missing {missing}")
    return [GrpcShardView(addresses[k], channels=channels, metadata=metadata, timeout_s=timeout_s)
            for k in range(count)]
