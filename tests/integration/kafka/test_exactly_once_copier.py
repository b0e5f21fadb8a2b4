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
import os
import random
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lowtide.client import Admin, Consumer, Producer
from lowtide.client.admin import OffsetSpec
from lowtide.errors import LowtideError
from lowtide.frontdoor.transactions.txn_records import TXN_STATE_TOPIC, partition_for_transactional_id
from lowtide.groups import OFFSETS_TOPIC, partition_for_group
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.messages import TopicPartition
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.kafka_tools import java_command, kafka_tools_manifest

INPUT, OUTPUT, GROUP = "copy-in", "copy-out", "copy-group"
PARTITIONS = 2
RECORDS_PER_PARTITION = 8_000  # the long run (make chaos-eos) copies 200,000
TRANSACTION_SIZE = 50
COPY_DEADLINE_S = 150
COPIER_CLASS = "org.apache.kafka.tools.TransactionalMessageCopier"

pytestmark = [pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    # transaction.version finalized at 1: the copier (a Kafka 4 client, which speaks version 2 when
    # it may) runs transactions version 1 (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn v4);
    # test_newest_kafka_clients.py runs the newest one on version 2.
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("eos-copier"), replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        session_timeout_ms=2000, extra_env={"LOWTIDE_KAFKA_TRANSACTION_VERSION": "1"}))


def copier_command(lib: str, *, partition: int, bootstrap: str) -> list[str]:
    return [*java_command(lib=lib, heap="256M"), COPIER_CLASS,
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

    def main_thread_stack(self) -> str:
        """Where a copier that is still running waits: its main thread in a JVM thread dump
        (SIGQUIT makes the JVM print one to its output and carry on)."""
        if self._proc is None or self._proc.poll() is not None:
            return ""
        self._proc.send_signal(signal.SIGQUIT)
        time.sleep(1.5)
        log = self.logs / f"copier-{self.partition}-{self.starts}.log"
        lines = log.read_text(errors="replace").splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith('"main"')), None)
        if start is None:
            return ""
        end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
        return "\n".join(lines[start:min(end, start + 40)])

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()

    def remaining(self) -> int | None:
        """Records its current run still has to copy (its last JSON status line), 0 once done."""
        if self.done:
            return 0
        log = self.logs / f"copier-{self.partition}-{self.starts}.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            if line.startswith("{") and '"remaining"' in line:
                try:
                    return int(json.loads(line)["remaining"])
                except (ValueError, KeyError):
                    continue
        return None


def finished(log: Path) -> bool:
    """The copier printed ShutdownComplete with nothing remaining (its JSON status lines)."""
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"ShutdownComplete"' in line:
            return json.loads(line).get("remaining") == 0
    return False


class Nemesis:
    """Every ``interval_s``: kill -9 (and restart) or SIGSTOP (and resume) a leader of an output
    partition, of the group's offsets partition or of a copier's transaction-state partition, or
    kill -9 and restart the front door or redis-server.

    With ``progress`` (a count that grows as the copiers copy), a fault also waits until the
    copiers moved on since the last one healed (at most ``PROGRESS_WAIT_S``): each fault costs a
    copier seconds (an aborted transaction, a rejoin), and once restarts took about a second the
    faults came so close together that a copier could not finish in time, whatever it did right."""

    PROGRESS_WAIT_S = 20.0

    def __init__(self, cluster: LocalCluster, *, seed: int, interval_s: float = 2.0,
                 progress: Callable[[], int] | None = None) -> None:
        self.progress = progress
        self._mark: int | None = None
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
            self._await_progress()
            if self._stop.is_set():
                return
            try:
                self._one_fault()
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                self.problems.append(f"{type(exc).__name__}: {exc}")
            if self.progress is not None:
                self._mark = self.progress()

    def _await_progress(self) -> None:
        if self.progress is None or self._mark is None:
            return
        until = time.monotonic() + self.PROGRESS_WAIT_S
        while self.progress() <= self._mark and time.monotonic() < until and not self._stop.wait(0.2):
            pass

    def _one_fault(self) -> None:
        kind = self.rng.choice(["kill-leader", "kill-leader", "pause-leader", "kill-frontdoor", "kill-redis"])
        if kind == "kill-redis":
            # Redis holds nothing of transactions: states are in __transaction_state, producer ids
            # in blocks claimed in the metadata store (etcd).
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
                time.sleep(2.0)  # the fault itself: a leader hung this long (past the 2 s session timeout)
                self.cluster.resume(name)
        self.faults[kind] += 1


class EndedTransactions:
    """The broker's own account of which transaction protocol the copiers ran: every front door's
    ``lowtide_transactions_ended_total{transaction_version,result}`` (its coordinator counts each
    transaction it completes), scraped every ``interval_s`` while the copy runs. A front door the
    nemesis kills starts counting again from 0, so each process (name, pid) is summed at the last
    value read from it: what a killed one completed after its last scrape is not counted."""

    METRIC = "lowtide_transactions_ended_total{"

    def __init__(self, cluster: LocalCluster, *, interval_s: float = 0.5) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self._last: dict[tuple[str, int], dict[tuple[str, str], float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ended-transactions", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[tuple[str, str], int]:
        """(transaction version, result) -> transactions ended, after one last scrape."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._scrape()
        total: collections.Counter[tuple[str, str]] = collections.Counter()
        for counts in self._last.values():
            total.update({k: int(v) for k, v in counts.items()})
        return dict(total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._scrape()

    def _scrape(self) -> None:
        for e in self.cluster.services("frontdoor"):
            try:
                text = urllib.request.urlopen(e.metrics_url, timeout=2).read().decode()
            except OSError:
                continue  # being restarted: its previous process's last values stay counted
            counts: dict[tuple[str, str], float] = {}
            for line in text.splitlines():
                if line.startswith(self.METRIC):
                    labels = dict(item.split("=", 1) for item in line[len(self.METRIC):].split("}", 1)[0].split(","))
                    key = (labels["transaction_version"].strip('"'), labels["result"].strip('"'))
                    counts[key] = float(line.rsplit(" ", 1)[1])
            self._last[(e.name, e.pid)] = counts


def describe_isr_gap(cluster: LocalCluster, topic: str) -> str:
    """What a failed wait for a full ISR needs to be understood: each partition's state, whether
    each replica process runs, and each replica's log lines about ``topic`` and its warnings."""
    states = s.store(cluster).partition_states(topic)
    lines = [f"{st.topic}-{st.partition}: leader {st.leader} epoch {st.leader_epoch} replicas {list(st.replicas)} "
             f"isr {list(st.isr)} partition epoch {st.partition_epoch}" for st in states]
    for e in cluster.services("replica"):
        lines.append(f"{e.name}: pid {e.pid} {'running' if _alive(e.pid) else 'NOT RUNNING'}")
    short = [f"{st.topic}-{st.partition}" for st in states if len(st.isr) < len(st.replicas)]
    # Whether each leader still answers each follower's rounds: a follower that stopped fetching
    # is another bug than a leader that does not take it back.
    before = {e.name: _rounds(e.metrics_url) for e in cluster.services("replica")}
    time.sleep(2.0)
    for e in cluster.services("replica"):
        after = _rounds(e.metrics_url)
        lines.append(f"{e.name} follower rounds answered in 2 s: "
                     f"{ {k: v - before[e.name].get(k, 0) for k, v in after.items()} }")
    for e in cluster.services("replica"):
        try:
            text = Path(e.log).read_text(errors="replace").splitlines()
        except OSError as exc:
            lines.append(f"--- {e.name}: no log ({exc})")
            continue
        hits = [ln for ln in text if f'"{topic}"' in ln or '"WARNING"' in ln or '"ERROR"' in ln or "Traceback" in ln]
        lines.append(f"--- {e.name} log: {topic}, warnings, errors (last 40 of {len(hits)}; short: {short}) ---")
        lines += hits[-40:]
    return "\n".join(lines)


def _rounds(metrics_url: str) -> dict[str, float]:
    """``lowtide_replication_rounds_total`` of one replica, by follower and transport."""
    try:
        text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    except OSError as exc:
        return {"unreachable": 0.0, str(exc): 0.0}
    return {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("lowtide_replication_rounds_total{")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


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


@dataclass
class CopyOutcome:
    """What one copy under faults did and what the output holds."""

    seconds: float
    seed: int
    faults: dict[str, int]
    starts: list[int]
    exits: list[list[int]]
    problems: list[str]
    stuck: str  # the output of copiers that did not finish ("" when all did)
    records: int = 0
    read: int = 0
    duplicated: list[bytes] = field(default_factory=list)
    missing: list[bytes] = field(default_factory=list)
    unexpected: list[bytes] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)
    # (transaction version, "commit" | "abort") -> transactions the front doors completed
    # (EndedTransactions: a lower bound, what killed front doors did after their last scrape is missing).
    ended: dict[tuple[str, str], int] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"copied in {self.seconds:.1f} s; faults {self.faults} (seed {self.seed}), copier starts "
                f"{self.starts}, exits {self.exits}, problems {self.problems}, transactions ended {self.ended}")

    def ended_in_version(self, version: str) -> int:
        return sum(n for (v, _), n in self.ended.items() if v == version)

    @property
    def exactly_once(self) -> bool:
        return not (self.stuck or self.duplicated or self.missing or self.unexpected) and \
            set(self.committed.values()) == {self.records // PARTITIONS}


def copy_under_faults(cluster: LocalCluster, *, lib: str, records_per_partition: int, deadline_s: float,
                      seed: int, logs: Path, fault_interval_s: float = 2.0) -> CopyOutcome:
    """Fill the input, run the copiers to its end while the nemesis works, read the output."""
    for topic in (INPUT, OUTPUT):
        s.create_topic(cluster, topic, partitions=PARTITIONS, rf=3, config={"min.insync.replicas": "2"})
    expected: dict[int, list[bytes]] = {}
    with Producer(cluster.bootstrap) as producer:
        for p in range(PARTITIONS):
            expected[p] = [f"{p}-{i}".encode() for i in range(records_per_partition)]
            for value in expected[p]:
                producer.send(INPUT, value, partition=p)
        producer.flush()

    copiers = [Copier(lib, partition=p, bootstrap=cluster.kafka_bootstrap, logs=logs) for p in range(PARTITIONS)]
    started = time.monotonic()
    deadline = started + deadline_s
    threads = [threading.Thread(target=c.run, args=(deadline,), daemon=True) for c in copiers]
    for t in threads:
        t.start()
    # Faults start once the copiers' first transactions exist: their coordinator topics are then
    # there for the nemesis to aim at.
    s.wait_until(lambda: {OFFSETS_TOPIC, TXN_STATE_TOPIC} <= set(s.store(cluster).topics()), timeout_s=60,
                 what="the copiers' first transactions")
    total = records_per_partition * PARTITIONS

    def copied() -> int:
        return total - sum(records_per_partition if (r := c.remaining()) is None else r for c in copiers)

    nemesis = Nemesis(cluster, seed=seed, interval_s=fault_interval_s, progress=copied)
    ended = EndedTransactions(cluster)
    ended.start()
    nemesis.start()
    try:
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.monotonic() + 5))
    finally:
        nemesis.stop()
        ended_counts = ended.stop()
        tails = {c.partition: c.tail() for c in copiers if not c.done}
        stacks = {c.partition: c.main_thread_stack() for c in copiers if not c.done}
        for c in copiers:
            c.kill()
    outcome = CopyOutcome(
        seconds=time.monotonic() - started, seed=seed, faults=dict(nemesis.faults), starts=[c.starts for c in copiers],
        exits=[c.exits for c in copiers], problems=nemesis.problems, records=records_per_partition * PARTITIONS,
        ended=ended_counts,
        stuck="\n".join(f"--- copier {c.partition} (run {c.starts}) ---\n{tails[c.partition]}\n{stacks[c.partition]}"
                        for c in copiers if not c.done))
    if outcome.stuck:
        return outcome
    # Read once the faults have settled: every output replica back in the ISR. A leader paused by
    # the last fault may answer ListOffsets from its old high watermark until it learns it was
    # deposed (the client sends no leader epoch), and the read would stop short of the end.
    try:
        s.wait_until(lambda: all(len(st.isr) == len(st.replicas) for st in s.store(cluster).partition_states(OUTPUT)),
                     timeout_s=60, what=f"every {OUTPUT} replica back in the ISR")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{outcome.summary()}\n{describe_isr_gap(cluster, OUTPUT)}") from exc
    copied = read_committed(cluster.bootstrap, OUTPUT)
    got = collections.Counter(v for values in copied.values() for v in values)
    want = collections.Counter(v for values in expected.values() for v in values)
    outcome.read = sum(got.values())
    outcome.duplicated = sorted(v for v, n in got.items() if n > 1)
    outcome.missing = sorted(set(want) - set(got))
    outcome.unexpected = sorted(set(got) - set(want))
    # A stable read (KIP-447's require_stable, what a read_committed consumer asks): the group's log
    # read to its high watermark first, so the last transaction's offsets are in whatever the
    # front door's tail has read so far; retried while a leader of the group's log is not settled.
    with Admin(cluster.bootstrap) as admin:
        def stable() -> bool:
            try:
                committed = admin.fetch_offsets(GROUP, [(INPUT, p) for p in range(PARTITIONS)], require_stable=True)
            except LowtideError:  # COORDINATOR_LOAD_IN_PROGRESS: a leader of the group's log not settled
                return False
            outcome.committed = {p: c.offset for (_, p), c in committed.items() if c.error is None}
            return len(outcome.committed) == PARTITIONS
        try:
            s.wait_until(stable, timeout_s=30, what="a stable read of the copier group's offsets")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{outcome.summary()}") from exc
    return outcome


def test_transactional_message_copier_copies_every_value_exactly_once_while_leaders_front_door_and_redis_die(
        kcluster, tmp_path):
    lib = kafka_tools_manifest()["lib"]
    got = copy_under_faults(kcluster, lib=lib, records_per_partition=RECORDS_PER_PARTITION,
                            deadline_s=COPY_DEADLINE_S, seed=random.randrange(1 << 30), logs=tmp_path)
    print(got.summary())
    assert not got.stuck, f"a copier did not finish within {COPY_DEADLINE_S} s: {got.summary()}\n{got.stuck}"
    assert sum(got.faults.values()) >= 3, f"too few faults to prove anything: {got.summary()}"
    assert (got.duplicated, got.missing, got.unexpected) == ([], [], []), (
        f"{len(got.duplicated)} values copied more than once (e.g. {got.duplicated[:5]}), {len(got.missing)} "
        f"missing (e.g. {got.missing[:5]}), {len(got.unexpected)} never produced; {got.summary()}")
    assert got.committed == {p: RECORDS_PER_PARTITION for p in range(PARTITIONS)}
    # The broker's side: the coordinator completed the copiers' transactions in version 1.
    assert got.ended.get(("1", "commit"), 0) > 0 and got.ended_in_version("2") == 0, got.summary()


# -- the long run (make chaos-eos) ---------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``python -m tests.integration.kafka.test_exactly_once_copier --records 200000 --out FILE``:
    the same copy on a bigger input, its outcome appended to FILE as a table; exit 1 on a violation.
    The cluster finalizes ``transaction.version`` 2 (its default): the copiers run version 2."""
    import argparse
    import datetime as dt
    import subprocess as sp
    import tempfile

    from lowtide.common.procs import require_tool

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--records", type=int, default=200_000, help="records per input partition")
    parser.add_argument("--minutes", type=float, default=20, help="how long the copiers may take")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="markdown file the result is appended to")
    args = parser.parse_args(argv)
    require_tool("java", "install a Java 17+ runtime (make setup does)")
    manifest = json.loads((Path(__file__).resolve().parents[3] / ".tools" / "kafka-tools.json").read_text())
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    with tempfile.TemporaryDirectory(prefix="lowtide-eos-") as tmp:
        cluster = LocalCluster(ClusterConfig(data_dir=Path(tmp) / "cluster", replicas=3,
                                             replica_config=dict(DEFAULT_REPLICA_CONFIG), session_timeout_ms=2000))
        cluster.up(detach=True)
        try:
            (Path(tmp) / "logs").mkdir()
            got = copy_under_faults(cluster, lib=manifest["lib"], records_per_partition=args.records,
                                    deadline_s=args.minutes * 60, seed=seed, logs=Path(tmp) / "logs")
        finally:
            cluster.down(timeout_s=10)
    commit = sp.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = [("date", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")), ("commit", commit), ("seed", seed),
            ("records", f"{got.records} ({PARTITIONS} partitions, transactions of {TRANSACTION_SIZE})"),
            ("copy time", f"{got.seconds:.0f} s"),
            ("faults", ", ".join(f"{k} {v}" for k, v in sorted(got.faults.items()))),
            ("copier starts", got.starts), ("read_committed records read", got.read),
            ("values copied twice or more", len(got.duplicated)), ("values missing", len(got.missing)),
            ("transactions ended (version, result)", got.ended),
            ("committed offsets", got.committed), ("result", "PASS" if got.exactly_once else "FAIL")]
    table = "\n".join(["", "## Exactly-once copy (TransactionalMessageCopier) under faults", "",
                       "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""])
    print(table)
    if got.stuck:
        print(got.stuck)
    if args.out is not None:
        with args.out.open("a") as f:
            f.write(table)
    return 0 if got.exactly_once else 1


if __name__ == "__main__":
    raise SystemExit(main())
