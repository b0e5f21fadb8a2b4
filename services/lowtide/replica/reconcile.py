"""Hosted partitions follow the cluster metadata: open the partitions assigned here, apply each
leadership change (become leader / follower), and remove the partitions no longer assigned here.

Removing never trusts the metadata's silence (docs/design/metadata.md#stray-partitions): a
partition's log is deleted only when the metadata says so, because its topic still exists and the
partition was moved to other brokers, or its topic was deleted through the API (the store keeps
the deleted topic's id). A partition of a topic the metadata does not name, or names under
another id, with no record of a deletion, is *stray*: its directory is renamed aside
(``<topic>-<p>.<unique>-stray``) and kept until the operator removes it.

New partitions in bulk (a CreateTopics of thousands): each new directory would cost about seven
fsyncs (its files, their renames, the directory itself), 10-14 s for 3,000 partitions RF 3 on
one disk. From ``BULK_CREATE_MIN`` new partitions in a pass, their directories are built under
``.lowtide-creating/`` with no fsync, made durable at once with one syncfs of the data
directory's filesystem, renamed into place (a rename is atomic) and the data directory fsynced;
then they are opened as existing directories. A crash before the renames leaves only the staging
directory, which the next bulk creation or orphan pass removes; nothing in it was ever served.

A pass runs at start, then whenever the metadata version moved (a metadata event or a periodic
look) or someone knows its view is stale (``ReconcileTrigger.force``: a follower fetch answered
NOT_LEADER_OR_FOLLOWER although the metadata did not change yet in our eyes).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lowtide.errors import LowtideError, MetadataStoreUnavailable
from lowtide.log.checkpoint import deferring_fsync, fsync_directory, sync_filesystem
from lowtide.log.filenames import (
    CREATING_DIR,
    is_deleted_partition_dir,
    is_stray_partition_dir,
    parse_partition_dir,
    partition_dir_name,
    stray_partition_dir_name,
)
from lowtide.log.partition_log import LogConfig, PartitionLog, remove_partition_dir
from lowtide.log.partition_metadata import read_partition_metadata, write_partition_metadata
from lowtide.log.strays import list_strays
from lowtide.messages import TopicPartition
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore
from lowtide.replica import metrics as replica_metrics
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.partition import LEADER, Partition
from lowtide.replica.registry import PartitionRegistry

log = logging.getLogger(__name__)
# How often the loop looks at the metadata version when nothing woke it.
RECONCILE_POLL_S = 2.0
# From this many new partitions in one pass their directories are created in bulk (module doc).
BULK_CREATE_MIN = 32


class ReconcileTrigger:
    """Requests for a reconcile pass.

    Contract: ``wake()`` makes the loop look at the metadata version and reconcile if it moved;
    ``force()`` makes the next look reconcile even if it did not. A force stays pending until a
    pass runs (a Redis error while reading the version does not lose it).

    Thread-safety: thread-safe; any thread may wake or force, one loop thread waits.
    """

    def __init__(self) -> None:
        self._wanted = threading.Event()
        self._forced = False

    def wake(self) -> None:
        self._wanted.set()

    def force(self) -> None:
        self._forced = True
        self._wanted.set()

    def wait(self, timeout_s: float) -> None:
        """Block until woken or ``timeout_s`` passed, then re-arm."""
        self._wanted.wait(timeout_s)
        self._wanted.clear()

    @property
    def forced(self) -> bool:
        return self._forced

    def clear_forced(self) -> None:
        self._forced = False


def build_log_config(topic: TopicInfo, *, defaults: Mapping[str, str]) -> LogConfig:
    """The log settings of a topic: the broker's defaults overridden by the topic's own config."""
    return LogConfig.from_topic_config({**defaults, **topic.config})


class PartitionReconciler:
    """Makes the hosted partitions match the metadata.

    Contract: after ``reconcile()`` the registry hosts exactly the partitions whose replica set
    contains this broker (of topics that exist), each with the metadata's leader, epoch, replicas
    and ISR; a new partition opens its log with the checkpointed LSO and HW; a removed one has its
    log deleted; a partition whose role or epoch changed, or that was removed, has its waiting
    DeleteRecords re-checked (``complete_waiting_deletes``: leadership moved, they fail); a
    partition led here whose replica set changed under the same epoch (a reassignment step) has
    them re-checked too and its low watermark reported (``report_low_watermarks``); then
    ``on_reconciled`` runs (the fetchers follow the new leaders) and every parked request wakes.
    A metadata read failure leaves everything as it was.

    Thread-safety: ``reconcile`` may run on any thread (the manager runs the first pass, then the
    loop thread); the registry applies each assignment atomically and hands a removed partition to
    one pass only. ``start``/``stop`` once each.
    """

    def __init__(self, *, config: ReplicaConfig, store: MetadataStore, registry: PartitionRegistry,
                 trigger: ReconcileTrigger, saved_log_start_offsets: Mapping[TopicPartition, int],
                 saved_high_watermarks: Mapping[TopicPartition, int],
                 complete_waiting_deletes: Callable[[Iterable[TopicPartition]], None],
                 on_reconciled: Callable[[], None],
                 on_config_changed: Callable[[list[Partition]], None] | None = None,
                 report_low_watermarks: Callable[[list[Partition]], None] | None = None) -> None:
        self.config, self.broker_id, self.data_dir = config, config.broker_id, Path(config.data_dir)
        self.store, self.registry, self.trigger = store, registry, trigger
        # What the last run checkpointed: the LSO and HW a partition's log reopens with (own
        # copies: each entry is used once, by ``_open``).
        self._saved_lso, self._saved_hw = dict(saved_log_start_offsets), dict(saved_high_watermarks)
        self._complete_waiting_deletes, self._on_reconciled = complete_waiting_deletes, on_reconciled
        self._on_config_changed = on_config_changed
        self._report_low_watermarks = report_low_watermarks
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Set by the manager from the clean-shutdown marker (log/clean_shutdown.py) before the
        # first pass: the logs on disk were closed cleanly, so they open without a scan.
        self.clean_start = False
        # A pass completed: every directory on disk at start was opened (recovered), removed or
        # set aside, so a clean shutdown from now on may mark the data directory clean.
        self.passed_once = False

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop thread (the first pass is the caller's ``reconcile()``)."""
        self._thread = threading.Thread(target=self._run, name="reconcile", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.trigger.wake()

    # -- one pass --------------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Make hosted partitions match the metadata."""
        try:
            topics = self.store.topics()
            states = self.store.all_partition_states()
            deleted = self.store.deleted_topic_ids()
        except MetadataStoreUnavailable as exc:
            log.warning("metadata unavailable: %s", exc)
            return
        mine = {tp: st for tp, st in states.items() if self.broker_id in st.replicas and tp[0] in topics}
        # A topic deleted and created again under its name between two passes: the partition
        # hosted is the old topic's (another topic id). Reused, it kept the old records, and its
        # partition epoch, which the new record's (0 again) is below, so apply_state would take
        # the new record for a stale one. Unhost it now (its log is deleted as any unassigned
        # one) and open the new topic's on the next pass, forced.
        recreated = {tp for tp in mine if (hosted := self.registry.find(*tp)) is not None
                     and hosted.topic_info.topic_id != topics[tp[0]].topic_id}
        if recreated:
            mine = {tp: st for tp, st in mine.items() if tp not in recreated}
            self.trigger.force()
        # The logs to open are opened first, in parallel and outside the registry's lock (a
        # restart opens thousands; each open is mostly fsyncs). One that failed is opened again
        # in apply_assignment, which raises as a sequential open did.
        opened = self._open_many([tp for tp in mine if self.registry.find(*tp) is None], topics, deleted)
        changes = self.registry.apply_assignment(
            mine, open_partition=lambda tp: opened.pop(tp, None) or self._open(topics[tp[0]], tp, deleted=deleted))
        for p in opened.values():  # not taken after all (cannot happen while one thread reconciles)
            p.log.close()
        for p in changes.removed:
            self._complete_waiting_deletes([p.key])
            if self._may_delete(p.topic, p.topic_info.topic_id, topics, deleted):
                log.info("removing partition", extra={"fields": {"topic": p.topic, "partition": p.partition}})
                p.log.delete()
            else:
                p.log.close()
                self._set_aside(self.data_dir / partition_dir_name(p.topic, p.partition))
        for topic in {p.topic for p in changes.removed} - {tp[0] for tp in mine}:
            replica_metrics.forget_topic(topic)
        self._remove_orphan_dirs(set(mine), topics, deleted)
        for p, role in changes.became:
            log.info("became %s", role, extra={"fields": {"topic": p.topic, "partition": p.partition,
                                                          "leader_epoch": p.leader_epoch, "leader": p.leader_id}})
            self._complete_waiting_deletes([p.key])
            if role == LEADER:
                replica_metrics.track_isr_changes(p.topic)
        if changes.resized:
            # A replica joined or left a partition led here (a reassignment step): a DeleteRecords
            # whose only holdout was a removed replica completes now rather than at its timeout,
            # and the LW published follows the new set (until an added replica reports, it
            # computes -1, which is never published).
            log.info("replica set changed", extra={"fields": {
                "partitions": sorted(f"{p.topic}-{p.partition}" for p in changes.resized)}})
            self._complete_waiting_deletes([p.key for p in changes.resized])
            if self._report_low_watermarks is not None:
                self._report_low_watermarks(changes.resized)
        self._adopt_topic_configs(topics)
        self.passed_once = True
        self.clean_start = False  # a directory opened later was closed by this process, or is new
        self._on_reconciled()
        self.registry.notify()

    def _adopt_topic_configs(self, topics: Mapping[str, TopicInfo]) -> None:
        # A topic's config changes in place (AlterConfigs) with no change of partition state: the
        # hosted partitions are given the new config here, so retention, cleanup.policy and the
        # cleaner follow it without reopening the log.
        changed = []
        for p in self.registry.all():
            topic = topics.get(p.topic)
            if topic is None or topic.config == p.topic_info.config:
                continue
            try:
                log_config = build_log_config(topic, defaults=self.config.log_defaults)
            except LowtideError as exc:  # the front door validates; keep the old settings, say why
                log.warning("ignoring a topic config this replica cannot apply: %s", exc.message,
                            extra={"fields": {"topic": p.topic, "partition": p.partition}})
                continue
            if p.update_topic(topic, log_config):
                changed.append(p)
        if changed:
            log.info("topic config changed", extra={"fields": {
                "partitions": sorted(f"{p.topic}-{p.partition}" for p in changed)}})
            if self._on_config_changed is not None:
                self._on_config_changed(changed)

    @staticmethod
    def _may_delete(topic: str, topic_id: str | None, topics: Mapping[str, TopicInfo], deleted: set[str]) -> bool:
        """Whether the metadata says this partition's log goes (module doc): its topic exists under
        the same id (the partition moved elsewhere), or its id was deleted through the API."""
        current = topics.get(topic)
        if topic_id is None:  # a directory from before partition.metadata: only a live topic vouches
            return current is not None
        return (current is not None and current.topic_id == topic_id) or topic_id in deleted

    def _expire_stray(self, dir: Path) -> None:
        """The operator's age for strays (``--stray-retention-ms``; off by default)."""
        retention = self.config.stray_retention_ms
        if retention < 0:
            return
        for stray in list_strays(dir.parent):
            if stray.path == dir and stray.age_ms(int(time.time() * 1000)) >= retention:
                log.warning("removing a stray partition older than --stray-retention-ms",
                            extra={"fields": {"dir": str(dir), "retention_ms": retention}})
                shutil.rmtree(dir, ignore_errors=True)

    def _set_aside(self, dir: Path) -> None:
        target = dir.with_name(stray_partition_dir_name(dir.name, uuid.uuid4().hex))
        try:
            os.rename(dir, target)
        except FileNotFoundError:
            return
        fsync_directory(dir.parent)
        replica_metrics.count_stray_partition()
        log.warning("set aside a partition the metadata does not name (kept, not served; remove it with "
                    "`lowtide strays remove` once you are sure)",
                    extra={"fields": {"dir": str(dir), "kept_as": str(target)}})

    def _open_many(self, tps: list[TopicPartition], topics: Mapping[str, TopicInfo],
                   deleted: set[str]) -> dict[TopicPartition, Partition]:
        """Open these partitions on up to ``log_open_threads`` threads; those that failed are left
        out (the caller opens them again and meets the error)."""
        if len(tps) < 2 or self.config.log_open_threads < 2:
            return {}
        started = time.monotonic()
        new = [tp for tp in tps if not (self.data_dir / partition_dir_name(*tp)).exists()]
        if len(new) >= BULK_CREATE_MIN:
            self._create_in_bulk(new, topics)
        opened: dict[TopicPartition, Partition] = {}
        with ThreadPoolExecutor(max_workers=min(self.config.log_open_threads, len(tps)),
                                thread_name_prefix="log-open") as pool:
            futures = {pool.submit(self._open, topics[tp[0]], tp, deleted=deleted): tp for tp in tps}
            for future, tp in futures.items():
                try:
                    opened[tp] = future.result()
                except Exception:  # noqa: BLE001 - reopened by the caller, which reports it
                    pass
        log.info("opened partition logs", extra={"fields": {
            "partitions": len(opened), "seconds": round(time.monotonic() - started, 3),
            "threads": self.config.log_open_threads, "after_clean_shutdown": self.clean_start}})
        return opened

    def _create_in_bulk(self, tps: list[TopicPartition], topics: Mapping[str, TopicInfo]) -> None:
        """Create these new partitions' directories with one filesystem sync (module doc); on any
        failure none is renamed into place and each is created the usual way. (Becoming leader
        still writes the leader-epoch file with its fsyncs: an epoch starting at the log end is
        dropped when a log opens, as Kafka drops it.)"""
        started = time.monotonic()
        staging = self.data_dir / CREATING_DIR
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()

        def build(tp: TopicPartition) -> None:
            topic = topics[tp[0]]
            dir = staging / partition_dir_name(*tp)
            with deferring_fsync():
                PartitionLog.open(dir, topic=tp[0], partition=tp[1],
                                  config=build_log_config(topic, defaults=self.config.log_defaults),
                                  log_start_offset=0, recover=False).close()
                write_partition_metadata(dir, topic_id=topic.topic_id)

        try:
            with ThreadPoolExecutor(max_workers=min(self.config.log_open_threads, len(tps)),
                                    thread_name_prefix="log-create") as pool:
                list(pool.map(build, tps))
            sync_filesystem(staging)
            for tp in tps:
                name = partition_dir_name(*tp)
                os.rename(staging / name, self.data_dir / name)
                # New: a start-up checkpoint entry of the same name was for an earlier topic.
                self._saved_lso.pop(tp, None)
                self._saved_hw.pop(tp, None)
            fsync_directory(self.data_dir)
        except (OSError, LowtideError) as exc:
            log.warning("bulk creation of partition directories failed; creating them one by one",
                        extra={"fields": {"partitions": len(tps), "error": str(exc)}})
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("created partition directories", extra={"fields": {
            "partitions": len(tps), "seconds": round(time.monotonic() - started, 3)}})

    def _open(self, topic: TopicInfo, tp: TopicPartition, *, deleted: set[str] = frozenset()) -> Partition:
        dir = self.data_dir / partition_dir_name(*tp)
        if dir.exists():
            # A directory of another topic of this name (deleted and created again while this
            # replica was away): never served as the new topic's records.
            try:
                recorded = read_partition_metadata(dir)
            except LowtideError:
                recorded = None
            if recorded is not None and recorded != topic.topic_id:
                if recorded in deleted:
                    remove_partition_dir(dir)
                else:
                    self._set_aside(dir)
        # The checkpoints read at start-up describe the logs then on disk: they count for a
        # directory that exists (the restart of a hosted partition), once. A partition created
        # since, or deleted and created again under the same name, starts at offset 0 as a new
        # one does; with the stale entry it started at the old log start offset.
        recovering = dir.exists()
        saved_lso, saved_hw = self._saved_lso.pop(tp, None), self._saved_hw.pop(tp, None)
        plog = PartitionLog.open(dir, topic=tp[0], partition=tp[1],
                                 config=build_log_config(topic, defaults=self.config.log_defaults),
                                 log_start_offset=saved_lso if recovering and saved_lso is not None else 0,
                                 recover=not self.clean_start)
        if recovering and saved_hw is not None:
            plog.set_high_watermark(min(saved_hw, plog.log_end_offset))
        if not recovering or read_partition_metadata(dir) is None:
            write_partition_metadata(dir, topic_id=topic.topic_id)
        return Partition(topic=topic, partition=tp[1], log=plog, broker_id=self.broker_id)

    def _remove_orphan_dirs(self, hosted: set[TopicPartition], topics: Mapping[str, TopicInfo],
                            deleted: set[str]) -> None:
        for entry in os.scandir(self.data_dir):
            if not entry.is_dir():
                continue
            if entry.name == CREATING_DIR:  # a bulk creation a crash interrupted: never served
                shutil.rmtree(entry.path, ignore_errors=True)
                continue
            if is_stray_partition_dir(entry.name):
                self._expire_stray(Path(entry.path))
                continue
            if is_deleted_partition_dir(entry.name):  # a delete a crash interrupted: finish it
                log.info("finishing the deletion of a partition directory", extra={"fields": {"dir": entry.path}})
                shutil.rmtree(entry.path, ignore_errors=True)
                continue
            try:
                tp = parse_partition_dir(entry.name)
            except (ValueError, LowtideError):
                continue
            if tp not in hosted:
                try:
                    topic_id = read_partition_metadata(Path(entry.path))
                except LowtideError:
                    topic_id = ""  # unreadable: nobody vouches for it, keep it
                if topic_id != "" and self._may_delete(tp[0], topic_id, topics, deleted):
                    log.info("deleting directory of a partition no longer assigned here",
                             extra={"fields": {"dir": entry.path}})
                    remove_partition_dir(Path(entry.path))
                else:
                    self._set_aside(Path(entry.path))

    # -- loop ------------------------------------------------------------------------------------
    def _run(self) -> None:
        seen = -1
        while not self._stop.is_set():
            self.trigger.wait(RECONCILE_POLL_S)
            if self._stop.is_set():
                return
            try:
                version = self.store.version()
            except MetadataStoreUnavailable:
                continue
            if version != seen or self.trigger.forced:
                seen = version
                self.trigger.clear_forced()
                self.reconcile()
