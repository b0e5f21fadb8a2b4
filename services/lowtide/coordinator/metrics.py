"""Prometheus metrics of a diskless coordinator shard (base units, ``lowtide_`` prefix).

    lowtide_coordinator_commit_duration_seconds{shard}   histogram: CommitFile, request to reply
                                                         (check + replication + apply)
    lowtide_coordinator_commit_requests_total{shard,transport,error}
                                                         counter: CommitFile calls answered, by
                                                         transport (grpc, framed) and Kafka error
                                                         name (NONE: answered with results)
    lowtide_coordinator_batches{shard}                   live batches in the shard's state
    lowtide_coordinator_files{shard,state}               file rows by state (live, released,
                                                         handing_over, deletable)
    lowtide_coordinator_pending_records{shard}           appended, not yet applied records
    lowtide_coordinator_snapshot_age_seconds{shard}      age of the newest snapshot (absent: none yet)
    lowtide_coordinator_applied_offset{shard}            last applied metadata log offset
    lowtide_coordinator_leader{shard}                    1 while this process leads the shard
    lowtide_coordinator_append_duration_seconds{shard}   histogram: one acks=all metadata append
    lowtide_coordinator_append_decisions{shard}          histogram: requests carried per append
                                                         (the last two defined in coordinator.pipeline)

The gauges are read at scrape time from the shard (a few indexed SQLite queries under its lock).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from lowtide.coordinator.service import LEADER, ShardService

COMMIT_REQUESTS = Counter(
    "lowtide_coordinator_commit_requests_total", "CommitFile calls answered, by transport and Kafka error name",
    ["shard", "transport", "error"])
COMMIT_DURATION = Histogram(
    "lowtide_coordinator_commit_duration_seconds", "CommitFile latency on the coordinator: check, acks=all append "
    "of the metadata records, apply", ["shard"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
FILE_STATES = ("live", "released", "handing_over", "deletable")


class CoordinatorCollector(Collector):
    """Scrape-time gauges of one shard. Thread-safe (reads go through the shard's lock)."""

    def __init__(self, shard: ShardService) -> None:
        self.shard = shard

    def collect(self) -> Iterator[GaugeMetricFamily]:
        label = str(self.shard.config.shard)
        numbers = self.shard.gauges()
        yield _shard_gauge("lowtide_coordinator_leader", "1 while this process leads the shard", label,
                           1.0 if numbers["status"] == LEADER else 0.0)
        yield _shard_gauge("lowtide_coordinator_batches", "Live batches in the shard's state", label,
                           numbers["batches"])
        files = GaugeMetricFamily("lowtide_coordinator_files", "File rows of the shard by lifetime state",
                                  labels=["shard", "state"])
        for state in sorted(set(FILE_STATES) | set(numbers["files"])):
            files.add_metric([label, state], numbers["files"].get(state, 0))
        yield files
        yield _shard_gauge("lowtide_coordinator_pending_records", "Metadata records appended but not yet applied",
                           label, numbers["pending_records"])
        yield _shard_gauge("lowtide_coordinator_applied_offset", "Last applied metadata log offset", label,
                           numbers["applied_offset"])
        snapshot_time = numbers["snapshot_time"]
        yield _shard_gauge("lowtide_coordinator_snapshot_age_seconds", "Age of the newest state snapshot", label,
                           None if snapshot_time is None else max(0.0, time.time() - snapshot_time))


def _shard_gauge(name: str, documentation: str, shard: str, value: float | None) -> GaugeMetricFamily:
    """A gauge labelled by shard with the shard's one sample (none while ``value`` is None)."""
    gauge = GaugeMetricFamily(name, documentation, labels=["shard"])
    if value is not None:
        gauge.add_metric([shard], value)
    return gauge
