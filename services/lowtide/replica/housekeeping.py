"""Periodic work of a replica that no request triggers: ISR shrink checks, time/size retention,
and the LSO/HW checkpoint files.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from lowtide.clock import now_ms
from lowtide.errors import LowtideError
from lowtide.log.checkpoint import CheckpointFile
from lowtide.log.filenames import LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT
from lowtide.messages import TopicPartition
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.consumed_retention import ConsumedRetention
from lowtide.replica.isr import IsrUpdater
from lowtide.replica.partition import LEADER
from lowtide.replica.registry import PartitionRegistry

log = logging.getLogger(__name__)

MIN_WAKE_GAP_S = 0.2


class ReplicaCheckpoints:
    """The ``log-start-offset-checkpoint`` and ``replication-offset-checkpoint`` files of one data
    directory (Kafka's text format, written atomically by ``CheckpointFile``).

    Contract: the saved offsets are read once, at construction, for partitions opened later
    (on restart LSO = max(checkpointed LSO, first segment's base offset)); ``write`` replaces both
    files with the LSO and HW of the given partitions.

    Thread-safety: ``write`` is serialised by an internal lock (periodic thread and shutdown).
    """

    def __init__(self, *, data_dir: Path) -> None:
        self._lso_file = CheckpointFile(Path(data_dir) / LOG_START_OFFSET_CHECKPOINT)
        self._hw_file = CheckpointFile(Path(data_dir) / REPLICATION_OFFSET_CHECKPOINT)
        self.saved_log_start_offsets: dict[TopicPartition, int] = self._lso_file.read()
        self.saved_high_watermarks: dict[TopicPartition, int] = self._hw_file.read()
        self._lock = threading.Lock()

    def write(self, registry: PartitionRegistry) -> None:
        """Checkpoint the LSO and HW of every hosted partition."""
        with self._lock:
            parts = registry.all()
            self._lso_file.write({p.key: p.log.log_start_offset for p in parts})
            self._hw_file.write({p.key: p.log.high_watermark for p in parts})


class Housekeeping:
    """The ISR, retention and checkpoint threads of a replica.

    Contract:

    * every ``replica_lag_time_max_ms / 2`` (at least 100 ms) the ISR of each led partition drops
      followers that have not caught up within ``replica_lag_time_max_ms``;
    * every ``retention_check_interval_ms`` each *led* partition deletes first what consumed
      retention allows (KIP-68, ``consumed_retention``), then the segments time and size
      retention allow (followers adopt the leader's LSO, so replicas agree);
    * every ``checkpoint_interval_ms`` the LSO and HW of every hosted partition are checkpointed;
    * every ``producer_id_expiration_check_interval_ms`` every hosted partition, led or not,
      forgets the producers idle for its ``producer.id.expiration.ms`` (KIP-854; Kafka expires on
      every replica too, from the batch timestamps, so replicas agree);
    * every ``segment_file_idle_ms`` every hosted partition closes the files of the segments not
      used since the last pass (``release_idle_files``; opened again on use);
    * an HW or LSO that moved wakes every parked request (``registry.notify``);
    * ``wake_retention`` runs a retention pass soon (at most one per ``MIN_WAKE_GAP_S``) without
      waiting for the interval: a share group's start offset moved, and what it frees should go
      within a second (issue 49), not a whole ``retention_check_interval_ms`` later.

    Thread-safety: the one-pass methods (``shrink_isrs``, ``apply_retention``,
    ``write_checkpoints``, ``expire_producers``) may be called from any thread; ``start``/``stop``
    once each.
    """

    def __init__(self, *, config: ReplicaConfig, registry: PartitionRegistry, isr: IsrUpdater,
                 checkpoints: ReplicaCheckpoints, clock: Callable[[], int] = now_ms,
                 consumed_retention: ConsumedRetention | None = None) -> None:
        self.config, self.registry, self.isr, self.checkpoints = config, registry, isr, checkpoints
        self.clock = clock
        self.consumed_retention = consumed_retention
        self._stop = threading.Event()
        self._retention_due = threading.Event()

    def wake_retention(self) -> None:
        """Ask for a retention pass now (cheap: sets a flag; passes coalesce)."""
        self._retention_due.set()

    def start(self) -> None:
        for name, target in [("isr", self._run_isr_checks), ("checkpoint", self._run_checkpoints),
                             ("retention", self._run_retention), ("producer-expiry", self._run_expiry),
                             ("file-release", self._run_file_release)]:
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._retention_due.set()

    # -- one pass each ---------------------------------------------------------------------------
    def shrink_isrs(self) -> None:
        if self.isr.shrink_lagging(lag_time_max_ms=self.config.replica_lag_time_max_ms):
            self.registry.notify()

    def apply_retention(self) -> None:
        changed = False
        if self.consumed_retention is not None:
            try:
                changed = bool(self.consumed_retention.apply())
            except Exception:  # noqa: BLE001 - time/size retention must still run
                log.exception("consumed retention pass failed")
        for p in self.registry.all():
            if p.role != LEADER:
                continue  # followers adopt the leader's LSO, so replicas agree
            try:
                before = p.log.log_start_offset
                p.log.delete_retention_segments(now_ms=self.clock())
                changed |= p.log.log_start_offset != before
            except LowtideError as exc:
                log.warning("retention failed: %s", exc)
        if changed:
            self.registry.notify()

    def write_checkpoints(self) -> None:
        self.checkpoints.write(self.registry)

    def expire_producers(self) -> int:
        """One expiry pass over every hosted partition; how many producers were forgotten."""
        expired = 0
        for p in self.registry.all():
            try:
                expired += len(p.log.remove_expired_producers(now_ms=self.clock()))
            except LowtideError as exc:
                log.warning("producer expiry failed: %s", exc)
        return expired

    def release_idle_files(self) -> int:
        """One pass: every hosted partition closes its segments' files unused since the last pass;
        how many were closed."""
        released = 0
        for p in self.registry.all():
            try:
                released += p.log.release_idle_files()
            except LowtideError as exc:
                log.warning("releasing idle segment files failed: %s", exc)
        return released

    # -- loops -----------------------------------------------------------------------------------
    def _run_file_release(self) -> None:
        if self.config.segment_file_idle_ms <= 0:
            return
        while not self._stop.wait(self.config.segment_file_idle_ms / 1000):
            self.release_idle_files()

    def _run_isr_checks(self) -> None:
        interval = max(0.1, self.config.replica_lag_time_max_ms / 2000)
        while not self._stop.wait(interval):
            self.shrink_isrs()

    def _run_checkpoints(self) -> None:
        while not self._stop.wait(self.config.checkpoint_interval_ms / 1000):
            self.write_checkpoints()

    def _run_retention(self) -> None:
        while True:
            woken = self._retention_due.wait(self.config.retention_check_interval_ms / 1000)
            self._retention_due.clear()
            if self._stop.is_set():
                return
            self.apply_retention()
            # Woken passes (share acknowledgements may come hundreds a second) are spaced out.
            if woken and self._stop.wait(MIN_WAKE_GAP_S):
                return

    def _run_expiry(self) -> None:
        while not self._stop.wait(self.config.producer_id_expiration_check_interval_ms / 1000):
            self.expire_producers()
