"""CreateTopics with the client's own placement (``assignments``), on a 4-broker cluster: Kafka's
``kafka-topics --replica-assignment`` and kafka-python's ``create_topics`` get exactly the
partitions and replica lists they asked for; a bad placement is refused with Kafka's error and
Kafka's message (``ReplicationControlManager.createTopic``) and creates nothing; a broker that
is down may be named, and the partition is led by the first live one."""

from __future__ import annotations

import subprocess

import pytest
from kafka import KafkaAdminClient

from tests.integration import support as s
from tests.kafka_tools import kafka_tool


@pytest.fixture(scope="module")
def four(request, tmp_path_factory):
    from lowtide.localcluster import ClusterConfig
    from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("assigned"), replicas=4,
                                                      coordinators=0, orphan_scanners=0,
                                                      replica_config=dict(DEFAULT_REPLICA_CONFIG)))


@pytest.fixture(scope="module")
def admin(four):
    client = KafkaAdminClient(bootstrap_servers=four.kafka_bootstrap, request_timeout_ms=15000)
    yield client
    client.close()


def placement(cluster, topic: str) -> list[tuple[int, ...]]:
    return [st.replicas for st in s.store(cluster).partition_states(topic)]


def refusal(admin: KafkaAdminClient, topic: str, **spec) -> tuple[str, str]:
    """(error name, message) of a CreateTopics of ``topic`` with ``spec``; the topic must not exist after."""
    answer = admin.create_topics({topic: spec}, raise_errors=False)
    [result] = answer["topics"]
    return result["error_code"], result["error_message"]


def test_kafka_topics_creates_exactly_the_replica_assignment_given(four):
    tool = subprocess.run([str(kafka_tool("kafka-topics")), "--bootstrap-server", four.kafka_bootstrap, "--create",
                           "--topic", "mv", "--replica-assignment", "3:0:1,2:3:0"],
                          capture_output=True, text=True, timeout=120)
    assert tool.returncode == 0, tool.stdout + tool.stderr[-3000:]
    assert placement(four, "mv") == [(3, 0, 1), (2, 3, 0)]
    states = s.store(four).partition_states("mv")
    assert [(st.leader, st.isr) for st in states] == [(3, (3, 0, 1)), (2, (2, 3, 0))]


def test_kafka_python_creates_three_partitions_assigned_by_hand(four, admin):
    admin.create_topics({"by-hand": {"assignments": {0: [1, 2], 1: [2, 3], 2: [3, 0]}}})
    assert placement(four, "by-hand") == [(1, 2), (2, 3), (3, 0)]
    # CreateTopics answers once the metadata holds the topic; its leader hosts it a moment later.
    s.wait_until(lambda: s.produce(four, "by-hand", [b"on-1-and-2"], partition=0).error_code == 0, timeout_s=30,
                 interval_s=0.1, what="a produce to by-hand-0 at its leader, broker 1")


@pytest.mark.parametrize(("spec", "error", "message"), [
    ({"num_partitions": 2, "assignments": {0: [0, 1]}}, "INVALID_REQUEST",
     "A manual partition assignment was specified, but numPartitions was not set to -1."),
    ({"replication_factor": 2, "assignments": {0: [0, 1]}}, "INVALID_REQUEST",
     "A manual partition assignment was specified, but replication factor was not set to -1."),
    ({"assignments": {0: [0, 9]}}, "INVALID_REPLICA_ASSIGNMENT",
     "The manual partition assignment includes broker 9, but no such broker is registered."),
    ({"assignments": {0: [1, 1]}}, "INVALID_REPLICA_ASSIGNMENT",
     "The manual partition assignment includes the broker 1 more than once."),
    ({"assignments": {0: [0, 1], 1: [2]}}, "INVALID_REPLICA_ASSIGNMENT",
     "The manual partition assignment includes a partition with 1 replica(s), but this is not consistent with "
     "previous partitions, which have 2 replica(s)."),
    ({"assignments": {0: [0, 1], 2: [1, 2]}}, "INVALID_REPLICA_ASSIGNMENT",
     "partitions should be a consecutive 0-based integer sequence"),
    ({"assignments": {0: []}}, "INVALID_REPLICA_ASSIGNMENT",
     "The manual partition assignment includes an empty replica list."),
])
def test_a_bad_assignment_is_refused_in_kafkas_words_and_creates_nothing(four, admin, spec, error, message):
    code, text = refusal(admin, "refused", **spec)
    assert (code, text) == ({"INVALID_REQUEST": 42, "INVALID_REPLICA_ASSIGNMENT": 39}[error], message)
    assert "refused" not in s.store(four).topics()


def test_a_broker_that_is_down_may_be_named_and_the_first_live_one_leads(four, admin):
    four.stop_service("replica-3")
    s.wait_until(lambda: 3 not in s.store(four).live_broker_ids(), timeout_s=30, what="broker 3 to leave")
    admin.create_topics({"around-3": {"assignments": {0: [3, 0, 1]}}})
    [st] = s.store(four).partition_states("around-3")
    assert (st.replicas, st.leader, st.isr) == ((3, 0, 1), 0, (0, 1))
    code, text = refusal(admin, "only-3", assignments={0: [3]})
    assert (code, text) == (39, "All brokers specified in the manual partition assignment for partition 0 are "
                                "fenced or in controlled shutdown.")
