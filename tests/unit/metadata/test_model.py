"""Metadata records as stored in Redis."""

from __future__ import annotations

import json

from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo


def test_records_written_by_a_newer_lowtide_still_read():
    state = PartitionState(topic="t", partition=0, leader=1, leader_epoch=2, replicas=(1, 2), isr=(1, 2),
                           partition_epoch=3)
    doc = json.loads(state.to_json()) | {"adding_replicas": [3]}
    assert PartitionState.from_json(json.dumps(doc)) == state
    broker = BrokerInfo(id=1, host="h", port=2)
    assert BrokerInfo.from_json(json.dumps(json.loads(broker.to_json()) | {"future": 1})) == broker
    topic = TopicInfo(name="t", topic_id="ab", partitions=1, replication_factor=1, config={})
    assert TopicInfo.from_json(json.dumps(json.loads(topic.to_json()) | {"future": True})) == topic
