"""/metrics of the share-partitions a replica holds (KIP-932), read at scrape time::

    lowtide_share_partition_start_offset{group,topic,partition,replica}        SPSO
    lowtide_share_partition_end_offset{group,topic,partition,replica}          SPEO (next never acquired)
    lowtide_share_partition_records{group,topic,partition,state,replica}       in flight, by state
    lowtide_share_sessions{replica}                                             open share sessions
    lowtide_share_group_low_watermark_lag_records{group,topic,partition,replica}
        start offset - low watermark: done with by the share group, not yet deleted on every replica
        (only where this replica leads the partition and knows its low watermark)

Only share-partitions loaded on this replica are shown (those it leads or led since it started:
a share-partition whose leadership moved away keeps its last values until it is loaded again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from lowtide.share.partitions import SharePartitions
from lowtide.share.state import STATE_NAMES


class ShareCollector(Collector):
    """The gauges of the module doc. Thread-safe (reads copies of each share-partition)."""

    def __init__(self, shares: SharePartitions, *, broker_id: int,
                 topic_names: Callable[[], Mapping[str, str]],
                 low_watermark: Callable[[str, int], int] | None = None) -> None:
        self._shares = shares
        self._replica = str(broker_id)
        self._topic_names = topic_names  # topic id -> name
        # (topic, partition) -> its low watermark, -1 where unknown here (not the leader).
        self._low_watermark = low_watermark

    def collect(self):
        labels = ["group", "topic", "partition", "replica"]
        start = GaugeMetricFamily("lowtide_share_partition_start_offset",
                                  "Share-partition start offset: every record below is acknowledged or archived",
                                  labels=labels)
        end = GaugeMetricFamily("lowtide_share_partition_end_offset",
                                "Share-partition end offset: the next offset never acquired", labels=labels)
        records = GaugeMetricFamily("lowtide_share_partition_records",
                                    "Records in flight in a share-partition, by state",
                                    labels=["group", "topic", "partition", "state", "replica"])
        lag = GaugeMetricFamily("lowtide_share_group_low_watermark_lag_records",
                                "Records a share group is done with (below its start offset) not yet deleted on "
                                "every replica", labels=labels)
        names = self._topic_names()
        for key, state in self._shares.copy_loaded():
            topic = names.get(key.topic_id, key.topic_id)
            values = [key.group_id, topic, str(key.partition)]
            start.add_metric([*values, self._replica], state.start_offset)
            lw = self._low_watermark(topic, key.partition) if self._low_watermark is not None else -1
            if lw >= 0:
                lag.add_metric([*values, self._replica], max(0, state.start_offset - lw))
            end.add_metric([*values, self._replica], state.end_offset)
            counts = dict.fromkeys(STATE_NAMES, 0)
            for r in state.ranges:
                counts[r.state] += r.count
            for code, name in STATE_NAMES.items():
                records.add_metric([*values, name.lower(), self._replica], counts[code])
        sessions = GaugeMetricFamily("lowtide_share_sessions", "Open share sessions on this replica",
                                     labels=["replica"])
        sessions.add_metric([self._replica], self._shares.count_sessions())
        yield from (start, end, records, sessions, lag)
