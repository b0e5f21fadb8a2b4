"""This replica's membership of the cluster: its broker registration and session heartbeat, the
set of live brokers it counts, and the metadata change events it listens to.

The live set matters to KIP-107: the low watermark is the min LSO over the leader and every
replica on a *live* broker, so a broker leaving may complete parked DeleteRecords and a broker
joining holds them back.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

import redis as redis_lib

from lowtide.metadata.model import BrokerInfo
from lowtide.metadata.store import METADATA_CHANNEL, MetadataStore
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.registry import PartitionRegistry

log = logging.getLogger(__name__)


class BrokerMembership:
    """Registers this broker, keeps its session alive and keeps the registry's live-broker set.

    Contract:

    * ``register()`` publishes this broker (address, rack, metrics URL) under a fresh incarnation
      and reads the live set; ``unregister()`` removes it (clean shutdown), best effort.
    * The heartbeat thread renews the session every ``heartbeat_interval_ms``; if the session
      expired meanwhile (a paused process), it registers again so the address is current.
    * ``refresh_live_brokers()`` re-reads the live set; on a change it calls
      ``on_live_brokers_changed`` (re-check DeleteRecords, republish low watermarks). It runs after
      every heartbeat (sessions expire silently) and on every broker registration event, so a
      broker that joins is counted within a pub/sub hop.
    * Every metadata event calls ``on_metadata_changed`` (wake the reconciler).

    Thread-safety: thread-safe; ``start``/``stop`` once each. Redis failures are logged and
    retried by the loops, never raised from them.
    """

    def __init__(self, *, config: ReplicaConfig, store: MetadataStore, redis: redis_lib.Redis,
                 registry: PartitionRegistry, on_live_brokers_changed: Callable[[], None],
                 on_metadata_changed: Callable[[], None]) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.store = store
        self.redis = redis
        self.registry = registry
        self.incarnation = uuid.uuid4().hex[:12]
        self._on_live_brokers_changed = on_live_brokers_changed
        self._on_metadata_changed = on_metadata_changed
        self._stop = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------
    def register(self) -> None:
        """Register this broker and read the live set (no change callback: nothing is hosted yet)."""
        self.store.register_broker(self._broker_info(), incarnation=self.incarnation,
                                   session_timeout_ms=self.config.session_timeout_ms)
        self.registry.update_live_brokers(self.store.live_broker_ids())

    def start(self) -> None:
        """Start the heartbeat and metadata-event threads."""
        for name, target in [("heartbeat", self._run_heartbeat), ("metadata-events", self._run_metadata_events)]:
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def unregister(self) -> None:
        try:
            self.store.unregister_broker(self.broker_id, incarnation=self.incarnation)
        except redis_lib.RedisError:
            log.warning("could not unregister from redis")

    def _broker_info(self) -> BrokerInfo:
        return BrokerInfo(id=self.broker_id, host=self.config.advertised_host, port=self.config.grpc_port,
                          rack=self.config.rack, metrics=self.config.metrics_url,
                          kafka_port=self.config.kafka_port, kafka_listeners=dict(self.config.kafka_listeners),
                          replication_port=self.config.replication_port)

    # -- live brokers ----------------------------------------------------------------------------
    def refresh_live_brokers(self) -> None:
        """Re-read which brokers hold a live session; on a change, call ``on_live_brokers_changed``."""
        try:
            live = frozenset(self.store.live_broker_ids())
        except redis_lib.RedisError as exc:
            log.warning("reading live brokers failed: %s", exc)
            return
        if not self.registry.update_live_brokers(live):
            return
        log.info("live brokers changed", extra={"fields": {"live": sorted(live)}})
        self._on_live_brokers_changed()

    # -- loops -----------------------------------------------------------------------------------
    def _run_heartbeat(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval):
            try:
                if not self.store.redis.exists(f"lowtide:broker:{self.broker_id}:alive"):
                    # Our session expired (e.g. we were paused): re-register so the address is current.
                    self.store.register_broker(self._broker_info(), incarnation=self.incarnation,
                                               session_timeout_ms=self.config.session_timeout_ms)
                else:
                    self.store.heartbeat(self.broker_id, incarnation=self.incarnation,
                                         session_timeout_ms=self.config.session_timeout_ms)
            except redis_lib.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            self.refresh_live_brokers()

    def _run_metadata_events(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(METADATA_CHANNEL)
                # Brokers that registered between register() reading the live set and this
                # subscription published their event before we listened: read the set again.
                self.refresh_live_brokers()
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=1.0)
                    if msg:
                        if msg.get("data") in (b"broker", "broker"):
                            self.refresh_live_brokers()
                        self._on_metadata_changed()
            except redis_lib.RedisError:
                self._stop.wait(1.0)
