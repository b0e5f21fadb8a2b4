"""Idempotent produce with Kafka's own clients under faults (issue 34, docs/design/idempotence.md).

    python -m tests.chaos.kafka_idempotence --minutes 10 --seed 7 --out tests/chaos/RESULTS.md

Starts a local cluster of 3 replicas (3 s session timeout, 3 s ISR lag limit, as ``tests.chaos.run``)
and two RF 3 topics with min.insync.replicas=2, then runs two idempotent acks=all producers at once,
each on its own topic, through the replicas' Kafka listeners:

* Kafka's own ``VerifiableProducer`` (kafka-tools, what Kafka's system tests drive;
  ``.tools/bin/kafka-verifiable-producer``) with ``enable.idempotence=true``, values ``1.<n>``;
  it prints a JSON line per acknowledged value naming its partition and offset;
* confluent-kafka (librdkafka) with ``enable.idempotence=True``, values ``2.<n>``, the partition and
  offset taken from each delivery report.

Meanwhile ``RandomNemesis`` kills -9 and restarts replicas, SIGSTOPs and SIGCONTs them, the leaders
especially (``KAFKA_FAULT_KINDS``; with 3 partitions on 3 replicas every replica leads one, so every
kill is a leader's). Then it heals, stops the producers (each flushes what it still holds), reads
every partition in full from its leader from offset 0, and checks per producer:

``duplicated``  a value stored more than once (the producer sent each value once: a copy is a retry
                the leader appended again, what idempotence exists to prevent);
``lost``        an acknowledged value stored nowhere;
``misplaced``   an acknowledged (partition, offset) holding another value, or nothing.

A value whose send failed (delivery timeout, a fatal producer error) may be stored or not, but not
twice. Prints a summary table, appends it to ``--out``, exits 1 on a violation, 2 on a harness
error. A seed reproduces the sequence of faults (not their timing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lowtide.errors import LowtideError
from lowtide.localcluster import LocalCluster
from tests.chaos.harness import SESSION_TIMEOUT_MS, ChaosEnv, log_tails, start_cluster, wait_until
from tests.chaos.nemesis import Nemesis, RandomNemesis
from tests.chaos.run import git_commit

REPO = Path(__file__).resolve().parents[2]
VERIFIABLE_PRODUCER = REPO / ".tools" / "bin" / "kafka-verifiable-producer"
PARTITIONS = 3
# Replica faults only: kill -9 and SIGSTOP of leaders and followers (no redis-server restart).
KAFKA_FAULT_KINDS = ("kill_restart", "pause_resume", "pause_leader", "leader_pause_follower_restart")
CLIENTS = ("verifiable-producer", "confluent-kafka")
TOPICS = {"verifiable-producer": "kidem-java", "confluent-kafka": "kidem-confluent"}
PREFIXES = {"verifiable-producer": 1, "confluent-kafka": 2}  # VerifiableProducer takes an integer prefix
# A short request timeout: a paused leader's request times out and is retried (the case idempotence
# answers), instead of waiting 30 s for a SIGCONT.
REQUEST_TIMEOUT_MS = 5000
DELIVERY_TIMEOUT_MS = 120_000
# VerifiableProducer sets retries=0 unless its --producer.config says otherwise (Kafka's system tests
# give it retries too): the idempotent producer needs them.
JAVA_PRODUCER_CONFIG = {
    "enable.idempotence": "true", "acks": "all", "retries": "2147483647", "max.in.flight.requests.per.connection": "5",
    "linger.ms": "5", "request.timeout.ms": str(REQUEST_TIMEOUT_MS), "delivery.timeout.ms": str(DELIVERY_TIMEOUT_MS),
    "retry.backoff.ms": "100", "metadata.max.age.ms": "5000",
}
CONFLUENT_CONFIG = {
    "enable.idempotence": True, "acks": "all", "max.in.flight.requests.per.connection": 5, "linger.ms": 5,
    "request.timeout.ms": REQUEST_TIMEOUT_MS, "message.timeout.ms": DELIVERY_TIMEOUT_MS,
    "retry.backoff.ms": 100, "topic.metadata.refresh.interval.ms": 5000,
}


# ------------------------------------------------------------------------------------- checking


@dataclass
class ValueCheck:
    """What the final read of one producer's topic says about the values it sent."""

    acked: int
    stored: int  # records in the final read
    duplicated: dict[str, list[tuple[int, int]]]  # value -> every (partition, offset) holding it
    lost: list[str]
    misplaced: list[tuple[str, int, int, str | None]]  # (value, partition, offset, what is there)
    foreign: int  # stored values this producer did not send (not of its prefix)

    @property
    def extra_copies(self) -> int:
        return sum(len(where) - 1 for where in self.duplicated.values())

    @property
    def ok(self) -> bool:
        return not (self.duplicated or self.lost or self.misplaced or self.foreign)


def check_values(prefix: str, acked: dict[str, tuple[int, int]],
                 final: dict[int, list[tuple[int, str | None]]]) -> ValueCheck:
    """``acked``: value -> (partition, offset) the producer was told; ``final``: partition -> every
    (offset, value) it holds from offset 0."""
    where: dict[str, list[tuple[int, int]]] = {}
    at: dict[tuple[int, int], str | None] = {}
    foreign = stored = 0
    for partition, records in final.items():
        for offset, value in records:
            stored += 1
            at[(partition, offset)] = value
            if value is None or not value.startswith(prefix + "."):
                foreign += 1
                continue
            where.setdefault(value, []).append((partition, offset))
    duplicated = {v: sorted(w) for v, w in where.items() if len(w) > 1}
    lost = sorted(v for v in acked if v not in where)
    misplaced = [(v, p, o, at.get((p, o))) for v, (p, o) in sorted(acked.items()) if at.get((p, o)) != v]
    return ValueCheck(acked=len(acked), stored=stored, duplicated=duplicated, lost=lost, misplaced=misplaced,
                      foreign=foreign)


# ------------------------------------------------------------------------------------ producers


@dataclass
class ProducerRun:
    """One producer's side of a run: what it sent and what it was told."""

    client: str
    topic: str
    prefix: str
    sent: int = 0
    acked: dict[str, tuple[int, int]] = field(default_factory=dict)
    acked_twice: int = 0  # a value acknowledged more than once (a client bug, never expected)
    failed: Counter[str] = field(default_factory=Counter)  # send errors by name
    client_errors: Counter[str] = field(default_factory=Counter)  # errors outside a send (librdkafka error_cb)
    errors: list[str] = field(default_factory=list)  # harness-level problems
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, value: str, partition: int, offset: int) -> None:
        with self._lock:
            if value in self.acked:
                self.acked_twice += 1
            self.acked[value] = (partition, offset)

    def fail(self, name: str) -> None:
        with self._lock:
            self.failed[name] += 1

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)


class VerifiableProducer:
    """Kafka's ``VerifiableProducer`` as a child process, its JSON lines parsed as they come."""

    def __init__(self, run: ProducerRun, bootstrap: str, rate: int, work: Path, tool: Path) -> None:
        self.run = run
        work.mkdir(parents=True, exist_ok=True)
        config = work / "verifiable-producer.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in JAVA_PRODUCER_CONFIG.items()))
        self.stderr_path = work / "verifiable-producer.stderr"
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(tool), "--topic", run.topic, "--bootstrap-server", bootstrap, "--producer.config", str(config),
             "--value-prefix", run.prefix, "--throughput", str(rate), "--max-messages", "-1", "--acks", "-1"],
            stdout=subprocess.PIPE, stderr=self._stderr, stdin=subprocess.DEVNULL, text=True, bufsize=1,
            start_new_session=True)
        self.shut_down = False
        self.reader = threading.Thread(target=self._read, name="verifiable-producer-out", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                self.run.client_errors["non-JSON line"] += 1
                continue
            name = event.get("name")
            if name == "producer_send_success":
                self.run.ack(event["value"], int(event["partition"]), int(event["offset"]))
            elif name == "producer_send_error":
                self.run.fail(str(event.get("exception", "?")).rsplit(".", 1)[-1])
            elif name == "tool_data":
                self.run.sent = int(event.get("sent", 0))
            elif name == "shutdown_complete":
                self.shut_down = True

    def exited(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"VerifiableProducer exited {self.proc.returncode}: {_tail(self.stderr_path)}"

    def stop(self, timeout_s: float = 150.0) -> None:
        """SIGTERM: the tool stops sending, closes its producer (which waits for every send still in
        flight to be acknowledged or to fail) and prints its totals."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.run.errors.append(f"VerifiableProducer did not exit {timeout_s:.0f}s after SIGTERM: killed")
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        self._stderr.close()
        if not self.shut_down:
            self.run.errors.append(f"VerifiableProducer exited {self.proc.returncode} without shutdown_complete; "
                                   f"stderr: {_tail(self.stderr_path)}")


class ConfluentProducer:
    """A confluent-kafka idempotent producer in a thread, ``rate`` values a second."""

    def __init__(self, run: ProducerRun, bootstrap: str, rate: int) -> None:
        self.run = run
        self.bootstrap = bootstrap
        self.rate = rate
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="confluent-producer", daemon=True)
        self.thread.start()

    def _delivered(self, err, msg) -> None:
        value = msg.value().decode()
        if err is None:
            self.run.ack(value, msg.partition(), msg.offset())
        else:
            self.run.fail(err.name())

    def _error(self, err) -> None:
        self.run.client_errors[("FATAL " if err.fatal() else "") + err.name()] += 1

    def _produce(self) -> None:
        from confluent_kafka import KafkaException, Producer

        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "error_cb": self._error, **CONFLUENT_CONFIG})
            n, began = 0, time.monotonic()
            while not self.stopping.is_set():
                due = int((time.monotonic() - began) * self.rate)
                while n < due and not self.stopping.is_set():
                    try:
                        producer.produce(self.run.topic, value=f"{self.run.prefix}.{n}".encode(),
                                         on_delivery=self._delivered)
                    except BufferError:
                        producer.poll(0.05)
                        continue
                    n += 1
                    self.run.sent = n
                producer.poll(0.01)
            left = producer.flush(DELIVERY_TIMEOUT_MS / 1000 + 30)
            if left:
                self.run.errors.append(f"confluent-kafka: {left} values neither acknowledged nor failed by flush")
        except KafkaException as exc:
            self.run.errors.append(f"confluent-kafka: {exc!r}")

    def exited(self) -> str | None:
        return None if self.thread.is_alive() else f"confluent-kafka producer ended: {self.run.errors}"

    def stop(self, timeout_s: float = 180.0) -> None:
        self.stopping.set()
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.run.errors.append(f"confluent-kafka producer still flushing after {timeout_s:.0f}s")


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------- a run


@dataclass
class KafkaRunResult:
    seed: int
    minutes: float
    started_at: str
    elapsed_s: float
    commit: str
    faults: dict[str, int]
    producers: dict[str, ProducerRun]
    checks: dict[str, ValueCheck]
    harness_errors: list[str] = field(default_factory=list)
    fault_log: list[str] = field(default_factory=list)

    @property
    def violations(self) -> bool:
        return any(not c.ok for c in self.checks.values())

    @property
    def ok(self) -> bool:
        return not self.violations and not self.harness_errors

    def table(self) -> str:
        rows = [("date", self.started_at), ("seed", str(self.seed)),
                ("duration", f"{self.minutes:g} min of faults, {self.elapsed_s:.0f} s in all"),
                ("commit", self.commit),
                ("topics", f"{PARTITIONS} partitions, RF 3, min.insync.replicas=2; producers idempotent, acks=all")]
        rows += [(f"faults: {k}", str(self.faults.get(k, 0))) for k in KAFKA_FAULT_KINDS]
        for client, run in self.producers.items():
            c = self.checks.get(client)
            rows += [(f"{client}: values sent", str(run.sent)),
                     (f"{client}: acknowledged", str(len(run.acked))),
                     (f"{client}: sends failed", ", ".join(f"{k} {v}" for k, v in sorted(run.failed.items()))
                      or "none"),
                     (f"{client}: client errors", ", ".join(f"{k} {v}" for k, v in sorted(run.client_errors.items()))
                      or "none")]
            if c is None:
                continue
            rows += [(f"{client}: records read", str(c.stored)),
                     (f"{client}: values stored twice or more", f"{len(c.duplicated)} ({c.extra_copies} extra copies)"),
                     (f"{client}: acknowledged values lost", str(len(c.lost))),
                     (f"{client}: acknowledged offsets holding another value", str(len(c.misplaced))),
                     (f"{client}: foreign values", str(c.foreign))]
        rows.append(("result", "PASS" if self.ok else ("FAIL" if self.violations else "HARNESS ERROR")))
        out = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
        for client, c in self.checks.items():
            if c.ok:
                continue
            acked = self.producers[client].acked
            lines = [f"- `{v}` at {', '.join(f'{p}:{o}' for p, o in w)}"
                     f" (acknowledged at {':'.join(map(str, acked[v])) if v in acked else 'none: its send failed'})"
                     for v, w in list(c.duplicated.items())[:10]]
            lines += [f"- lost: `{v}` acknowledged at {':'.join(map(str, acked[v]))}" for v in c.lost[:10]]
            lines += [f"- misplaced: `{v}` acknowledged at {p}:{o}, which holds {there!r}"
                      for v, p, o, there in c.misplaced[:10]]
            out += ["", f"{client}, first violations (partition:offset):", ""] + lines
        if self.harness_errors:
            out += ["", "Harness errors:", ""] + [f"- {e}" for e in self.harness_errors]
        return "\n".join(out)


def _settle(env: ChaosEnv, topics: list[str], say: Callable[[str], None]) -> None:
    try:
        wait_until(lambda: len(env.live_brokers()) == 3, timeout_s=30, what="every replica live")
        for topic in topics:
            for p in range(PARTITIONS):
                wait_until(lambda t=topic, p=p: env.leader(t, p) >= 0 and len(env.state(t, p).isr) == 3,
                           timeout_s=30, what=f"{topic}-{p} led with a full ISR")
    except AssertionError as exc:
        say(f"settle: {exc} (checking anyway)")


def read_partition(env: ChaosEnv, topic: str, partition: int, acked_end: int,
                   timeout_s: float = 30.0) -> list[tuple[int, str | None]]:
    """Every record of the partition, from offset 0, from its leader, once its HW covers every
    acknowledged offset (or after ``timeout_s``: then the check says what is missing)."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            st = env.state(topic, partition)
            if st.leader >= 0:
                info = env.describe(st.leader, topic, partition)
                if info.role == "leader" and (info.high_watermark >= acked_end or time.monotonic() > deadline):
                    _lso, _hw, records = env.read_from(st.leader, topic, partition, 0, epoch=st.leader_epoch,
                                                       timeout_s=60)
                    return [(o, None if v is None else v.decode(errors="replace")) for o, v in records]
        except (LowtideError, AssertionError) as exc:
            last = exc
            for r in range(3):
                env.forget(r)
        if time.monotonic() > deadline + 15:
            raise AssertionError(f"no final read of {topic}-{partition}: {last!r}")
        time.sleep(0.2)


def run_kafka_idempotence(*, minutes: float, seed: int, data_dir: Path | None = None, rate: int = 400,
                          clients: tuple[str, ...] = CLIENTS, say: Callable[[str], None] = print,
                          keep_data: bool = False, tool: Path = VERIFIABLE_PRODUCER,
                          enough: Callable[[Mapping[str, int]], bool] | None = None) -> KafkaRunResult:
    """``minutes`` of faults; with ``enough``, also until it holds for the fault counts so far (at
    most twice as long again): on a loaded machine a fault takes longer to heal and fewer fit."""
    started_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    t0 = time.monotonic()
    own_dir = data_dir is None
    data_dir = Path(data_dir or tempfile.mkdtemp(prefix="lowtide-kafka-idem-"))
    harness_errors: list[str] = []
    clusters: list[LocalCluster] = []
    nemesis: Nemesis | None = None
    env: ChaosEnv | None = None
    runs = {c: ProducerRun(c, TOPICS[c], str(PREFIXES[c])) for c in clients}
    checks: dict[str, ValueCheck] = {}
    producers: dict[str, VerifiableProducer | ConfluentProducer] = {}
    say(f"kafka idempotence: seed {seed}, {minutes:g} min, {', '.join(clients)} at {rate}/s each, in {data_dir}")
    try:
        cluster = start_cluster(data_dir / "cluster", register=clusters.append)
        env = ChaosEnv(cluster)
        for run in runs.values():
            env.create_topic(run.topic, partitions=PARTITIONS, rf=3)
        # The replicas' Kafka listeners (and the front door's): a client that lost one finds another.
        bootstrap = ",".join([s.kafka for s in cluster.services("replica") if s.kafka]
                             + ([cluster.kafka_bootstrap] if cluster.kafka_bootstrap else []))
        nemesis = Nemesis(cluster, say=say)
        random_nemesis = RandomNemesis(nemesis, seed=seed, topic=runs[clients[0]].topic, partitions=PARTITIONS,
                                       session_timeout_ms=SESSION_TIMEOUT_MS, kinds=KAFKA_FAULT_KINDS)
        for client, run in runs.items():
            producers[client] = (VerifiableProducer(run, bootstrap, rate, data_dir / "client", tool)
                                 if client == "verifiable-producer" else ConfluentProducer(run, bootstrap, rate))
        # some acknowledged values from each before the first fault
        def started() -> bool:
            ended = [e for e in (p.exited() for p in producers.values()) if e]
            if ended:
                raise RuntimeError("; ".join(ended))
            return all(r.acked_count() >= rate for r in runs.values())

        wait_until(started, timeout_s=60, what=f"{rate} values acknowledged to each producer")
        stop = threading.Event()
        thread = threading.Thread(target=random_nemesis.run, args=(stop,), name="nemesis", daemon=True)
        thread.start()
        stop.wait(minutes * 60)
        if enough is not None:
            more_until = time.monotonic() + 2 * minutes * 60
            while not enough(nemesis.counts()) and time.monotonic() < more_until:
                time.sleep(0.5)
        stop.set()
        thread.join(60)
        say("kafka idempotence: healing")
        nemesis.heal()
        if random_nemesis.error is not None:
            harness_errors.append(f"nemesis: {random_nemesis.error!r}")
        _settle(env, [r.topic for r in runs.values()], say)
        time.sleep(1.0)  # the producers go on on the healed cluster for a moment
        say("kafka idempotence: stopping the producers (each flushes what it holds)")
        for producer in producers.values():
            producer.stop()
        say("kafka idempotence: final read")
        for client, run in runs.items():
            harness_errors += [f"{client}: {e}" for e in run.errors]
            if run.acked_twice:
                harness_errors.append(f"{client}: {run.acked_twice} values acknowledged twice by the client")
            final = {}
            for p in range(PARTITIONS):
                acked_end = max((o + 1 for pp, o in run.acked.values() if pp == p), default=0)
                final[p] = read_partition(env, run.topic, p, acked_end)
            checks[client] = check_values(run.prefix, run.acked, final)
    except Exception as exc:  # noqa: BLE001 - reported as a harness error with the log tails
        harness_errors.append(f"{type(exc).__name__}: {exc}")
        for c in clusters:
            say(log_tails(c))
    finally:
        for producer in producers.values():
            if isinstance(producer, VerifiableProducer) and producer.proc.poll() is None:
                producer.proc.kill()
            elif isinstance(producer, ConfluentProducer):
                producer.stopping.set()
        if env is not None:
            env.close()
        failed = harness_errors or any(not c.ok for c in checks.values())
        for c in clusters:
            if failed:
                say(log_tails(c, lines=30))
            c.down(timeout_s=10)
        if own_dir and not keep_data and not failed:
            shutil.rmtree(data_dir, ignore_errors=True)
    return KafkaRunResult(seed=seed, minutes=minutes, started_at=started_at, elapsed_s=time.monotonic() - t0,
                          commit=git_commit(), faults=dict(nemesis.counts()) if nemesis else {}, producers=runs,
                          checks=checks, harness_errors=harness_errors,
                          fault_log=[f.describe() for f in nemesis.faults] if nemesis else [])


def write_results(result: KafkaRunResult, out: Path, *, title_note: str = "") -> None:
    section = (f"\n## {result.started_at} — seed {result.seed}, {result.minutes:g} min, idempotent Kafka producers "
               f"(VerifiableProducer, confluent-kafka){title_note}\n\n{result.table()}\n")
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.kafka_idempotence",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to inject faults")
    parser.add_argument("--seed", type=int, default=None, help="nemesis seed (default: random)")
    parser.add_argument("--rate", type=int, default=400, help="values a second, per producer")
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated, of {', '.join(CLIENTS)}")
    parser.add_argument("--out", type=Path, default=None, help="markdown file to append the summary to")
    parser.add_argument("--data-dir", type=Path, default=None, help="cluster directory (default: a temp dir)")
    parser.add_argument("--keep-data", action="store_true", help="keep the cluster directory after a pass")
    args = parser.parse_args(argv)
    clients = tuple(c.strip() for c in args.clients.split(",") if c.strip())
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown:
        parser.error(f"unknown client(s) {unknown}")
    if "verifiable-producer" in clients and not os.access(VERIFIABLE_PRODUCER, os.X_OK):
        print(f"{VERIFIABLE_PRODUCER} is missing: run 'make kafka-tools'", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    result = run_kafka_idempotence(minutes=args.minutes, seed=seed, data_dir=args.data_dir, rate=args.rate,
                                   clients=clients, keep_data=args.keep_data)
    print(result.table())
    print("\n".join(result.fault_log))
    if args.out is not None:
        write_results(result, args.out)
        print(f"appended to {args.out}")
    if result.harness_errors:
        return 2
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
