"""The file lifetime worker of a coordinator shard (KIP-1164 "file lifetime", docs/design/diskless.md#file-lifetime).

For each file row of the shard's state:

    handing_over  this shard owned the file and has no live batch left in it: call HandOverFile
                  on the next owner (owner_ids[my index + 1]), then append FileHandedOver here,
                  which removes this shard's row. Order matters: the receiver records it first, so
                  a crash in between leaves the file owned by someone (the call is idempotent).
    deletable     this shard is the last owner and has no live batch left: once
                  marked_for_deletion_at_ms + grace has passed, delete the object from the object
                  store (a missing object is fine: an earlier attempt got that far), then append
                  FileDeleted. The grace period lets fetches that already hold the file's batch
                  list finish reading (the reference implementation waits 1 minute).
    released      this shard has no live batch left, but an earlier owner still owns the file:
                  normally that owner hands it over in time. But a broker's CommitFile may have
                  reached only some of the owners (it died, or one shard's call failed), and an
                  earlier owner that never recorded the file never hands it over. So once the row
                  is ``claim_after_ms`` old (longer than a commit can be in flight, the rule the
                  orphan scanner's grace period follows: after it, no shard can record the file any
                  more), ask every earlier owner from the current one on (DescribeFiles). If none
                  knows the file, claim it: append FileHandedOver to this shard itself, which makes
                  the row handing_over or deletable here. If one knows it, wait for its handover
                  (asked again after a back-off). An unreachable owner is an error: retried.

Every step is retried forever: a failing file backs off on its own (0.5 s doubling to 60 s) without
holding up the others. The worker runs on the shard's leader only, from its shard thread, so it
restarts by itself on whichever process leads next (the rows are in the replicated state).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from lowtide.clock import Clock, now_ms
from lowtide.objectstore.base import ObjectNotFound, ObjectStore

if TYPE_CHECKING:
    from lowtide.coordinator.service import ShardService

log = logging.getLogger(__name__)

# (target shard, object key, owner ids, index of the target in them) -> None; raises on failure.
HandOver = Callable[[int, str, tuple[int, ...], int], None]
# (target shard, object key) -> whether that shard knows the file (a row or a pending commit);
# raises when it cannot answer.
KnowsFile = Callable[[int, str], bool]
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.5, 60.0
DEFAULT_CLAIM_AFTER_MS = 600_000  # the orphan scanner's default grace period: the same bound


class _StillOwned(Exception):
    """An earlier owner still knows a released file: wait for its handover (not a failure)."""


class FileLifetime:
    """Hands over and deletes the files of one shard. Thread-safety: one thread (the shard's)."""

    def __init__(self, *, store: ObjectStore, grace_ms: int, hand_over: HandOver, knows_file: KnowsFile,
                 claim_after_ms: int = DEFAULT_CLAIM_AFTER_MS, interval_ms: int = 1_000,
                 clock: Clock = now_ms) -> None:
        if claim_after_ms <= 0:
            raise ValueError(f"claim_after_ms must be > 0, got {claim_after_ms}")
        self.store = store
        self.grace_ms = grace_ms
        self.hand_over = hand_over
        self.knows_file = knows_file
        self.claim_after_ms = claim_after_ms
        self.interval_s = interval_ms / 1000
        self.clock = clock
        self._next_run = 0.0
        self._retry: dict[str, tuple[float, float]] = {}  # key -> (not before, backoff)
        self.deleted = 0
        self.handed_over = 0
        self.claimed = 0

    def run_due(self, shard: ShardService) -> None:
        if time.monotonic() < self._next_run:
            return
        self._next_run = time.monotonic() + self.interval_s
        self.run_once(shard)

    def run_once(self, shard: ShardService) -> None:
        """One pass over the shard's handing_over and deletable files."""
        handing = shard.read(lambda core: core.state.files_in_state("handing_over"))
        deletable = shard.read(lambda core: core.state.files_in_state("deletable"))
        released = shard.read(lambda core: core.state.files_in_state("released"))
        now = self.clock()
        for row in handing:
            self._attempt(row.object_key, lambda row=row: self._hand_over(shard, row))
        for row in deletable:
            marked = row.marked_for_deletion_at_ms or 0
            if now >= marked + self.grace_ms:
                self._attempt(row.object_key, lambda row=row: self._delete(shard, row))
        claimable = [r for r in released if now >= r.created_at_ms + self.claim_after_ms]
        for row in claimable:
            self._attempt(row.object_key, lambda row=row: self._claim(shard, row))
        live = {r.object_key for r in handing} | {r.object_key for r in deletable} | {r.object_key for r in claimable}
        for key in [k for k in self._retry if k not in live]:
            del self._retry[key]

    def _attempt(self, key: str, step: Callable[[], None]) -> None:
        not_before, backoff = self._retry.get(key, (0.0, MIN_BACKOFF_S / 2))
        if time.monotonic() < not_before:
            return
        try:
            step()
            self._retry.pop(key, None)
        except _StillOwned:
            # Asked again later, backing off to once a minute: an earlier owner may keep its
            # batches in the file for as long as its topic's retention says.
            backoff = min(MAX_BACKOFF_S, backoff * 2)
            self._retry[key] = (time.monotonic() + backoff, backoff)
        except Exception as exc:  # noqa: BLE001 - retried forever, with backoff per file
            backoff = min(MAX_BACKOFF_S, backoff * 2)
            self._retry[key] = (time.monotonic() + backoff, backoff)
            log.warning("file lifetime step failed; will retry", extra={"fields": {
                "object_key": key, "error": f"{type(exc).__name__}: {exc}", "retry_in_s": backoff}})

    def _hand_over(self, shard: ShardService, row) -> None:
        to_index = row.my_owner_index + 1
        owners = tuple(row.owner_ids)
        self.hand_over(owners[to_index], row.object_key, owners, to_index)
        shard.mutate(lambda core: core.hand_over_file(object_key=row.object_key, owner_ids=owners,
                                                      to_owner_index=to_index))
        self.handed_over += 1
        log.info("handed a file over", extra={"fields": {"object_key": row.object_key, "to_shard": owners[to_index]}})

    def _claim(self, shard: ShardService, row) -> None:
        owners = tuple(row.owner_ids)
        mine = row.my_owner_index
        for target in owners[max(0, row.current_owner_index):mine]:
            if self.knows_file(target, row.object_key):
                raise _StillOwned(row.object_key)
        # No earlier owner has the file, and none can record it any more (the row is older than a
        # commit can be in flight): nobody will hand it over, so this shard takes it.
        shard.mutate(lambda core: core.hand_over_file(object_key=row.object_key, owner_ids=owners,
                                                      to_owner_index=mine))
        self.claimed += 1
        log.warning("claimed a file no earlier owner recorded (a commit reached only some of its owners)",
                    extra={"fields": {"object_key": row.object_key, "owner_ids": list(owners), "shard": owners[mine]}})

    def _delete(self, shard: ShardService, row) -> None:
        try:
            self.store.delete(row.object_key)
        except ObjectNotFound:
            pass
        shard.mutate(lambda core: core.file_deleted(object_key=row.object_key))
        self.deleted += 1
        log.info("deleted a file", extra={"fields": {"object_key": row.object_key, "bytes": row.size}})
