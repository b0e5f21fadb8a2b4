"""DescribeTopicPartitions on the Kafka listener, as Kafka 4's ``kafka-topics --describe`` uses it
(its AdminClient asks DescribeTopicPartitions first and follows ``next_cursor``), and at the
protocol level for the cursor rules Kafka's handler applies. On the shared cluster: topics here
are named ``dtp-*`` and nothing is faulted."""

from __future__ import annotations

import subprocess

import pytest

from lowtide.client import Admin
from lowtide.localcluster import LocalCluster
from tests.integration import support as s
from tests.integration.kafka.wire import kafka_call, request_module
from tests.kafka_tools import kafka_tool

API_KEY = 75
NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST = 0, 3, 42


@pytest.fixture(scope="module")
def topics(shared_cluster) -> LocalCluster:
    s.create_topic(shared_cluster, "dtp-five", partitions=5, rf=3)
    s.create_topic(shared_cluster, "dtp-one", partitions=1, rf=2)
    return shared_cluster


def served(cluster: LocalCluster) -> float:
    """DescribeTopicPartitions requests answered by every listener of the cluster."""
    names = [f"replica-{i}" for i in range(3)] + ["frontdoor-0"]
    return sum(s.metric(cluster, n, "lowtide_kafka_requests_total", api="DescribeTopicPartitions", outcome="ok")
               for n in names)


def kafka_topics(cluster: LocalCluster, *args: str) -> str:
    result = subprocess.run([str(kafka_tool("kafka-topics")), "--bootstrap-server", cluster.kafka_bootstrap,
                             "--describe", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def partition_lines(out: str) -> dict[tuple[str, int], dict[str, str]]:
    """kafka-topics --describe's partition lines ('Topic: t<TAB>Partition: 0<TAB>Leader: 1...')."""
    lines = {}
    for line in out.splitlines():
        fields = dict(part.split(": ", 1) for part in line.strip().split("\t") if ": " in part)
        if "Partition" in fields:
            lines[(fields["Topic"], int(fields["Partition"]))] = fields
    return lines


def truth(cluster: LocalCluster, *names: str) -> dict[tuple[str, int], tuple[str, str, str]]:
    with Admin(cluster.bootstrap) as admin:
        described = admin.describe_topics(list(names))
    return {(n, p.partition): (str(p.leader), ",".join(map(str, p.replicas)), ",".join(map(str, p.isr)))
            for n, t in described.items() for p in t.partitions}


def test_kafka_topics_describe_pages_through_describe_topic_partitions(topics):
    cluster = topics
    before = served(cluster)
    # two partitions per answer: dtp-five takes three requests, dtp-one a fourth
    out = kafka_topics(cluster, "--topic", "dtp-five,dtp-one", "--partition-size-limit-per-response", "2")
    shown = {key: (f["Leader"], f["Replicas"], f["Isr"]) for key, f in partition_lines(out).items()}
    assert shown == truth(cluster, "dtp-five", "dtp-one")
    heads = [line for line in out.splitlines() if line.startswith("Topic:") and "PartitionCount" in line]
    assert len(heads) == 2 and "PartitionCount: 5" in heads[0] + heads[1]
    assert served(cluster) - before >= 3  # the tool followed the cursor


def test_kafka_topics_describe_of_every_topic_lists_ours(topics):
    cluster = topics
    before = served(cluster)
    out = kafka_topics(cluster, "--exclude-internal")
    assert {("dtp-five", p) for p in range(5)} | {("dtp-one", 0)} <= set(partition_lines(out))
    assert served(cluster) > before


def describe(cluster: LocalCluster, names: list[str], *, limit: int = 2000, cursor: tuple[str, int] | None = None):
    m = request_module(API_KEY, 0)
    return kafka_call(cluster.kafka_bootstrap, m.DescribeTopicPartitionsRequest(
        topics=tuple(m.TopicRequest(name=n) for n in names), response_partition_limit=limit,
        cursor=m.Cursor(topic_name=cursor[0], partition_index=cursor[1]) if cursor else None))


def summary(answer) -> list[tuple[str, int, list[int]]]:
    return [(t.name, int(t.error_code), [p.partition_index for p in t.partitions]) for t in answer.topics]


def test_the_cursor_and_the_limit_page_as_kafka_pages(topics):
    cluster = topics
    names = ["dtp-one", "dtp-five", "dtp-missing"]
    whole = describe(cluster, names)
    assert summary(whole) == [("dtp-five", NONE, [0, 1, 2, 3, 4]), ("dtp-missing", UNKNOWN_TOPIC_OR_PARTITION, []),
                              ("dtp-one", NONE, [0])]
    assert whole.next_cursor is None
    five = whole.topics[0]
    assert five.topic_id is not None and not five.is_internal
    assert {p.leader_id for p in five.partitions} <= {0, 1, 2} and all(len(p.isr_nodes) for p in five.partitions)

    first = describe(cluster, names, limit=3)
    assert summary(first) == [("dtp-five", NONE, [0, 1, 2])]
    assert (first.next_cursor.topic_name, first.next_cursor.partition_index) == ("dtp-five", 3)
    second = describe(cluster, names, limit=2, cursor=("dtp-five", 3))
    assert summary(second) == [("dtp-five", NONE, [3, 4])]
    # the limit reached at a topic's end: the cursor points at the next topic's start
    assert (second.next_cursor.topic_name, second.next_cursor.partition_index) == ("dtp-missing", 0)
    third = describe(cluster, names, limit=2, cursor=("dtp-missing", 0))
    assert summary(third) == [("dtp-missing", UNKNOWN_TOPIC_OR_PARTITION, []), ("dtp-one", NONE, [0])]
    assert third.next_cursor is None
    # every topic (no names): unknown ones are not invented, the cursor still applies
    listed = describe(cluster, [], cursor=("dtp-five", 4))
    assert summary(listed)[:2] == [("dtp-five", NONE, [4]), ("dtp-one", NONE, [0])]
    # a cursor naming a topic the list does not hold is INVALID_REQUEST, as Kafka answers it
    refused = describe(cluster, ["dtp-one"], cursor=("dtp-five", 0))
    assert summary(refused) == [("dtp-one", INVALID_REQUEST, [])]
