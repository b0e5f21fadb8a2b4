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
    lowtide_partition_replicas{topic,partition,replica}                   assigned replicas, leader only
    lowtide_partition_under_replicated{topic,partition,replica}           1 when ISR < replicas, leader only
    lowtide_partition_leader{topic,partition,replica}                     1 on the leader, 0 elsewhere

Series are computed from the partitions hosted at scrape time, so a partition that is deleted or
moves away stops being reported at once (no stale series).

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
    lowtide_produce_bytes_total{topic}                    record batch bytes appended by produce requests
    lowtide_fetch_bytes_total{topic,kind}                 record bytes returned (kind: consumer | follower)
    lowtide_isr_shrinks_total{topic}                      ISR changes this leader made that removed replicas
    lowtide_isr_expands_total{topic}                      ISR changes this leader made that added replicas
    lowtide_consumed_retention_inactive_groups_total{topic,group}  groups that stopped holding back consumed
                                                          retention (consumed_retention.py)
    lowtide_replication_throttled_bytes_total{direction}  bytes replicated through a KIP-73 throttle
                                                          (leader: sent, follower: fetched; quota.py)
    lowtide_replication_throttle_rate_bytes{direction}    the throttle rate in force, bytes/s (-1: unlimited)

Every series labelled by topic is removed once the replica hosts none of the topic's partitions
(``forget_topic``, called by reconcile when a topic is deleted or moves away).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from lowtide.replica.partition import LEADER

if TYPE_CHECKING:  # the manager imports the ISR updater, which counts into this module
    from lowtide.replica.manager import ReplicaManager

LABELS = ["topic", "partition", "replica"]

REPLICATION_STREAMS = Gauge("lowtide_replication_streams", "Open Replicate streams on this leader, by follower",
                            ["follower"])
REPLICATION_ROUNDS = Counter("lowtide_replication_rounds", "Follower fetch rounds answered by this leader",
                             ["follower", "transport"])
PRODUCE_BYTES = Counter("lowtide_produce_bytes", "Record batch bytes appended by produce requests", ["topic"])
FETCH_BYTES = Counter("lowtide_fetch_bytes", "Record bytes returned by fetches", ["topic", "kind"])
_produce_children: dict[str, Counter] = {}
_fetch_children: dict[tuple[str, str], Counter] = {}


def count_produced_bytes(topic: str, size: int) -> None:
    # Children cached per topic: labels() takes a lock and builds a tuple on every call.
    child = _produce_children.get(topic)
    if child is None:
        child = _produce_children[topic] = PRODUCE_BYTES.labels(topic)
    child.inc(size)


def count_fetched_bytes(topic: str, kind: str, size: int) -> None:
    child = _fetch_children.get((topic, kind))
    if child is None:
        child = _fetch_children[(topic, kind)] = FETCH_BYTES.labels(topic, kind)
    child.inc(size)


THROTTLED_BYTES = Counter("lowtide_replication_throttled_bytes",
                          "Bytes replicated through a replication throttle (KIP-73), by direction", ["direction"])
THROTTLE_RATE = Gauge("lowtide_replication_throttle_rate_bytes",
                      "Replication throttle rate in force (bytes/s, -1 = unlimited), by direction", ["direction"])
_throttled_children: dict[str, Counter] = {}


def count_throttled_bytes(direction: str, size: int) -> None:
    child = _throttled_children.get(direction)
    if child is None:
        child = _throttled_children[direction] = THROTTLED_BYTES.labels(direction)
    child.inc(size)


def set_replication_throttle_rate(direction: str, rate: int | None) -> None:
    THROTTLE_RATE.labels(direction).set(-1 if rate is None else rate)


ISR_SHRINKS = Counter("lowtide_isr_shrinks", "ISR changes made by this leader that removed replicas", ["topic"])
ISR_EXPANDS = Counter("lowtide_isr_expands", "ISR changes made by this leader that added replicas", ["topic"])
INACTIVE_GROUPS = Counter("lowtide_consumed_retention_inactive_groups",
                          "Groups that stopped holding back consumed retention: no commit on the topic for "
                          "consumed.retention.group.inactive.ms", ["topic", "group"])
_inactive_lock = threading.Lock()
_inactive_series: set[tuple[str, str]] = set()  # (topic, group) of INACTIVE_GROUPS, for forget_topic


def count_inactive_group(topic: str, group: str) -> None:
    with _inactive_lock:
        _inactive_series.add((topic, group))
        INACTIVE_GROUPS.labels(topic, group).inc()


STRAY_PARTITIONS = Counter("lowtide_stray_partitions",
                           "Partition directories set aside (-stray) because the metadata does not name them")


def count_stray_partition() -> None:
    STRAY_PARTITIONS.inc()


def track_isr_changes(topic: str) -> None:
    """Export the topic's ISR change counters at 0 from its first leadership here: a series that
    only appeared with its first increment has no earlier sample, so rate() over a window
    holding that increment shows nothing (the dashboard's ISR panel stayed empty)."""
    ISR_SHRINKS.labels(topic)
    ISR_EXPANDS.labels(topic)


def forget_topic(topic: str) -> None:
    """Drop the topic's counter series once this replica hosts none of its partitions.

    Without this a deleted topic's series would stay exported until the process restarts (and a
    dashboard would list topics long gone). A topic that comes back starts its counters at zero,
    which Prometheus' rate() reads as a counter reset.
    """
    for key in [k for k in list(_fetch_children) if k[0] == topic]:
        _fetch_children.pop(key, None)
        _remove_series(FETCH_BYTES, *key)
    _produce_children.pop(topic, None)
    for counter in (PRODUCE_BYTES, ISR_SHRINKS, ISR_EXPANDS):
        _remove_series(counter, topic)
    with _inactive_lock:
        for key in [k for k in _inactive_series if k[0] == topic]:
            _inactive_series.discard(key)
            _remove_series(INACTIVE_GROUPS, *key)


def _remove_series(metric: Counter, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:  # never counted on this replica
        pass


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
            ("replicas", "Number of assigned replicas (leader only)"),
            ("under_replicated", "1 when the ISR is smaller than the replica set (leader only)"),
            ("leader", "1 when this replica leads the partition"),
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
                g["replicas"].add_metric(labels, len(p.replicas))
                g["under_replicated"].add_metric(labels, 1 if len(p.isr) < len(p.replicas) else 0)
            g["leader"].add_metric(labels, 1 if p.role == LEADER else 0)
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
