"""Kafka 4's online upgrade of a classic consumer group to a KIP-848 consumer group, and the
downgrade back, as users roll them: Kafka's Java ``VerifiableConsumer`` (kafka-tools, 4.1) members
start with ``--group-protocol classic`` and are restarted one by one with ``--group-protocol
consumer`` while ``VerifiableProducer`` writes, then rolled back to ``classic`` the same way.

A poller asks the coordinator every 100 ms, as a broker-side observer: ListGroups v5 (the group's
type), ConsumerGroupDescribe (a consumer group: its members, classic ones with member_type 0) or
DescribeGroups (a classic group), OffsetFetch. It checks that

* no partition is ever in two members' current assignments, and a Stable group owns each
  partition exactly once;
* a committed offset never goes back;

the test checks that the group became a consumer group at the first consumer-protocol member and
a classic group again when the last one left, and at the end that every value the producer had
acknowledged was consumed and the committed offsets are the partitions' ends (the checks and
tools of ``test_consumer_group_protocol.py``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lowtide.frontdoor.groups.classic_members import decode_assignment
from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.test_consumer_group_protocol import (
    CONSUMER_CLASS,
    PARTITIONS,
    JavaTool,
    Watch,
    finish,
    producer,
)
from tests.integration.kafka.wire import kafka_call, request_module
from tests.kafka_tools import java_command
from tests.waiting import wait_until

HEARTBEAT_MS, SESSION_MS = 500, 4000
LIST_GROUPS, DESCRIBE_GROUPS, CONSUMER_GROUP_DESCRIBE, OFFSET_FETCH = 16, 15, 69, 9
CLASSIC_MEMBER_TYPE = 0

pytestmark = [pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def mcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("kip848-migration"), replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        extra_env={"LOWTIDE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
                   "LOWTIDE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_MS),
                   "LOWTIDE_GROUP_INITIAL_REBALANCE_DELAY_MS": "500"}))


def member(cluster: LocalCluster, *, protocol: str, topic: str, group: str, log: Path) -> JavaTool:
    """VerifiableConsumer with ``--group-protocol``; a classic one heartbeats as often as the new
    ones (its rebalances are then as quick) and gives up a silent member as soon."""
    extra: list[str] = []
    if protocol == "classic":
        config = log.with_suffix(".properties")
        config.write_text(f"heartbeat.interval.ms={HEARTBEAT_MS}\nsession.timeout.ms={SESSION_MS}\n"
                          "max.poll.interval.ms=20000\n")
        extra = ["--consumer.config", str(config)]
    return JavaTool([*java_command(),
                     CONSUMER_CLASS, "--topic", topic, "--group-id", group, "--group-protocol", protocol, *extra,
                     "--bootstrap-server", cluster.kafka_bootstrap, "--reset-policy", "earliest", "--verbose"], log)


@dataclass
class Look:
    kind: str = ""  # the group's type in ListGroups: "classic", "consumer", "" (not listed)
    state: str = ""
    members: int = -1
    classic_members: int = -1  # members using the classic protocol (ConsumerGroupDescribe's member_type 0)


@dataclass
class MigrationWatch(Watch):
    look: Look = field(default_factory=Look)
    kinds: list[str] = field(default_factory=list)  # the group's types, in the order seen


class MigrationPoller:
    """The broker-side observer of the module doc (``Watch`` as ``finish`` reads it)."""

    def __init__(self, cluster: LocalCluster, *, topic: str, group: str) -> None:
        self.cluster, self.topic, self.group = cluster, topic, group
        self.watch = MigrationWatch()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._look()
            except (OSError, AssertionError, ValueError) as exc:
                self.watch.errors += 1
                self.watch.last_error = repr(exc)

    def _check_owners(self, assignments: dict[str, list[int]], *, stable: bool, what: str) -> None:
        owners: dict[int, str] = {}
        for member_id, parts in assignments.items():
            for p in parts:
                if p in owners:
                    self.watch.violations.append(f"{what}: {self.topic}-{p} owned by {owners[p]} and {member_id}")
                owners[p] = member_id
        if stable and assignments and sorted(owners) != list(range(PARTITIONS)):
            self.watch.violations.append(f"{what}: Stable owns {sorted(owners)}")

    def _look(self) -> None:
        address, w = self.cluster.kafka_bootstrap, self.watch
        lg = request_module(LIST_GROUPS, 5)
        listed = [g for g in kafka_call(address, lg.ListGroupsRequest(states_filter=(), types_filter=())).groups
                  if g.group_id == self.group]
        look = Look()
        if listed and listed[0].group_type == "consumer":
            cgd = request_module(CONSUMER_GROUP_DESCRIBE, 1)
            answer = kafka_call(address, cgd.ConsumerGroupDescribeRequest(
                group_ids=(self.group,), include_authorized_operations=False)).groups[0]
            if int(answer.error_code) == 0:
                look = Look(kind="consumer", state=answer.group_state, members=len(answer.members),
                            classic_members=sum(1 for m in answer.members if m.member_type == CLASSIC_MEMBER_TYPE))
                self._check_owners({m.member_id: [p for tp in m.assignment.topic_partitions for p in tp.partitions]
                                    for m in answer.members}, stable=look.state == "Stable",
                                   what=f"consumer group epoch {answer.group_epoch}")
        elif listed and listed[0].group_type == "classic":
            dg = request_module(DESCRIBE_GROUPS, 5)
            answer = kafka_call(address, dg.DescribeGroupsRequest(groups=(self.group,),
                                                                  include_authorized_operations=False)).groups[0]
            if int(answer.error_code) == 0:
                look = Look(kind="classic", state=answer.group_state, members=len(answer.members),
                            classic_members=len(answer.members))
                if answer.group_state == "Stable":
                    self._check_owners({m.member_id: sorted(decode_assignment(m.member_assignment).get(self.topic, ()))
                                        for m in answer.members}, stable=True, what="classic group")
        fetch = request_module(OFFSET_FETCH, 8)
        offsets = kafka_call(address, fetch.OffsetFetchRequest(groups=(fetch.OffsetFetchRequestGroup(
            group_id=self.group, topics=None),), require_stable=False)).groups[0]
        for t in offsets.topics:
            for p in t.partitions:
                if p.committed_offset < 0:
                    continue
                before = w.committed.get(p.partition_index, -1)
                if p.committed_offset < before:
                    w.violations.append(f"committed offset of {t.name}-{p.partition_index} went back "
                                        f"from {before} to {p.committed_offset}")
                w.committed[p.partition_index] = max(before, p.committed_offset)
        if look.kind and (not w.kinds or w.kinds[-1] != look.kind):
            w.kinds.append(look.kind)
        w.look = look
        w.looks += 1

    def settled(self, *, kind: str, members: int, classic: int, timeout_s: float = 40) -> None:
        """Wait for fresh looks to find the group of ``kind`` Stable with ``members``, ``classic``
        of them using the classic protocol."""
        first = self.watch.looks + 2
        wait_until(lambda: self.watch.looks >= first and self.watch.look == Look(
            kind=kind, state="Stable", members=members, classic_members=classic), timeout_s=timeout_s,
            interval_s=0.1, what=f"a Stable {kind} group of {members} members, {classic} classic (last look: "
                                 f"{self.watch.look}, error: {self.watch.last_error or 'none'})")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_classic_group_is_upgraded_member_by_member_and_downgraded_back_while_records_flow(mcluster, tmp_path):
    topic, group = "migration", "migration-group"
    s.create_topic(mcluster, topic, partitions=PARTITIONS, rf=3)
    poller = MigrationPoller(mcluster, topic=topic, group=group)
    prod = producer(mcluster, topic=topic, records=9000, rate=250, log=tmp_path / "producer.log")
    started: list[JavaTool] = []

    def start(name: str, protocol: str) -> JavaTool:
        c = member(mcluster, protocol=protocol, topic=topic, group=group, log=tmp_path / f"{name}.log")
        started.append(c)
        return c

    try:
        live = [start(f"classic{i}", "classic") for i in range(3)]
        poller.settled(kind="classic", members=3, classic=3)
        # The rolling upgrade: each classic member is stopped (it leaves) and comes back new.
        for i in range(3):
            live[i].stop()
            assert live[i].named("shutdown_complete"), live[i].tail()
            live[i] = start(f"consumer{i}", "consumer")
            poller.settled(kind="consumer", members=3, classic=2 - i)
        assert poller.watch.kinds == ["classic", "consumer"], poller.watch.kinds
        # The rolling downgrade: the group stays a consumer group while a new member is left.
        for i in range(3):
            live[i].stop()
            assert live[i].named("shutdown_complete"), live[i].tail()
            live[i] = start(f"back{i}", "classic")
            if i < 2:
                poller.settled(kind="consumer", members=3, classic=i + 1)
        poller.settled(kind="classic", members=3, classic=3)
        assert poller.watch.kinds == ["classic", "consumer", "classic"], poller.watch.kinds
        finish(mcluster, topic=topic, poller=poller, prod=prod, consumers=started, live=live)  # type: ignore[arg-type]
    finally:
        poller.stop()
        prod.stop()
        for c in started:
            c.stop()
