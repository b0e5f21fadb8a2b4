"""Follower fetchers: one thread per leader broker, fetching every partition this replica
follows from that leader in one long-polled Fetch (Kafka's ReplicaFetcherThread).

Each request carries, per partition, the fetch offset (our LEO) and our log start offset
(KIP-107); each response carries records, the leader's HW and the leader's LSO. We append, adopt
the HW and LSO (a log makes a new LSO durable in its log start offset file before taking it, so
an acknowledged low watermark survives a crash of this replica), and fetch again at once — the
next request is what tells the leader our new LSO.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import grpc

from lowtide.errors import LowtideError
from lowtide.metadata.model import BrokerInfo
from lowtide.rpc.channels import CHANNEL_OPTIONS as GRPC_OPTIONS
from lowtide_pb import replica_pb2, replica_pb2_grpc

if TYPE_CHECKING:
    from lowtide.replica.manager import ReplicaManager

log = logging.getLogger(__name__)

OFFSET_OUT_OF_RANGE = 1
RETRY_BACKOFF_S = 0.2
ADDRESS_TTL_S = 5.0


class FetcherThread:
    """Fetches from one leader. Thread-safety: owned by FetcherManager; stop() from any thread."""

    def __init__(self, *, manager: ReplicaManager, leader_id: int) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self._stop = threading.Event()
        self._channel: grpc.Channel | None = None
        self._address = ""
        self._stub: replica_pb2_grpc.ReplicaStub | None = None
        self._stale = True
        self._resolved_at = 0.0
        self.thread = threading.Thread(target=self._run, name=f"fetcher-{leader_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _stub_for_leader(self) -> replica_pb2_grpc.ReplicaStub | None:
        # The address is looked up again only after a failed call or every few seconds: a Redis
        # round trip per fetch cost ~8% of a replica's CPU.
        now = time.monotonic()
        if self._stub is not None and not self._stale and now - self._resolved_at < ADDRESS_TTL_S:
            return self._stub
        self._stale, self._resolved_at = False, now
        broker: BrokerInfo | None = self.manager.store.brokers().get(self.leader_id)
        if broker is None:
            return None
        if broker.address != self._address or self._stub is None:
            if self._channel is not None:
                self._channel.close()
            self._address = broker.address
            self._channel = grpc.insecure_channel(broker.address, options=GRPC_OPTIONS)
            self._stub = replica_pb2_grpc.ReplicaStub(self._channel)
        return self._stub

    def _run(self) -> None:
        cfg = self.manager.config
        while not self._stop.is_set():
            parts = self.manager.partitions_following(self.leader_id)
            if not parts:
                self._stop.wait(0.2)
                continue
            try:
                stub = self._stub_for_leader()
            except Exception as exc:  # noqa: BLE001 - redis hiccup: retry
                log.warning("cannot resolve leader %s: %s", self.leader_id, exc)
                stub = None
            if stub is None:
                self._stop.wait(RETRY_BACKOFF_S)
                continue
            req = replica_pb2.FetchRequest(
                replica_id=self.manager.broker_id, max_wait_ms=cfg.replica_fetch_wait_max_ms, min_bytes=1,
                max_bytes=cfg.replica_fetch_max_bytes,
                partitions=[replica_pb2.FetchPartition(
                    topic=p.topic, partition=p.partition, fetch_offset=p.log.log_end_offset,
                    log_start_offset=p.log.log_start_offset, partition_max_bytes=cfg.replica_fetch_max_bytes,
                    current_leader_epoch=p.leader_epoch) for p in parts])
            try:
                resp = stub.Fetch(req, timeout=cfg.replica_fetch_wait_max_ms / 1000 + 10)
            except grpc.RpcError as exc:
                self._stale = True
                if not self._stop.is_set():
                    log.debug("fetch from leader %s failed: %s", self.leader_id, exc.code())
                    self._stop.wait(RETRY_BACKOFF_S)
                continue
            self._apply(resp)
        if self._channel is not None:
            self._channel.close()

    def _apply(self, resp: replica_pb2.FetchResponse) -> None:
        lso_changed = appended = refresh = False
        touched = []
        for r in resp.partitions:
            try:
                p = self.manager.get_partition(r.topic, r.partition)
            except LowtideError:
                continue
            touched.append((r.topic, r.partition))
            try:
                if r.error_code == 0:
                    a, l_changed = p.apply_fetched(records=r.records, leader_hw=r.high_watermark,
                                                   leader_lso=r.log_start_offset)
                    appended |= a
                    lso_changed |= l_changed
                elif r.error_code == OFFSET_OUT_OF_RANGE:
                    p.handle_out_of_range(leader_lso=r.log_start_offset, leader_leo=r.log_end_offset)
                    lso_changed = True
                else:
                    refresh = True  # NOT_LEADER / FENCED / UNKNOWN: our metadata is stale
            except LowtideError as err:
                log.warning("cannot apply fetched data", extra={"fields": {
                    "topic": r.topic, "partition": r.partition, "error": err.name, "detail": err.message}})
                refresh = True
        if refresh:
            self._stale = True
            self.manager.request_reconcile()
            self._stop.wait(RETRY_BACKOFF_S)
        if appended or lso_changed:
            self.manager.notify_changed(touched)


class FetcherManager:
    """Keeps one FetcherThread per leader we follow. Thread-safe."""

    def __init__(self, *, manager: ReplicaManager) -> None:
        self.manager = manager
        self._threads: dict[int, FetcherThread] = {}
        self._lock = threading.Lock()

    def sync(self) -> None:
        leaders = {p.leader_id for p in self.manager.partitions() if p.role == "follower" and p.leader_id >= 0}
        with self._lock:
            for lid in leaders - set(self._threads):
                t = FetcherThread(manager=self.manager, leader_id=lid)
                self._threads[lid] = t
                t.start()
            for lid in set(self._threads) - leaders:
                self._threads.pop(lid).stop()

    def stop(self) -> None:
        with self._lock:
            for t in self._threads.values():
                t.stop()
            threads = list(self._threads.values())
            self._threads.clear()
        for t in threads:
            t.thread.join(timeout=2)
