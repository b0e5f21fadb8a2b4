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

from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.model import BrokerInfo
from lowtide.metadata.store import MetadataStore
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
      ``on_live_brokers_changed`` (shrink ISRs, re-check DeleteRecords, republish low watermarks).
      The live-brokers thread runs it after every heartbeat and on every change the metadata watch
      applies (a session's expiry is etcd deleting the broker's ``alive`` key), so a broker that
      joins or leaves is counted within a watch hop. It has a thread of its own because the
      callback may be long (the ISR of thousands of partitions): on the heartbeat thread it once
      delayed our own heartbeats past the session timeout, so that one broker's death made the
      controller take every other broker for dead too.
    * Every metadata change calls ``on_metadata_changed`` (wake the reconciler).

    Thread-safety: thread-safe; ``start``/``stop`` once each. Store failures are logged and
    retried by the loops, never raised from them; while etcd is unreachable the live set stays
    what the image last showed (the data plane keeps serving).
    """

    def __init__(self, *, config: ReplicaConfig, store: MetadataStore,
                 registry: PartitionRegistry, on_live_brokers_changed: Callable[[], None],
                 on_metadata_changed: Callable[[], None]) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.store = store
        self.registry = registry
        self.incarnation = uuid.uuid4().hex[:12]
        self._on_live_brokers_changed = on_live_brokers_changed
        self._on_metadata_changed = on_metadata_changed
        self._stop = threading.Event()
        self._live_wake = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------
    def register(self) -> None:
        """Register this broker and read the live set (no change callback: nothing is hosted yet)."""
        self.store.register_broker(self._broker_info(), incarnation=self.incarnation,
                                   session_timeout_ms=self.config.session_timeout_ms)
        self.registry.update_live_brokers(self.store.live_broker_ids())

    def start(self) -> None:
        """Start the heartbeat thread and listen to the metadata watch."""
        self.store.listen(self._on_metadata_event)
        threading.Thread(target=self._run_heartbeat, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._run_live_brokers, name="live-brokers", daemon=True).start()
        # Brokers that registered between register() reading the live set and the listening: read again.
        self._live_wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._live_wake.set()

    def unregister(self) -> None:
        try:
            self.store.unregister_broker(self.broker_id, incarnation=self.incarnation)
        except MetadataStoreUnavailable:
            log.warning("could not unregister from the metadata store")

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
        except MetadataStoreUnavailable as exc:
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
                if not self.store.heartbeat(self.broker_id, incarnation=self.incarnation,
                                            session_timeout_ms=self.config.session_timeout_ms):
                    # Our session expired (e.g. we were paused): re-register so the address is current.
                    self.store.register_broker(self._broker_info(), incarnation=self.incarnation,
                                               session_timeout_ms=self.config.session_timeout_ms)
            except MetadataStoreUnavailable as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            self._live_wake.set()

    def _run_live_brokers(self) -> None:
        while True:
            self._live_wake.wait()
            self._live_wake.clear()
            if self._stop.is_set():
                return
            try:
                self.refresh_live_brokers()
            except Exception:  # noqa: BLE001 - the thread must outlive one failed callback
                log.exception("handling a change of the live brokers failed")

    def _on_metadata_event(self, keys: list[str]) -> None:
        if self._stop.is_set():
            return
        self._live_wake.set()
        self._on_metadata_changed()
