"""The file lifetime worker of a coordinator shard (KIP-1164 "file lifetime", brief §7).

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
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.5, 60.0


class FileLifetime:
    """Hands over and deletes the files of one shard. Thread-safety: one thread (the shard's)."""

    def __init__(self, *, store: ObjectStore, grace_ms: int, hand_over: HandOver, interval_ms: int = 1_000,
                 clock: Clock = now_ms) -> None:
        self.store = store
        self.grace_ms = grace_ms
        self.hand_over = hand_over
        self.interval_s = interval_ms / 1000
        self.clock = clock
        self._next_run = 0.0
        self._retry: dict[str, tuple[float, float]] = {}  # key -> (not before, backoff)
        self.deleted = 0
        self.handed_over = 0

    def run_due(self, shard: ShardService) -> None:
        if time.monotonic() < self._next_run:
            return
        self._next_run = time.monotonic() + self.interval_s
        self.run_once(shard)

    def run_once(self, shard: ShardService) -> None:
        """One pass over the shard's handing_over and deletable files."""
        handing = shard.read(lambda core: core.state.files_in_state("handing_over"))
        deletable = shard.read(lambda core: core.state.files_in_state("deletable"))
        now = self.clock()
        for row in handing:
            self._attempt(row.object_key, lambda row=row: self._hand_over(shard, row))
        for row in deletable:
            marked = row.marked_for_deletion_at_ms or 0
            if now >= marked + self.grace_ms:
                self._attempt(row.object_key, lambda row=row: self._delete(shard, row))
        live = {r.object_key for r in handing} | {r.object_key for r in deletable}
        for key in [k for k in self._retry if k not in live]:
            del self._retry[key]

    def _attempt(self, key: str, step: Callable[[], None]) -> None:
        not_before, backoff = self._retry.get(key, (0.0, MIN_BACKOFF_S / 2))
        if time.monotonic() < not_before:
            return
        try:
            step()
            self._retry.pop(key, None)
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

    def _delete(self, shard: ShardService, row) -> None:
        try:
            self.store.delete(row.object_key)
        except ObjectNotFound:
            pass
        shard.mutate(lambda core: core.file_deleted(object_key=row.object_key))
        self.deleted += 1
        log.info("deleted a file", extra={"fields": {"object_key": row.object_key, "bytes": row.size}})
