"""A coordinator shard's warm standby: following the metadata log while it does not lead, and the
standby reads from its copy (docs/design/diskless.md#warm-standby).

Warm standby (``ShardConfig.standby``; ``follow`` alone keeps the following, for a shard's own
process that lost it): while it does not lead, the shard follows the metadata log into its own
SQLite copy (``StandbyFollower.follow``: long-polling fetches from its applied offset, through its
applier), answers FindBatches from it to callers that ask for a standby answer
(``StandbyFollower.read``, behind ``ShardService.read_standby``, with how fresh it is), and contends
for the lease every 100 ms once it has seen a leader (``StandbyFollower.may_contend``), so a killed
leader's shard is taken over one lease expiry after the kill, with a few records to load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lowtide.coordinator.core import CoordinatorCore
from lowtide.coordinator.leadership import ShardLease
from lowtide.coordinator.metadata_log import MetadataLog
from lowtide.errors import NotCoordinator, OffsetOutOfRange
from lowtide.leases import Lease


class StandbyFollower:
    """Shard ``shard``'s following of its metadata log while it does not lead (see the module).

    Contract: ``follow()`` is one step of it: ``ready()`` (False while there is no log to follow:
    the step then returns False; else it opens the applier), one fetch from ``applied_offset()`` + 1
    waiting up to ``follow_wait_ms``, its entries applied through ``apply`` (a list of (value,
    offset)); a log that starts past the applied offset calls ``restore()`` instead (a snapshot
    covers the gap, or it raises). True if the fetch ran (and waited). ``read(fn, core=,
    following=)`` is a standby's answer ``(fn(core), freshness)``, NOT_COORDINATOR unless this is a
    ``standby`` that is ``following`` (not leading) and has caught up at least once.
    ``may_contend()`` says whether the lease thread may try for the lease now.

    Thread-safety: ``follow`` runs on the shard thread only, ``may_contend`` on the lease thread
    only; ``read`` may be called from any thread, holding the shard lock (which ``follow`` does not
    take: the freshness it reads is two plain attributes).
    """

    def __init__(self, *, shard: int, metadata_log: MetadataLog, lease: Lease, standby: bool, follow_wait_ms: int,
                 ready: Callable[[], bool], applied_offset: Callable[[], int],
                 apply: Callable[[list[tuple[bytes, int]]], Any], restore: Callable[[], None]) -> None:
        self.shard = shard
        self.log = metadata_log
        self.lease = lease
        self.standby = standby
        self.follow_wait_ms = follow_wait_ms
        self._ready = ready
        self._applied_offset = applied_offset
        self._apply = apply
        self._restore = restore
        # When it last reached the high watermark, and that watermark.
        self._followed_at: float | None = None
        self._followed_hw = -1
        # A standby contends for the lease only once it has seen a leader: at a cluster's start it
        # leaves each shard to its own process.
        self._seen_leader = False

    def follow(self) -> bool:
        """A standby's step: apply what the log holds past our applied offset (one long-polling
        fetch); True if the fetch ran (and waited), False if there is no log yet."""
        if not self._ready():
            return False
        try:
            got = self.log.read(self._applied_offset() + 1, max_wait_ms=self.follow_wait_ms)
        except OffsetOutOfRange:
            self._restore()  # the log below was deleted: a snapshot covers it
            return True
        if got.entries:
            self._apply([(e.value, e.offset) for e in got.entries])
        if self._applied_offset() + 1 >= got.high_watermark:
            self._followed_at, self._followed_hw = time.monotonic(), got.high_watermark
        return True

    def read(self, fn: Callable[[CoordinatorCore], Any], *, core: CoordinatorCore,
             following: bool) -> tuple[Any, dict[str, int]]:
        """A warm standby's answer: ``fn(core)`` on its own copy, which may be behind the leader,
        and how fresh it is: ``applied_offset``, the ``high_watermark`` it last caught up with and
        ``lag_ms`` since then. NOT_COORDINATOR unless this shard is a following standby that has
        caught up at least once. Never the leader's answer: only a caller that asked for a
        standby's gets it (servicer)."""
        if not self.standby or not following or self._followed_at is None:
            raise NotCoordinator(f"this process is not a caught-up standby of coordinator shard {self.shard}")
        fresh = {"applied_offset": self._applied_offset(), "high_watermark": self._followed_hw,
                 "lag_ms": int((time.monotonic() - self._followed_at) * 1000)}
        return fn(core), fresh

    def may_contend(self) -> bool:
        """A standby contends once it has seen another process hold the lease: at a cluster's start
        each shard's own process takes it (and tests find it there)."""
        if not self.standby or self._seen_leader or not isinstance(self.lease, ShardLease):
            return True
        holder = self.lease.holder()
        self._seen_leader = holder is not None and holder != self.lease.owner
        return False
