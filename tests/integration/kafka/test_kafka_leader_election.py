"""Leader balance on real processes: after a broker's kill -9 and restart its partitions are led
by others; Kafka's own ``kafka-leader-election`` moves them back to the preferred replicas, and
with ``auto.leader.rebalance.enable`` the controller does it by itself. Every acknowledged record
reads back across the moves."""

from __future__ import annotations

import subprocess

import pytest

from lowtide.client import Admin, Producer
from tests import waiting
from tests.integration import support as s
from tests.kafka_tools import kafka_tool

TOPIC = "balanced"


@pytest.fixture
def balance_cluster(cluster_factory):
    # Balance off to start with: the test decides when leaders move back.
    return cluster_factory(session_timeout_ms=2000, coordinators=0, extra_env={
        "LOWTIDE_AUTO_LEADER_REBALANCE_ENABLE": "false", "LOWTIDE_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS": "1"})


def leaders(cluster) -> dict[int, int]:
    return {st.partition: st.leader for st in s.store(cluster).partition_states(TOPIC)}


def preferred(cluster) -> dict[int, int]:
    return {st.partition: st.replicas[0] for st in s.store(cluster).partition_states(TOPIC)}


def produce(cluster, values: list[bytes]) -> None:
    with Producer(cluster.bootstrap, acks=-1) as producer:
        for i, value in enumerate(values):
            producer.send(TOPIC, value, partition=i % 3)
        producer.flush()


def restart_broker_0(cluster) -> None:
    """kill -9 broker 0, let the controller move its leaderships away, start it again and wait
    until it is back in every ISR (only then may it lead again)."""
    cluster.kill("replica-0")
    waiting.wait_until(lambda: 0 not in leaders(cluster).values(), timeout_s=30, what="broker 0 leading nothing")
    produce(cluster, [f"while-down-{i}".encode() for i in range(30)])
    cluster.start_service("replica-0")
    waiting.wait_until(lambda: all(0 in st.isr for st in s.store(cluster).partition_states(TOPIC)),
                       timeout_s=60, what="broker 0 back in every ISR")


def test_kafka_leader_election_and_auto_rebalance_move_leaders_back_to_preferred_replicas(balance_cluster):
    cluster = balance_cluster
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=3, replication_factor=3)
    produce(cluster, [f"before-{i}".encode() for i in range(30)])
    restart_broker_0(cluster)
    moved = [p for p, leader in leaders(cluster).items() if leader != preferred(cluster)[p]]
    assert moved, "broker 0 should have lost its preferred leadership"

    tool = subprocess.run([str(kafka_tool("kafka-leader-election")), "--bootstrap-server", cluster.kafka_bootstrap,
                           "--election-type", "preferred", "--all-topic-partitions"],
                          capture_output=True, text=True, timeout=120)
    assert tool.returncode == 0, tool.stdout + tool.stderr[-3000:]
    assert "Successfully completed leader election (PREFERRED) for partitions" in tool.stdout, tool.stdout
    assert all(f"{TOPIC}-{p}" in tool.stdout for p in moved), tool.stdout
    assert leaders(cluster) == preferred(cluster)

    again = subprocess.run([str(kafka_tool("kafka-leader-election")), "--bootstrap-server", cluster.kafka_bootstrap,
                            "--election-type", "preferred", "--topic", TOPIC, "--partition", "0"],
                           capture_output=True, text=True, timeout=120)
    assert "Valid replica already elected for partitions" in again.stdout + again.stderr, again.stdout + again.stderr

    # the same with the controller's balance on: restart the front door with it
    cluster.config.extra_env["LOWTIDE_AUTO_LEADER_REBALANCE_ENABLE"] = "true"
    cluster.stop_service("frontdoor-0")
    cluster.start_service("frontdoor-0")
    restart_broker_0(cluster)
    waiting.wait_until(lambda: leaders(cluster) == preferred(cluster), timeout_s=30,
                       what="the controller moving leaders back to the preferred replicas")
    produce(cluster, [f"after-{i}".encode() for i in range(30)])
    read = [v for p in range(3) for _, v in s.read_all(cluster, TOPIC, partition=p)]
    expected = [f"{phase}-{i}".encode() for phase in ("before", "while-down", "after") for i in range(30)]
    expected += [f"while-down-{i}".encode() for i in range(30)]  # produced during both restarts
    assert sorted(read) == sorted(expected)
