"""One orphan-file scan (KIP-1164 "Orphan files", docs/design/diskless.md#orphan-scanner), independent of transport.

A WAL file is an *orphan* when it sits in object storage but no diskless coordinator shard knows
it: its broker died between upload and commit, or every commit of it failed and the broker could
not delete it. A scan:

1. asks every shard for the creation time of the oldest file it still has batches in;
2. threshold = min(those, now) - grace period. The grace period must exceed the longest a commit
   can be in flight, so a file uploaded but not committed *yet* is never old enough to be a
   candidate; taking the shards' oldest file into the minimum keeps the threshold behind anything
   a shard is still working with, even across clock skew between the brokers and the store;
3. streams the store's listing of objects older than the threshold (never the whole listing in
   memory) in batches of ``describe_batch``;
4. asks every shard which keys of the batch it knows (DescribeFiles);
5. deletes the keys no shard knows.

Safety: any shard that cannot answer, at step 1 or at step 4 of any batch, stops the scan before
it deletes anything more (files deleted from earlier batches were unknown to *every* shard, so
they were orphans). A dry run does everything but step 5. A shard view says why it could not
answer by raising ``ScanFailure(reason, ...)``; any other exception counts as ``shard_unavailable``.

Memory: the listing is consumed ``describe_batch`` objects at a time; the report keeps counts and
at most ``MAX_REPORTED_KEYS`` keys per list, so a scan of millions of objects stays small.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import Protocol

from lowtide.objectstore.base import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

MAX_REPORTED_KEYS = 1000


class ScanFailure(Exception):
    """Raised by a shard view (or the caller building the shard list) when a shard cannot vouch
    for its files; ``reason`` becomes the report's ``failure`` (a metric label: keep it short)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class ShardView(Protocol):
    """What a scan needs of one coordinator shard (the gRPC client implements it)."""

    name: str

    def oldest_file_created_ms(self) -> int | None:
        """Creation time (epoch ms) of the oldest file the shard has live batches in; None if none."""

    def known_files(self, keys: Sequence[str]) -> set[str]:
        """The subset of ``keys`` the shard knows (DescribeFiles); raises when it cannot answer."""


@dataclass(frozen=True)
class ScanConfig:
    grace_period_ms: int
    prefix: str = ""
    describe_batch: int = 1000

    def __post_init__(self) -> None:
        if self.grace_period_ms <= 0:
            raise ValueError(f"grace period must be > 0 ms, got {self.grace_period_ms}")
        if self.describe_batch <= 0:
            raise ValueError(f"describe_batch must be > 0, got {self.describe_batch}")


@dataclass
class ScanReport:
    """What one scan saw and did. ``failure`` names why it stopped early (then it deleted nothing
    after that point): ``shard_unavailable`` (or the ``ScanFailure`` reason a shard view gave),
    ``list_failed`` or ``delete_failed``. ``orphan_keys`` and ``deleted`` keep the first
    ``MAX_REPORTED_KEYS`` keys; ``orphans`` and ``deleted_count`` count them all."""

    dry_run: bool
    threshold_ms: int = 0
    listed: int = 0  # objects the listing returned
    skipped: int = 0  # listed, but not older than the threshold
    candidates: int = 0  # objects older than the threshold
    known: int = 0  # candidates some shard knows
    orphans: int = 0  # candidates no shard knows (deleted unless a dry run)
    orphan_keys: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    deleted_count: int = 0
    deleted_bytes: int = 0
    failure: str | None = None
    failure_detail: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None


Progress = Callable[[ScanReport], None]


def _batches(items: Iterator[ObjectInfo], size: int) -> Iterator[list[ObjectInfo]]:
    while batch := list(islice(items, size)):
        yield batch


def _older_than(listing: Iterator[ObjectInfo], threshold_s: float, report: ScanReport) -> Iterator[ObjectInfo]:
    # Filtered here rather than by the store, so the report can say how many recent objects
    # were left alone (S3 filters client-side anyway; the local store does the same comparison).
    for obj in listing:
        report.listed += 1
        if obj.last_modified < threshold_s:
            yield obj
        else:
            report.skipped += 1


def run_scan(store: ObjectStore, shards: Sequence[ShardView], *, config: ScanConfig, now_ms: int,
             dry_run: bool = False, progress: Progress | None = None) -> ScanReport:
    """One scan as the module doc describes. Never raises for a shard or store failure: the
    report's ``failure`` says what stopped it."""
    began = time.monotonic()
    report = ScanReport(dry_run=dry_run)
    try:
        return _scan(store, shards, config=config, now_ms=now_ms, report=report, progress=progress)
    finally:
        report.duration_s = time.monotonic() - began


def _fail(report: ScanReport, reason: str, detail: str) -> ScanReport:
    report.failure, report.failure_detail = reason, detail
    log.warning("orphan scan stopped, nothing more deleted", extra={"fields": {"reason": reason, "detail": detail}})
    return report


def _reason(exc: Exception) -> str:
    return exc.reason if isinstance(exc, ScanFailure) else "shard_unavailable"


def _scan(store: ObjectStore, shards: Sequence[ShardView], *, config: ScanConfig, now_ms: int,
          report: ScanReport, progress: Progress | None) -> ScanReport:
    if not shards:
        # Without a single shard nobody can vouch for any file: deleting would be a guess.
        return _fail(report, "shard_unavailable", "no coordinator shard is configured")
    oldest = now_ms
    for shard in shards:
        try:
            created = shard.oldest_file_created_ms()
        except Exception as exc:  # noqa: BLE001 - any failure of a shard means "delete nothing"
            return _fail(report, _reason(exc), f"{shard.name}: oldest file: {type(exc).__name__}: {exc}")
        if created is not None:
            oldest = min(oldest, created)
    report.threshold_ms = oldest - config.grace_period_ms
    listing = _older_than(iter(store.list(prefix=config.prefix)), report.threshold_ms / 1000, report)
    # One batch's orphans are deleted (one delete_many: a DeleteObjects per 1,000 keys on S3) on
    # this thread while the next batch is listed and described: the two wait on different things.
    with ThreadPoolExecutor(1, thread_name_prefix="orphan-delete") as pool:
        return _scan_batches(store, shards, listing, config=config, report=report, progress=progress, pool=pool)


def _count_deleted(orphans: list[ObjectInfo], failures: dict[str, object], report: ScanReport) -> str | None:
    """Count the orphans a delete_many removed; the first failure's description, if any."""
    first_failure = None
    for obj in orphans:
        failure = failures.get(obj.key)
        if failure is not None:
            first_failure = first_failure or f"{obj.key}: {type(failure).__name__}: {failure}"
            continue
        if len(report.deleted) < MAX_REPORTED_KEYS:
            report.deleted.append(obj.key)
        report.deleted_count += 1
        report.deleted_bytes += obj.size
    return first_failure


def _scan_batches(store: ObjectStore, shards: Sequence[ShardView], listing: Iterator[ObjectInfo], *,
                  config: ScanConfig, report: ScanReport, progress: Progress | None,
                  pool: ThreadPoolExecutor) -> ScanReport:
    in_flight: tuple[Future, list[ObjectInfo]] | None = None

    def settle() -> str | None:
        """Wait for the batch being deleted; the first failure's description, if any."""
        nonlocal in_flight
        if in_flight is None:
            return None
        future, orphans = in_flight
        in_flight = None
        try:
            failures = future.result()
        except Exception as exc:  # noqa: BLE001 - reported as the scan's failure
            return f"{type(exc).__name__}: {exc}"
        return _count_deleted(orphans, failures, report)

    try:
        try:
            for batch in _batches(listing, config.describe_batch):
                report.candidates += len(batch)
                keys = [o.key for o in batch]
                known: set[str] = set()
                for shard in shards:
                    try:
                        known |= shard.known_files(keys)
                    except Exception as exc:  # noqa: BLE001 - see _scan's contract
                        failed = settle()  # the batch before was confirmed: its deletes stand
                        return _fail(report, _reason(exc), f"{shard.name}: DescribeFiles: {type(exc).__name__}: {exc}"
                                     + (f"; and a delete failed: {failed}" if failed else ""))
                report.known += len(known)
                orphans = [obj for obj in batch if obj.key not in known]
                report.orphans += len(orphans)
                report.orphan_keys += [o.key for o in orphans[:MAX_REPORTED_KEYS - len(report.orphan_keys)]]
                failed = settle()
                if failed is not None:
                    return _fail(report, "delete_failed", failed)
                if orphans and not report.dry_run:
                    in_flight = (pool.submit(store.delete_many, [o.key for o in orphans]), orphans)
                if progress is not None:
                    progress(report)
        except Exception as exc:  # noqa: BLE001 - the listing itself failed midway
            failed = settle()
            return _fail(report, "list_failed", f"{type(exc).__name__}: {exc}"
                         + (f"; and a delete failed: {failed}" if failed else ""))
        failed = settle()
        if failed is not None:
            return _fail(report, "delete_failed", failed)
        return report
    finally:
        settle()
