"""KIP-932 share groups with Kafka's own share consumer: kafka-tools 4.4.0's
``VerifiableShareConsumer`` (a ``KafkaShareConsumer`` with implicit acknowledgement) run unchanged
from the jars of ``make kafka-tools`` (``--newest``), consuming what Kafka's ``VerifiableProducer``
writes while it writes.

Three members share a topic of three partitions (the coordinator's ``simple`` assignor spreads
them); one member is killed with -9 while it holds records. The replicas run with a short
acquisition lock (``--group-share-record-lock-duration-ms``) and the front door with a short share
session timeout, so:

* every value the producer had acknowledged is delivered to some member;
* every record is done at the broker: the share-partition start offsets (``kafka-share-groups
  --describe``) reach the partitions' ends;
* every offset was reported acknowledged by a member (its ``offsets_acknowledged`` events), or
  delivered up to the delivery limit, or went to the killed member;
* records acquired by a member that vanished without acknowledging them (a raw ShareFetch, then
  silence: certainly unacknowledged, where the killed Java member may have acknowledged its last
  records just before it died) are delivered again, to another member, once their lock timed out;
* the killed member comes back (a new process, a new member id) and ShareGroupDescribe shows
  three members, Stable, with every partition assigned, and
  ``kafka-share-groups --list`` and ``--describe`` (DescribeShareGroupOffsets) show the group and
  its start offsets at the partitions' ends.

The second test kills with -9 the replica leading a partition (the share-partition's leader) while
members consume, and restarts it: its successor takes the share-partition over from
``__share_group_state``, so no record acknowledged before the kill is acknowledged again (none is
delivered again), every value is delivered, and the start offsets reach the ends. Then it kills
and restarts the front door (the share group coordinator, membership in memory): the members join
the new one.

Another consumer acknowledges explicitly, by offset: accept, release, reject. Released records come
back until their delivery count reaches the limit, then are archived; rejected ones never come
back; nothing is delivered past the limit.

Kafka 4.1's share consumer (the pinned tools: ShareFetch and ShareAcknowledge v1) consumes and
acknowledges a topic too; ``kafka-share-groups --reset-offsets --to-earliest`` of the emptied group
(AlterShareGroupOffsets) makes a new member get everything again, and ``--delete`` (DeleteGroups)
deletes the group and its state.

Kafka's ``kafka-console-share-consumer`` accepts a topic in one group, and in another releases
every record until each was delivered up to the limit. ``kafka-configs --entity-type groups`` sets,
describes and deletes a group's configs (its lock duration is what its ShareFetches are answered
with); every Java share consumer here sets its group's ``share.auto.offset.reset`` the same way.

A raw ShareFetch parked with nothing to acquire answers with a record produced while it waits (the
replica's wake-up, not its next poll).

Records deleted once delivered: a topic whose ``consumed.retention.groups`` names
share groups (``share:<group>``) keeps what one of them has not acknowledged (a named share group
that never consumed holds everything back), and loses the segments below the start offset once
every named share group is past them; and a record a named share group has not acknowledged
survives kill -9 of its share coordinator and of its share-partition's leader.
"""

from __future__ import annotations

import datetime
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter

import pytest

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from lowtide.client.producer import Producer
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.share.codec import SHARE_STATE_TOPIC, ShareStateKey, partition_for_key
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.test_consumer_group_protocol import JavaTool, producer
from tests.integration.kafka.wire import KafkaConnection, kafka_call, request_module
from tests.kafka_tools import java_command
from tests.waiting import wait_until

PARTITIONS = 3
SHARE_CONSUMER_CLASS = "org.apache.kafka.tools.VerifiableShareConsumer"
LOCK_MS, HEARTBEAT_MS, SESSION_MS, DELIVERY_LIMIT = 3000, 500, 4000, 3
SHARE_GROUP_DESCRIBE, SHARE_FETCH, DESCRIBE_SHARE_GROUP_OFFSETS = 77, 78, 90

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("kip932"), replicas=3,
        replica_config={**DEFAULT_REPLICA_CONFIG, "log.retention.check.interval.ms": "300"},
        extra_env={"LOWTIDE_GROUP_SHARE_RECORD_LOCK_DURATION_MS": str(LOCK_MS),
                   "LOWTIDE_GROUP_SHARE_DELIVERY_COUNT_LIMIT": str(DELIVERY_LIMIT),
                   "LOWTIDE_GROUP_SHARE_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
                   "LOWTIDE_GROUP_SHARE_SESSION_TIMEOUT_MS": str(SESSION_MS)}))


def share_consumer(cluster: LocalCluster, *, topic: str, group: str, log, ack_pattern: str = "",
                   newest: bool = True) -> JavaTool:
    """VerifiableShareConsumer; ``ack_pattern`` (accept|release|reject, by offset modulo its length)
    turns on explicit acknowledgement, synchronous. ``newest=False``: the pinned Kafka 4.1's. The
    tool sets its group's ``share.auto.offset.reset`` to earliest with an IncrementalAlterConfigs of
    the GROUP resource before it subscribes (the replicas' own default is Kafka's, latest)."""
    explicit = ["--acknowledgement-mode", "sync", "--ack-pattern", ack_pattern] if ack_pattern else []
    return JavaTool([*java_command(newest=newest),
                     SHARE_CONSUMER_CLASS, "--topic", topic, "--group-id", group, *explicit,
                     "--offset-reset-strategy", "earliest",
                     "--bootstrap-server", cluster.kafka_bootstrap, "--verbose"], log)


def received(c: JavaTool) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of every record delivered to ``c``, in order."""
    return [(e["partition"], e["offset"], e["value"]) for e in c.named("record_data")]


def acknowledged(c: JavaTool) -> set[tuple[int, int]]:
    return {(p["partition"], o) for e in c.named("offsets_acknowledged") if e.get("success")
            for p in e["partitions"] for o in p["offsets"]}


def share_groups_tool(cluster: LocalCluster, *args: str) -> str:
    """``kafka-share-groups`` (kafka-tools 4.4.0's ShareGroupCommand): its stdout."""
    done = subprocess.run([*java_command(newest=True),
                           "org.apache.kafka.tools.consumer.group.ShareGroupCommand", "--bootstrap-server",
                           cluster.kafka_bootstrap, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def describe_start_offsets(cluster: LocalCluster, group: str, topic: str) -> dict[int, int]:
    """Partition -> START-OFFSET in ``kafka-share-groups --describe``'s table."""
    out = {}
    for line in share_groups_tool(cluster, "--describe", "--group", group).splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == group and fields[1] == topic and re.fullmatch(r"\d+", fields[2]):
            out[int(fields[2])] = int(fields[3]) if fields[3].lstrip("-").isdigit() else -1
    return out


def start_offsets_on_the_wire(cluster: LocalCluster, group: str, topic: str) -> dict[int, int]:
    """Partition -> start offset, from a replica's DescribeShareGroupOffsets v1 (what
    ``kafka-share-groups --describe`` asks) in Python: a check repeated while waiting costs no JVM."""
    m = request_module(DESCRIBE_SHARE_GROUP_OFFSETS, 1)
    answer = kafka_call(cluster.service("replica-0").kafka, m.DescribeShareGroupOffsetsRequest(groups=(
        m.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=(
            m.DescribeShareGroupOffsetsRequestTopic(topic_name=topic, partitions=tuple(range(PARTITIONS))),)),)))
    return {p.partition_index: p.start_offset for g in answer.groups for t in g.topics if t.topic_name == topic
            for p in t.partitions if int(p.error_code) == 0 and p.start_offset >= 0}


def wait_for_start_offsets(cluster: LocalCluster, group: str, topic: str, want: dict[int, int], *,
                           what: str) -> None:
    """Wait (in Python) until the group's start offsets are ``want``, then check that Kafka's own
    ``kafka-share-groups --describe`` shows them too."""
    wait_until(lambda: start_offsets_on_the_wire(cluster, group, topic) == want, timeout_s=40, interval_s=0.3,
               what=f"{what}: start offsets {want}", explain=lambda: f"on the wire: "
               f"{start_offsets_on_the_wire(cluster, group, topic)}")
    assert describe_start_offsets(cluster, group, topic) == want


def ends_of(cluster: LocalCluster, topic: str) -> dict[int, int]:
    with Admin(cluster.bootstrap) as admin:
        return {p: a.offset for (_, p), a in admin.list_offsets(
            {(topic, p): OffsetSpec.LATEST for p in range(PARTITIONS)}).items()}


def acquire_and_vanish(cluster: LocalCluster, *, topic: str, group: str, partition: int) -> set[tuple[int, int]]:
    """A share group member that fetches from the partition's leader (raw ShareFetch v2) and dies
    at once: what it acquired, which nobody will ever acknowledge for it."""
    topic_id = uuid.UUID(hex=s.store(cluster).topic(topic).topic_id)
    address = cluster.service(f"replica-{s.leader_of(cluster, topic, partition)}").kafka
    m = request_module(SHARE_FETCH, 2)
    answer = kafka_call(address, m.ShareFetchRequest(
        group_id=group, member_id=uuid.uuid4().hex, share_session_epoch=0, max_wait=datetime.timedelta(seconds=2),
        min_bytes=1, max_bytes=1 << 20, max_records=50, batch_size=50, forgotten_topics_data=(),
        topics=(m.FetchTopic(topic_id=topic_id, partitions=(
            m.FetchPartition(partition_index=partition, acknowledgement_batches=()),)),)))
    assert int(answer.error_code) == 0, answer
    return {(partition, o) for t in answer.responses for p in t.partitions for r in p.acquired_records
            for o in range(r.first_offset, r.last_offset + 1)}


def explain_members(cluster: LocalCluster, group: str, members: list[JavaTool]) -> str:
    """For a failure message: each member's events by name and exit code, and the group's assignment."""
    said = [(Counter(e.get("name") for e in m.events), m.proc.poll()) for m in members]
    try:
        answer = describe(cluster, group)
        group_said = f"state {answer.group_state}, assignment " + str(
            {m.member_id[:8]: [(tp.topic_id.hex[:8], list(tp.partitions)) for tp in m.assignment.topic_partitions]
             for m in answer.members})
    except Exception as err:  # noqa: BLE001 - only for the message
        group_said = f"ShareGroupDescribe failed: {err!r}"
    return f"members' events (by name, exit code): {said}; group: {group_said}"


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
        # 20 s of records: the vanishing member below must find some still unacquired after the
        # kill, also on a loaded machine (at 300/s the live members had taken everything once).
        prod = producer(kcluster, topic=topic, records=3000, rate=150, log=tmp_path / "producer.log", newest=True)
        # The member killed is the first one holding records (a member sharing its partitions with
        # another may wait its turn a while on a loaded machine).
        wait_until(lambda: any(received(m) for m in members), timeout_s=30, interval_s=0.05,
                   what="records delivered to a member, which is then killed",
                   explain=lambda: explain_members(kcluster, group, members))
        victim = next(m for m in members if received(m))
        victim.stop(signal.SIGKILL)
        # A member that acquires and vanishes without a word, as the killed one may have: its
        # records are certainly unacknowledged, so they must reach the others after the lock.
        vanished: set[tuple[int, int]] = set()

        def vanish() -> bool:
            vanished.update(acquire_and_vanish(kcluster, topic=topic, group=group, partition=1))
            return bool(vanished)

        # The live members are stopped (SIGSTOP) meanwhile: parked fetches are woken by each append
        # and the live ones, always fetching, took every record before the newcomer's first fetch.
        others = [m for m in members if m is not victim]
        for m in others:
            m.proc.send_signal(signal.SIGSTOP)
        try:
            wait_until(vanish, timeout_s=20, interval_s=0.1, what="records acquired by a member that then vanishes")
        finally:
            for m in others:
                m.proc.send_signal(signal.SIGCONT)
        # The killed member comes back (a new process: a new member id).
        members.append(share_consumer(kcluster, topic=topic, group=group, log=tmp_path / "m0-again.log"))
        assert prod.proc.wait(60) == 0, prod.tail()
        acked_values = {e["value"] for e in prod.named("producer_send_success")}
        assert acked_values, prod.tail()
        ends = ends_of(kcluster, topic)
        every = {(p, o) for p, end in ends.items() for o in range(end)}
        live = [m for m in members if m is not victim]

        # Every record is done at the broker (acknowledged, or archived past its delivery limit).
        wait_for_start_offsets(kcluster, group, topic, ends,
                               what=f"kafka-share-groups --describe showing start offsets at the ends {ends}")
        delivered_values = {v for m in members for _, _, v in received(m)}
        assert acked_values <= delivered_values, sorted(acked_values - delivered_values)[:10]
        # Each offset is reported acknowledged by a member (a report comes with the member's next
        # poll), or was delivered up to the limit (a member slower than the lock lets records go),
        # or went to the killed member (which may have acknowledged it in its last moments, before
        # it could say so).
        def unexplained() -> set[tuple[int, int]]:
            deliveries = Counter((p, o) for m in members for p, o, _ in received(m))
            reported = set().union(*(acknowledged(m) for m in members))
            return {k for k in every - reported if deliveries[k] < DELIVERY_LIMIT} - \
                {(p, o) for p, o, _ in received(victim)}

        def failed_acks() -> list:
            return [(e.get("error"), [(p["partition"], min(p["offsets"]), len(p["offsets"])) for p in e["partitions"]])
                    for m in members for e in m.named("offsets_acknowledged") if not e.get("success")]

        wait_until(lambda: not unexplained(), timeout_s=20, interval_s=0.2,
                   what=f"every offset reported acknowledged (not yet: {sorted(unexplained())[:10]}, "
                        f"failed acknowledgements: {failed_acks()[:10]})")
        # What the vanished member held went to the others once its locks timed out.
        redelivered = {(p, o) for m in live for p, o, _ in received(m)}
        assert vanished <= redelivered, sorted(vanished - redelivered)[:10]
        # The killed member's session expired; it came back as a new member.
        wait_until(lambda: len(describe(kcluster, group).members) == 3, timeout_s=20, interval_s=0.2,
                   what="the two members that stayed and the killed one back")
        answer = describe(kcluster, group)
        assert int(answer.error_code) == 0 and answer.group_state == "Stable", answer
        assigned = {p for m in answer.members for tp in m.assignment.topic_partitions for p in tp.partitions}
        assert assigned == set(range(PARTITIONS)), answer
        for m in live:
            assert m.proc.poll() is None, m.tail()
        assert group in share_groups_tool(kcluster, "--list").split()
    finally:
        for m in members:
            m.stop()
        if prod is not None:
            prod.stop()


def test_a_killed_share_partition_leader_loses_no_acknowledgement(kcluster, tmp_path):
    topic, group = "kip932-failover", "kip932-failover-group"
    s.create_topic(kcluster, topic, partitions=PARTITIONS, rf=3)
    members = [share_consumer(kcluster, topic=topic, group=group, log=tmp_path / f"m{i}.log") for i in range(2)]
    prod = None
    try:
        wait_until(lambda: len(describe(kcluster, group).members) == 2, timeout_s=40, interval_s=0.2,
                   what="two members in the share group")
        prod = producer(kcluster, topic=topic, records=2400, rate=300, log=tmp_path / "producer.log", newest=True)
        wait_until(lambda: len(set().union(*(acknowledged(m) for m in members))) >= 300, timeout_s=30,
                   interval_s=0.05, what="records acknowledged before the kill")
        # The partition with the most acknowledged so far (the producer's sticky partitioner may
        # not have written to every partition yet): its leader is killed.
        counts = Counter(p for m in members for p, _ in acknowledged(m))
        victim = counts.most_common(1)[0][0]
        leader = s.leader_of(kcluster, topic, victim)
        kcluster.kill(f"replica-{leader}")
        acked_before = {(p, o) for m in members for p, o in acknowledged(m) if p == victim}
        assert acked_before, "nothing of the killed leader's partition was acknowledged before the kill"
        time.sleep(1.0)
        kcluster.start_service(f"replica-{leader}")
        # And the share group coordinator (the front door, membership in memory): the members
        # are told UNKNOWN_MEMBER_ID by the new one and join again.
        frontdoor = kcluster.services("frontdoor")[0].name
        kcluster.kill(frontdoor)
        kcluster.start_service(frontdoor)
        assert prod.proc.wait(60) == 0, prod.tail()
        acked_values = {e["value"] for e in prod.named("producer_send_success")}
        assert acked_values, prod.tail()
        ends = ends_of(kcluster, topic)
        wait_for_start_offsets(kcluster, group, topic, ends,
                               what=f"start offsets at the ends {ends} (kafka-share-groups --describe)")
        delivered_values = {v for m in members for _, _, v in received(m)}
        assert acked_values <= delivered_values, sorted(acked_values - delivered_values)[:10]
        # An acknowledgement answered before the kill survived it: that record was never handed out
        # again, so nobody acknowledged it a second time.
        reports = Counter((part["partition"], o) for m in members for e in m.named("offsets_acknowledged")
                          if e.get("success") for part in e["partitions"] for o in part["offsets"])
        twice = {k for k, n in reports.items() if n > 1}
        assert not twice & acked_before, sorted(twice & acked_before)[:10]
        wait_until(lambda: len(describe(kcluster, group).members) == 2, timeout_s=20, interval_s=0.2,
                   what="both members back in the share group after the coordinator's restart")
        for m in members:
            assert m.proc.poll() is None, m.tail()
    finally:
        for m in members:
            m.stop()
        if prod is not None:
            prod.stop()


def log_start(cluster: LocalCluster, topic: str) -> int:
    return s.describe(cluster, s.leader_of(cluster, topic), topic).log_start_offset


def retention_passes(cluster: LocalCluster, broker: int) -> float:
    return s.metric(cluster, f"replica-{broker}", "lowtide_consumed_retention_passes_total")


def test_segments_go_once_every_named_share_group_acknowledged_them(kcluster, tmp_path):
    topic, group = "kip932-drain", "kip932-drain-group"
    s.create_topic(kcluster, topic, partitions=1, rf=3, config={
        "consumed.retention.ms": "0", "consumed.retention.groups": f"share:{group},share:never-consumed"})
    for _ in range(20):
        assert s.produce(kcluster, topic, [b"x" * 1024] * 20).error_code == 0
    leader = s.leader_of(kcluster, topic)
    bases = s.segment_files(kcluster, leader, topic)
    assert len(bases) >= 4, bases
    member = share_consumer(kcluster, topic=topic, group=group, log=tmp_path / "drain.log")
    try:
        wait_for_start_offsets(kcluster, group, topic, {0: 400}, what="every record acknowledged by the share group")
        # The other named share group has no state on the partition: it holds everything back.
        passes = retention_passes(kcluster, leader)
        wait_until(lambda: retention_passes(kcluster, leader) >= passes + 2, timeout_s=20, interval_s=0.1,
                   what="two consumed retention passes after the last acknowledgement")
        assert log_start(kcluster, topic) == 0
        assert s.metric(kcluster, f"replica-{leader}", "lowtide_share_group_low_watermark_lag_records",
                        group=group, topic=topic) == 400  # done with, not deleted
        with Admin(kcluster.bootstrap) as admin:
            admin.alter_topic_config(topic, set_config={"consumed.retention.groups": f"share:{group}"})
        expected = 400  # every segment ends at or below the start offset: all of them go
        for r in (0, 1, 2):
            s.wait_until(lambda r=r: s.describe(kcluster, r, topic).log_start_offset == expected,
                         what=f"replica {r}'s log start offset at {expected}")
            s.wait_until(lambda r=r: min(s.segment_files(kcluster, r, topic)) == expected,
                         what=f"replica {r}'s segments below {expected} deleted")
        s.wait_until(lambda: s.metric(kcluster, f"replica-{leader}", "lowtide_share_group_low_watermark_lag_records",
                                      group=group, topic=topic) == 0, what="the share group's low watermark lag 0")
        assert member.proc.poll() is None, member.tail()
    finally:
        member.stop()


def test_released_records_come_back_until_the_delivery_limit_and_rejected_ones_never(kcluster, tmp_path):
    topic, group = "kip932-acks", "kip932-acks-group"
    s.create_topic(kcluster, topic, partitions=1, rf=3)
    assert s.produce(kcluster, topic, [b"r%d" % i for i in range(30)]).error_code == 0
    member = share_consumer(kcluster, topic=topic, group=group, log=tmp_path / "acks.log",
                            ack_pattern="accept,release,reject")
    try:
        wait_for_start_offsets(kcluster, group, topic, {0: 30},
                               what="every record accepted, rejected or archived past its delivery limit")
        leader = s.leader_of(kcluster, topic)
        assert s.metric(kcluster, f"replica-{leader}", "lowtide_share_partition_start_offset", group=group,
                        topic=topic, partition="0") == 30
        deliveries = Counter(o for _, o, _ in received(member))
        expected = {o: DELIVERY_LIMIT if o % 3 == 1 else 1 for o in range(30)}
        assert deliveries == expected, {o: (deliveries[o], n) for o, n in expected.items() if deliveries[o] != n}
        assert member.proc.poll() is None, member.tail()
    finally:
        member.stop()


def test_kafka_4_1s_share_consumer_consumes_everything_and_again_after_a_reset_and_a_delete(kcluster, tmp_path):
    """The pinned Kafka 4.1's share consumer (ShareFetch and ShareAcknowledge v1); then
    ``kafka-share-groups --reset-offsets --to-earliest`` of the emptied group, and a new member gets
    everything again; ``--delete-offsets`` of the topic, ``--delete`` of the group."""
    topic, group = "kip932-v41", "kip932-v41-group"
    s.create_topic(kcluster, topic, partitions=1, rf=3)
    values = {f"v41-{i}" for i in range(50)}
    assert s.produce(kcluster, topic, [v.encode() for v in sorted(values)]).error_code == 0
    first = share_consumer(kcluster, topic=topic, group=group, log=tmp_path / "v41.log", newest=False)
    second = None
    try:
        wait_for_start_offsets(kcluster, group, topic, {0: 50},
                               what="every record acknowledged by Kafka 4.1's share consumer")
        # (4.1's tool reports no acknowledgements in its implicit mode: the start offset says it.)
        assert {v for _, _, v in received(first)} == values
        first.stop()  # it leaves the group: the group is empty
        wait_until(lambda: len(describe(kcluster, group).members) == 0, timeout_s=20, interval_s=0.2,
                   what="the share group empty")
        share_groups_tool(kcluster, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
                          "--execute")
        assert describe_start_offsets(kcluster, group, topic) == {0: 0}
        second = share_consumer(kcluster, topic=topic, group=group, log=tmp_path / "again.log")
        wait_until(lambda: {v for _, _, v in received(second)} == values, timeout_s=40, interval_s=0.2,
                   what="every record delivered again after the reset")
        wait_for_start_offsets(kcluster, group, topic, {0: 50}, what="every record acknowledged again")
        # kafka-share-groups --delete of the emptied group: gone from --list, and its state with it
        # (a member of a new group of that name starts from the log start again: earliest here).
        second.stop()
        wait_until(lambda: len(describe(kcluster, group).members) == 0, timeout_s=20, interval_s=0.2,
                   what="the share group empty again")
        # kafka-share-groups --delete-offsets (DeleteShareGroupOffsets) of the topic: the group
        # keeps no state of it (nothing to describe), then --delete deletes the group.
        out = share_groups_tool(kcluster, "--delete-offsets", "--group", group, "--topic", topic)
        assert topic in out, out
        assert describe_start_offsets(kcluster, group, topic) in ({}, {0: -1})
        share_groups_tool(kcluster, "--delete", "--group", group)
        assert group not in share_groups_tool(kcluster, "--list").split()
        third = share_consumer(kcluster, topic=topic, group=group, log=tmp_path / "after-delete.log")
        try:
            wait_until(lambda: {v for _, _, v in received(third)} == values, timeout_s=40, interval_s=0.2,
                       what="every record delivered to the group made again after the delete")
        finally:
            third.stop()
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_parked_share_fetch_is_woken_by_records_produced_while_it_waits(kcluster):
    """A ShareFetch with nothing to acquire parks (at most 500 ms at the replica) and is woken by an
    append: it answers with the record produced meanwhile before its wait is over. Raw ShareFetch
    v2 from one member on one connection (epoch 0 opens its session, then 1, 2, ...). Each round
    first fetches until nothing is left to acquire, then parks a fetch and produces 200 ms into
    it. A fetch that is not woken also answers with the record, but at the end of its 500 ms (it
    looks once more): so a round counts when its fetch answered with the record in under 450 ms.
    A loaded machine may be late in a round, so up to five rounds; without the wake-up every round
    takes 500 ms."""
    topic, group = "kip932-wake", "kip932-wake-group"
    s.create_topic(kcluster, topic, partitions=1, rf=3)
    topic_id = uuid.UUID(hex=s.store(kcluster).topic(topic).topic_id)
    address = kcluster.service(f"replica-{s.leader_of(kcluster, topic, 0)}").kafka
    m = request_module(SHARE_FETCH, 2)
    member, epoch = uuid.uuid4().hex, [0]

    def fetch() -> list[tuple[int, int]]:
        answer = conn.call(m.ShareFetchRequest(
            group_id=group, member_id=member, share_session_epoch=epoch[0], max_wait=datetime.timedelta(seconds=5),
            min_bytes=1, max_bytes=1 << 20, max_records=50, batch_size=50, forgotten_topics_data=(),
            topics=(m.FetchTopic(topic_id=topic_id, partitions=(
                m.FetchPartition(partition_index=0, acknowledgement_batches=()),)),)))
        epoch[0] += 1
        assert int(answer.error_code) == 0, answer
        return [(r.first_offset, r.last_offset) for t in answer.responses for p in t.partitions
                for r in p.acquired_records]

    rounds: list[tuple[int, list, float]] = []
    # One connection, opened first: a request on a fresh one (connect, ApiVersions) could reach the
    # replica after the record, which a fetch then takes at once without having parked.
    with KafkaConnection(address) as conn:
        for _ in range(5):
            while fetch():
                pass  # what an earlier round left is acquired; the last of these parked and found nothing
            got: list[tuple[int, int]] = []
            start = time.monotonic()
            ended = [0.0]

            def parked_fetch(got=got, ended=ended) -> None:
                got.extend(fetch())
                ended[0] = time.monotonic()

            parked = threading.Thread(target=parked_fetch)
            parked.start()
            time.sleep(0.2)
            produced = s.produce(kcluster, topic, [b"wake"])
            assert produced.error_code == 0
            parked.join(30)
            rounds.append((produced.base_offset, got, round(ended[0] - start, 3)))
            if any(first <= produced.base_offset <= last for first, last in got) and ended[0] - start < 0.45:
                return
    pytest.fail(f"no parked ShareFetch was woken by the record produced while it waited "
                f"(record offset, acquired, seconds): {rounds}")


def configs_tool(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """``kafka-configs`` (kafka-tools 4.4.0's ConfigCommand)."""
    done = subprocess.run([*java_command(newest=True), "org.apache.kafka.tools.ConfigCommand", "--bootstrap-server",
                           cluster.kafka_bootstrap, *args], capture_output=True, text=True, timeout=60)
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    return done


def lock_timeout_answered(cluster: LocalCluster, *, topic: str, group: str) -> int:
    """The AcquisitionLockTimeoutMs a ShareFetch of ``group`` is answered with."""
    topic_id = uuid.UUID(hex=s.store(cluster).topic(topic).topic_id)
    m = request_module(SHARE_FETCH, 2)
    answer = kafka_call(cluster.service(f"replica-{s.leader_of(cluster, topic)}").kafka, m.ShareFetchRequest(
        group_id=group, member_id=uuid.uuid4().hex, share_session_epoch=0, max_wait=datetime.timedelta(0),
        min_bytes=1, max_bytes=1 << 20, max_records=1, batch_size=1, forgotten_topics_data=(),
        topics=(m.FetchTopic(topic_id=topic_id, partitions=(
            m.FetchPartition(partition_index=0, acknowledgement_batches=()),)),)))
    assert int(answer.error_code) == 0, answer
    return int(answer.acquisition_lock_timeout.total_seconds() * 1000)


def test_kafka_configs_sets_describes_and_deletes_a_share_groups_configs(kcluster):
    """``kafka-configs --entity-type groups``: the group's lock duration is what its ShareFetches
    are answered with; a value out of range, a key that is no group config and an isolation level
    Kafka has not are refused and change nothing."""
    topic, group = "kip932-configs", "kip932-configs-group"
    s.create_topic(kcluster, topic, partitions=1, rf=3)
    entity = ["--entity-type", "groups", "--entity-name", group]
    assert lock_timeout_answered(kcluster, topic=topic, group=group) == LOCK_MS  # the replicas' flag
    configs_tool(kcluster, *entity, "--alter", "--add-config",
                 "share.record.lock.duration.ms=15000,share.auto.offset.reset=earliest")
    described = configs_tool(kcluster, *entity, "--describe").stdout
    assert "share.record.lock.duration.ms=15000" in described and "share.auto.offset.reset=earliest" in described, \
        described
    assert lock_timeout_answered(kcluster, topic=topic, group=group) == 15000
    for bad in ("share.record.lock.duration.ms=10", "retention.ms=1", "share.isolation.level=serializable"):
        refused = configs_tool(kcluster, *entity, "--alter", "--add-config", bad, ok=False)
        assert "InvalidConfigurationException" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    configs_tool(kcluster, *entity, "--alter", "--delete-config", "share.record.lock.duration.ms")
    described = configs_tool(kcluster, *entity, "--describe").stdout
    assert "share.record.lock.duration.ms" not in described and "share.auto.offset.reset=earliest" in described, \
        described
    assert lock_timeout_answered(kcluster, topic=topic, group=group) == LOCK_MS


SHARE_ACKNOWLEDGE, ACCEPT, RELEASE = 79, 1, 2


class RawShareMember:
    """A share group member speaking ShareFetch v2 / ShareAcknowledge v1 itself, to the partition's
    leader of the moment: acknowledgements exactly where a test wants them."""

    def __init__(self, cluster: LocalCluster, *, topic: str, group: str) -> None:
        self.cluster, self.topic, self.group = cluster, topic, group
        self.topic_id = uuid.UUID(hex=s.store(cluster).topic(topic).topic_id)
        self.member_id, self.epoch = uuid.uuid4().hex, 0

    def _leader(self) -> str:
        return self.cluster.service(f"replica-{s.leader_of(self.cluster, self.topic)}").kafka

    def fetch(self, max_records: int) -> list[tuple[int, int]]:
        m = request_module(SHARE_FETCH, 2)
        answer = kafka_call(self._leader(), m.ShareFetchRequest(
            group_id=self.group, member_id=self.member_id, share_session_epoch=self.epoch,
            max_wait=datetime.timedelta(seconds=1), min_bytes=1, max_bytes=1 << 20, max_records=max_records,
            batch_size=max_records, forgotten_topics_data=(), topics=(m.FetchTopic(topic_id=self.topic_id, partitions=(
                m.FetchPartition(partition_index=0, acknowledgement_batches=()),)),)))
        self.epoch += 1
        assert int(answer.error_code) == 0, answer
        errors = [int(p.error_code) for t in answer.responses for p in t.partitions]
        assert errors in ([], [0]), answer
        return [(r.first_offset, r.last_offset) for t in answer.responses for p in t.partitions
                for r in p.acquired_records]

    def acknowledge(self, first: int, last: int, kind: int) -> None:
        m = request_module(SHARE_ACKNOWLEDGE, 1)
        answer = kafka_call(self._leader(), m.ShareAcknowledgeRequest(
            group_id=self.group, member_id=self.member_id, share_session_epoch=self.epoch, topics=(
                m.AcknowledgeTopic(topic_id=self.topic_id, partitions=(m.AcknowledgePartition(
                    partition_index=0, acknowledgement_batches=(m.AcknowledgementBatch(
                        first_offset=first, last_offset=last, acknowledge_types=(kind,)),)),)),)))
        self.epoch += 1
        assert int(answer.error_code) == 0, answer
        assert [int(p.error_code) for t in answer.responses for p in t.partitions] == [0], answer


def test_a_record_a_named_share_group_has_not_acknowledged_survives_kill_9_of_its_coordinator_and_leader(
        kcluster, tmp_path):
    """Two share groups named in ``consumed.retention.groups``: one acknowledges all 400 records,
    the other the first 150 only (the segments below the one holding offset 150 go). Then its share
    coordinator (the leader of its ``__share_group_state`` partition) and the topic's leader (its
    share-partition's leader) are killed with -9 in turn and restarted. That group starts at latest
    (Kafka's default): a leader that lost its state would start it afresh at the high watermark,
    and the retention pass would then delete the 250 records it never acknowledged. Sampled
    throughout on every replica, the log start offset stays at that segment's base and every
    record from 150 stays readable; once the group acknowledges the rest, the partition drains on
    every replica."""
    topic, done, slow = "kip932-kill-retention", "kip932-kill-done", "kip932-kill-slow"
    s.create_topic(kcluster, topic, partitions=1, rf=3, config={
        "consumed.retention.ms": "0", "consumed.retention.groups": f"share:{done},share:{slow}"})
    member = RawShareMember(kcluster, topic=topic, group=slow)
    assert member.fetch(1) == []  # the share-partition starts at the high watermark: 0
    for _ in range(20):
        assert s.produce(kcluster, topic, [b"x" * 1024] * 20).error_code == 0
    consumer = share_consumer(kcluster, topic=topic, group=done, log=tmp_path / "done.log")
    try:
        acquired: list[tuple[int, int]] = []
        while not acquired or acquired[-1][1] < 149:  # whole batches, as many as one fetch answers
            got = member.fetch(150)
            assert got, acquired
            acquired += got
        assert acquired[0][0] == 0, acquired
        member.acknowledge(0, 149, ACCEPT)
        if acquired[-1][1] > 149:
            member.acknowledge(150, acquired[-1][1], RELEASE)
        wait_for_start_offsets(kcluster, done, topic, {0: 400}, what="the first group done with every record")
        assert start_offsets_on_the_wire(kcluster, slow, topic) == {0: 150}
        # Whole segments go: the log starts at the base of the one holding offset 150.
        base = max(b for b in s.segment_files(kcluster, s.leader_of(kcluster, topic), topic) if b <= 150)
        assert base > 0, s.segment_files(kcluster, s.leader_of(kcluster, topic), topic)
        for r in (0, 1, 2):
            s.wait_until(lambda r=r: s.describe(kcluster, r, topic).log_start_offset == base,
                         what=f"replica {r}'s log start offset at {base}, the segment below the slow group's 150")
        seen: dict[int, int] = {}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.05):
                for r in (0, 1, 2):
                    try:
                        seen[r] = max(seen.get(r, 0), s.describe(kcluster, r, topic).log_start_offset)
                    except Exception:  # noqa: BLE001 - a replica being killed answers nothing
                        pass

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            state_topic = s.store(kcluster).topic(SHARE_STATE_TOPIC)
            key = ShareStateKey(group_id=slow, topic_id=member.topic_id.hex, partition=0)
            state_partition = partition_for_key(key, partitions=state_topic.partitions)
            for leading in ((SHARE_STATE_TOPIC, state_partition), (topic, 0)):  # the topic's: after the first restart
                victim = s.leader_of(kcluster, *leading)
                kcluster.kill(f"replica-{victim}")
                time.sleep(1.0)
                kcluster.start_service(f"replica-{victim}")
            # Counted on whichever replica leads the topic when asked (a restarted one may have lost it).
            passes = {r: retention_passes(kcluster, r) for r in (0, 1, 2)}

            def passes_of_leader() -> tuple[int, float]:
                leader = s.leader_of(kcluster, topic)
                return leader, retention_passes(kcluster, leader) - passes[leader]

            wait_until(lambda: passes_of_leader()[1] >= 3, timeout_s=30, interval_s=0.1,
                       what="three consumed retention passes of the leader after the restarts",
                       explain=lambda: f"(leader, passes since): {passes_of_leader()}")
        finally:
            stop.set()
            sampler.join(5)
        assert set(seen) == {0, 1, 2} and max(seen.values()) == base, seen
        assert start_offsets_on_the_wire(kcluster, slow, topic) == {0: 150}
        assert [o for o, _ in s.read_all(kcluster, topic, start=150)] == list(range(150, 400))
        # The slow group, through a new member, takes and acknowledges the rest: all of it goes.
        member = RawShareMember(kcluster, topic=topic, group=slow)
        taken: list[tuple[int, int]] = []
        wait_until(lambda: bool(taken.extend(member.fetch(500)) or taken and taken[-1][1] >= 399), timeout_s=30,
                   interval_s=0.2, what="the slow group's new member acquiring 150..399")
        member.acknowledge(150, 399, ACCEPT)
        for r in (0, 1, 2):
            s.wait_until(lambda r=r: s.describe(kcluster, r, topic).log_start_offset == 400,
                         what=f"replica {r}'s log start offset at 400")
        assert consumer.proc.poll() is None, consumer.tail()
    finally:
        consumer.stop()


def set_group_config(cluster: LocalCluster, group: str, key: str, value: str) -> None:
    """IncrementalAlterConfigs v1 of a GROUP resource (what Kafka's share tools send), in Python."""
    m = request_module(44, 1)
    answer = kafka_call(cluster.kafka_bootstrap, m.IncrementalAlterConfigsRequest(validate_only=False, resources=(
        m.AlterConfigsResource(resource_type=32, resource_name=group, configs=(
            m.AlterableConfig(name=key, config_operation=0, value=value),)),)))
    assert [int(r.error_code) for r in answer.responses] == [0], answer


def console_share_consumer(cluster: LocalCluster, *, topic: str, group: str, messages: int,
                           extra: tuple[str, ...] = ()) -> list[str]:
    """``kafka-console-share-consumer`` (kafka-tools 4.4.0's ConsoleShareConsumer): the values it
    printed before ``messages`` were consumed."""
    done = subprocess.run([*java_command(newest=True), "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
                           "--bootstrap-server", cluster.kafka_bootstrap, "--topic", topic, "--group", group,
                           "--max-messages", str(messages), "--timeout-ms", "30000", *extra],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_kafka_console_share_consumer_accepts_and_its_released_records_come_back_until_the_limit(kcluster):
    """Kafka's console share consumer: one group accepts every record (its start offset at the
    end); another releases every record it gets, so each comes back until it was delivered
    ``group.share.delivery.count.limit`` times, and is then archived (its start offset at the end
    too, and nothing more is delivered)."""
    topic = "kip932-console"
    s.create_topic(kcluster, topic, partitions=1, rf=3)
    values = [f"c{i}" for i in range(20)]
    assert s.produce(kcluster, topic, [v.encode() for v in values]).error_code == 0
    for group in ("kip932-console-accept", "kip932-console-release"):
        set_group_config(kcluster, group, "share.auto.offset.reset", "earliest")
    accepted = console_share_consumer(kcluster, topic=topic, group="kip932-console-accept", messages=20)
    assert accepted == values
    wait_for_start_offsets(kcluster, "kip932-console-accept", topic, {0: 20}, what="every record accepted")
    released = console_share_consumer(kcluster, topic=topic, group="kip932-console-release",
                                      messages=20 * DELIVERY_LIMIT, extra=("--release",))
    assert Counter(released) == {v: DELIVERY_LIMIT for v in values}
    wait_for_start_offsets(kcluster, "kip932-console-release", topic, {0: 20},
                           what="every record archived at its delivery limit")


def test_a_read_committed_share_group_gets_committed_records_only_and_an_open_transaction_once_committed(
        kcluster):
    """``share.isolation.level=read_committed`` (a group config): Kafka's console share consumer of
    such a group gets a committed transaction's records, never an aborted one's, and an open
    transaction's only once it commits; a read_uncommitted group gets all of them at once. Both
    groups' start offsets reach the partition's end (the aborted records archived, the markers
    done with)."""
    topic, committed_group, uncommitted_group = "kip932-txn", "kip932-txn-rc", "kip932-txn-ru"
    s.create_topic(kcluster, topic, partitions=1, rf=3)
    for group in (committed_group, uncommitted_group):
        set_group_config(kcluster, group, "share.auto.offset.reset", "earliest")
    set_group_config(kcluster, committed_group, "share.isolation.level", "read_committed")
    with Producer(kcluster.bootstrap, transactional_id="kip932-txn-producer") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce_values(topic, [b"c1", b"c2"], partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.produce_values(topic, [b"a1", b"a2"], partition=0)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.produce_values(topic, [b"o1"], partition=0)
        assert console_share_consumer(kcluster, topic=topic, group=committed_group, messages=2) == ["c1", "c2"]
        assert sorted(console_share_consumer(kcluster, topic=topic, group=uncommitted_group, messages=5)) == [
            "a1", "a2", "c1", "c2", "o1"]
        producer.commit_transaction()
    assert console_share_consumer(kcluster, topic=topic, group=committed_group, messages=1) == ["o1"]
    end = ends_of(kcluster, topic)[0]
    assert end == 8  # 5 records and 3 markers
    wait_for_start_offsets(kcluster, committed_group, topic, {0: end}, what="the read_committed group done with all")
