"""Admin.list_offsets on real processes while a partition's leadership moves: retriable answers
are asked again, as Kafka's AdminClient does, and a partition that does not exist is not."""

from __future__ import annotations

import signal
import time

from lowtide.client import Admin, Producer
from lowtide.client.admin import OffsetSpec
from lowtide.errors import UnknownTopicOrPartition
from tests.integration import support as s


def test_list_offsets_right_after_a_kill_9_of_the_leader_answers_from_the_next_leader(cluster_factory):
    cluster = cluster_factory(session_timeout_ms=2000, coordinators=0)
    s.create_topic(cluster, "moving", partitions=1, rf=3)
    with Producer(cluster.bootstrap) as producer:
        producer.produce_values("moving", [str(i).encode() for i in range(25)], partition=0)
    leader = s.leader_of(cluster, "moving")
    cluster.kill(f"replica-{leader}", signal.SIGKILL)
    began = time.monotonic()
    with Admin(cluster.bootstrap, timeout_s=30) as admin:
        answer = admin.list_offsets({("moving", 0): OffsetSpec.LATEST})[("moving", 0)]
    assert answer.error is None, answer.error
    assert answer.offset == 25
    assert s.leader_of(cluster, "moving") != leader
    assert time.monotonic() - began < 30


def test_list_offsets_of_a_partition_that_does_not_exist_answers_at_once(shared_cluster):
    s.create_topic(shared_cluster, "two", partitions=2, rf=3)
    began = time.monotonic()
    with Admin(shared_cluster.bootstrap, timeout_s=30) as admin:
        answers = admin.list_offsets({("two", 1): OffsetSpec.LATEST, ("two", 7): OffsetSpec.LATEST})
    assert answers[("two", 1)].error is None and answers[("two", 1)].offset == 0
    assert isinstance(answers[("two", 7)].error, UnknownTopicOrPartition)
    assert time.monotonic() - began < 10
