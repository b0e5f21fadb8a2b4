"""KIP-848's consumer group protocol with a client that is not Kafka's: franz-go (``kgo``, Go).

``.tools/bin/kgo-verifiable-consumer`` (source and pinned go.mod in ``tests/go/kgo-verifiable``,
built by ``scripts/setup.sh``, so by ``make setup`` and CI) is a kgo group member that opts into
the new protocol (``kgo.ServerSideBalancer``) and prints what it consumes, its rebalance callbacks
and its commits as JSON lines, the way Kafka's VerifiableConsumer does. franz-go falls back to the
classic protocol, silently, when it finds no ConsumerGroupHeartbeat v1, so the protocol is checked
from the broker's side: ListGroups v5 lists the group with type ``consumer`` and
ConsumerGroupDescribe shows the members by the member ids kgo generated (KIP-848 v1: the client
names itself) and by kgo's client id.

The run is the Java test's (``test_consumer_group_protocol.py``, whose poller, producer and end
checks it reuses) with kgo members: two start, a third joins, the replica leading the group's
``__consumer_offsets`` partition and then the front door (the coordinator) are killed -9 and
restarted, one member leaves (SIGTERM: it commits and leaves with epoch -1), one is killed -9 (its
session expires), a fourth joins. Throughout, no partition is in two members' assignments and a
Stable group owns each partition once (ConsumerGroupDescribe every 100 ms), and a committed offset
never goes back (OffsetFetch, and each member's own commit answers); after each rebalance the
members' own callbacks add up to the broker's assignment; no member loses its partitions (fenced
or expired) through the faults; at the end every value VerifiableProducer had acknowledged was
consumed and the committed offsets are the partitions' ends. A second test has kgo's RangeBalancer
ask for the ``range`` assignor.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from lowtide.groups import OFFSETS_TOPIC, partition_for_group
from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka import test_consumer_group_protocol as kip848
from tests.integration.kafka.wire import kafka_call, request_module
from tests.kafka_tools import TOOLS_BIN
from tests.waiting import wait_until

KGO_CONSUMER = TOOLS_BIN / "kgo-verifiable-consumer"
# The coordinator's session timeout here, longer than the Java test's 4 s: kgo retries a heartbeat
# on the broker it had, down or not, until it is back, so a member keeps its session through a
# replica's kill -9 and restart only when the session outlasts that (the Java consumer moves to
# another broker at once). kgo's retry backoff is capped well below it (--retry-backoff-max).
SESSION_MS = 8000
RETRY_BACKOFF_MAX = "500ms"
LIST_GROUPS = 16
KGO_CLIENT_ID = "kgo"  # franz-go's default client id, which ConsumerGroupDescribe reports per member

pytestmark = [pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    kgo_consumer_binary()  # skip before starting a cluster when the tool is missing
    # Short group.consumer.* settings: a member killed -9 is removed within seconds.
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("kgo-kip848"), replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        extra_env={"LOWTIDE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(kip848.HEARTBEAT_MS),
                   "LOWTIDE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_MS)}))


def kgo_consumer_binary() -> Path:
    if not os.access(KGO_CONSUMER, os.X_OK):
        pytest.skip(f"kgo-verifiable-consumer (franz-go) is not built ({KGO_CONSUMER} missing): run 'make tools' "
                    "(scripts/setup.sh builds tests/go/kgo-verifiable with Go)")
    return KGO_CONSUMER


def kgo_consumer(cluster: LocalCluster, *, topic: str, group: str, log: Path, assignor: str = "uniform",
                 protocol: str = "consumer") -> kip848.JavaTool:
    """A kgo group member whose JSON events are collected as they come (kgo's log in ``log``)."""
    return kip848.JavaTool([str(kgo_consumer_binary()), "--bootstrap-server", cluster.kafka_bootstrap, "--topic", topic,
                            "--group-id", group, "--assignor", assignor, "--group-protocol", protocol,
                            "--retry-backoff-max", RETRY_BACKOFF_MAX], log)


def save_events(member: kip848.JavaTool) -> None:
    """The member's events beside its log (NAME.events.jsonl), for reading a failed run."""
    lines = [json.dumps(e) for e in list(member.events)]
    member.log.with_suffix(".events.jsonl").write_text("\n".join(lines) + "\n")


def described_members(cluster: LocalCluster, group: str) -> dict[str, tuple[str, list[int]]]:
    """ConsumerGroupDescribe's members: member id -> (client id, partitions)."""
    describe = request_module(kip848.CONSUMER_GROUP_DESCRIBE, 1)
    answer = kafka_call(cluster.kafka_bootstrap, describe.ConsumerGroupDescribeRequest(
        group_ids=(group,), include_authorized_operations=False)).groups[0]
    assert int(answer.error_code) == 0, answer
    return {m.member_id: (m.client_id, sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions))
            for m in answer.members}


def described_state(cluster: LocalCluster, group: str) -> tuple[str, int]:
    """(state, number of members) as ConsumerGroupDescribe answers them."""
    describe = request_module(kip848.CONSUMER_GROUP_DESCRIBE, 1)
    answer = kafka_call(cluster.kafka_bootstrap, describe.ConsumerGroupDescribeRequest(
        group_ids=(group,), include_authorized_operations=False)).groups[0]
    assert int(answer.error_code) == 0, answer
    return answer.group_state, len(answer.members)


def group_type(cluster: LocalCluster, group: str) -> str:
    """The group's type as ListGroups v5 (KIP-1043) answers it: "consumer" or "classic"."""
    list_groups = request_module(LIST_GROUPS, 5)
    answer = kafka_call(cluster.kafka_bootstrap, list_groups.ListGroupsRequest(states_filter=(), types_filter=()))
    assert int(answer.error_code) == 0, answer
    return next((g.group_type for g in answer.groups if g.group_id == group), "")


def client_view(members: list[kip848.JavaTool]) -> dict[str, list[int]]:
    """Each live member's id -> what it owns, after its last rebalance callback."""
    view = {}
    for m in members:
        events = [e for e in list(m.events) if e.get("name", "").startswith("partitions_")]
        if events:
            view[events[-1]["member_id"]] = sorted(tp["partition"] for tp in events[-1]["assignment"])
    return view


def check_own_commits_never_go_back(members: list[kip848.JavaTool]) -> None:
    """What each member was told it committed, partition by partition, never goes back (the
    poller checks the same from OffsetFetch, across members)."""
    for m in members:
        last: dict[int, int] = {}
        for event in m.named("offsets_committed"):
            for o in event["offsets"] if event["success"] else ():
                assert o["offset"] >= last.get(o["partition"], -1), (m.log, o, last)
                last[o["partition"]] = o["offset"]


def check_members_agree_with_the_broker(cluster: LocalCluster, group: str, members: list[kip848.JavaTool]) -> None:
    """The members' own callbacks add up to the coordinator's assignment: the same member ids (the
    ones kgo generated), kgo's client id, every partition owned by exactly one member."""
    def agree() -> bool:
        broker = described_members(cluster, group)
        return client_view(members) == {member: parts for member, (_, parts) in broker.items()}

    wait_until(agree, timeout_s=30, interval_s=0.2,
               what=f"the kgo members' callbacks ({client_view(members)}) matching ConsumerGroupDescribe")
    broker = described_members(cluster, group)
    assert {client for client, _ in broker.values()} == {KGO_CLIENT_ID}, broker
    owned = sorted(p for _, parts in broker.values() for p in parts)
    assert owned == list(range(kip848.PARTITIONS)), broker


def test_franz_go_members_join_with_the_consumer_group_protocol_and_survive_joins_leaves_and_kills(kcluster, tmp_path):
    topic, group = "kgo-kip848", "kgo-kip848-group"
    s.create_topic(kcluster, topic, partitions=kip848.PARTITIONS, rf=3)
    poller = kip848.Poller(kcluster, topic=topic, group=group)
    prod = kip848.producer(kcluster, topic=topic, records=9000, rate=600, log=tmp_path / "producer.log")
    started: list[kip848.JavaTool] = []

    def start(name: str) -> kip848.JavaTool:
        c = kgo_consumer(kcluster, topic=topic, group=group, log=tmp_path / f"{name}.log")
        started.append(c)
        return c

    try:
        c1, c2 = start("c1"), start("c2")
        epoch = poller.stable_with(2)
        # The broker's side of "joined with the new protocol": a consumer group (a classic one has
        # no ConsumerGroupDescribe answer, so the poller would not have seen it Stable either).
        assert group_type(kcluster, group) == "consumer"
        assert poller.watch.assignor == "uniform", poller.watch
        check_members_agree_with_the_broker(kcluster, group, [c1, c2])

        c3 = start("c3")  # joins
        epoch = poller.stable_with(3, after=epoch)
        check_members_agree_with_the_broker(kcluster, group, [c1, c2, c3])

        # The coordinator's records lose their leader, then the coordinator itself restarts and
        # rebuilds the group from them: the members carry on, not fenced, at the same group epoch.
        offsets_partitions = s.store(kcluster).topics()[OFFSETS_TOPIC].partitions
        leader = s.leader_of(kcluster, OFFSETS_TOPIC, partition_for_group(group, partitions=offsets_partitions))
        kcluster.kill(f"replica-{leader}")
        time.sleep(2)
        kcluster.start_service(f"replica-{leader}")
        frontdoor = kcluster.services("frontdoor")[0].name
        kcluster.kill(frontdoor)
        kcluster.start_service(frontdoor)
        assert poller.stable_now(3) == epoch
        check_members_agree_with_the_broker(kcluster, group, [c1, c2, c3])

        c1.stop()  # leaves: commits, then leaves the group with epoch -1
        assert c1.named("shutdown_complete"), c1.tail()
        assert c1.proc.returncode == 0, c1.tail()
        epoch = poller.stable_with(2, after=epoch)
        check_members_agree_with_the_broker(kcluster, group, [c2, c3])

        c2.stop(signal.SIGKILL)  # dies: the coordinator removes it when its session expires
        epoch = poller.stable_with(1, after=epoch)
        check_members_agree_with_the_broker(kcluster, group, [c3])

        c4 = start("c4")
        poller.stable_with(2, after=epoch)
        check_members_agree_with_the_broker(kcluster, group, [c3, c4])

        kip848.finish(kcluster, topic=topic, poller=poller, prod=prod, consumers=started, live=[c3, c4])
        check_own_commits_never_go_back(started)
        assert all(not c.named("partitions_lost") for c in started), [c.named("partitions_lost") for c in started]
        assert group_type(kcluster, group) == "consumer"
    finally:
        poller.stop()
        prod.stop()
        for c in started:
            c.stop()
            save_events(c)


def test_franz_go_members_asking_for_the_range_assignor_get_contiguous_ranges_and_leave_an_empty_group(
        kcluster, tmp_path):
    # kgo names the server assignor after its first balancer: RangeBalancer asks for "range".
    topic, group = "kgo-kip848-range", "kgo-kip848-range-group"
    s.create_topic(kcluster, topic, partitions=kip848.PARTITIONS, rf=3)
    poller = kip848.Poller(kcluster, topic=topic, group=group)
    members = [kgo_consumer(kcluster, topic=topic, group=group, log=tmp_path / f"r{i}.log", assignor="range")
               for i in range(3)]
    try:
        poller.stable_with(3)
        assert poller.watch.assignor == "range", poller.watch
        assert sorted(poller.watch.ranges) == [[0, 1], [2, 3], [4, 5]], poller.watch
        check_members_agree_with_the_broker(kcluster, group, members)
        for m in members:
            m.stop()  # SIGTERM: each leaves with epoch -1 and exits 0
            assert m.proc.returncode == 0 and m.named("shutdown_complete"), m.tail()
        wait_until(lambda: described_state(kcluster, group) == ("Empty", 0), timeout_s=30, interval_s=0.2,
                   what="the group Empty once every kgo member left")
        assert not poller.watch.violations, poller.watch.violations[:10]
    finally:
        poller.stop()
        for m in members:
            m.stop()
            save_events(m)
