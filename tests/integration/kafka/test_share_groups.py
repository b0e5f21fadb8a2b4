"""KIP-932 share groups with Kafka's own share consumer: kafka-tools 4.4.0's
``VerifiableShareConsumer`` (a ``KafkaShareConsumer`` with implicit acknowledgement) run unchanged
from the jars of ``make kafka-tools`` (``--newest``), consuming what Kafka's ``VerifiableProducer``
writes while it writes.

Three members share a topic of three partitions (the coordinator's ``simple`` assignor spreads
them); one member is killed with -9 while it holds records. The replicas run with a short
acquisition lock (``--group-share-record-lock-duration-ms``) and the front door with a short share
session timeout, so:

* every value the producer had acknowledged is delivered to some member;
* every offset of every partition is acknowledged (the consumers' ``offsets_acknowledged`` events,
  each a successful ShareAcknowledge or piggy-backed acknowledgement);
* the records the killed member had received and not acknowledged are delivered again, to
  another member, once their lock timed out;
* ShareGroupDescribe shows the two members left, Stable, with every partition assigned.
"""

from __future__ import annotations

import signal

import pytest

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.test_consumer_group_protocol import JavaTool, producer
from tests.integration.kafka.wire import kafka_call, request_module
from tests.kafka_tools import kafka_tools_manifest
from tests.waiting import wait_until

PARTITIONS = 3
SHARE_CONSUMER_CLASS = "org.apache.kafka.tools.VerifiableShareConsumer"
LOCK_MS, HEARTBEAT_MS, SESSION_MS = 3000, 500, 4000
SHARE_GROUP_DESCRIBE = 77

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("kip932"), replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        extra_env={"LOWTIDE_GROUP_SHARE_RECORD_LOCK_DURATION_MS": str(LOCK_MS),
                   # VerifiableShareConsumer sets share.auto.offset.reset through a group config,
                   # which is not served yet: the replicas' default says where a group starts.
                   "LOWTIDE_GROUP_SHARE_AUTO_OFFSET_RESET": "earliest",
                   "LOWTIDE_GROUP_SHARE_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
                   "LOWTIDE_GROUP_SHARE_SESSION_TIMEOUT_MS": str(SESSION_MS)}))


def share_consumer(cluster: LocalCluster, *, topic: str, group: str, log) -> JavaTool:
    lib = kafka_tools_manifest(newest=True)["lib"]
    return JavaTool(["java", "-Xmx192M", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*",
                     SHARE_CONSUMER_CLASS, "--topic", topic, "--group-id", group,
                     "--bootstrap-server", cluster.kafka_bootstrap, "--verbose"], log)


def received(c: JavaTool) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of every record delivered to ``c``, in order."""
    return [(e["partition"], e["offset"], e["value"]) for e in c.named("record_data")]


def acknowledged(c: JavaTool) -> set[tuple[int, int]]:
    return {(p["partition"], o) for e in c.named("offsets_acknowledged") if e.get("success")
            for p in e["partitions"] for o in p["offsets"]}


def describe(cluster: LocalCluster, group: str):
    module = request_module(SHARE_GROUP_DESCRIBE, 1)
    return kafka_call(cluster.kafka_bootstrap, module.ShareGroupDescribeRequest(
        group_ids=(group,), include_authorized_operations=False)).groups[0]


def test_three_members_share_three_partitions_and_a_killed_members_records_go_to_another(kcluster, tmp_path):
    topic, group = "kip932", "kip932-group"
    s.create_topic(kcluster, topic, partitions=PARTITIONS, rf=3)
    members = [share_consumer(kcluster, topic=topic, group=group, log=tmp_path / f"m{i}.log") for i in range(3)]
    prod = None
    try:
        wait_until(lambda: len(describe(kcluster, group).members) == 3, timeout_s=40, interval_s=0.2,
                   what="three members in the share group")
        prod = producer(kcluster, topic=topic, records=3000, rate=300, log=tmp_path / "producer.log", newest=True)
        victim = members[0]
        wait_until(lambda: len(received(victim)) > 0, timeout_s=30, interval_s=0.05,
                   what="records delivered to the member that is killed")
        victim.stop(signal.SIGKILL)
        held = {(p, o) for p, o, _ in received(victim)} - acknowledged(victim)
        assert prod.proc.wait(60) == 0, prod.tail()
        acked_values = {e["value"] for e in prod.named("producer_send_success")}
        assert acked_values, prod.tail()
        with Admin(kcluster.bootstrap) as admin:
            ends = {p: a.offset for (_, p), a in admin.list_offsets(
                {(topic, p): OffsetSpec.LATEST for p in range(PARTITIONS)}).items()}
        every = {(p, o) for p, end in ends.items() for o in range(end)}
        live = members[1:]

        def all_acknowledged() -> bool:
            return every <= set().union(*(acknowledged(m) for m in members))

        wait_until(all_acknowledged, timeout_s=40, interval_s=0.2,
                   what=f"every offset acknowledged (missing: "
                        f"{sorted(every - set().union(*(acknowledged(m) for m in members)))[:10]})")
        delivered_values = {v for m in members for _, _, v in received(m)}
        assert acked_values <= delivered_values, sorted(acked_values - delivered_values)[:10]
        assert held, "the killed member held no unacknowledged record when killed (nothing to redeliver)"
        redelivered = {(p, o) for m in live for p, o, _ in received(m)}
        assert held <= redelivered, sorted(held - redelivered)[:10]
        answer = describe(kcluster, group)
        assert int(answer.error_code) == 0 and answer.group_state == "Stable", answer
        assert len(answer.members) == 2, answer
        assigned = {p for m in answer.members for tp in m.assignment.topic_partitions for p in tp.partitions}
        assert assigned == set(range(PARTITIONS)), answer
        for m in live:
            assert m.proc.poll() is None, m.tail()
    finally:
        for m in members:
            m.stop()
        if prod is not None:
            prod.stop()
