"""Exactly-once read-process-write with Kafka's own Java clients, under faults (issue 34).

kafka-tools' ``TransactionalMessageCopier`` (what Kafka's transactions system test drives) copies
each partition of an input topic to an output topic in transactions: consume, produce the same
value, ``sendOffsetsToTransaction`` with the consumer's group metadata (TxnOffsetCommit), commit.
While it runs, leaders (of the output partitions and of the group's ``__consumer_offsets``
partition) and the front door (the transaction and group coordinator) are killed with -9 and
restarted, so is redis-server, and leaders are paused with SIGSTOP. The coordinator's states live
in ``__transaction_state`` (replicated): the leaders of the copiers' partitions there are among the
nemesis's targets too. A copier that dies is started again with the same transactional id, as
the system test bounces its copiers: its InitProducerId fences the old one and aborts what it left
open, and it resumes from the offsets committed with the last committed
transaction. Then a ``read_committed`` read of the whole output must hold every input value
exactly once, and the group's committed offsets must be each input partition's end.

Nothing here is mocked: the copier is Kafka's class run unchanged from the kafka-tools jar of
``make kafka-tools``, talking to the replicas' Kafka listeners.
"""

from __future__ import annotations

import collections
import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lowtide.client import Admin, Consumer, Producer
from lowtide.client.admin import OffsetSpec
from lowtide.frontdoor.txn_records import TXN_STATE_TOPIC, partition_for_transactional_id
from lowtide.groups import OFFSETS_TOPIC, partition_for_group
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.messages import TopicPartition
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.kafka_tools import kafka_tools_manifest

INPUT, OUTPUT, GROUP = "copy-in", "copy-out", "copy-group"
PARTITIONS = 2
RECORDS_PER_PARTITION = 20_000
TRANSACTION_SIZE = 50
COPY_DEADLINE_S = 150
COPIER_CLASS = "org.apache.kafka.tools.TransactionalMessageCopier"

pytestmark = [pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("eos-copier"), replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        session_timeout_ms=2000))


def copier_command(lib: str, *, partition: int, bootstrap: str) -> list[str]:
    return ["java", "-Xmx256M", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*", COPIER_CLASS,
            "--input-topic", INPUT, "--input-partition", str(partition), "--output-topic", OUTPUT,
            "--broker-list", bootstrap, "--transactional-id", f"copier-{partition}", "--consumer-group", GROUP,
            "--transaction-size", str(TRANSACTION_SIZE), "--transaction-timeout", "20000",
            "--use-group-metadata", "--max-messages", "-1"]


class Copier:
    """One copier of one input partition, started again whenever it exits before it is done."""

    def __init__(self, lib: str, *, partition: int, bootstrap: str, logs: Path) -> None:
        self.command = copier_command(lib, partition=partition, bootstrap=bootstrap)
        self.partition = partition
        self.logs = logs
        self.starts = 0
        self.done = False
        self.exits: list[int] = []
        self._proc: subprocess.Popen | None = None

    def run(self, deadline: float) -> None:
        while time.monotonic() < deadline and not self.done:
            self.starts += 1
            out = self.logs / f"copier-{self.partition}-{self.starts}.log"
            with out.open("w") as sink:
                self._proc = subprocess.Popen(self.command, stdout=sink, stderr=subprocess.STDOUT)
                try:
                    code = self._proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                    return
            self.exits.append(code)
            self.done = code == 0 and finished(out)
            if not self.done:
                time.sleep(0.5)

    def tail(self, lines: int = 25) -> str:
        """The last lines of its last run's output (JSON status lines and Java logs)."""
        log = self.logs / f"copier-{self.partition}-{self.starts}.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()


def finished(log: Path) -> bool:
    """The copier printed ShutdownComplete with nothing remaining (its JSON status lines)."""
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"ShutdownComplete"' in line:
            return json.loads(line).get("remaining") == 0
    return False


class Nemesis:
    """Every ``interval_s``: kill -9 (and restart) or SIGSTOP (and resume) a leader of an output
    partition, of the group's offsets partition or of a copier's transaction-state partition, or
    kill -9 and restart the front door or redis-server."""

    def __init__(self, cluster: LocalCluster, *, seed: int, interval_s: float = 2.0) -> None:
        self.cluster = cluster
        self.seed = seed
        self.rng = random.Random(seed)
        self.interval_s = interval_s
        self.faults: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self.problems: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _targets(self) -> list[tuple[str, int]]:
        store = s.store(self.cluster)
        offsets_partition = partition_for_group(GROUP, partitions=store.topic(OFFSETS_TOPIC).partitions)
        txn_partitions = store.topic(TXN_STATE_TOPIC).partitions
        return ([(OUTPUT, p) for p in range(PARTITIONS)] + [(OFFSETS_TOPIC, offsets_partition)]
                + [(TXN_STATE_TOPIC, partition_for_transactional_id(f"copier-{p}", partitions=txn_partitions))
                   for p in range(PARTITIONS)])

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._one_fault()
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                self.problems.append(f"{type(exc).__name__}: {exc}")

    def _one_fault(self) -> None:
        kind = self.rng.choice(["kill-leader", "kill-leader", "pause-leader", "kill-frontdoor", "kill-redis"])
        if kind == "kill-redis":
            # Transaction states live in Redis (AOF): a kill -9 loses nothing it acknowledged.
            name = next(e.name for e in self.cluster.services() if e.is_redis)
            self.cluster.kill(name, signal.SIGKILL)
            time.sleep(0.5)
            self.cluster.start_service(name)
        elif kind == "kill-frontdoor":
            name = self.rng.choice([e.name for e in self.cluster.services("frontdoor")])
            self.cluster.kill(name, signal.SIGKILL)
            time.sleep(1.0)
            self.cluster.start_service(name)
        else:
            topic, partition = self.rng.choice(self._targets())
            name = f"replica-{s.leader_of(self.cluster, topic, partition)}"
            if kind == "kill-leader":
                self.cluster.kill(name, signal.SIGKILL)
                time.sleep(1.0)
                self.cluster.start_service(name)
            else:
                self.cluster.pause(name)
                time.sleep(2.0)
                self.cluster.resume(name)
        self.faults[kind] += 1


def read_committed(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    """Every committed value of every partition of ``topic``, in offset order."""
    with Admin(bootstrap) as admin:
        ends = {p: a.offset for (_, p), a in admin.list_offsets(
            {(topic, p): OffsetSpec.LATEST for p in range(PARTITIONS)}).items()}
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    with Consumer(bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while any(consumer.position(TopicPartition(topic, p)) < ends[p] for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, f"read_committed of {topic} did not reach {ends}"
            for r in consumer.poll(max_wait_ms=200):
                out[r.partition].append(r.value)
    return out


def test_transactional_message_copier_copies_every_value_exactly_once_while_leaders_front_door_and_redis_die(
        kcluster, tmp_path):
    lib = kafka_tools_manifest()["lib"]
    for topic in (INPUT, OUTPUT):
        s.create_topic(kcluster, topic, partitions=PARTITIONS, rf=3, config={"min.insync.replicas": "2"})
    expected: dict[int, list[bytes]] = {}
    with Producer(kcluster.bootstrap) as producer:
        for p in range(PARTITIONS):
            expected[p] = [f"{p}-{i}".encode() for i in range(RECORDS_PER_PARTITION)]
            for value in expected[p]:
                producer.send(INPUT, value, partition=p)
        producer.flush()

    copiers = [Copier(lib, partition=p, bootstrap=kcluster.kafka_bootstrap, logs=tmp_path) for p in range(PARTITIONS)]
    started = time.monotonic()
    deadline = started + COPY_DEADLINE_S
    threads = [threading.Thread(target=c.run, args=(deadline,), daemon=True) for c in copiers]
    for t in threads:
        t.start()
    time.sleep(3.0)  # the copiers' JVMs start and the first transactions commit before any fault
    nemesis = Nemesis(kcluster, seed=random.randrange(1 << 30))
    nemesis.start()
    try:
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.monotonic() + 5))
    finally:
        nemesis.stop()
        for c in copiers:
            c.kill()
    summary = (f"copied in {time.monotonic() - started:.1f} s; faults {dict(nemesis.faults)} (seed {nemesis.seed}), "
               f"copier starts {[c.starts for c in copiers]}, exits {[c.exits for c in copiers]}, "
               f"problems {nemesis.problems}")
    print(summary)
    stuck = "\n".join(f"--- copier {c.partition} (run {c.starts}) ---\n{c.tail()}" for c in copiers if not c.done)
    assert not stuck, f"a copier did not finish within {COPY_DEADLINE_S} s: {summary}\n{stuck}"
    assert sum(nemesis.faults.values()) >= 3, f"too few faults to prove anything: {summary}"

    copied = read_committed(kcluster.bootstrap, OUTPUT)
    got = collections.Counter(v for values in copied.values() for v in values)
    want = collections.Counter(v for values in expected.values() for v in values)
    duplicated = sorted(v for v, n in got.items() if n > 1)
    missing = sorted(set(want) - set(got))
    unexpected = sorted(set(got) - set(want))
    assert (duplicated, missing, unexpected) == ([], [], []), (
        f"{len(duplicated)} values copied more than once (e.g. {duplicated[:5]}), {len(missing)} missing "
        f"(e.g. {missing[:5]}), {len(unexpected)} never produced; {summary}")
    with Admin(kcluster.bootstrap) as admin:
        committed = admin.fetch_offsets(GROUP, [(INPUT, p) for p in range(PARTITIONS)])
    assert {p: c.offset for (_, p), c in committed.items()} == {p: RECORDS_PER_PARTITION for p in range(PARTITIONS)}
