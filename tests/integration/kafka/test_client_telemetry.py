"""KIP-714 client telemetry end to end, against a one-replica cluster whose processes ask for a push
every second (``LOWTIDE_CLIENT_TELEMETRY_PUSH_INTERVAL_MS``):

* Apache Kafka's own producer (``kafka-producer-perf-test``, ProducerPerformance, Kafka 4.1) with
  ``enable.metrics.push=true``: while it produces, the replica's ``/metrics`` shows the producer's
  own request latency under its client id; the replica answered its GetTelemetrySubscriptions and
  PushTelemetry without throttling a single push (the push rule's slack holds for the real
  client's timing), and the series go once it closed.
* librdkafka (confluent-kafka), a producer and a consumer: the producer's request latency and the
  consumer's fetch latency, the two the Cluster dashboard's Clients row charts, under their
  client ids."""

from __future__ import annotations

import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer
from prometheus_client.parser import text_string_to_metric_families

from lowtide.localcluster import ClusterConfig
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.kafka_tools import kafka_tool
from tests.waiting import wait_until

TOPIC, CLIENT_ID = "telemetry", "telemetry-perf"
PUSH_INTERVAL_MS = 1000
LATENCY_AVG = "org.apache.kafka.producer.request.latency.avg"
FETCH_LATENCY_AVG = "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg"


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("client-telemetry"), replicas=1, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        extra_env={"LOWTIDE_CLIENT_TELEMETRY_PUSH_INTERVAL_MS": str(PUSH_INTERVAL_MS)}))


def pushed(kcluster, service: str, *, text: str | None = None) -> dict[tuple[str, str], float]:
    """(client_id, name) -> value of the client metrics on ``service``'s /metrics (or in ``text``,
    a scrape of it)."""
    out = {}
    for family in text_string_to_metric_families(s.metrics_text(kcluster, service) if text is None else text):
        if family.name == "lowtide_client_metric":
            out.update({(x.labels["client_id"], x.labels["name"]): x.value for x in family.samples})
    return out


def test_a_java_producers_pushed_request_latency_shows_on_the_replicas_metrics_under_its_client_id(kcluster):
    s.create_topic(kcluster, TOPIC, rf=1)
    replica = kcluster.service("replica-0")
    # About 10 s of producing (2000 records at 200/s): several push intervals.
    tool = subprocess.Popen(
        [str(kafka_tool("kafka-producer-perf-test")), "--topic", TOPIC, "--num-records", "2000",
         "--record-size", "100", "--throughput", "200", "--producer-props", f"bootstrap.servers={replica.kafka}",
         f"client.id={CLIENT_ID}", "enable.metrics.push=true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # One scrape, read whole: the producer may close (and its series go) right after it.
        scrape = {"text": ""}

        def measured() -> bool:  # a number once the producer measured a request (NaN before)
            scrape["text"] = s.metrics_text(kcluster, "replica-0")
            return pushed(kcluster, "replica-0", text=scrape["text"]).get((CLIENT_ID, LATENCY_AVG), -1.0) >= 0

        wait_until(measured, timeout_s=20, interval_s=0.5,
                   what=f"{LATENCY_AVG} of client {CLIENT_ID} on replica-0's /metrics")
        metrics = pushed(kcluster, "replica-0", text=scrape["text"])
        assert (CLIENT_ID, "org.apache.kafka.producer.request.latency.max") in metrics
        # The default prefixes: the producer's metrics only (not app-info, not kafka-metrics-count).
        assert all(name.startswith("org.apache.kafka.producer.") for client, name in metrics if client == CLIENT_ID)
        assert "\nlowtide_client_telemetry_clients 0.0" not in scrape["text"]
        assert "\nlowtide_client_telemetry_clients " in scrape["text"]
    finally:
        out, err = tool.communicate(timeout=60)
    assert tool.returncode == 0, err[-4000:]
    assert "2000 records sent" in out
    requests = "lowtide_kafka_requests_total"
    assert s.metric(kcluster, "replica-0", requests, api="GetTelemetrySubscriptions", outcome="ok") >= 1
    assert s.metric(kcluster, "replica-0", requests, api="PushTelemetry", outcome="ok") >= 3
    assert s.metric(kcluster, "replica-0", requests, api="PushTelemetry", outcome="THROTTLING_QUOTA_EXCEEDED") == 0
    # Closed: its last push was a terminating one, or its series expired after 3 intervals.
    wait_until(lambda: not any(client == CLIENT_ID for client, _ in pushed(kcluster, "replica-0")),
               timeout_s=3 * PUSH_INTERVAL_MS / 1000 + 5, interval_s=0.5,
               what="the producer's series gone once it closed")


def test_a_librdkafka_producers_request_latency_and_consumers_fetch_latency_show_under_their_client_ids(kcluster):
    topic = "telemetry-rd"
    s.create_topic(kcluster, topic, rf=1)
    bootstrap = kcluster.service("replica-0").kafka
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "rd-producer", "enable.metrics.push": True,
                         "linger.ms": 5})
    consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": "rd-consumer", "group.id": "rd-telemetry",
                         "auto.offset.reset": "earliest", "enable.metrics.push": True})
    consumer.subscribe([topic])
    wanted = {("rd-producer", LATENCY_AVG), ("rd-consumer", FETCH_LATENCY_AVG)}

    def measured(metrics: dict[tuple[str, str], float]) -> bool:
        return all(metrics.get(key, -1.0) >= 0 for key in wanted)  # present, and not NaN

    deadline = time.monotonic() + 20
    try:
        while not measured(pushed(kcluster, "replica-0")) and time.monotonic() < deadline:
            producer.produce(topic, b"x" * 100)
            producer.poll(0)
            consumer.poll(0.2)  # librdkafka pushes from its own threads; this only keeps both clients busy
        metrics = pushed(kcluster, "replica-0")
        assert measured(metrics), sorted((k, v) for k, v in metrics.items() if k[0].startswith("rd-"))
    finally:
        producer.flush(10)
        consumer.close()
