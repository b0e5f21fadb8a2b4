"""Reading the cluster metadata as releases before etcd kept it in Redis, for
``lowtide metadata migrate --from-redis URL`` (and the chart's upgrade hook).

The layout it reads (read-only; nothing here writes Redis)::

    lowtide:cluster_id              STRING the cluster id
    lowtide:topics                  HASH   topic name -> TopicInfo JSON
    lowtide:partitions:{topic}      HASH   partition  -> PartitionState JSON
    lowtide:brokers                 HASH   broker id  -> BrokerInfo JSON
    lowtide:broker_configs          HASH   broker id ("" = cluster default) -> JSON of its configs
    lowtide:txn:next_producer_id    INT    the last producer id handed out (INCR)

The JSON documents are the same types the etcd store keeps, so they are copied as they are, with
their leader and partition epochs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import redis as redis_lib

from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo


@dataclass
class LegacyMetadata:
    cluster_id: str | None
    topics: list[TopicInfo] = field(default_factory=list)
    states: list[PartitionState] = field(default_factory=list)
    brokers: list[BrokerInfo] = field(default_factory=list)
    broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    # The last producer id Redis handed out (0: none): ids from the store must start above it.
    last_producer_id: int = 0


def read_legacy_metadata(url: str) -> LegacyMetadata:
    """Everything of the layout above in the Redis at ``url``."""
    client = redis_lib.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)
    try:
        raw_id = client.get("lowtide:cluster_id")
        topics = [TopicInfo.from_json(v) for v in client.hgetall("lowtide:topics").values()]
        states = [PartitionState.from_json(v) for t in topics
                  for v in client.hgetall(f"lowtide:partitions:{t.name}").values()]
        brokers = [BrokerInfo.from_json(v) for v in client.hgetall("lowtide:brokers").values()]
        configs = {k.decode(): dict(json.loads(v)) for k, v in client.hgetall("lowtide:broker_configs").items()}
        last_producer_id = int(client.get("lowtide:txn:next_producer_id") or 0)
    finally:
        client.close()
    return LegacyMetadata(cluster_id=raw_id.decode() if raw_id is not None else None,
                          topics=sorted(topics, key=lambda t: t.name),
                          states=sorted(states, key=lambda s: (s.topic, s.partition)),
                          brokers=sorted(brokers, key=lambda b: b.id), broker_configs=configs,
                          last_producer_id=last_producer_id)
