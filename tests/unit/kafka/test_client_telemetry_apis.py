"""KIP-714 GetTelemetrySubscriptions (71) and PushTelemetry (72) on the Kafka listener's dispatcher,
frame by frame: the real KafkaBroker with every API and a real ClientTelemetry (an injected clock),
each request encoded with Kafka's own schemas as a client sends it. The pushed metrics are real OTLP
MetricsData (OpenTelemetry's classes), compressed with each codec offered by lowtide's record
codecs (Kafka's framing), and read back from a fresh Prometheus registry."""

from __future__ import annotations

import io
import struct
import uuid
from typing import Any

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.get_telemetry_subscriptions.v0.request import GetTelemetrySubscriptionsRequest
from kio.schema.push_telemetry.v0.request import PushTelemetryRequest
from kio.serial import entity_reader, entity_writer
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from prometheus_client import CollectorRegistry

from lowtide.kafka.broker import KafkaBroker, KafkaServices, Node
from lowtide.kafka.listener import Connection
from lowtide.kafka.protocol import RequestHead, request_type, response_type
from lowtide.kafka.server import TELEMETRY_CODECS, all_apis
from lowtide.observability.client_telemetry import ClientTelemetry, TelemetryConfig
from lowtide.record.compression import Compression, compress

GET, PUSH = 71, 72
NONE, INVALID_REQUEST, UNSUPPORTED_COMPRESSION_TYPE, INVALID_RECORD = 0, 42, 76, 87
THROTTLING_QUOTA_EXCEEDED, UNKNOWN_SUBSCRIPTION_ID, TELEMETRY_TOO_LARGE = 89, 117, 118
INTERVAL = 1000
LATENCY_AVG = "org.apache.kafka.producer.request.latency.avg"
FETCH_LATENCY_MAX = "org.apache.kafka.consumer.fetch.manager.fetch.latency.max"
INSTANCE = uuid.UUID("8a1f3c2e-0b4d-4e5f-9a6b-7c8d9e0f1a2b")


class FakeClock:
    def __init__(self) -> None:
        self.now = 5_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def telemetry(clock) -> ClientTelemetry:
    return ClientTelemetry(TelemetryConfig(push_interval_ms=INTERVAL, max_bytes=4096),
                           accepted_compression_types=TELEMETRY_CODECS, clock=clock)


@pytest.fixture
def broker(telemetry) -> KafkaBroker:
    return KafkaBroker(apis=all_apis(), services=KafkaServices(node=Node(1, "127.0.0.1", 9092), telemetry=telemetry))


def frame(api_key: int, version: int, body: Any, *, client_id: str = "orders-producer") -> bytes:
    """One request as a client encodes it (header and body, no size prefix)."""
    entity = request_type(api_key, version)
    header_cls = entity.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(request_api_key=api_key, request_api_version=version,
                                              correlation_id=7, client_id=client_id))
    entity_writer(entity)(buf, body)
    return buf.getvalue()


def answer_bytes(broker: KafkaBroker, api_key: int, version: int, body: Any, **kw) -> bytes:
    payload = frame(api_key, version, body, **kw)
    return broker(Connection(peer="test"), RequestHead.parse(payload), payload)


def send(broker: KafkaBroker, api_key: int, version: int, body: Any, **kw) -> Any:
    """Dispatch one encoded request; the decoded answer."""
    answer = answer_bytes(broker, api_key, version, body, **kw)
    answer_type = response_type(api_key, version)
    # size, correlation id, [tagged fields: flexible versions, but never ApiVersions (header v0)]
    return entity_reader(answer_type)(answer, 8 + (1 if answer_type.__flexible__ and api_key != 18 else 0))[0]


def subscribe(broker: KafkaBroker, instance: uuid.UUID | None = None) -> Any:
    return send(broker, GET, 0, GetTelemetrySubscriptionsRequest(client_instance_id=instance or uuid.UUID(int=0)))


def push(broker: KafkaBroker, sub: Any, metrics: bytes, *, compression: int = 0, terminating: bool = False,
         subscription_id: int | None = None, instance: uuid.UUID | None = None, **kw) -> int:
    """Push ``metrics`` (already compressed with ``compression``); the answer's error code."""
    answer = send(broker, PUSH, 0, PushTelemetryRequest(
        client_instance_id=instance if instance is not None else sub.client_instance_id,
        subscription_id=sub.subscription_id if subscription_id is None else subscription_id,
        terminating=terminating, compression_type=compression, metrics=metrics), **kw)
    return int(answer.error_code)


def metrics_data(*gauges: tuple[str, float]) -> bytes:
    data = MetricsData()
    for name, value in gauges:
        metric = data.resource_metrics.add().scope_metrics.add().metrics.add(name=name)
        metric.gauge.data_points.add(as_double=value)
    return data.SerializeToString()


def exported(telemetry: ClientTelemetry) -> dict[tuple[str, str], float]:
    """(client_id, name) -> value of lowtide_client_metric, from a fresh registry."""
    registry = CollectorRegistry()
    registry.register(telemetry)
    family = next(m for m in registry.collect() if m.name == "lowtide_client_metric")
    return {(s.labels["client_id"], s.labels["name"]): s.value for s in family.samples}


def test_api_versions_advertises_both_telemetry_apis_in_version_0(broker):
    keys = {k.api_key: (k.min_version, k.max_version) for k in send(
        broker, 18, 3, ApiVersionsRequest(client_software_name="t", client_software_version="1")).api_keys}
    assert keys[GET] == (0, 0) and keys[PUSH] == (0, 0)


def test_a_zero_client_instance_id_gets_a_new_random_one_with_the_subscription(broker, telemetry):
    first, second = subscribe(broker), subscribe(broker)
    assert first.client_instance_id.int != 0 and first.client_instance_id != second.client_instance_id
    assert int(first.error_code) == NONE
    assert first.subscription_id == second.subscription_id == telemetry.subscription_id
    assert tuple(first.accepted_compression_types) == (Compression.ZSTD, Compression.LZ4, Compression.GZIP)
    assert first.push_interval.total_seconds() * 1000 == INTERVAL
    assert (first.telemetry_max_bytes, first.delta_temporality) == (4096, False)
    assert tuple(first.requested_metrics) == ("org.apache.kafka.producer.", "org.apache.kafka.consumer.")
    assert subscribe(broker, INSTANCE).client_instance_id == INSTANCE  # a known id is answered with itself


def test_the_subscription_answer_is_byte_for_byte_kafkas_encoding(broker, telemetry):
    prefixes = [b"org.apache.kafka.producer.", b"org.apache.kafka.consumer."]
    body = (struct.pack(">ih", 0, 0) + INSTANCE.bytes + struct.pack(">i", telemetry.subscription_id)
            + bytes([3 + 1, 4, 3, 1])  # compact array of int8: length + 1, then zstd, lz4, gzip
            + struct.pack(">ii?", INTERVAL, 4096, False)
            + bytes([len(prefixes) + 1]) + b"".join(bytes([len(p) + 1]) + p for p in prefixes)
            + b"\0")  # no tagged fields
    expected = struct.pack(">iib", 4 + 1 + len(body), 7, 0) + body  # size, correlation id, header tags
    assert answer_bytes(broker, GET, 0, GetTelemetrySubscriptionsRequest(client_instance_id=INSTANCE)) == expected


@pytest.mark.parametrize("codec", [Compression.NONE, *TELEMETRY_CODECS], ids=lambda c: Compression(c).name)
def test_a_push_compressed_with_each_offered_codec_is_decoded_and_exported_with_its_client_id(
        broker, telemetry, codec):
    sub = subscribe(broker)
    raw = metrics_data((LATENCY_AVG, 4.25), (FETCH_LATENCY_MAX, 120.0), ("org.apache.kafka.app.info", 1.0))
    sent = raw if codec == Compression.NONE else compress(codec, raw)
    assert push(broker, sub, sent, compression=codec) == NONE
    assert exported(telemetry) == {("orders-producer", LATENCY_AVG): 4.25,  # app.info: not subscribed
                                   ("orders-producer", FETCH_LATENCY_MAX): 120.0}


def test_a_push_sooner_than_the_interval_is_throttled_and_the_next_one_in_time_is_accepted(broker, telemetry, clock):
    sub = subscribe(broker)
    assert push(broker, sub, metrics_data((LATENCY_AVG, 1.0))) == NONE  # the first after the Get
    clock.now += INTERVAL // 2
    assert push(broker, sub, metrics_data((LATENCY_AVG, 2.0))) == THROTTLING_QUOTA_EXCEEDED
    clock.now += INTERVAL // 2
    assert push(broker, sub, metrics_data((LATENCY_AVG, 3.0))) == NONE
    assert exported(telemetry) == {("orders-producer", LATENCY_AVG): 3.0}


def test_a_terminating_push_is_accepted_at_once_and_its_clients_series_go(broker, telemetry):
    sub = subscribe(broker)
    assert push(broker, sub, metrics_data((LATENCY_AVG, 1.0))) == NONE
    assert push(broker, sub, compress(Compression.ZSTD, metrics_data((LATENCY_AVG, 2.0))),
                compression=Compression.ZSTD, terminating=True) == NONE
    assert exported(telemetry) == {}


@pytest.mark.parametrize(("case", "code"), [
    ("stale subscription id", UNKNOWN_SUBSCRIPTION_ID),
    ("snappy, not offered", UNSUPPORTED_COMPRESSION_TYPE),
    ("more than telemetry_max_bytes", TELEMETRY_TOO_LARGE),
    ("inflates past 16 x telemetry_max_bytes", TELEMETRY_TOO_LARGE),
    ("gzip that does not decompress", INVALID_RECORD),
    ("no MetricsData", INVALID_RECORD),
    ("no client instance id", INVALID_REQUEST),
])
def test_a_push_kafka_would_refuse_is_answered_with_kafkas_error_code_and_keeps_nothing(
        broker, telemetry, case, code):
    sub = subscribe(broker)
    metrics, kw = metrics_data((LATENCY_AVG, 1.0)), {}
    if case == "stale subscription id":
        kw["subscription_id"] = sub.subscription_id + 1
    elif case == "snappy, not offered":
        kw["compression"] = Compression.SNAPPY
    elif case == "more than telemetry_max_bytes":
        metrics = metrics_data(*((f"org.apache.kafka.producer.m{i}", float(i)) for i in range(200)))
        assert len(metrics) > 4096
    elif case == "inflates past 16 x telemetry_max_bytes":
        metrics, kw["compression"] = compress(Compression.GZIP, bytes(16 * 4096 + 1)), Compression.GZIP
        assert len(metrics) <= 4096
    elif case == "gzip that does not decompress":
        metrics, kw["compression"] = b"\x1f\x8b not gzip at all", Compression.GZIP
    elif case == "no MetricsData":
        metrics = b"\xff\xff\xff\xff"
    elif case == "no client instance id":
        kw["instance"] = uuid.UUID(int=0)
    assert push(broker, sub, metrics, **kw) == code
    assert exported(telemetry) == {}


def test_a_listener_without_telemetry_asks_for_no_metric():
    broker = KafkaBroker(apis=all_apis(), services=KafkaServices(node=Node(1, "127.0.0.1", 9092)))
    sub = subscribe(broker)
    assert tuple(sub.requested_metrics) == () and sub.push_interval.total_seconds() == 300
    assert push(broker, sub, metrics_data((LATENCY_AVG, 1.0))) == NONE
