"""Dashboards and alert rules against a real Prometheus scraping a real local cluster.

One scenario (module-scoped cluster, ``--with-prometheus``, 1 s scrapes, every alert's ``for:``
shortened to 3 s): produce into small segments, DeleteRecords, SIGSTOP a follower, delete again
(the leader's LSO moves, the low watermark cannot), resume the follower. Then:

* the low-watermark lag is seen in Prometheus rising while the follower is stopped and back to 0
  after it resumes, and ``LowtideLowWatermarkLagStuck`` fires, then resolves;
* every PromQL expression of every dashboard panel and every alert rule parses in Prometheus, and
  each panel on a metric the scenario exercised returns data;
* Apache Kafka's own Java producer and consumer (``kafka-producer-perf-test``,
  ``kafka-console-consumer``, ``enable.metrics.push=true``) push their metrics (KIP-714) to the
  replicas all along, so Prometheus scrapes them and the Clients row's latency panels return them
  under the tools' client ids.

The session timeout is long (60 s) so the stopped follower stays *live*: a live replica counts
toward the low watermark (docs/design/kip-107-delete-records.md#replication-and-the-low-watermark),
which is exactly what holds the lag up. Its short
``replica.lag.time.max.ms`` makes it leave the ISR meanwhile (ISR shrink, then expand on resume).
The lag series is written to ``tests/bench/out/observability/lag.json`` for the README picture
(``scripts/plot_lag.py``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lowtide.client.scanner import ScannerClient
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.observability.dashboards import (
    CLUSTER,
    DASHBOARDS,
    FETCH_LATENCY,
    PRODUCE_LATENCY,
    build_dashboard,
    iter_exprs,
)
from lowtide.observability.prometheus import PrometheusApi
from lowtide.observability.rules import ALERTS
from tests.integration.conftest import running_cluster
from tests.integration.support import create_topic, delete_records, leader_of, lowtide_cli, produce, store
from tests.kafka_tools import kafka_tool, require_java
from tests.waiting import wait_until

TOPIC = "observed"
PLOT_OUT = Path(__file__).resolve().parents[2] / "bench" / "out" / "observability" / "lag.json"

DISKLESS_TOPIC = "observed-diskless"
# Panels whose metrics this scenario does not produce (KIP-68 and share groups have their own tests;
# errors are not provoked here); every other panel, the Diskless dashboard's and the Clients row's
# included, must return data.
NOT_EXERCISED = {
    # Share groups: tests/integration/kafka/test_share_groups.py reads these metrics on /metrics.
    "lowtide-deletion": {"Consumed-retention lag (min committed - LW)",
                         "Share-group low-watermark lag (start offset - LW)", "Share-partition start and end offsets",
                         "Share-partition records in flight, by state"},
    "lowtide-cluster": {"Errors / s per RPC and code"},
}

# KIP-714: the Java clients below push every second (the replicas' subscription says so), so their
# series are in every 1 s scrape while they run; they run for the whole module.
TELEMETRY_TOPIC, PUSH_INTERVAL_MS = "observed-telemetry", 1000
JAVA_PRODUCER, JAVA_CONSUMER = "observed-java-producer", "observed-java-consumer"


def substitute(expr: str) -> str:
    """A panel's expression as Grafana sends it with every variable at All and a 1 m rate window."""
    for var in ("$namespace", "$topic", "$partition"):
        expr = expr.replace(var, ".*")
    return expr.replace("$__rate_interval", "1m")


@pytest.fixture(scope="module")
def observed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus; `make setup` does it)")
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("observed"), replicas=3, session_timeout_ms=60_000,
                           replica_config={"segment.bytes": "65536", "replica.lag.time.max.ms": "2000"},
                           with_prometheus=True, prometheus_scrape_interval="1s", prometheus_rule_for="3s",
                           extra_env={"LOWTIDE_CLIENT_TELEMETRY_PUSH_INTERVAL_MS": str(PUSH_INTERVAL_MS)})
    yield from running_cluster(request, config)


@pytest.fixture(scope="module")
def pushing_java_clients(observed: LocalCluster) -> Iterator[None]:
    """Kafka's Java producer (slowly, for as long as the module runs) and a Java consumer reading
    its records, both with ``enable.metrics.push=true``."""
    require_java()
    create_topic(observed, TELEMETRY_TOPIC, partitions=1, rf=3)
    bootstrap = observed.kafka_bootstrap  # the Kafka listener (observed.bootstrap is the gRPC door)
    tools = [
        subprocess.Popen([str(kafka_tool("kafka-producer-perf-test")), "--topic", TELEMETRY_TOPIC,
                          "--num-records", "10000000", "--record-size", "100", "--throughput", "20",
                          "--producer-props", f"bootstrap.servers={bootstrap}", f"client.id={JAVA_PRODUCER}",
                          "enable.metrics.push=true"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
        subprocess.Popen([str(kafka_tool("kafka-console-consumer")), "--bootstrap-server", bootstrap,
                          "--topic", TELEMETRY_TOPIC, "--from-beginning",
                          "--consumer-property", f"client.id={JAVA_CONSUMER}",
                          "--consumer-property", "enable.metrics.push=true"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
    ]
    try:
        yield
    finally:
        for tool in tools:
            tool.terminate()
        for tool in tools:
            try:
                tool.wait(timeout=20)
            except subprocess.TimeoutExpired:
                tool.kill()
                tool.wait()


def client_latency_in_prometheus(api: PrometheusApi, metric: str) -> dict[str, float]:
    """client id -> the pushed ``metric`` as Prometheus has it (the Clients row's query, avg)."""
    result = api.query(f'max by (client_id) (lowtide_client_metric{{name="{metric}.avg"}})')
    return {r["metric"].get("client_id", ""): float(r["value"][1]) for r in result}


def lag_in_prometheus(api: PrometheusApi) -> float | None:
    result = api.query(f'max(lowtide_partition_low_watermark_lag_records{{topic="{TOPIC}"}})')
    return float(result[0]["value"][1]) if result else None


def alert_state(api: PrometheusApi, name: str) -> str | None:
    states = [a["state"] for a in api.alerts() if a["labels"].get("alertname") == name
              and a["labels"].get("topic") == TOPIC]
    return "firing" if "firing" in states else (states[0] if states else None)


@pytest.fixture(scope="module")
def scenario(observed: LocalCluster, pushing_java_clients: None) -> dict:
    """Runs the scenario once; returns what it saw."""
    cluster = observed
    api = PrometheusApi(cluster.state.prometheus["url"])
    began = time.time()
    create_topic(cluster, TOPIC, partitions=1, rf=3)
    value = b"x" * 1024
    for _ in range(20):
        assert produce(cluster, TOPIC, [value] * 20).error_code == 0
    [first] = delete_records(cluster, [(TOPIC, 0, 100)])
    assert first.error_code == 0 and first.low_watermark == 100
    wait_until(lambda: lag_in_prometheus(api) == 0, timeout_s=20, interval_s=0.5,
               what="lag 0 in Prometheus after the first delete")

    leader = leader_of(cluster, TOPIC)
    follower = next(r for r in store(cluster).partition_state(TOPIC, 0).replicas if r != leader)
    cluster.pause(f"replica-{follower}")
    try:
        for _ in range(5):
            assert produce(cluster, TOPIC, [value] * 20, acks=1).error_code == 0
        # The leader's LSO moves to 300 at once; the stopped (but live) follower holds the LW.
        [second] = delete_records(cluster, [(TOPIC, 0, 300)], timeout_ms=1500)
        assert second.error_code == 7, second  # REQUEST_TIMED_OUT: the LW did not get there in time
        wait_until(lambda: (lag_in_prometheus(api) or 0) >= 200, timeout_s=20, interval_s=0.5,
                   what="low-watermark lag >= 200 in Prometheus while the follower is stopped")
        wait_until(lambda: alert_state(api, "LowtideLowWatermarkLagStuck") == "firing", timeout_s=30, interval_s=0.5,
                   what="LowtideLowWatermarkLagStuck firing")
        lag_while_stopped = lag_in_prometheus(api)
        # The ISR panel's shrink: the stopped follower left the ISR (replica.lag.time.max.ms).
        wait_until(lambda: follower not in store(cluster).partition_state(TOPIC, 0).isr, timeout_s=30,
                   interval_s=0.5, what="the stopped follower out of the ISR")
    finally:
        cluster.resume(f"replica-{follower}")
    # ... and its expand, before the last scrapes (on a loaded machine the catch-up can be late).
    wait_until(lambda: follower in store(cluster).partition_state(TOPIC, 0).isr, timeout_s=30, interval_s=0.5,
               what="the resumed follower back in the ISR")
    wait_until(lambda: lag_in_prometheus(api) == 0, timeout_s=30, interval_s=0.5,
               what="lag back to 0 after the follower resumed")
    wait_until(lambda: alert_state(api, "LowtideLowWatermarkLagStuck") is None, timeout_s=30, interval_s=0.5,
               what="LowtideLowWatermarkLagStuck resolved")
    # One more delete while everything is healthy, so rates and latency windows hold fresh data.
    [third] = delete_records(cluster, [(TOPIC, 0, 400)])
    assert third.error_code == 0 and third.low_watermark == 400
    exercise_diskless(cluster)
    # The Java clients have pushed for the whole scenario; a measured latency (NaN until the
    # client's first request completes) under each tool's client id, as Prometheus scraped it.
    latencies = {}
    for client, metric in ((JAVA_PRODUCER, PRODUCE_LATENCY), (JAVA_CONSUMER, FETCH_LATENCY)):
        wait_until(lambda c=client, m=metric: client_latency_in_prometheus(api, m).get(c, -1.0) >= 0, timeout_s=30,
                   interval_s=0.5, what=f"{metric}.avg of {client} in Prometheus")
        latencies[client] = client_latency_in_prometheus(api, metric)[client]
    time.sleep(3)
    ended = time.time()
    series = {}
    for name, expr in [("lso", "lowtide_partition_log_start_offset"),
                       ("hw", "lowtide_partition_high_watermark"),
                       ("lw", "lowtide_partition_low_watermark"),
                       ("lag", "lowtide_partition_low_watermark_lag_records")]:
        result = api.query_range(f'max({expr}{{topic="{TOPIC}"}})', start=began, end=ended, step=1)
        series[name] = [(float(t) - began, float(v)) for t, v in result[0]["values"]] if result else []
    PLOT_OUT.parent.mkdir(parents=True, exist_ok=True)
    PLOT_OUT.write_text(json.dumps({"topic": TOPIC, "series": series}))
    return {"api": api, "lag_while_stopped": lag_while_stopped, "series": series, "client_latencies": latencies}


def exercise_diskless(cluster: LocalCluster) -> None:
    """A diskless topic produced to and read back (WAL files, CommitFile, FindBatches) and one
    orphan scan, so the Diskless dashboard's panels have data."""
    bootstrap = ["--bootstrap-server", cluster.bootstrap, "--output", "json"]
    for args in (["topics", "create", "--topic", DISKLESS_TOPIC, "--partitions", "2", "--diskless"],
                 ["produce", "--topic", DISKLESS_TOPIC, "--num-records", "300", "--record-size", "512"],
                 ["consume", "--topic", DISKLESS_TOPIC, "--partition", "0", "--offset", "0", "--max-records", "10"]):
        proc = lowtide_cli(*args, *bootstrap)
        assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-2000:]
    scanner = ScannerClient(cluster.service("orphan-scanner-0").grpc)
    try:
        assert scanner.scan_now(dry_run=True).ok
    finally:
        scanner.close()


def test_the_low_watermark_lag_rises_while_a_follower_is_stopped_and_falls_back_to_zero(scenario: dict) -> None:
    assert scenario["lag_while_stopped"] >= 200
    lags = [v for _, v in scenario["series"]["lag"]]
    assert max(lags) >= 200 and lags[-1] == 0


def test_java_clients_pushed_latencies_are_scraped_by_prometheus_under_their_client_ids(scenario: dict) -> None:
    assert set(scenario["client_latencies"]) == {JAVA_PRODUCER, JAVA_CONSUMER}
    assert all(v >= 0 for v in scenario["client_latencies"].values()), scenario["client_latencies"]
    # The dashboard's own query (per client id, avg and max) returns the Java producer's series.
    [expr] = [e for title, e in iter_exprs(build_dashboard(CLUSTER)) if title == "Produce latency seen by producers"
              and ".avg" in e]
    assert {r["metric"].get("client_id") for r in scenario["api"].query(substitute(expr))} >= {JAVA_PRODUCER}


def test_every_alert_rule_is_loaded_and_healthy_in_prometheus(scenario: dict) -> None:
    rules = {r["name"]: r for g in scenario["api"].rule_groups() for r in g["rules"]}
    assert set(rules) == {a.name for a in ALERTS}
    assert all(r["health"] == "ok" for r in rules.values()), {n: r.get("lastError") for n, r in rules.items()}


def test_every_alert_expression_parses(scenario: dict) -> None:
    for alert in ALERTS:
        scenario["api"].query(alert.expr)  # raises PrometheusError on a parse error


def test_every_dashboard_expression_parses_and_exercised_panels_return_data(scenario: dict) -> None:
    empty = []
    for spec in DASHBOARDS:
        skipped = NOT_EXERCISED.get(spec.uid, set())
        exprs = list(iter_exprs(build_dashboard(spec)))
        assert len(exprs) == sum(len(p.targets) for p in spec.panels())
        for title, expr in exprs:
            result = scenario["api"].query(substitute(expr))
            if title not in skipped and not result:
                empty.append(f"{spec.uid}: {title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_the_cluster_file_names_prometheus_and_it_scrapes_every_service(observed: LocalCluster,
                                                                        scenario: dict) -> None:
    doc = json.loads((observed.data_dir / "cluster.json").read_text())
    assert doc["prometheus"] == observed.state.prometheus["url"]
    targets = scenario["api"].targets()
    scraped = {t["labels"]["service"] for t in targets if t["health"] == "up"}
    assert scraped == {s.name for s in observed.services() if s.metrics_addr}
