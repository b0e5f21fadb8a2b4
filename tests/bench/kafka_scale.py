"""Apache Kafka 4.1's side of issue 48's scale curve, on this box. Reports; never asserts.

At each size (quick: 300; full: 300, 3,000 and 10,000 partitions RF 3), a Kafka cluster of its own
is started as a user would run one: KRaft, one controller and three brokers, each a JVM of Kafka's
own jars (``.tools/kafka-tools.json``: ``make kafka-tools``) run as ``kafka.Kafka server.properties``
with the JVM options of ``bin/kafka-server-start.sh`` (G1, ``MaxGCPauseMillis=20``) but a heap of
``-Xms256m -Xmx1g``, Kafka's defaults otherwise (``broker.session.timeout.ms`` 9 s,
``num.recovery.threads.per.data.dir`` 1 as in the stock ``server.properties``), logs at INFO to a
file, storage formatted with ``kafka.tools.StorageTool format``, data under the bench's data dir,
ports from ``find_free_port``. Every JVM is stopped (SIGTERM, then SIGKILL) whatever happens.
Through Kafka's admin API (confluent-kafka, i.e. librdkafka) and producer:

* ``kafka_scale_<n>_create_s``: CreateTopics of one topic of ``n`` partitions RF 3, until the
  metadata shows a leader for every partition (at 10,000: CreateTopics of 5,000 then CreatePartitions
  to 10,000, as Kafka refuses one operation of more than 10,000 metadata records);
* then ``settle_s`` (full 60 s) and a window of ``window_s`` (full 60 s), nothing running against
  the cluster: ``kafka_scale_<n>_idle_cpu_pct``, CPU (utime + stime from /proc) of the four JVMs
  summed, in % of one core, and ``kafka_scale_<n>_idle_cpu_<process>_pct`` per JVM;
  ``kafka_scale_<n>_rss_<process>_mib`` and ``kafka_scale_<n>_fds_<process>`` at the end of the
  window, and ``kafka_scale_<n>_broker_rss_mib`` / ``_broker_fds`` for the largest broker (beside
  lowtide's largest replica);
* ``kafka_scale_<n>_produce_all_s``: one acks=all record to every partition with Kafka's own Java
  producer (``JAVA_CLIENT``: defaults but ``acks=all``, ``linger.ms`` 5; already connected with the
  topic's metadata when its clock starts), until ``flush()`` returns and every send is acknowledged;
  ``kafka_scale_<n>_produce_all_kafka_python_s``: the same with kafka-python's producer (which also
  sends one ProduceRequest per broker holding every ready partition), second: the Java producer's
  round is the first write to each partition (as lowtide's ``scale_<n>_produce_all_s`` is) and its
  JVM's client code is cold, kafka-python's finds every partition written once;
* ``kafka_scale_<n>_delete_records_s``: DeleteRecords of every partition up to offset 1 in one call
  of Kafka's Java Admin (one request per leader), until every partition answered;
  ``kafka_scale_<n>_delete_records_librdkafka_s``: the same to offset 2 through confluent-kafka;
* ``kafka_scale_<n>_failover_s``: kill -9 of broker 2 until the metadata shows every partition it
  led with another leader (includes the broker session timeout);
* ``kafka_scale_<n>_restart_full_isr_s``: that broker started again until every partition's ISR
  has 3 members (includes its log recovery after the unclean shutdown).

A size that cannot finish within ``SIZE_BUDGET_S`` (15 min) or fails otherwise is recorded as error
figures naming the reason, for the metrics it did not reach; the next size runs. When the ``scale``
section runs beside this one, ``run.py`` puts Kafka's value into lowtide's matching figure's ratio.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from lowtide.common.procs import find_free_port
from tests.bench.common import Figure, failed, say
from tests.bench.scale import TICKS, cpu_ticks, open_fds, rss_mib

REPO = Path(__file__).resolve().parents[2]
TOPIC = "kafka-scale-bench"
VICTIM = 2  # broker ids are 1, 2, 3; the controller is 100
CONTROLLER_ID = 100
BROKER_IDS = (1, 2, 3)
SIZE_BUDGET_S = 15 * 60.0
# Kafka's controller refuses a user operation of more than 10,000 metadata records
# (QuorumController's MAX_RECORDS_PER_USER_OP): CreateTopics of 10,000 partitions (a record each, plus
# the topic's) fails with POLICY_VIOLATION "Unable to perform excessively large batch operation.", so
# a larger topic is created as a user must: CreateTopics of this many, then CreatePartitions by as many.
CREATE_CHUNK = 5000
HEAP = ("-Xms256m", "-Xmx1g")
# bin/kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS
JVM_OPTS = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true")

# Kafka's own clients (the Java producer and Admin of kafka-clients), as a single-file Java program run
# by the JDK's source launcher (``java -cp 'lib/*' KafkaScaleClient.java``: no javac, no build); it
# times the work itself, so JVM start and compilation are outside the figure.
JAVA_CLIENT = r"""import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;

/** lowtide bench (kafka_scale): Kafka's own clients, timed inside the JVM.
 *  produce BOOTSTRAP TOPIC N: one acks=all record to each partition, flush; delete BOOTSTRAP TOPIC N OFFSET:
 *  DeleteRecords of every partition up to OFFSET in one Admin call. Prints "elapsed_s SECONDS". */
public class KafkaScaleClient {
    public static void main(String[] args) throws Exception {
        String mode = args[0], bootstrap = args[1], topic = args[2];
        int n = Integer.parseInt(args[3]);
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        // 10,000 partitions' DeleteRecords outlast the default 30 s request timeout on this box
        props.put("request.timeout.ms", "300000");
        props.put("default.api.timeout.ms", "600000");
        props.put("delivery.timeout.ms", "600000");  // >= linger.ms + request.timeout.ms
        if (mode.equals("produce")) {
            props.put("acks", "all");
            props.put("linger.ms", "5");
            props.put("key.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
            props.put("value.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
                producer.partitionsFor(topic);  // connected, with the topic's metadata, before the clock starts
                long t0 = System.nanoTime();
                List<Future<RecordMetadata>> sent = new ArrayList<>(n);
                for (int p = 0; p < n; p++) {
                    sent.add(producer.send(new ProducerRecord<>(topic, p, null, ("kafka-scale-" + p).getBytes())));
                }
                producer.flush();
                for (Future<RecordMetadata> f : sent) f.get();
                System.out.println("elapsed_s " + (System.nanoTime() - t0) / 1e9);
            }
        } else {
            long offset = Long.parseLong(args[4]);
            try (Admin admin = Admin.create(props)) {
                admin.describeCluster().nodes().get();  // connected before the clock starts
                Map<TopicPartition, RecordsToDelete> items = new HashMap<>();
                for (int p = 0; p < n; p++) {
                    items.put(new TopicPartition(topic, p), RecordsToDelete.beforeOffset(offset));
                }
                long t0 = System.nanoTime();
                admin.deleteRecords(items).all().get();
                System.out.println("elapsed_s " + (System.nanoTime() - t0) / 1e9);
            }
        }
    }
}
"""

# (metric, name template, unit) of every figure a size reports, in order; {n} is the size.
PROCS = ("controller", "broker1", "broker2", "broker3")
METRICS: list[tuple[str, str, str]] = [
    ("create_s", "Kafka 4.1: CreateTopics until every partition has a leader, {n} partitions RF 3", "s"),
    ("idle_cpu_pct", "Kafka 4.1: idle CPU, 4 JVMs summed, {n} partitions RF 3", "% of a core"),
    *[(f"idle_cpu_{p}_pct", f"Kafka 4.1: idle CPU, {p}, {{n}} partitions RF 3", "% of a core") for p in PROCS],
    ("broker_rss_mib", "Kafka 4.1: largest broker RSS, {n} partitions RF 3", "MiB"),
    ("broker_fds", "Kafka 4.1: largest broker open descriptors, {n} partitions RF 3", "fds"),
    *[(f"rss_{p}_mib", f"Kafka 4.1: RSS, {p}, {{n}} partitions RF 3", "MiB") for p in PROCS],
    *[(f"fds_{p}", f"Kafka 4.1: open descriptors, {p}, {{n}} partitions RF 3", "fds") for p in PROCS],
    ("produce_all_s", "Kafka 4.1: one acks=all record to every partition (Java producer), {n} partitions RF 3",
     "s"),
    ("produce_all_kafka_python_s", "Kafka 4.1: one acks=all record to every partition (kafka-python), {n} "
     "partitions RF 3", "s"),
    ("delete_records_s", "Kafka 4.1: DeleteRecords of every partition in one call (Java Admin), {n} partitions "
     "RF 3", "s"),
    ("delete_records_librdkafka_s", "Kafka 4.1: DeleteRecords of every partition in one call (librdkafka), {n} "
     "partitions RF 3", "s"),
    ("failover_s", "Kafka 4.1: failover after kill -9 of a broker, {n} partitions RF 3", "s"),
    ("restart_full_isr_s", "Kafka 4.1: broker restart until every ISR is full, {n} partitions RF 3", "s"),
]


def kafka_lib() -> Path:
    """Kafka's jars (``make kafka-tools``), from the manifest ``.tools/kafka-tools.json``."""
    manifest = REPO / ".tools" / "kafka-tools.json"
    try:
        lib = Path(json.loads(manifest.read_text())["lib"])
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeError(f"Kafka's jars are not installed ({manifest}: {exc}); run 'make kafka-tools'") from exc
    if not (lib / f"kafka_2.13-{lib.parent.name}.jar").exists() and not list(lib.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"no Kafka server jar (kafka_2.13-*.jar) in {lib}")
    return lib


class KafkaCluster:
    """One KRaft controller and three brokers on loopback, each a JVM of its own."""

    def __init__(self, data_dir: Path, lib: Path) -> None:
        self.dir, self.lib = data_dir, lib
        self.dir.mkdir(parents=True, exist_ok=True)
        self.controller_port = find_free_port()
        self.ports = {b: find_free_port() for b in BROKER_IDS}
        self.bootstrap = ",".join(f"127.0.0.1:{p}" for p in self.ports.values())
        self.procs: dict[str, subprocess.Popen] = {}
        self.cluster_id = _kafka_uuid()
        self._log4j = self.dir / "log4j2.properties"

    @staticmethod
    def name(node: int) -> str:
        return "controller" if node == CONTROLLER_ID else f"broker{node}"

    def _props(self, node: int) -> Path:
        voters = f"{CONTROLLER_ID}@127.0.0.1:{self.controller_port}"
        common = {"node.id": node, "controller.quorum.voters": voters, "controller.listener.names": "CONTROLLER",
                  "log.dirs": self.dir / self.name(node) / "data", "num.recovery.threads.per.data.dir": 1}
        if node == CONTROLLER_ID:
            props = {"process.roles": "controller", "listeners": f"CONTROLLER://127.0.0.1:{self.controller_port}",
                     "listener.security.protocol.map": "CONTROLLER:PLAINTEXT"}
        else:
            port = self.ports[node]
            props = {"process.roles": "broker", "listeners": f"PLAINTEXT://127.0.0.1:{port}",
                     "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                     "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                     "inter.broker.listener.name": "PLAINTEXT", "offsets.topic.replication.factor": 3,
                     "transaction.state.log.replication.factor": 3, "transaction.state.log.min.isr": 2,
                     "share.coordinator.state.topic.replication.factor": 3,
                     "group.initial.rebalance.delay.ms": 0}
        path = self.dir / self.name(node) / "server.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{k}={v}\n" for k, v in {**common, **props}.items()))
        return path

    def _java(self, *args: str, log: Path | None = None) -> list[str]:
        return ["java", *HEAP, *JVM_OPTS, f"-Dlog4j2.configurationFile={self._log4j}",
                *([f"-Dkafka.logs.dir={log.parent}", f"-Dlowtide.kafka.log={log}"] if log else []),
                "-cp", f"{self.lib}/*", *args]

    def format(self) -> None:
        self._log4j.write_text(
            "status = warn\n"
            "appender.file.type = File\nappender.file.name = file\n"
            "appender.file.fileName = ${sys:lowtide.kafka.log:-/dev/null}\n"
            "appender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = file\n")
        for node in (CONTROLLER_ID, *BROKER_IDS):
            props = self._props(node)
            out = subprocess.run(["java", "-cp", f"{self.lib}/*", "kafka.tools.StorageTool", "format",
                                  "-t", self.cluster_id, "-c", str(props)],
                                 capture_output=True, text=True, timeout=120)
            if out.returncode:
                raise RuntimeError(f"kafka-storage format {self.name(node)}: {out.stdout[-500:]} {out.stderr[-500:]}")

    def start(self, node: int) -> None:
        name = self.name(node)
        props = self.dir / name / "server.properties"
        log = self.dir / name / "server.log"
        with open(self.dir / name / "stdout.log", "ab") as out:
            self.procs[name] = subprocess.Popen(self._java("kafka.Kafka", str(props), log=log), stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, cwd=self.dir / name)

    def up(self, admin_factory) -> None:
        self.format()
        for node in (CONTROLLER_ID, *BROKER_IDS):
            self.start(node)
        admin = admin_factory(self.bootstrap)
        deadline = time.monotonic() + 120
        while True:
            self.check_alive()
            try:
                if len(admin.list_topics(timeout=5).brokers) == len(BROKER_IDS):
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("Kafka brokers not all registered within 120 s")
            time.sleep(0.5)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.dir / name / "stdout.log").read_text(errors="replace")[-800:]
                raise RuntimeError(f"Kafka {name} exited with {proc.returncode}: {tail}")

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None}

    def java_client(self, mode: str, topic: str, partitions: int, *args: str, timeout_s: float) -> float:
        """Run ``JAVA_CLIENT`` (``produce`` or ``delete``) against the cluster; the seconds it timed."""
        source = self.dir / "KafkaScaleClient.java"
        source.write_text(JAVA_CLIENT)
        out = subprocess.run(["java", f"-Dlog4j2.configurationFile={self._log4j}", "-cp", f"{self.lib}/*",
                              str(source), mode, self.bootstrap, topic, str(partitions), *args],
                             capture_output=True, text=True, timeout=timeout_s, cwd=self.dir)
        for line in out.stdout.splitlines():
            if line.startswith("elapsed_s "):
                return float(line.split()[1])
        causes = [line.strip() for line in out.stderr.splitlines() if "Exception" in line and not
                  line.lstrip().startswith("at ")]
        raise RuntimeError(f"Kafka's Java client ({mode}) exited {out.returncode}: {' / '.join(causes[:3])} "
                           f"{out.stdout[-200:]}")

    def kill(self, node: int) -> None:
        proc = self.procs.pop(self.name(node))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def down(self) -> None:
        """SIGTERM to the brokers (a controlled shutdown needs the controller), then the controller;
        SIGKILL to what is still running 30 s later."""
        brokers = [p for n, p in self.procs.items() if n != "controller"]
        controller = [p for n, p in self.procs.items() if n == "controller"]
        for group in (brokers, controller):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            for proc in group:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.procs.clear()


def _delete_records_librdkafka(bootstrap: str, partitions: int, timeout_s: float) -> float:
    """Seconds of one confluent-kafka ``delete_records`` of every partition up to offset 2."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    # socket.timeout.ms: librdkafka's per-request timeout (30 s by default) cuts 10,000 partitions' call
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300000, "log_level": 2})
    admin.list_topics(TOPIC, timeout=30)  # connected before the clock starts
    t0 = time.monotonic()
    futs = admin.delete_records([TopicPartition(TOPIC, p, 2) for p in range(partitions)],
                                request_timeout=300, operation_timeout=300)
    bad = []
    for tp, fut in futs.items():
        result = fut.result(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        if getattr(result, "low_watermark", 2) != 2:
            bad.append((tp.partition, result))
    elapsed = time.monotonic() - t0
    if bad:
        raise RuntimeError(f"DeleteRecords: {len(bad)} partitions answered another low watermark (first {bad[0]})")
    return elapsed


def _kafka_uuid() -> str:
    """A cluster id as ``kafka-storage random-uuid`` prints one (URL-safe base64 of 16 bytes)."""
    import base64

    while True:  # not one starting with "-": kafka-storage would take it for an option
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def kafka_scale_figures(data_dir: Path, *, quick: bool) -> list[Figure]:
    sizes = (300,) if quick else (300, 3000, 10000)
    settle_s, window_s = (10.0, 10.0) if quick else (60.0, 60.0)
    lib = kafka_lib()
    figures: list[Figure] = []
    for partitions in sizes:
        figures += _measure_size(data_dir / f"p{partitions}", lib, partitions=partitions, settle_s=settle_s,
                                 window_s=window_s)
    return figures


def _measure_size(data_dir: Path, lib: Path, *, partitions: int, settle_s: float, window_s: float) -> list[Figure]:
    values: dict[str, float] = {}
    params: dict[str, Any] = {"partitions": partitions, "rf": 3, "controllers": 1, "brokers": 3,
                              "settle_s": settle_s, "window_s": window_s, "heap": " ".join(HEAP),
                              "kafka": lib.parent.name}
    error: BaseException | None = None
    cluster = KafkaCluster(data_dir, lib)
    try:
        _run_size(cluster, partitions, settle_s, window_s, values, params)
    except Exception as exc:  # noqa: BLE001 - reported as error figures, the next size runs
        say(f"kafka_scale: {partitions} partitions: failed: {exc!r}")
        error = exc
    finally:
        say(f"kafka_scale: stopping Kafka ({partitions} partitions)")
        cluster.down()
    figures = []
    for metric, name, unit in METRICS:
        key, name = f"kafka_scale_{partitions}_{metric}", name.format(n=f"{partitions:,}")
        if metric in values:
            note = params.get("create", "") if metric == "create_s" else ""
            figures.append(Figure(key, name, values[metric], unit, params=dict(params), note=note))
        elif (reason := params.get(metric.removesuffix("_s") + "_error")) is not None:
            figures.append(failed(key, name, unit, None, reason))
        elif error is not None:
            figures.append(failed(key, name, unit, None, f"not reached: {error!r}"))
    return figures


def _run_size(cluster: KafkaCluster, partitions: int, settle_s: float, window_s: float, values: dict[str, float],
              params: dict[str, Any]) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
    from kafka import KafkaProducer

    began_size = time.monotonic()

    def budget_left(what: str) -> float:
        left = SIZE_BUDGET_S - (time.monotonic() - began_size)
        if left <= 0:
            raise TimeoutError(f"{what}: past the {SIZE_BUDGET_S / 60:.0f} min budget of one size")
        return left

    def wait(cond, what: str, interval_s: float = 0.1) -> float:
        t0 = time.monotonic()
        while not cond():
            budget_left(what)
            cluster.check_alive()
            time.sleep(interval_s)
        return time.monotonic() - t0

    def admin_factory(bootstrap: str) -> AdminClient:
        # log_level 2: not librdkafka's line for every refused connect while the brokers start
        return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 30000, "log_level": 2})

    say(f"kafka_scale: starting Kafka (1 controller, 3 brokers) for {partitions} partitions in {cluster.dir}")
    t0 = time.monotonic()
    cluster.up(admin_factory)
    say(f"kafka_scale: Kafka up in {time.monotonic() - t0:.1f}s, bootstrap {cluster.bootstrap}")
    admin = admin_factory(cluster.bootstrap)

    def topic_md():
        try:
            md = admin.list_topics(TOPIC, timeout=30)
        except Exception:  # noqa: BLE001 - a broker gone mid-request: ask again
            return None
        t = md.topics.get(TOPIC)
        if t is None or t.error is not None:
            return None
        return t.partitions

    # CreateTopics until every partition has a leader
    t0 = time.monotonic()
    first = min(partitions, CREATE_CHUNK)
    futures = admin.create_topics([NewTopic(TOPIC, first, 3)], operation_timeout=300, request_timeout=300)
    futures[TOPIC].result(timeout=budget_left("CreateTopics"))
    for total in range(first + CREATE_CHUNK, partitions + CREATE_CHUNK, CREATE_CHUNK):
        total = min(total, partitions)
        futures = admin.create_partitions([NewPartitions(TOPIC, total)], operation_timeout=300, request_timeout=300)
        futures[TOPIC].result(timeout=budget_left("CreatePartitions"))
    if partitions > first:
        params["create"] = (f"CreateTopics of {first:,} partitions, then CreatePartitions by {CREATE_CHUNK:,} "
                            f"(Kafka's controller refuses one of {partitions:,}: POLICY_VIOLATION \"Unable to "
                            f"perform excessively large batch operation.\", over 10,000 metadata records)")

    def all_led() -> bool:
        parts = topic_md()
        return parts is not None and len(parts) == partitions and all(p.leader >= 0 for p in parts.values())
    wait(all_led, "every partition led")
    values["create_s"] = time.monotonic() - t0
    say(f"kafka_scale: {partitions} partitions created, every one led, in {values['create_s']:.1f}s")

    # idle: settle, then a window
    time.sleep(settle_s)
    cluster.check_alive()
    pids = cluster.pids()
    start = {name: cpu_ticks(pid) for name, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - t0
    cluster.check_alive()
    cpu = {name: (cpu_ticks(pid) - start[name]) / TICKS / elapsed * 100 for name, pid in pids.items()}
    rss = {name: rss_mib(pid) for name, pid in pids.items()}
    fds = {name: open_fds(pid) for name, pid in pids.items()}
    values["idle_cpu_pct"] = sum(cpu.values())
    for name in PROCS:
        values[f"idle_cpu_{name}_pct"], values[f"rss_{name}_mib"], values[f"fds_{name}"] = (
            cpu[name], rss[name], fds[name])
    brokers = [n for n in PROCS if n != "controller"]
    values["broker_rss_mib"] = max(rss[n] for n in brokers)
    values["broker_fds"] = max(fds[n] for n in brokers)
    say(f"kafka_scale: {partitions} partitions RF 3: idle CPU {values['idle_cpu_pct']:.1f}% of a core "
        f"({', '.join(f'{n} {c:.1f}%' for n, c in sorted(cpu.items()))}); RSS "
        f"{', '.join(f'{n} {r:.0f}' for n, r in sorted(rss.items()))} MiB; fds "
        f"{', '.join(f'{n} {f}' for n, f in sorted(fds.items()))}")

    # one acks=all record to every partition: Kafka's Java producer, then kafka-python (which also
    # groups the ready partitions into one ProduceRequest per broker; librdkafka sends a partition
    # per request, which measures the client: 300 partitions took it 5-18 s here)
    values["produce_all_s"] = cluster.java_client("produce", TOPIC, partitions, timeout_s=budget_left("produce"))
    say(f"kafka_scale: one acks=all record to each of {partitions} partitions (Java producer) in "
        f"{values['produce_all_s']:.2f}s")
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap.split(","), acks="all", linger_ms=5,
                             max_block_ms=60000, request_timeout_ms=60000)
    try:
        producer.partitions_for(TOPIC)  # connected, with the topic's metadata, before the clock starts
        t0 = time.monotonic()
        sent = [producer.send(TOPIC, value=b"lowtide-kafka-scale-%d" % p, partition=p) for p in range(partitions)]
        producer.flush(timeout=budget_left("produce"))
        values_produce = time.monotonic() - t0
        errors = [f.exception for f in sent if not f.succeeded()]
    finally:
        producer.close(timeout=10)
    if errors:
        raise RuntimeError(f"produce: {len(errors)} of {partitions} records not acknowledged (first {errors[0]!r})")
    values["produce_all_kafka_python_s"] = values_produce
    say(f"kafka_scale: one acks=all record to each of {partitions} partitions (kafka-python) in "
        f"{values_produce:.2f}s")

    # DeleteRecords, every partition, one call: Kafka's Java Admin (to offset 1), then librdkafka's (to 2)
    values["delete_records_s"] = cluster.java_client("delete", TOPIC, partitions, "1",
                                                     timeout_s=budget_left("DeleteRecords"))
    say(f"kafka_scale: DeleteRecords of {partitions} partitions in one call (Java Admin): "
        f"{values['delete_records_s']:.2f}s")
    try:  # the second client's row: its failure is reported, the size goes on
        values["delete_records_librdkafka_s"] = _delete_records_librdkafka(cluster.bootstrap, partitions,
                                                                           budget_left("DeleteRecords"))
        say(f"kafka_scale: DeleteRecords of {partitions} partitions in one call (librdkafka): "
            f"{values['delete_records_librdkafka_s']:.2f}s")
    except Exception as exc:  # noqa: BLE001
        say(f"kafka_scale: DeleteRecords through librdkafka failed: {exc!r}")
        params["delete_records_librdkafka_error"] = repr(exc)[:300]

    # failover after kill -9 of one broker
    parts = topic_md()
    led = {p for p, m in parts.items() if m.leader == VICTIM}
    params["victim_led"] = len(led)
    t0 = time.monotonic()
    cluster.kill(VICTIM)

    def led_elsewhere() -> bool:
        now = topic_md()
        return now is not None and all(now[p].leader not in (VICTIM, -1) for p in led)
    wait(led_elsewhere, "every partition of the killed broker led elsewhere", interval_s=0.05)
    values["failover_s"] = time.monotonic() - t0
    say(f"kafka_scale: failover of {len(led)} partitions after kill -9 of broker {VICTIM}: "
        f"{values['failover_s']:.1f}s")

    # restart until every ISR is full
    t0 = time.monotonic()
    cluster.start(VICTIM)

    def isr_full() -> bool:
        now = topic_md()
        return now is not None and len(now) == partitions and all(len(m.isrs) == 3 for m in now.values())
    wait(isr_full, "every ISR full after the restart", interval_s=0.2)
    values["restart_full_isr_s"] = time.monotonic() - t0
    say(f"kafka_scale: broker {VICTIM} restarted, every ISR full in {values['restart_full_isr_s']:.1f}s")
