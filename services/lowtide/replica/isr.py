"""ISR changes of the partitions this replica leads, written through the metadata store.

Kafka's leader sends AlterPartition to the controller; here the leader compare-and-sets the
partition state in Redis (``MetadataStore.update_isr``) and adopts the ISR only once the store
accepted it, so the ISR a leader computes its HW over is never ahead of the one elections use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import redis as redis_lib

from lowtide.errors import InvalidUpdateVersion, LowtideError
from lowtide.metadata.store import MetadataStore
from lowtide.replica.metrics import ISR_EXPANDS, ISR_SHRINKS
from lowtide.replica.partition import Partition
from lowtide.replica.registry import PartitionRegistry

log = logging.getLogger(__name__)


class IsrUpdater:
    """Expands and shrinks the ISR of led partitions.

    Contract: ``change`` writes the new ISR under the partition's current leader epoch and
    partition epoch and returns whether the HW moved; a write the store rejects (stale leader or
    partition epoch, Redis down) changes nothing
    locally and wakes the reconciler (our view of the partition is probably stale; it reconciles
    if the metadata version moved).
    ``shrink_lagging`` drops, from every led partition, the followers that have not caught up
    within ``lag_time_max_ms`` and those whose broker is no longer live: a replica stops counting
    toward the low watermark when its session lapses, so it must leave the ISR (the set election
    picks from) before a DeleteRecords can be acknowledged without it.

    Thread-safety: thread-safe (called from fetch handler threads and the ISR check thread);
    the store's compare-and-set serialises concurrent changes of one partition.
    """

    def __init__(self, *, store: MetadataStore, registry: PartitionRegistry,
                 wake_reconciler: Callable[[], None]) -> None:
        self.store = store
        self.registry = registry
        self.wake_reconciler = wake_reconciler

    def change(self, p: Partition, isr: Iterable[int]) -> bool:
        """Write ``isr`` for ``p``; returns whether its HW moved."""
        try:
            # Under our view's partition epoch (Kafka's AlterPartition): if the record moved on
            # (a reassignment step changed ``replicas``), the ISR we computed may name a replica
            # that is no longer one, and the store refuses it (INVALID_UPDATE_VERSION).
            st = self.store.update_isr(topic=p.topic, partition=p.partition, leader=self.registry.broker_id,
                                       leader_epoch=p.leader_epoch, isr=isr,
                                       expected_partition_epoch=p.partition_epoch)
        except InvalidUpdateVersion as exc:
            # Not an error: our view is behind. The reconciler adopts the new record (its write
            # moved the metadata version) and the next follower fetch or ISR check, which
            # recompute the candidate ISR, retries under the new partition epoch.
            log.info("ISR change refused, reconciling first: %s", exc.message)
            self.wake_reconciler()
            return False
        except (LowtideError, redis_lib.RedisError) as exc:
            log.warning("ISR change failed: %s", exc)
            self.wake_reconciler()
            return False
        log.info("ISR changed", extra={"fields": {"topic": p.topic, "partition": p.partition, "isr": list(st.isr)}})
        before, after = frozenset(p.isr), frozenset(st.isr)
        moved = p.set_isr(st)
        if before - after:
            ISR_SHRINKS.labels(p.topic).inc()
        if after - before:
            ISR_EXPANDS.labels(p.topic).inc()
        return moved

    def shrink_lagging(self, *, lag_time_max_ms: int) -> bool:
        """One ISR check over every hosted partition; returns whether any HW moved."""
        changed = False
        live = self.registry.live_brokers
        for p in self.registry.all():
            new_isr = p.isr_shrink_candidate(lag_time_max_ms=lag_time_max_ms, live_brokers=live)
            if new_isr is not None:
                changed |= self.change(p, new_isr)
        return changed
