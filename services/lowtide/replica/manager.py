"""ReplicaManager: every partition replica hosted by this server, wired together.

The work is done by one object per responsibility; this module builds them, starts and stops them
in order, and is the one surface the servicer, the metrics collector and the server use:

* ``registry``      PartitionRegistry: hosted partitions, live brokers, parked-request wake-ups
* ``reconciler``    PartitionReconciler: hosted partitions follow the metadata
* ``membership``    BrokerMembership: registration, heartbeat, live brokers, metadata events
* ``requests``      ReplicaRequests: produce, fetch, list offsets, follower-fetch bookkeeping
* ``deletes``       DeleteRecordsHandler: KIP-107 on the leader, low-watermark reporting
* ``isr``           IsrUpdater: ISR expansion/shrink through the metadata store
* ``housekeeping``  Housekeeping: ISR checks, retention, checkpoints
* ``consumed_retention``  ConsumedRetention: KIP-68 broker side, run by housekeeping before time/size
* ``fetchers``      FetcherManager: follower fetch threads, one per leader
* ``cleaner``       LogCleaner: compaction of the hosted compacted logs (log/cleaner/), leader or follower
"""

from __future__ import annotations

import logging
from pathlib import Path

from lowtide.auth.identity import token_file_metadata
from lowtide.client.replica import ReplicaClient
from lowtide.clock import now_ms
from lowtide.errors import InvalidConfig
from lowtide.log.clean_shutdown import mark_clean_shutdown, take_clean_shutdown_marker
from lowtide.log.cleaner.config import CleanerSettings, CompactionConfig
from lowtide.log.cleaner.scheduler import LogCleaner
from lowtide.log.partition_log import PartitionLog
from lowtide.metadata.store import MetadataStore
from lowtide.purgatory.connection import RedisClient
from lowtide.purgatory.purgatory import Purgatory
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.consumed_retention import ConsumedRetention
from lowtide.replica.delete_records import DeleteRecordsHandler, LowWatermarkListener
from lowtide.replica.fetch_session import FetchSessions
from lowtide.replica.fetcher import FetcherConfig, FetcherManager
from lowtide.replica.housekeeping import Housekeeping, ReplicaCheckpoints
from lowtide.replica.isr import IsrUpdater
from lowtide.replica.membership import BrokerMembership
from lowtide.replica.offsets_reader import ConsumerOffsetsReader
from lowtide.replica.partition import Partition
from lowtide.replica.quota import QuotaConfigWatcher, ReplicationQuotas
from lowtide.replica.reconcile import PartitionReconciler, ReconcileTrigger
from lowtide.replica.registry import PartitionRegistry
from lowtide.replica.requests import ReplicaRequests

log = logging.getLogger(__name__)


class ReplicaManager:
    """The replica server's domain: builds, starts and stops its parts, and forwards requests.

    Contract: ``start()`` registers the broker, starts the DeleteRecords purgatory, reconciles
    once with the metadata, then starts the background threads (heartbeat, metadata events,
    reconcile, ISR checks, checkpoints, retention, the log cleaner unless ``log.cleaner.enable``
    is false) and, through reconciliation, the follower fetchers. ``stop()`` is a clean shutdown:
    stop cleaning and fetching, wake parked requests, fail waiting
    DeleteRecords, checkpoint LSO and HW, close logs, leave the cluster. Setting
    ``on_leader_lw_change`` subscribes to low-watermark changes of led partitions.

    Thread-safety: public methods are thread-safe (each part documents its own); ``start`` and
    ``stop`` once each, from one thread.
    """

    def __init__(self, *, config: ReplicaConfig, store: MetadataStore, redis: RedisClient) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.store = store
        self.redis = redis
        self.data_dir = Path(config.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints = ReplicaCheckpoints(data_dir=self.data_dir)
        self.registry = PartitionRegistry(broker_id=self.broker_id)
        self.delete_purgatory = Purgatory(name="DeleteRecords", redis=redis, owner=f"replica-{self.broker_id}")
        self.deletes = DeleteRecordsHandler(registry=self.registry, purgatory=self.delete_purgatory)
        self.reconcile_trigger = ReconcileTrigger()
        # Followers' fetch sessions on this leader: the fetch path keeps them, the ISR check asks them.
        self.fetch_sessions = FetchSessions(registry=self.registry)
        self.isr = IsrUpdater(store=store, registry=self.registry, wake_reconciler=self.reconcile_trigger.wake,
                              sessions=self.fetch_sessions)
        # KIP-73 replication throttles: one pair of buckets shared by the leader and follower paths.
        self.quotas = ReplicationQuotas(broker_id=self.broker_id)
        self.quota_watcher = QuotaConfigWatcher(store=store, quotas=self.quotas)
        self.fetchers = FetcherManager(
            registry=self.registry,
            config=FetcherConfig(replica_id=self.broker_id, max_wait_ms=config.replica_fetch_wait_max_ms,
                                 max_bytes=config.replica_fetch_max_bytes,
                                 transport=config.replication_transport, sessions=config.replica_fetch_sessions),
            lookup_brokers=store.brokers, request_reconcile=self.reconcile_trigger.force,
            call_metadata=tuple(token_file_metadata(config.token_file)), quotas=self.quotas)
        self.reconciler = PartitionReconciler(
            config=config, store=store, registry=self.registry, trigger=self.reconcile_trigger,
            saved_log_start_offsets=self.checkpoints.saved_log_start_offsets,
            saved_high_watermarks=self.checkpoints.saved_high_watermarks,
            complete_waiting_deletes=self.deletes.complete_ready, on_reconciled=self.fetchers.sync,
            on_config_changed=self._topic_config_changed, report_low_watermarks=self.deletes.report_low_watermarks)
        self.membership = BrokerMembership(
            config=config, store=store, registry=self.registry,
            on_live_brokers_changed=self._recheck_led_partitions, on_metadata_changed=self._metadata_changed)
        self.requests = ReplicaRequests(registry=self.registry, isr=self.isr, deletes=self.deletes,
                                        min_insync_replicas=config.min_insync_replicas,
                                        fetch_limits=config.fetch_limits, quotas=self.quotas,
                                        replication_linger_ms=config.replication_linger_ms,
                                        sessions=self.fetch_sessions)
        # KIP-68 broker side: group offsets read straight from __consumer_offsets' leaders.
        self.offsets_client = ReplicaClient(metadata=token_file_metadata(config.token_file))
        self.consumed_retention = ConsumedRetention(
            registry=self.registry, reader=ConsumerOffsetsReader(store=store, replicas=self.offsets_client),
            broker_defaults=config.log_defaults, clock=now_ms)
        self.housekeeping = Housekeeping(config=config, registry=self.registry, isr=self.isr,
                                         checkpoints=self.checkpoints, consumed_retention=self.consumed_retention)
        # Every replica compacts its own copy of each compacted partition, as in Kafka.
        self.cleaner_settings = CleanerSettings.from_broker_config(config.log_defaults)
        self.cleaner = LogCleaner(data_dir=self.data_dir, logs=self._compacted_logs, settings=self.cleaner_settings)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.membership.register()
        self.quota_watcher.start()  # the rates apply from the first fetch
        self.delete_purgatory.start()
        # Taken away before any log opens: a crash from here on finds no marker (clean_shutdown.py).
        self.reconciler.clean_start = take_clean_shutdown_marker(self.data_dir)
        log.info("opening partition logs", extra={"fields": {
            "after_clean_shutdown": self.reconciler.clean_start}})
        self.reconciler.reconcile()
        self.membership.start()
        self.reconciler.start()
        self.housekeeping.start()
        if self.cleaner_settings.enabled:
            self.cleaner.start()

    def stop(self) -> None:
        """Clean shutdown: stop fetching, checkpoint LSO and HW, close logs, leave the cluster."""
        self.membership.stop()
        self.quota_watcher.stop()
        self.reconciler.stop()
        self.housekeeping.stop()
        self.cleaner.stop()  # before the logs close: a pass in progress gives up and tidies up
        self.requests.stop()
        self.fetchers.stop()
        self.registry.notify()
        self.delete_purgatory.close()
        self.write_checkpoints()
        self.registry.close_logs(threads=self.config.log_open_threads)
        # Only once every log on disk was opened since start (recovered, or clean before): a
        # stop before the first pass finished leaves unscanned logs of a crash behind.
        if self.reconciler.passed_once:
            mark_clean_shutdown(self.data_dir)
        self.offsets_client.close()
        self.membership.unregister()

    def _metadata_changed(self) -> None:
        self.reconcile_trigger.wake()
        self.quota_watcher.wake()  # a throttle rate change publishes a metadata event too

    def _recheck_led_partitions(self) -> None:
        # The live set moved. A broker leaving leaves the ISR first (it stops counting toward the
        # low watermark only once it can no longer be elected), which may complete parked
        # DeleteRecords; one joining holds them back; either way the published LWs may be stale.
        if self.isr.shrink_lagging(lag_time_max_ms=self.config.replica_lag_time_max_ms):
            self.registry.notify()
        self.deletes.recheck_low_watermarks(self.registry.leading())

    def _topic_config_changed(self, partitions: list[Partition]) -> None:
        # A topic may have just become compacted, or got a shorter delete horizon: look now rather
        # than after the cleaner's backoff. Retention picks the new settings up on its next pass.
        self.cleaner.wake()

    def _compacted_logs(self) -> list[tuple[PartitionLog, CompactionConfig]]:
        """For the cleaner: the hosted logs of compacted topics, with the topic's compaction knobs
        (the broker's defaults overridden by the topic's config, as for the log's own settings)."""
        out = []
        for p in self.registry.all():
            if not p.log.config.compacts:
                continue
            try:
                compaction = CompactionConfig.from_topic_config({**self.config.log_defaults, **p.topic_info.config})
            except InvalidConfig as exc:  # the front door validates topic configs; a bad broker default
                log.warning("using default compaction settings for %s: %s", p.topic, exc)
                compaction = CompactionConfig()
            out.append((p.log, compaction))
        return out

    # -- state ---------------------------------------------------------------------------------
    @property
    def live_brokers(self) -> frozenset[int]:
        return self.registry.live_brokers

    @property
    def incarnation(self) -> str:
        return self.membership.incarnation

    @property
    def on_leader_lw_change(self) -> LowWatermarkListener | None:
        """Called with the led partitions whose low watermark changed: [(tp, lw), ...]."""
        return self.deletes.on_low_watermark_change

    @on_leader_lw_change.setter
    def on_leader_lw_change(self, listener: LowWatermarkListener | None) -> None:
        self.deletes.on_low_watermark_change = listener

    def get_partition(self, topic: str, partition: int) -> Partition:
        return self.registry.get(topic, partition)

    def partitions(self) -> list[Partition]:
        return self.registry.all()

    def partitions_following(self, leader_id: int) -> list[Partition]:
        return self.registry.following(leader_id)

    # -- maintenance -----------------------------------------------------------------------------
    def notify_changed(self, keys: list[tuple[str, int]] | None = None) -> None:
        """Wake requests parked on these partitions; None = all."""
        self.registry.notify(keys)

    def reconcile(self) -> None:
        self.reconciler.reconcile()

    def request_reconcile(self) -> None:
        """Reconcile soon, even if the metadata version did not move."""
        self.reconcile_trigger.force()

    def refresh_live_brokers(self) -> None:
        self.membership.refresh_live_brokers()

    def write_checkpoints(self) -> None:
        self.housekeeping.write_checkpoints()
