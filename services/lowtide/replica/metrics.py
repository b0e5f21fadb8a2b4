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

The log cleaner's process totals (log/cleaner/scheduler.py), read at scrape time:

    lowtide_log_cleaner_passes_total{replica}                 cleaning passes completed
    lowtide_log_cleaner_failures_total{replica}               passes that failed (retried later)
    lowtide_log_cleaner_bytes_read_total{replica}             segment bytes read (map + rewrite)
    lowtide_log_cleaner_bytes_written_total{replica}          cleaned segment bytes written
    lowtide_log_cleaner_dirty_bytes_total{replica}            dirty bytes the passes started from
    lowtide_log_cleaner_records_removed_total{replica}        records removed (superseded, tombstones, keyless)
    lowtide_log_cleaner_tombstones_removed_total{replica}     tombstones removed past their delete horizon
    lowtide_log_cleaner_delete_horizons_set_total{replica}    batches given a KIP-534 delete horizon
    lowtide_log_cleaner_segments_rolled_total{replica}        idle active segments rolled to become cleanable
    lowtide_log_cleaner_pass_seconds_total{replica}           time spent in passes
    lowtide_log_cleaner_throttle_seconds_total{replica}       of which asleep (log.cleaner.io.max.bytes.per.second)

Counted on the request path (one labelled child per follower, cached per stream):

    lowtide_replication_streams{follower}                 open Replicate streams on this leader
    lowtide_replication_rounds_total{follower,transport}  follower fetch rounds answered (stream|fetch)
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
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
        yield from self._cleaner_counters(rid)

    def _cleaner_counters(self, rid: str):
        snap = self.manager.cleaner.metrics.snapshot()
        for name, doc, value in [
            ("passes", "Log cleaner passes completed", snap.passes),
            ("failures", "Log cleaner passes that failed", snap.failures),
            ("bytes_read", "Segment bytes the log cleaner read", snap.bytes_read),
            ("bytes_written", "Cleaned segment bytes the log cleaner wrote", snap.bytes_written),
            ("dirty_bytes", "Dirty bytes the log cleaner's passes started from", snap.dirty_bytes_cleaned),
            ("records_removed", "Records the log cleaner removed", snap.records_removed),
            ("tombstones_removed", "Tombstones removed past their delete horizon (KIP-534)", snap.tombstones_removed),
            ("delete_horizons_set", "Batches given a delete horizon (KIP-534)", snap.delete_horizons_set),
            ("segments_rolled", "Idle active segments of compacted logs rolled by the cleaner", snap.segments_rolled),
            ("pass_seconds", "Seconds spent in log cleaner passes", snap.pass_seconds),
            ("throttle_seconds", "Seconds the log cleaner slept to respect its I/O limit", snap.throttle_seconds),
        ]:
            counter = CounterMetricFamily(f"lowtide_log_cleaner_{name}", doc, labels=["replica"])
            counter.add_metric([rid], value)
            yield counter
