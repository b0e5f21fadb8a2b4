"""Cluster-wide health as the front door sees it in the metadata store, computed at scrape time:

    lowtide_cluster_brokers_registered                  brokers that ever registered
    lowtide_cluster_brokers_alive                       brokers with a live session
    lowtide_cluster_partitions{topic}                   partitions per topic
    lowtide_cluster_offline_partitions{topic}           partitions whose leader is none or not alive
    lowtide_cluster_under_replicated_partitions{topic}  partitions whose ISR lacks a replica of their
                                                        (target) replica set

Why here: "offline" is a fact no replica can report about itself (its leader is gone), and the
front door already reads this metadata for every Metadata call. Every front door reports the same
values; dashboards take ``max`` over instances.
"""

from __future__ import annotations

import logging
from collections import Counter

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)


class ClusterCollector(Collector):
    """Gauges of the module doc, read from the metadata image at each scrape.

    Thread-safety: ``collect`` runs on the metrics HTTP thread; the store is thread-safe. When
    the metadata store is unreachable the scrape reports ``lowtide_cluster_metadata_up 0`` and nothing else,
    instead of failing the whole scrape (the service's other metrics still matter then).
    """

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def collect(self):
        up = GaugeMetricFamily("lowtide_cluster_metadata_up",
                               "1 while this process follows the metadata store (its watch is connected)")
        try:
            brokers = self.store.brokers()
            alive = self.store.live_broker_ids()
            states = self.store.all_partition_states()
            if not self.store.connected():
                raise MetadataStoreUnavailable("the metadata watch is not connected")
        except MetadataStoreUnavailable as exc:
            log.warning("cluster metrics: metadata store unavailable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        registered = GaugeMetricFamily("lowtide_cluster_brokers_registered", "Brokers that registered")
        registered.add_metric([], len(brokers))
        yield registered
        live = GaugeMetricFamily("lowtide_cluster_brokers_alive", "Brokers with a live session")
        live.add_metric([], len(alive))
        yield live
        partitions: Counter[str] = Counter()
        offline: Counter[str] = Counter()
        under: Counter[str] = Counter()
        for (topic, _), st in states.items():
            partitions[topic] += 1
            offline[topic] += 0
            under[topic] += 0
            if st.leader < 0 or st.leader not in alive:
                offline[topic] += 1
            if len(set(st.isr) & set(st.target_replicas)) < len(st.target_replicas):
                under[topic] += 1
        for name, doc, counts in [
            ("partitions", "Partitions per topic", partitions),
            ("offline_partitions", "Partitions with no live leader", offline),
            ("under_replicated_partitions", "Partitions whose ISR is smaller than their replica set", under),
        ]:
            family = GaugeMetricFamily(f"lowtide_cluster_{name}", doc, labels=["topic"])
            for topic in sorted(counts):
                family.add_metric([topic], counts[topic])
            yield family
