"""ISR changes of the partitions this replica leads, written through the metadata store.

Kafka's leader sends AlterPartition to the controller; here the leader compare-and-sets the
partition state in etcd (``MetadataStore.update_isr``) and adopts the ISR only once the store
accepted it, so the ISR a leader computes its HW over is never ahead of the one elections use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from lowtide.errors import InvalidUpdateVersion, LowtideError
from lowtide.metadata.model import IsrChange
from lowtide.metadata.store import MetadataStore
from lowtide.replica.fetch_session import FetchSessions
from lowtide.replica.metrics import ISR_EXPANDS, ISR_SHRINKS
from lowtide.replica.partition import Partition
from lowtide.replica.registry import PartitionRegistry

log = logging.getLogger(__name__)


class IsrUpdater:
    """Expands and shrinks the ISR of led partitions.

    Contract: ``change`` (one partition) and ``change_many`` (a batch, in few etcd writes) write
    the new ISR under the partition's current leader epoch and partition epoch and tell whose HW
    moved; a write the store rejects (stale leader or partition epoch, etcd unreachable) changes
    nothing locally and wakes the reconciler (our view of the partition is probably stale; it
    reconciles if the metadata version moved).
    ``shrink_lagging`` drops, from every led partition, the followers that have not caught up
    within ``lag_time_max_ms`` and those whose broker is no longer live: a replica stops counting
    toward the low watermark when its session lapses, so it must leave the ISR (the set election
    picks from) before a DeleteRecords can be acknowledged without it.

    Thread-safety: thread-safe (called from fetch handler threads and the ISR check thread);
    the store's compare-and-set serialises concurrent changes of one partition.
    """

    def __init__(self, *, store: MetadataStore, registry: PartitionRegistry,
                 wake_reconciler: Callable[[], None], sessions: FetchSessions | None = None) -> None:
        self.store = store
        self.registry = registry
        self.wake_reconciler = wake_reconciler
        # A follower's fetch session rounds keep its unmoved partitions caught up (fetch_session.py).
        self.sessions = sessions

    def change(self, p: Partition, isr: Iterable[int]) -> bool:
        """Write ``isr`` for ``p``; returns whether its HW moved."""
        return bool(self.change_many([(p, frozenset(isr))]))

    def change_many(self, changes: Sequence[tuple[Partition, frozenset[int]]]) -> list[Partition]:
        """Write each partition's new ISR, all in a few etcd writes (one per
        ``PARTITIONS_PER_TXN``, as Kafka's AlterPartition carries many partitions); returns the
        partitions whose HW moved."""
        if not changes:
            return []
        # The followers an expansion adds were counted in the HW since its candidate ISR was
        # made (Partition.isr_expansion_candidate); each write's end says what becomes of them.
        added = [(p, isr - p.isr) for p, isr in changes]
        known = False
        try:
            moved = self._write(changes)
            known = True
            return moved
        except LowtideError as exc:
            # No answer: the write may have landed. The reconciler's next pass reads which.
            log.warning("ISR change of %d partitions failed: %s", len(changes), exc)
            self.wake_reconciler()
            return []
        finally:
            for p, new in added:
                p.end_isr_expansion(new, known=known)

    def _write(self, changes: Sequence[tuple[Partition, frozenset[int]]]) -> list[Partition]:
        # Under our view's partition epoch (Kafka's AlterPartition): if the record moved on
        # (a reassignment step changed ``replicas``), the ISR we computed may name a replica
        # that is no longer one, and the store refuses it (INVALID_UPDATE_VERSION).
        # The ISRs before the write, not when its answer is adopted: the reconciler may have
        # adopted the new record from etcd's watch first, and a shrink taken for a no-op then
        # never told the sessions (``left_isr``) of the followers it dropped.
        befores = [frozenset(p.isr) for p, _ in changes]
        answers = self.store.update_isrs([  # a LowtideError here: no answer (change_many)
            IsrChange(topic=p.topic, partition=p.partition, leader=self.registry.broker_id,
                      leader_epoch=p.leader_epoch, isr=tuple(isr), expected_partition_epoch=p.partition_epoch)
            for p, isr in changes])
        moved: list[Partition] = []
        refused = 0
        for (p, _), before, answer in zip(changes, befores, answers, strict=True):
            if isinstance(answer, InvalidUpdateVersion):
                # Not an error: our view is behind. The reconciler adopts the new record (its
                # write moved the metadata version) and the next follower fetch or ISR check,
                # which recompute the candidate ISR, retries under the new partition epoch.
                log.info("ISR change refused, reconciling first: %s", answer.message)
                refused += 1
                continue
            if isinstance(answer, LowtideError):
                log.warning("ISR change failed: %s", answer)
                refused += 1
                continue
            log.info("ISR changed",
                     extra={"fields": {"topic": p.topic, "partition": p.partition, "isr": list(answer.isr)}})
            after = frozenset(answer.isr)
            if p.set_isr(answer):
                moved.append(p)
            if before - after:
                ISR_SHRINKS.labels(p.topic).inc()
                if self.sessions is not None:
                    self.sessions.left_isr(before - after, p.key)
            if after - before:
                ISR_EXPANDS.labels(p.topic).inc()
        if refused:
            self.wake_reconciler()
        return moved

    def shrink_lagging(self, *, lag_time_max_ms: int) -> bool:
        """One ISR check over every hosted partition; returns whether any HW moved."""
        live = self.registry.live_brokers
        changes = []
        for p in self.registry.all():
            new_isr = p.isr_shrink_candidate(lag_time_max_ms=lag_time_max_ms, live_brokers=live,
                                             seen_ms=self.sessions.seen_ms if self.sessions is not None else None)
            if new_isr is not None:
                changes.append((p, new_isr))
        return bool(self.change_many(changes))
