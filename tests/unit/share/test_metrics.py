"""The share-partition gauges a replica's /metrics shows (lowtide.share.metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from lowtide.messages.share import ShareAckBatch
from lowtide.share.metrics import ShareCollector
from lowtide.share.partitions import ShareConfig, SharePartitions
from lowtide.share.state import ACCEPT, SharePartitionConfig
from tests.unit.share.test_partitions import KEY, Clock, MemoryStateLog, leader


def test_a_share_partitions_offsets_and_records_by_state_are_on_metrics():
    shares = SharePartitions(config=ShareConfig(partition=SharePartitionConfig(), auto_offset_reset="earliest"),
                             state_log=MemoryStateLog(), clock=Clock())
    shares.open_session(group_id="g", member_id="m", epoch=0, add=[(KEY.topic_id, 0)])
    shares.acquire(key=KEY, member_id="m", leader=leader(), max_records=25, max_bytes=1 << 20)
    shares.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(10, 14, (ACCEPT,))])
    registry = CollectorRegistry()
    registry.register(ShareCollector(shares, broker_id=2, topic_names=lambda: {KEY.topic_id: "orders"},
                                     low_watermark=lambda topic, partition: 3 if (topic, partition) == ("orders", 0)
                                     else -1))
    text = generate_latest(registry).decode()
    labels = 'group="g",partition="0",replica="2",topic="orders"'
    assert f"lowtide_share_partition_start_offset{{{labels}}} 0.0" in text
    assert f"lowtide_share_partition_end_offset{{{labels}}} 30.0" in text
    for state, count in (("acquired", 25), ("acknowledged", 5), ("available", 0), ("archived", 0)):
        assert f'lowtide_share_partition_records{{group="g",partition="0",replica="2",state="{state}",' \
               f'topic="orders"}} {count}.0' in text
    assert 'lowtide_share_sessions{replica="2"} 1.0' in text
    # Nothing is done with yet (start offset 0): nothing to delete, whatever the low watermark.
    assert f"lowtide_share_group_low_watermark_lag_records{{{labels}}} 0.0" in text
    shares.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    text = generate_latest(registry).decode()
    assert f"lowtide_share_group_low_watermark_lag_records{{{labels}}} 12.0" in text  # start 15 - LW 3
