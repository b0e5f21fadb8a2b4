"""KIP-848's consumer group protocol with Kafka's own Java consumer (``group.protocol=consumer``):
kafka-tools' ``VerifiableConsumer`` run unchanged with ``--group-protocol consumer`` from the jar of
``make kafka-tools`` (Kafka 4.1), consuming what ``VerifiableProducer`` writes while it writes.

Members come and go during the run: two start, a third joins, one leaves (SIGTERM: the consumer
closes and leaves with epoch -1), one is killed with -9 (its session expires), a fourth joins
(the default ``uniform`` assignor); in the second test three members asking for the ``range``
assignor consume while the replica leading the group's ``__consumer_offsets`` partition and then
the front door (the coordinator) are killed with -9 and restarted. Meanwhile a
poller asks the coordinator (ConsumerGroupDescribe, OffsetFetch, raw Kafka requests) every 100 ms:

* no partition is ever in two members' current assignments, and every Stable answer covers each
  partition exactly once (each rebalance ends with every partition owned once);
* a committed offset never goes back;

and at the end every value the producer had acknowledged was consumed, the committed offsets are
the partitions' ends, and ``kafka-consumer-groups --describe`` shows the group's members.
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from lowtide.groups import OFFSETS_TOPIC, partition_for_group
from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.wire import kafka_call, request_module
from tests.kafka_tools import java_command, kafka_tool
from tests.waiting import wait_until

PARTITIONS = 6
CONSUMER_CLASS = "org.apache.kafka.tools.VerifiableConsumer"
HEARTBEAT_MS, SESSION_MS = 500, 4000
CONSUMER_GROUP_DESCRIBE, OFFSET_FETCH = 69, 9
GROUP_ID_NOT_FOUND = 69

pytestmark = [pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    # The coordinator's group.consumer.* settings, short so that a killed member is noticed quickly.
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("kip848"), replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        extra_env={"LOWTIDE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
                   "LOWTIDE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_MS)}))


class JavaTool:
    """A Kafka tool as a child process whose JSON event lines are collected as they come."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._stderr = log.open("wb")
        self.log = log
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._stderr, stdin=subprocess.DEVNULL,
                                     text=True, bufsize=1, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._lock:
                    self.events.append(json.loads(line))

    def named(self, name: str) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e.get("name") == name]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        self._stderr.close()

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


def consumer(cluster: LocalCluster, *, topic: str, group: str, log: Path, assignor: str | None = None,
             newest: bool = False) -> JavaTool:
    """Kafka's VerifiableConsumer with ``--group-protocol consumer``; ``newest``: of the newest
    Kafka 4.x release instead of the pinned one."""
    remote = ["--group-remote-assignor", assignor] if assignor else []
    return JavaTool([*java_command(newest=newest),
                     CONSUMER_CLASS, "--topic", topic, "--group-id", group, "--group-protocol", "consumer", *remote,
                     "--bootstrap-server", cluster.kafka_bootstrap, "--reset-policy", "earliest", "--verbose"], log)


def producer(cluster: LocalCluster, *, topic: str, records: int, rate: int, log: Path,
             newest: bool = False) -> JavaTool:
    if newest:
        command = [*java_command(newest=True),
                   "org.apache.kafka.tools.VerifiableProducer"]
    else:
        command = [str(kafka_tool("kafka-verifiable-producer"))]
    return JavaTool([*command, "--topic", topic, "--bootstrap-server",
                     cluster.kafka_bootstrap, "--max-messages", str(records), "--throughput", str(rate),
                     "--acks", "-1"], log)


@dataclass
class Watch:
    """What the poller saw of the group (module doc)."""

    stable: list[tuple[int, int]] = field(default_factory=list)  # (group epoch, members) of Stable answers
    violations: list[str] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)
    members: int = -1
    state: str = ""
    epoch: int = -1
    looks: int = 0  # looks so far whose ConsumerGroupDescribe answered the group
    errors: int = 0
    last_error: str = ""
    assignor: str = ""
    ranges: list[list[int]] = field(default_factory=list)  # each member's partitions, last look


class Poller:
    def __init__(self, cluster: LocalCluster, *, topic: str, group: str) -> None:
        self.cluster, self.topic, self.group = cluster, topic, group
        self.watch = Watch()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._look()
            except (OSError, AssertionError, struct.error) as exc:  # the front door restarting: look again
                self.watch.errors += 1
                self.watch.last_error = repr(exc)

    def _look(self) -> None:
        address = self.cluster.kafka_bootstrap
        describe = request_module(CONSUMER_GROUP_DESCRIBE, 1)
        answer = kafka_call(address, describe.ConsumerGroupDescribeRequest(
            group_ids=(self.group,), include_authorized_operations=False)).groups[0]
        w = self.watch
        described = int(answer.error_code) == 0
        if not described:
            # Retriable answers (the coordinator restarting) are expected; a group seen before and
            # then unknown is not: these groups never empty, so they are never deleted.
            if int(answer.error_code) == GROUP_ID_NOT_FOUND and w.stable:
                w.violations.append(f"ConsumerGroupDescribe: {answer.error_message} (after epoch {w.epoch})")
            w.last_error = f"ConsumerGroupDescribe: error {int(answer.error_code)}: {answer.error_message}"
        else:
            owners: dict[int, str] = {}
            for m in answer.members:
                for tp in m.assignment.topic_partitions:
                    for p in tp.partitions:
                        if p in owners:
                            w.violations.append(f"epoch {answer.group_epoch}: {self.topic}-{p} owned by "
                                                f"{owners[p]} and {m.member_id}")
                        owners[p] = m.member_id
            if answer.group_state == "Stable" and answer.members:
                if sorted(owners) != list(range(PARTITIONS)):
                    w.violations.append(f"Stable at epoch {answer.group_epoch} owns {sorted(owners)}")
                if not w.stable or w.stable[-1][0] != answer.group_epoch:
                    w.stable.append((answer.group_epoch, len(answer.members)))
            w.state, w.members, w.epoch = answer.group_state, len(answer.members), answer.group_epoch
            w.assignor = answer.assignor_name
            w.ranges = [sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions)
                        for m in answer.members]
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
        if described:  # stable_now counts fresh looks: a look with no group state is not one
            w.looks += 1

    def stable_with(self, members: int, *, after: int = 0, timeout_s: float = 40) -> int:
        """Wait for a Stable group of ``members`` at a group epoch above ``after``; its epoch."""
        def seen() -> bool:
            return any(e > after and n == members for e, n in self.watch.stable) and self.watch.state == "Stable" \
                and self.watch.members == members
        wait_until(seen, timeout_s=timeout_s, interval_s=0.1, what=f"a Stable group of {members} members")
        return max(e for e, n in self.watch.stable if n == members)

    def stable_now(self, members: int, *, timeout_s: float = 40) -> int:
        """Wait for fresh looks (after now) to find the group Stable with ``members``; its epoch."""
        first = self.watch.looks + 3
        wait_until(lambda: self.watch.looks >= first and self.watch.state == "Stable"
                   and self.watch.members == members, timeout_s=timeout_s, interval_s=0.1,
                   what=f"a Stable group of {members} members, seen afresh (last look's error: "
                        f"{self.watch.last_error or 'none'})")
        return self.watch.epoch

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def consumed_values(consumers: list[JavaTool]) -> set[str]:
    return {e["value"] for c in consumers for e in c.named("record_data")}


def finish(cluster: LocalCluster, *, topic: str, poller: Poller, prod: JavaTool, consumers: list[JavaTool],
           live: list[JavaTool]) -> None:
    """The run's end: everything acknowledged consumed, offsets committed to the ends, no violation."""
    assert prod.proc.wait(120) == 0, prod.tail()
    acked = {e["value"] for e in prod.named("producer_send_success")}
    assert acked, prod.tail()
    wait_until(lambda: acked <= consumed_values(consumers), timeout_s=60, interval_s=0.2,
               what="every acknowledged value consumed")
    with Admin(cluster.bootstrap) as admin:
        answers = admin.list_offsets({(topic, p): OffsetSpec.LATEST for p in range(PARTITIONS)})
    assert all(a.error is None for a in answers.values()), answers
    ends = {p: a.offset for (_, p), a in answers.items()}
    failed_commits = [e for c in consumers for e in c.named("offsets_committed") if not e.get("success")]
    # A partition the producer's sticky partitioner never picked has nothing to commit.
    wait_until(lambda: all(poller.watch.committed.get(p, 0) == end for p, end in ends.items()), timeout_s=30,
               interval_s=0.2, what=f"committed offsets {poller.watch.committed} at the ends {ends} "
                                    f"(failed commits: {failed_commits[:5]})")
    for c in live:
        assert c.proc.poll() is None, c.tail()
    assert not poller.watch.violations, poller.watch.violations[:10]
    assert acked <= consumed_values(consumers)


def test_verifiable_consumers_join_leave_and_die(kcluster, tmp_path):
    topic, group = "kip848", "kip848-group"
    s.create_topic(kcluster, topic, partitions=PARTITIONS, rf=3)
    poller = Poller(kcluster, topic=topic, group=group)
    prod = producer(kcluster, topic=topic, records=9000, rate=600, log=tmp_path / "producer.log")
    started: list[JavaTool] = []

    def start(name: str) -> JavaTool:
        c = consumer(kcluster, topic=topic, group=group, log=tmp_path / f"{name}.log")
        started.append(c)
        return c

    try:
        c1, c2 = start("c1"), start("c2")
        epoch = poller.stable_with(2)
        c3 = start("c3")  # joins
        epoch = poller.stable_with(3, after=epoch)
        c1.stop()  # leaves: closes, commits, leaves the group with epoch -1
        assert c1.named("shutdown_complete"), c1.tail()
        epoch = poller.stable_with(2, after=epoch)
        c2.stop(signal.SIGKILL)  # dies: the coordinator removes it when its session expires
        epoch = poller.stable_with(1, after=epoch)
        c4 = start("c4")
        poller.stable_with(2, after=epoch)
        finish(kcluster, topic=topic, poller=poller, prod=prod, consumers=started, live=[c3, c4])
        assert len(poller.watch.stable) >= 5, poller.watch.stable

        describe = subprocess.run([str(kafka_tool("kafka-consumer-groups")), "--bootstrap-server",
                                   kcluster.kafka_bootstrap, "--describe", "--group", group],
                                  capture_output=True, text=True, timeout=120)
        assert describe.returncode == 0, describe.stderr[-3000:]
        rows = [line.split() for line in describe.stdout.splitlines() if line.startswith(group)]
        assert sorted(int(r[2]) for r in rows) == list(range(PARTITIONS)), describe.stdout
        # Each partition owned, and no lag (an empty partition has no committed offset: "-" at 0).
        assert all(r[6] != "-" and (r[3] == r[4] or (r[3], r[4]) == ("-", "0")) for r in rows), describe.stdout
        state = subprocess.run([str(kafka_tool("kafka-consumer-groups")), "--bootstrap-server",
                                kcluster.kafka_bootstrap, "--describe", "--group", group, "--state"],
                               capture_output=True, text=True, timeout=120)
        assert state.returncode == 0, state.stderr[-3000:]
        row = next(line.split() for line in state.stdout.splitlines() if line.startswith(group))
        assert row[-3:] == ["uniform", "Stable", "2"], state.stdout  # ASSIGNMENT-STRATEGY STATE #MEMBERS
    finally:
        poller.stop()
        prod.stop()
        for c in started:
            c.stop()


def test_consumers_carry_on_when_the_offsets_leader_and_the_coordinator_are_killed(kcluster, tmp_path):
    topic, group = "kip848-faults", "kip848-faults-group"
    s.create_topic(kcluster, topic, partitions=PARTITIONS, rf=3)
    poller = Poller(kcluster, topic=topic, group=group)
    prod = producer(kcluster, topic=topic, records=7000, rate=600, log=tmp_path / "producer.log")
    # These members ask for the range assignor (group.remote.assignor): contiguous ranges.
    consumers = [consumer(kcluster, topic=topic, group=group, log=tmp_path / f"c{i}.log", assignor="range")
                 for i in range(3)]
    try:
        epoch = poller.stable_with(3)
        assert poller.watch.assignor == "range" and sorted(poller.watch.ranges) == [[0, 1], [2, 3], [4, 5]], \
            poller.watch
        offsets_partitions = s.store(kcluster).topics()[OFFSETS_TOPIC].partitions
        leader = s.leader_of(kcluster, OFFSETS_TOPIC, partition_for_group(group, partitions=offsets_partitions))
        kcluster.kill(f"replica-{leader}")
        time.sleep(2)
        kcluster.start_service(f"replica-{leader}")
        frontdoor = kcluster.services("frontdoor")[0].name
        kcluster.kill(frontdoor)  # the coordinator: its groups come back from __consumer_offsets
        kcluster.start_service(frontdoor)
        # The coordinator came back with the group from its records: the members were never
        # fenced, so the group is Stable with all three at the same group epoch.
        assert poller.stable_now(3) == epoch
        finish(kcluster, topic=topic, poller=poller, prod=prod, consumers=consumers, live=consumers)
        assert all(not c.named("partitions_lost") for c in consumers), [c.named("partitions_lost") for c in consumers]
    finally:
        poller.stop()
        prod.stop()
        for c in consumers:
            c.stop()
