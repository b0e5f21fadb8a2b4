"""ReplicaManager: every partition replica hosted by this server, and the waiting around them.

Responsibilities (Kafka's ReplicaManager + a slice of its KafkaController client):
* reconcile hosted partitions with the metadata in Redis (create, become leader/follower, delete);
* produce (acks 0/1/all) and fetch (consumers up to the HW, followers up to the LEO) with
  long-polling: a parked fetch wakes on new data, on an HW change *and* on an LSO change — the
  LSO wake-up is what lets DeleteRecords finish in a few round trips on an idle partition;
* DeleteRecords on the leader, waiting in the purgatory until the low watermark reaches the offset;
* ISR shrink/expand, broker heartbeats, retention, LSO/HW checkpoints.

Thread-safety: public methods are thread-safe. ``_parts_lock`` guards the partition map; each
Partition has its own lock; ``Waiters`` wakes the parked fetches and acks=all produces of a
partition after any change they might wait for (data, HW, LSO, leadership).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis as redis_lib

from lowtide.errors import (
    InvalidRequest,
    InvalidRequiredAcks,
    LowtideError,
    NotLeaderOrFollower,
    RequestTimedOut,
    UnknownServerError,
    UnknownTopicOrPartition,
)
from lowtide.log.checkpoint import CheckpointFile
from lowtide.log.filenames import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    parse_partition_dir,
    partition_dir_name,
)
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.metadata.model import BrokerInfo, TopicInfo
from lowtide.metadata.store import METADATA_CHANNEL, MetadataStore
from lowtide.purgatory.purgatory import Purgatory
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.delete_records import DelayedDeleteRecords
from lowtide.replica.partition import FOLLOWER, LEADER, Partition, now_ms

log = logging.getLogger(__name__)
TP = tuple[str, int]


@dataclass
class FetchItem:
    topic: str
    partition: int
    fetch_offset: int
    log_start_offset: int = 0
    max_bytes: int = 1024 * 1024
    current_leader_epoch: int = -1


@dataclass
class FetchOutcome:
    topic: str
    partition: int
    error: LowtideError | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    leader_epoch: int = -1
    records: bytes = b""


class Waiters:
    """Per-partition wake-ups for parked fetches and acks=all produces.

    A waiter registers one Event under every partition it waits on; a change to a partition sets
    the events registered under it, so an append wakes only the waiters of that partition (a
    process-wide Condition woke every parked request on every append). Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[TP, set[threading.Event]] = {}

    @contextmanager
    def waiting(self, keys: list[TP]) -> Iterator[threading.Event]:
        event = threading.Event()
        with self._lock:
            for k in keys:
                self._by_key.setdefault(k, set()).add(event)
        try:
            yield event
        finally:
            with self._lock:
                for k in keys:
                    events = self._by_key.get(k)
                    if events is not None:
                        events.discard(event)
                        if not events:
                            del self._by_key[k]

    def notify(self, keys: Iterable[TP] | None) -> None:
        with self._lock:
            if keys is None:
                events = {e for evs in self._by_key.values() for e in evs}
            else:
                events = {e for k in keys for e in self._by_key.get(k, ())}
        for e in events:
            e.set()


class ReplicaManager:
    def __init__(self, *, config: ReplicaConfig, store: MetadataStore, redis: redis_lib.Redis) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.store = store
        self.redis = redis
        self.data_dir = Path(config.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.incarnation = uuid.uuid4().hex[:12]
        self._parts: dict[TP, Partition] = {}
        self._parts_lock = threading.RLock()
        self._waiters = Waiters()
        self._stop = threading.Event()
        self._reconcile_wanted = threading.Event()
        self._force_reconcile = False
        self._checkpoint_lock = threading.Lock()
        self.live_brokers: frozenset[int] = frozenset()
        self._live_lock = threading.Lock()
        self._lso_ckpt = CheckpointFile(self.data_dir / LOG_START_OFFSET_CHECKPOINT)
        self._hw_ckpt = CheckpointFile(self.data_dir / REPLICATION_OFFSET_CHECKPOINT)
        self._saved_lso = self._lso_ckpt.read()
        self._saved_hw = self._hw_ckpt.read()
        self.delete_purgatory = Purgatory(name="DeleteRecords", redis=redis, owner=f"replica-{self.broker_id}")
        self._threads: list[threading.Thread] = []
        self.fetchers = None  # set by start(); avoids an import cycle
        # Called with the partitions whose low watermark changed: [(tp, lw), ...].
        self.on_leader_lw_change: Callable[[list[tuple[TP, int]]], None] | None = None
        self._reported_lw: dict[TP, int] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        from lowtide.replica.fetcher import FetcherManager

        info = BrokerInfo(id=self.broker_id, host=self.config.advertised_host, port=self.config.grpc_port,
                          rack=self.config.rack, metrics=self.config.metrics_url)
        self.store.register_broker(info, incarnation=self.incarnation,
                                   session_timeout_ms=self.config.session_timeout_ms)
        self.live_brokers = frozenset(self.store.live_broker_ids())
        self.delete_purgatory.start()
        self.fetchers = FetcherManager(manager=self)
        self.reconcile()
        for name, target in [("heartbeat", self._run_heartbeat), ("reconcile", self._run_reconcile),
                             ("metadata-events", self._run_metadata_events), ("isr", self._run_isr_checks),
                             ("checkpoint", self._run_checkpoints), ("retention", self._run_retention)]:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Clean shutdown: stop fetching, checkpoint LSO and HW, close logs, leave the cluster."""
        self._stop.set()
        self._reconcile_wanted.set()
        if self.fetchers:
            self.fetchers.stop()
        self.notify_changed()
        self.delete_purgatory.close()
        self.write_checkpoints()
        with self._parts_lock:
            for p in self._parts.values():
                p.log.close()
        try:
            self.store.unregister_broker(self.broker_id, incarnation=self.incarnation)
        except redis_lib.RedisError:
            log.warning("could not unregister from redis")

    # -- notification ---------------------------------------------------------------------------
    def notify_changed(self, keys: Iterable[TP] | None = None) -> None:
        """Wake waiters (parked fetches, acks=all produces) of these partitions; None = all."""
        self._waiters.notify(keys)

    # -- partitions ---------------------------------------------------------------------------
    def get_partition(self, topic: str, partition: int) -> Partition:
        p = self._parts.get((topic, partition))
        if p is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} is not hosted on replica {self.broker_id}")
        return p

    def partitions(self) -> list[Partition]:
        with self._parts_lock:
            return list(self._parts.values())

    def partitions_following(self, leader_id: int) -> list[Partition]:
        return [p for p in self.partitions() if p.role == FOLLOWER and p.leader_id == leader_id]

    def log_config_for(self, topic: TopicInfo) -> LogConfig:
        return LogConfig.from_topic_config({**self.config.log_defaults, **topic.config})

    def reconcile(self) -> None:
        """Make hosted partitions match the metadata."""
        try:
            topics = self.store.topics()
            states = self.store.all_partition_states()
        except redis_lib.RedisError as exc:
            log.warning("metadata unavailable: %s", exc)
            return
        mine = {tp: st for tp, st in states.items() if self.broker_id in st.replicas and tp[0] in topics}
        became: list[tuple[Partition, str]] = []
        with self._parts_lock:
            for tp, st in mine.items():
                p = self._parts.get(tp)
                if p is None:
                    topic = topics[tp[0]]
                    plog = PartitionLog.open(self.data_dir / partition_dir_name(*tp), topic=tp[0], partition=tp[1],
                                             config=self.log_config_for(topic),
                                             log_start_offset=self._saved_lso.get(tp, 0))
                    saved_hw = self._saved_hw.get(tp)
                    if saved_hw is not None:
                        plog.set_high_watermark(min(saved_hw, plog.log_end_offset))
                    p = Partition(topic=topic, partition=tp[1], log=plog, broker_id=self.broker_id)
                    self._parts[tp] = p
                role = p.apply_state(st)
                if role:
                    became.append((p, role))
            gone = [tp for tp in self._parts if tp not in mine]
            removed = [self._parts.pop(tp) for tp in gone]
        for p in removed:
            log.info("removing partition", extra={"fields": {"topic": p.topic, "partition": p.partition}})
            self.delete_purgatory.check_and_complete(p.key)
            p.log.delete()
        self._remove_orphan_dirs(set(mine))
        for p, role in became:
            log.info("became %s", role, extra={"fields": {"topic": p.topic, "partition": p.partition,
                                                          "leader_epoch": p.leader_epoch, "leader": p.leader_id}})
            self.delete_purgatory.check_and_complete(p.key)
        if self.fetchers:
            self.fetchers.sync()
        self.notify_changed()

    def request_reconcile(self) -> None:
        self._force_reconcile = True
        self._reconcile_wanted.set()

    def _remove_orphan_dirs(self, hosted: set[TP]) -> None:
        for entry in os.scandir(self.data_dir):
            if not entry.is_dir():
                continue
            try:
                tp = parse_partition_dir(entry.name)
            except (ValueError, LowtideError):
                continue
            if tp not in hosted:
                log.info("deleting directory of a partition no longer assigned here",
                         extra={"fields": {"dir": entry.path}})
                shutil.rmtree(entry.path, ignore_errors=True)

    # -- produce -------------------------------------------------------------------------------
    def produce(self, items: list[tuple[str, int, bytes]], *, acks: int, timeout_ms: int) -> list:
        """Returns one (topic, partition, AppendInfo | LowtideError) per item."""
        if acks not in (0, 1, -1):
            raise InvalidRequiredAcks(f"acks must be 0, 1 or -1 (all), got {acks}")
        results: list = []
        keys = [(t, p) for t, p, _ in items]
        for topic, partition, records in items:
            try:
                p = self.get_partition(topic, partition)
                min_isr = int(p.topic_info.config.get("min.insync.replicas", self.config.min_insync_replicas))
                info = p.append_as_leader(records, acks=acks, min_insync_replicas=min_isr)
                results.append((topic, partition, info))
            except LowtideError as err:
                results.append((topic, partition, err))
        self.notify_changed(keys)
        if acks == -1:
            self._await_high_watermark(results, timeout_ms)
        return results

    def _await_high_watermark(self, results: list, timeout_ms: int) -> None:
        deadline = time.monotonic() + max(timeout_ms, 1) / 1000
        with self._waiters.waiting([(t, p) for t, p, _ in results]) as wake:
            self._await_loop(results, timeout_ms, deadline, wake)

    def _await_loop(self, results: list, timeout_ms: int, deadline: float, wake: threading.Event) -> None:
        while True:
            wake.clear()
            pending = False
            for i, (topic, partition, info) in enumerate(results):
                if isinstance(info, LowtideError):
                    continue
                p = self._parts.get((topic, partition))
                if p is None or p.role != LEADER:
                    results[i] = (topic, partition, NotLeaderOrFollower(f"leadership of {topic}-{partition} moved"))
                elif p.log.high_watermark <= info.last_offset:
                    pending = True
            if not pending:
                return
            if time.monotonic() >= deadline:
                for i, (topic, partition, info) in enumerate(results):
                    if not isinstance(info, LowtideError):
                        p = self._parts.get((topic, partition))
                        if p is None or p.log.high_watermark <= info.last_offset:
                            results[i] = (topic, partition, RequestTimedOut(
                                f"{topic}-{partition}: not replicated to the ISR within {timeout_ms} ms"))
                return
            wake.wait(max(0.0, deadline - time.monotonic()))

    # -- fetch ---------------------------------------------------------------------------------
    def fetch(self, items: list[FetchItem], *, replica_id: int, max_wait_ms: int, min_bytes: int,
              max_bytes: int) -> list[FetchOutcome]:
        follower = replica_id >= 0
        if follower:
            self._record_follower_fetch(replica_id, items)
        deadline = time.monotonic() + max(0, max_wait_ms) / 1000
        with self._waiters.waiting([(it.topic, it.partition) for it in items]) as wake:
            while True:
                wake.clear()  # before reading: a change during the read makes the wait return at once
                outcomes, size, now = self._read(items, follower=follower, max_bytes=max_bytes)
                if size >= max(min_bytes, 1) or now or time.monotonic() >= deadline or self._stop.is_set():
                    return outcomes
                wake.wait(max(0.0, deadline - time.monotonic()))

    def _read(self, items: list[FetchItem], *, follower: bool, max_bytes: int):
        outcomes: list[FetchOutcome] = []
        size = 0
        wake = False
        budget = max_bytes if max_bytes > 0 else 50 * 1024 * 1024
        for it in items:
            out = FetchOutcome(topic=it.topic, partition=it.partition)
            try:
                p = self.get_partition(it.topic, it.partition)
                p.check_leader(it.current_leader_epoch)
                plog = p.log
                out.high_watermark = plog.high_watermark
                out.log_start_offset = plog.log_start_offset
                out.log_end_offset = plog.log_end_offset
                out.leader_epoch = p.leader_epoch
                if follower and it.log_start_offset < out.log_start_offset:
                    wake = True  # the follower must learn the new LSO now (KIP-107, fast path)
                limit = min(it.max_bytes or 1024 * 1024, budget) if size else (it.max_bytes or 1024 * 1024)
                if limit > 0:
                    out.records = plog.read(it.fetch_offset, max_bytes=limit,
                                            max_offset=out.log_end_offset if follower else out.high_watermark)
                size += len(out.records)
                budget -= len(out.records)
            except LowtideError as err:
                out.error = err
                wake = True
            outcomes.append(out)
        return outcomes, size, wake

    def _record_follower_fetch(self, replica_id: int, items: list[FetchItem]) -> None:
        changed: list[TP] = []
        lso_moved: list[Partition] = []
        for it in items:
            p = self._parts.get((it.topic, it.partition))
            if p is None or p.role != LEADER:
                continue
            hw_changed, lso_changed = p.update_follower(replica_id, fetch_offset=it.fetch_offset,
                                                       log_start_offset=it.log_start_offset)
            new_isr = p.isr_expansion_candidate(replica_id)
            if new_isr is not None:
                hw_changed |= self._change_isr(p, new_isr)
            if lso_changed:
                lso_moved.append(p)
            if hw_changed:
                changed.append(p.key)
        if changed:
            self.notify_changed(changed)
        for p in lso_moved:
            self.delete_purgatory.check_and_complete(p.key)
        self._report_low_watermarks(lso_moved)

    def _change_isr(self, p: Partition, isr: Iterable[int]) -> bool:
        try:
            st = self.store.update_isr(topic=p.topic, partition=p.partition, leader=self.broker_id,
                                       leader_epoch=p.leader_epoch, isr=isr)
        except (LowtideError, redis_lib.RedisError) as exc:
            log.warning("ISR change failed: %s", exc)
            self._reconcile_wanted.set()
            return False
        log.info("ISR changed", extra={"fields": {"topic": p.topic, "partition": p.partition, "isr": list(st.isr)}})
        return p.set_isr(st)

    def _report_low_watermarks(self, parts: list[Partition]) -> None:
        """Publish the low watermarks that changed (one event per change, not per fetch)."""
        if not self.on_leader_lw_change or not parts:
            return
        changed = []
        for p in parts:
            lw = p.low_watermark(self.live_brokers)
            if self._reported_lw.get(p.key) != lw:
                self._reported_lw[p.key] = lw
                changed.append((p.key, lw))
        if changed:
            self.on_leader_lw_change(changed)

    # -- delete records -----------------------------------------------------------------------
    def delete_records(self, items: list[tuple[str, int, int]], *, timeout_ms: int) -> list:
        """KIP-107 on the leader. Returns one (topic, partition, low_watermark | LowtideError)."""
        required: dict[TP, tuple[int, int]] = {}
        errors: dict[TP, LowtideError] = {}
        lso_changed = False
        for topic, partition, offset in items:
            tp = (topic, partition)
            try:
                p = self.get_partition(topic, partition)
                target, changed = p.delete_records_before(offset)
                required[tp] = (target, p.leader_epoch)
                lso_changed |= changed
            except LowtideError as err:
                errors[tp] = err
        if lso_changed:
            # The new LSO is already durable (each log wrote its log start offset file before
            # taking it), so the parked follower fetches can go at once.
            self.notify_changed(list(required))
        op = DelayedDeleteRecords(manager=self, required=required,
                                  deadline_ms=now_ms() + max(1, timeout_ms))
        if required:
            if not self.delete_purgatory.try_complete_else_watch(op, list(required)):
                op.wait(timeout_ms / 1000 + 5)
            if not op.is_completed:
                op.force_complete()
        out = []
        for topic, partition, _ in items:
            tp = (topic, partition)
            out.append((topic, partition, errors.get(tp) or op.results.get(tp) or
                        UnknownServerError("no result")))
        return out

    # -- background loops ---------------------------------------------------------------------
    def _run_heartbeat(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval):
            try:
                if not self.store.redis.exists(f"lowtide:broker:{self.broker_id}:alive"):
                    # Our session expired (e.g. we were paused): re-register so the address is current.
                    info = BrokerInfo(id=self.broker_id, host=self.config.advertised_host,
                                      port=self.config.grpc_port, rack=self.config.rack,
                                      metrics=self.config.metrics_url)
                    self.store.register_broker(info, incarnation=self.incarnation,
                                               session_timeout_ms=self.config.session_timeout_ms)
                else:
                    self.store.heartbeat(self.broker_id, incarnation=self.incarnation,
                                         session_timeout_ms=self.config.session_timeout_ms)
            except redis_lib.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            self.refresh_live_brokers()

    def refresh_live_brokers(self) -> None:
        """Re-read which brokers hold a live session; on a change, re-check parked DeleteRecords
        and republish low watermarks (a broker leaving may complete them, one joining holds
        them back). Called by the heartbeat (sessions expire silently) and on broker
        registration events, so a broker that joins is counted within a pub/sub hop."""
        try:
            live = frozenset(self.store.live_broker_ids())
        except redis_lib.RedisError as exc:
            log.warning("reading live brokers failed: %s", exc)
            return
        with self._live_lock:
            if live == self.live_brokers:
                return
            self.live_brokers = live
        log.info("live brokers changed", extra={"fields": {"live": sorted(live)}})
        leaders = [p for p in self.partitions() if p.role == LEADER]
        for p in leaders:
            self.delete_purgatory.check_and_complete(p.key)
        self._report_low_watermarks(leaders)

    def _run_reconcile(self) -> None:
        seen = -1
        while not self._stop.is_set():
            self._reconcile_wanted.wait(2.0)
            self._reconcile_wanted.clear()
            if self._stop.is_set():
                return
            try:
                version = self.store.version()
            except redis_lib.RedisError:
                continue
            if version != seen or self._force_reconcile:
                seen = version
                self._force_reconcile = False
                self.reconcile()

    def _run_metadata_events(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(METADATA_CHANNEL)
                # Brokers that registered between start() reading the live set and this
                # subscription published their event before we listened: read the set again.
                self.refresh_live_brokers()
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=1.0)
                    if msg:
                        if msg.get("data") in (b"broker", "broker"):
                            self.refresh_live_brokers()
                        self._reconcile_wanted.set()
            except redis_lib.RedisError:
                self._stop.wait(1.0)

    def _run_isr_checks(self) -> None:
        interval = max(0.1, self.config.replica_lag_time_max_ms / 2000)
        while not self._stop.wait(interval):
            changed = False
            for p in self.partitions():
                new_isr = p.isr_shrink_candidate(lag_time_max_ms=self.config.replica_lag_time_max_ms)
                if new_isr is not None:
                    changed |= self._change_isr(p, new_isr)
            if changed:
                self.notify_changed()

    def _run_checkpoints(self) -> None:
        while not self._stop.wait(self.config.checkpoint_interval_ms / 1000):
            self.write_checkpoints()

    def _run_retention(self) -> None:
        while not self._stop.wait(self.config.retention_check_interval_ms / 1000):
            changed = False
            for p in self.partitions():
                if p.role != LEADER:
                    continue  # followers adopt the leader's LSO, so replicas agree
                try:
                    before = p.log.log_start_offset
                    p.log.delete_retention_segments(now_ms=now_ms())
                    changed |= p.log.log_start_offset != before
                except LowtideError as exc:
                    log.warning("retention failed: %s", exc)
            if changed:
                self.notify_changed()

    # -- checkpoints -------------------------------------------------------------------------
    def write_checkpoints(self) -> None:
        with self._checkpoint_lock:
            parts = self.partitions()
            self._lso_ckpt.write({p.key: p.log.log_start_offset for p in parts})
            self._hw_ckpt.write({p.key: p.log.high_watermark for p in parts})

    # -- list offsets ---------------------------------------------------------------------------
    def list_offset(self, topic: str, partition: int, timestamp: int) -> tuple[int, int, int]:
        """(offset, timestamp, leader epoch): -1 latest (HW), -2 earliest (LSO), -3 max timestamp,
        >= 0 the first offset whose timestamp is >= it (-1 when none)."""
        p = self.get_partition(topic, partition)
        p.check_leader()
        plog = p.log
        if timestamp == -1:
            return plog.high_watermark, -1, p.leader_epoch
        if timestamp == -2:
            return plog.log_start_offset, -1, p.leader_epoch
        if timestamp == -3:
            found = plog.max_timestamp_offset()
        elif timestamp >= 0:
            found = plog.offset_for_timestamp(timestamp)
        else:
            raise InvalidRequest(f"invalid ListOffsets timestamp {timestamp}")
        if found is None or found[0] >= plog.high_watermark:
            return -1, -1, p.leader_epoch
        return max(found[0], plog.log_start_offset), found[1], p.leader_epoch
