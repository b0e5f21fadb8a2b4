"""Metadata records as stored in Redis."""

from __future__ import annotations

import json

from lowtide.metadata.model import BrokerInfo, PartitionState, TopicInfo


def test_records_written_by_a_newer_lowtide_still_read():
    state = PartitionState(topic="t", partition=0, leader=1, leader_epoch=2, replicas=(1, 2), isr=(1, 2),
                           partition_epoch=3)
    doc = json.loads(state.to_json()) | {"directory_ids": ["x"]}
    assert PartitionState.from_json(json.dumps(doc)) == state
    broker = BrokerInfo(id=1, host="h", port=2)
    assert BrokerInfo.from_json(json.dumps(json.loads(broker.to_json()) | {"future": 1})) == broker
    topic = TopicInfo(name="t", topic_id="ab", partitions=1, replication_factor=1, config={})
    assert TopicInfo.from_json(json.dumps(json.loads(topic.to_json()) | {"future": True})) == topic


def test_a_partition_that_never_moved_is_written_without_move_fields():
    state = PartitionState(topic="t", partition=0, leader=1, leader_epoch=2, replicas=(1, 2), isr=(1, 2))
    assert json.loads(state.to_json()) == {"topic": "t", "partition": 0, "leader": 1, "leader_epoch": 2,
                                           "replicas": [1, 2], "isr": [1, 2], "partition_epoch": 0}
    assert not state.reassigning
    assert state.target_replicas == state.original_replicas == (1, 2)


def test_a_move_round_trips_and_names_its_target_and_original_sets():
    state = PartitionState(topic="t", partition=0, leader=0, leader_epoch=2, replicas=(1, 2, 3, 0),
                           isr=(0, 1, 2), adding_replicas=(3,), removing_replicas=(0,))
    back = PartitionState.from_json(state.to_json())
    assert back == state
    assert back.reassigning
    assert back.target_replicas == (1, 2, 3)
    assert back.original_replicas == (1, 2, 0)
