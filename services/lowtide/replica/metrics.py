"""Prometheus metrics of a replica, computed at scrape time from the hosted partitions (no cost
on the produce/fetch paths).

    lowtide_partition_log_start_offset{topic,partition,replica}
    lowtide_partition_high_watermark{topic,partition,replica}
    lowtide_partition_log_end_offset{topic,partition,replica}
    lowtide_partition_size_bytes{topic,partition,replica}
    lowtide_partition_segments{topic,partition,replica}
    lowtide_partition_low_watermark{topic,partition,replica}              leader only
    lowtide_partition_low_watermark_lag_records{topic,partition,replica}  leader LSO - LW, leader only
    lowtide_partition_in_sync_replicas{topic,partition,replica}           leader only

Counted on the request path (one labelled child per follower, cached per stream):

    lowtide_replication_streams{follower}                 open Replicate streams on this leader
    lowtide_replication_rounds_total{follower,transport}  follower fetch rounds answered (stream|fetch)
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from lowtide.replica.manager import ReplicaManager
from lowtide.replica.partition import LEADER

LABELS = ["topic", "partition", "replica"]

REPLICATION_STREAMS = Gauge("lowtide_replication_streams", "Open Replicate streams on this leader, by follower",
                            ["follower"])
REPLICATION_ROUNDS = Counter("lowtide_replication_rounds", "Follower fetch rounds answered by this leader",
                             ["follower", "transport"])


class ReplicaCollector(Collector):
    """Per-partition gauges of one replica, read from its partitions at each scrape.

    Thread-safety: ``collect`` runs on the metrics HTTP thread; it reads a snapshot of the hosted
    partitions and their logs' offsets (each read is atomic), never blocking the request paths.
    """

    def __init__(self, manager: ReplicaManager) -> None:
        self.manager = manager

    def collect(self):
        g = {name: GaugeMetricFamily(f"lowtide_partition_{name}", doc, labels=LABELS) for name, doc in [
            ("log_start_offset", "Log start offset (KIP-107) of this replica"),
            ("high_watermark", "High watermark known to this replica"),
            ("log_end_offset", "Log end offset of this replica"),
            ("size_bytes", "Bytes of segment files of this replica"),
            ("segments", "Number of segments of this replica"),
            ("low_watermark", "Low watermark: min LSO over the leader and live replicas (leader only)"),
            ("low_watermark_lag_records", "Leader LSO minus low watermark: deletion not yet on replicas"),
            ("in_sync_replicas", "Size of the ISR (leader only)"),
        ]}
        rid = str(self.manager.broker_id)
        live = self.manager.live_brokers
        for p in self.manager.partitions():
            labels = [p.topic, str(p.partition), rid]
            plog = p.log
            g["log_start_offset"].add_metric(labels, plog.log_start_offset)
            g["high_watermark"].add_metric(labels, plog.high_watermark)
            g["log_end_offset"].add_metric(labels, plog.log_end_offset)
            g["size_bytes"].add_metric(labels, plog.size_bytes)
            g["segments"].add_metric(labels, plog.num_segments)
            if p.role == LEADER:
                lw = p.low_watermark(live)
                g["low_watermark"].add_metric(labels, lw)
                g["low_watermark_lag_records"].add_metric(labels, max(0, plog.log_start_offset - lw) if lw >= 0
                                                          else plog.log_start_offset)
                g["in_sync_replicas"].add_metric(labels, len(p.isr))
        yield from g.values()
