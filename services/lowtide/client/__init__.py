"""Python client of lowtide: ``Admin`` (front door), ``Producer`` and ``Consumer`` (leaders).

    from lowtide.client import Admin, Producer, Consumer

    with Admin("127.0.0.1:9092") as admin:
        admin.create_topic("orders", partitions=3, replication_factor=3)
    with Producer("127.0.0.1:9092") as producer:
        producer.produce_values("orders", [b"a", b"b"])
    with Consumer("127.0.0.1:9092", group_id="etl") as consumer:
        consumer.subscribe("orders")
        records = consumer.poll()
        consumer.commit()
"""

from lowtide.client.admin import Admin, GroupOffsets, OffsetSpec
from lowtide.client.consumer import Consumer, ConsumerRecord
from lowtide.client.metadata import BrokerMetadata, ClusterMetadata, ClusterSnapshot, PartitionMetadata, TopicMetadata
from lowtide.client.partitioner import murmur2, partition_for_key
from lowtide.client.producer import Producer, ProduceReport
from lowtide.messages.replica import DeleteRecordsResult

__all__ = [
    "Admin",
    "BrokerMetadata",
    "ClusterMetadata",
    "ClusterSnapshot",
    "Consumer",
    "ConsumerRecord",
    "DeleteRecordsResult",
    "GroupOffsets",
    "OffsetSpec",
    "PartitionMetadata",
    "ProduceReport",
    "Producer",
    "TopicMetadata",
    "murmur2",
    "partition_for_key",
]
