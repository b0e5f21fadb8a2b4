"""KIP-714 client telemetry's store (lowtide/observability/client_telemetry.py): real OTLP
``MetricsData`` built with OpenTelemetry's own classes, decoded; the push rules on an injected
clock; and what a fresh Prometheus registry prints of it, caps and expiry included."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from prometheus_client import CollectorRegistry, generate_latest

from lowtide.errors import (
    InvalidConfig,
    InvalidRecord,
    TelemetryTooLarge,
    ThrottlingQuotaExceeded,
    UnknownSubscriptionId,
    UnsupportedCompressionType,
)
from lowtide.observability.client_telemetry import (
    ClientTelemetry,
    TelemetryConfig,
    decode_metrics,
    parse_requested_metrics,
)

LATENCY_AVG = "org.apache.kafka.producer.request.latency.avg"
NODE_LATENCY_MAX = "org.apache.kafka.producer.node.request.latency.max"
FETCH_LATENCY_AVG = "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg"
CLIENT = uuid.UUID("8a1f3c2e-0b4d-4e5f-9a6b-7c8d9e0f1a2b")
OTHER = uuid.UUID("11111111-2222-4333-8444-555555555555")
INTERVAL = 1000


class FakeClock:
    """Monotonic milliseconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def attrs(**values) -> list[KeyValue]:
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            any_value = AnyValue(bool_value=value)
        elif isinstance(value, int):
            any_value = AnyValue(int_value=value)
        else:
            any_value = AnyValue(string_value=value)
        out.append(KeyValue(key=key, value=any_value))
    return out


def metrics_data(*gauges: tuple[str, dict, float], resource: dict | None = None) -> bytes:
    """A MetricsData as Kafka's Java client builds it: one ResourceMetrics per metric, each a gauge
    with one data point."""
    data = MetricsData()
    for name, point_attrs, value in gauges:
        resource_metrics = data.resource_metrics.add()
        resource_metrics.resource.attributes.extend(attrs(**(resource or {})))
        metric = resource_metrics.scope_metrics.add().metrics.add()
        metric.name = name
        point = metric.gauge.data_points.add()
        point.as_double = value
        point.attributes.extend(attrs(**point_attrs))
    return data.SerializeToString()


def telemetry(clock: FakeClock | None = None, **config) -> ClientTelemetry:
    return ClientTelemetry(TelemetryConfig(**{"push_interval_ms": INTERVAL, **config}),
                           accepted_compression_types=(4, 3, 1), clock=clock or FakeClock())


def push(store: ClientTelemetry, instance: uuid.UUID, payload: bytes, *, client_id: str = "orders-producer",
         terminating: bool = False) -> None:
    store.admit(instance, subscription_id=store.subscription_id, terminating=terminating, compression_type=0,
                size=len(payload))
    if terminating:
        store.forget(instance)
    else:
        store.record(instance, client_id=client_id, payload=payload)


def scrape(store: ClientTelemetry) -> str:
    registry = CollectorRegistry()
    registry.register(store)
    return generate_latest(registry).decode()


def client_lines(store: ClientTelemetry) -> list[str]:
    return [line for line in scrape(store).splitlines() if line.startswith("lowtide_client_metric{")]


def series(store: ClientTelemetry) -> set[tuple[str, str, str, str, str, str, float]]:
    """(client_id, client_instance_id, name, node_id, topic, partition, value) of every exported series."""
    registry = CollectorRegistry()
    registry.register(store)
    family = next(m for m in registry.collect() if m.name == "lowtide_client_metric")
    return {(s.labels["client_id"], s.labels["client_instance_id"], s.labels["name"], s.labels["node_id"],
             s.labels["topic"], s.labels["partition"], s.value) for s in family.samples}


def gauge(store: ClientTelemetry, name: str) -> float:
    registry = CollectorRegistry()
    registry.register(store)
    return registry.get_sample_value(name)


# -- decoding ----------------------------------------------------------------------------------------
def test_decoding_gives_gauges_and_sums_as_they_are_and_histograms_as_count_and_sum():
    data = MetricsData()
    resource_metrics = data.resource_metrics.add()
    resource_metrics.resource.attributes.extend(attrs(client_rack="r1", topic="from-resource"))
    scope = resource_metrics.scope_metrics.add()
    gauge_metric = scope.metrics.add(name=LATENCY_AVG)
    gauge_metric.gauge.data_points.add(as_double=2.5)
    sum_metric = scope.metrics.add(name="org.apache.kafka.producer.record.send.total")
    sum_metric.sum.data_points.add(as_int=42).attributes.extend(attrs(topic="orders", partition=3))
    histogram = scope.metrics.add(name="org.apache.kafka.producer.batch.size")
    histogram.histogram.data_points.add(count=7, sum=700.0).attributes.extend(attrs(node_id="1"))
    scope.metrics.add(name="org.apache.kafka.producer.empty").gauge.data_points.add()  # no value: skipped
    points = {(p.name, tuple(sorted(p.attributes.items())), p.value)
              for p in decode_metrics(data.SerializeToString())}
    assert points == {
        (LATENCY_AVG, (("client_rack", "r1"), ("topic", "from-resource")), 2.5),
        ("org.apache.kafka.producer.record.send.total", (("client_rack", "r1"), ("partition", "3"),
                                                         ("topic", "orders")), 42.0),
        ("org.apache.kafka.producer.batch.size.count", (("client_rack", "r1"), ("node_id", "1"),
                                                        ("topic", "from-resource")), 7.0),
        ("org.apache.kafka.producer.batch.size.sum", (("client_rack", "r1"), ("node_id", "1"),
                                                      ("topic", "from-resource")), 700.0),
    }


def test_bytes_that_are_no_metrics_data_are_an_invalid_record():
    with pytest.raises(InvalidRecord, match="not an OTLP MetricsData"):
        decode_metrics(b"\xff\xff\xff\xff")  # a field tag whose varint never ends
    assert decode_metrics(b"") == []  # an empty MetricsData


# -- what is exported ----------------------------------------------------------------------------------
def test_a_push_is_exported_with_its_client_id_instance_and_only_the_allowed_attributes():
    store = telemetry()
    push(store, CLIENT, metrics_data((LATENCY_AVG, {}, 2.5),
                                     (NODE_LATENCY_MAX, {"node_id": "1", "client_software": "java"}, 9.0),
                                     resource={"client_rack": "r1"}))
    assert client_lines(store) == [
        f'lowtide_client_metric{{client_id="orders-producer",client_instance_id="{CLIENT}",'
        f'name="{NODE_LATENCY_MAX}",node_id="1",partition="",topic=""}} 9.0',
        f'lowtide_client_metric{{client_id="orders-producer",client_instance_id="{CLIENT}",'
        f'name="{LATENCY_AVG}",node_id="",partition="",topic=""}} 2.5',
    ]
    text = scrape(store)
    assert "lowtide_client_telemetry_clients 1.0" in text and "lowtide_client_telemetry_series 2.0" in text


def test_only_metrics_under_a_requested_prefix_are_kept():
    payload = metrics_data((LATENCY_AVG, {}, 1.0), (FETCH_LATENCY_AVG, {}, 2.0), ("org.apache.kafka.app.x", {}, 3.0))
    producer_only = telemetry(requested_metrics=("org.apache.kafka.producer.",))
    push(producer_only, CLIENT, payload)
    assert {s[2] for s in series(producer_only)} == {LATENCY_AVG}
    everything = telemetry(requested_metrics=parse_requested_metrics("*"))
    push(everything, CLIENT, payload)
    assert {s[2] for s in series(everything)} == {LATENCY_AVG, FETCH_LATENCY_AVG, "org.apache.kafka.app.x"}
    nothing = telemetry(requested_metrics=())
    push(nothing, CLIENT, payload)
    assert series(nothing) == set()


def test_a_push_replaces_the_series_its_client_pushed_before_and_the_last_duplicate_wins():
    clock = FakeClock()
    store = telemetry(clock)
    push(store, CLIENT, metrics_data((LATENCY_AVG, {}, 1.0), (NODE_LATENCY_MAX, {"node_id": "1"}, 5.0)))
    clock.advance(INTERVAL)
    # Two data points that differ only by an attribute that is dropped: the last one is kept.
    push(store, CLIENT, metrics_data((LATENCY_AVG, {"other": "a"}, 2.0), (LATENCY_AVG, {"other": "b"}, 3.0)),
         client_id="renamed")
    assert series(store) == {("renamed", str(CLIENT), LATENCY_AVG, "", "", "", 3.0)}


def test_over_the_series_cap_client_wide_series_are_kept_first_and_the_rest_are_counted_as_dropped():
    store = telemetry(max_series_per_client=3)
    push(store, CLIENT, metrics_data(
        ("org.apache.kafka.producer.topic.record.send.total", {"topic": "orders"}, 1.0),
        (NODE_LATENCY_MAX, {"node_id": "2"}, 2.0),
        (NODE_LATENCY_MAX, {"node_id": "1"}, 3.0),
        (LATENCY_AVG, {}, 4.0),
        ("org.apache.kafka.producer.request.latency.max", {}, 5.0)))
    assert {(s[2], s[3], s[4]) for s in series(store)} == {
        (LATENCY_AVG, "", ""), ("org.apache.kafka.producer.request.latency.max", "", ""), (NODE_LATENCY_MAX, "1", "")}
    assert gauge(store, "lowtide_client_telemetry_dropped_series_total") == 2


def test_over_the_client_cap_the_least_recently_heard_from_client_is_evicted():
    clock = FakeClock()
    store = telemetry(clock, max_clients=2)
    first, second, third = (uuid.UUID(int=i) for i in (1, 2, 3))
    push(store, first, metrics_data((LATENCY_AVG, {}, 1.0)), client_id="first")
    clock.advance(10)
    push(store, second, metrics_data((LATENCY_AVG, {}, 2.0)), client_id="second")
    clock.advance(10)
    store.subscribe(first)  # heard from again: now the most recent
    clock.advance(10)
    push(store, third, metrics_data((LATENCY_AVG, {}, 3.0)), client_id="third")
    assert {s[0] for s in series(store)} == {"first", "third"}
    assert gauge(store, "lowtide_client_telemetry_evicted_clients_total") == 1
    assert gauge(store, "lowtide_client_telemetry_clients") == 2


def test_a_clients_series_expire_three_push_intervals_after_its_last_push_and_at_once_when_it_terminates():
    clock = FakeClock()
    store = telemetry(clock)
    push(store, CLIENT, metrics_data((LATENCY_AVG, {}, 1.0)))
    push(store, OTHER, metrics_data((LATENCY_AVG, {}, 2.0)), client_id="other")
    clock.advance(3 * INTERVAL)
    assert len(series(store)) == 2  # exactly three intervals: still there
    push(store, OTHER, metrics_data((LATENCY_AVG, {}, 2.5)), client_id="other")
    clock.advance(1)
    assert series(store) == {("other", str(OTHER), LATENCY_AVG, "", "", "", 2.5)}
    push(store, OTHER, b"", terminating=True)
    assert series(store) == set()
    assert gauge(store, "lowtide_client_telemetry_clients") == 0


def test_label_values_are_cut_to_256_characters():
    store = telemetry(requested_metrics=("",))
    push(store, CLIENT, metrics_data(("n" * 300, {"topic": "t" * 300}, 1.0)), client_id="c" * 300)
    ((client_id, _, name, _, topic, _, _),) = series(store)
    assert (len(client_id), len(name), len(topic)) == (256, 256, 256)


# -- the subscription and the push rules ------------------------------------------------------------------
def test_the_subscription_is_the_same_for_the_same_config_and_its_id_changes_with_it():
    one = telemetry().subscribe(None)
    two = telemetry().subscribe(uuid.UUID(int=0))
    assert one.client_instance_id != two.client_instance_id and one.client_instance_id.int != 0
    assert one.subscription_id == two.subscription_id
    assert -(2**31) <= one.subscription_id < 2**31
    assert telemetry(push_interval_ms=2000).subscribe(None).subscription_id != one.subscription_id
    assert telemetry(requested_metrics=("",)).subscribe(None).subscription_id != one.subscription_id
    assert (one.accepted_compression_types, one.push_interval_ms, one.telemetry_max_bytes, one.delta_temporality,
            one.requested_metrics) == ((4, 3, 1), INTERVAL, 1 << 20, False,
                                       ("org.apache.kafka.producer.", "org.apache.kafka.consumer."))
    assert telemetry().subscribe(CLIENT).client_instance_id == CLIENT


def test_telemetry_off_asks_for_no_metric_every_five_minutes():
    off = ClientTelemetry(TelemetryConfig(push_interval_ms=0)).subscribe(None)
    assert (off.requested_metrics, off.push_interval_ms) == ((), 300_000)


def test_the_requested_metrics_flag_takes_prefixes_a_star_or_nothing():
    assert parse_requested_metrics(" a. , b.,a. ") == ("a.", "b.")
    assert parse_requested_metrics("*") == ("",)
    assert parse_requested_metrics("") == ()


@pytest.mark.parametrize("config", [{"push_interval_ms": -1}, {"max_bytes": 0}, {"max_clients": 0},
                                    {"max_series_per_client": 0}])
def test_a_config_out_of_range_is_refused(config):
    with pytest.raises(InvalidConfig):
        TelemetryConfig(**config)


def admit(store: ClientTelemetry, instance: uuid.UUID = CLIENT, **overrides) -> None:
    values = {"subscription_id": store.subscription_id, "terminating": False, "compression_type": 4, "size": 100}
    store.admit(instance, **{**values, **overrides})


def test_a_push_sooner_than_80_percent_of_the_interval_is_throttled_but_not_a_first_or_terminating_one():
    clock = FakeClock()
    store = telemetry(clock)
    admit(store)  # the first push, never heard of before: accepted
    clock.advance(int(INTERVAL * 0.8) - 1)
    with pytest.raises(ThrottlingQuotaExceeded) as refused:
        admit(store)
    assert refused.value.code == 89 and refused.value.retriable
    admit(store, terminating=True)  # a closing client's last push is always accepted
    clock.advance(int(INTERVAL * 0.8))
    admit(store)
    clock.advance(10)
    with pytest.raises(ThrottlingQuotaExceeded):
        admit(store)


def test_the_first_push_after_a_subscription_is_accepted_however_soon():
    clock = FakeClock()
    store = telemetry(clock)
    store.subscribe(CLIENT)
    clock.advance(INTERVAL // 2)  # the client's jitter: 0.5-1.5 intervals after the Get
    admit(store)
    clock.advance(1)
    store.subscribe(CLIENT)  # asked again (e.g. after UNKNOWN_SUBSCRIPTION_ID)
    clock.advance(1)
    admit(store)
    clock.advance(1)
    with pytest.raises(ThrottlingQuotaExceeded):
        admit(store)


@pytest.mark.parametrize(("overrides", "error", "code"), [
    ({"subscription_id": 12345}, UnknownSubscriptionId, 117),
    ({"compression_type": 2}, UnsupportedCompressionType, 76),  # snappy: not offered
    ({"compression_type": 9}, UnsupportedCompressionType, 76),
    ({"size": (1 << 20) + 1}, TelemetryTooLarge, 118),
])
def test_a_push_with_a_stale_subscription_a_codec_not_offered_or_too_many_bytes_is_refused(overrides, error, code):
    store = telemetry()
    with pytest.raises(error) as refused:
        admit(store, **overrides)
    assert refused.value.code == code
    admit(store, OTHER, compression_type=0, size=1 << 20)  # uncompressed, and exactly the limit: accepted
