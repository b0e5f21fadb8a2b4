"""DescribeProducers (KIP-664) on a replica, for both doors (issue 47): the gRPC
``Replica.DescribeProducers`` servicer and the Kafka listener (``kafka-transactions
describe-producers``, ``find-hanging``, ``abort --start-offset``) call this one handler with
``lowtide.messages`` types.

The policy: READ on each topic (topic ACLs only, as Kafka's DescribeProducers asks); each
partition is answered from this replica's own log of it, leader or follower, as Kafka's
``Partition.activeProducerState`` answers (a partition not hosted: UNKNOWN_TOPIC_OR_PARTITION).
One answer per partition, in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.auth.acl import AclOperation
from lowtide.errors import LowtideError
from lowtide.messages import TopicPartition
from lowtide.messages.replica import PartitionProducers
from lowtide.replica.handler_parts import RequestHandler, topic_of


def _refused(partition: TopicPartition, error: LowtideError) -> PartitionProducers:
    return PartitionProducers(topic=partition.topic, partition=partition.partition, error=error)


class DescribeProducersHandler(RequestHandler):
    """DescribeProducers for an authenticated principal (module doc has the policy).

    Thread-safety: stateless; what it calls is thread-safe.
    """

    def describe_producers(self, principal: str, partitions: Sequence[TopicPartition]) -> list[PartitionProducers]:
        screened = self.access.screen(principal, [TopicPartition(t, p) for t, p in partitions],
                                      operation=AclOperation.READ, topic=topic_of)
        answers = self.requests.describe_producers(list(screened.allowed)) if screened.any_allowed else []
        return screened.merge([
            _refused(TopicPartition(topic, partition), producers) if isinstance(producers, LowtideError)
            else PartitionProducers(topic=topic, partition=partition, producers=tuple(producers))
            for topic, partition, producers in answers], _refused)
