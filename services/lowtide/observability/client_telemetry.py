"""KIP-714 client telemetry: the metrics Kafka clients push, kept per client instance and exported
on this process's ``/metrics``.

A Kafka 3.7+ client (``enable.metrics.push=true``, the Java client's default) asks a broker for its
subscription (GetTelemetrySubscriptions), then pushes its metrics every push interval
(PushTelemetry) as an OTLP ``MetricsData`` protobuf, maybe compressed. ``lowtide/kafka/
apis_telemetry.py`` answers both requests with what this module decides; here are the subscription
every client gets, the push rules, the OTLP decoding and what is kept::

    ClientTelemetry                one per process, shared by its Kafka listeners; one lock
    |-- subscription               from the flags, the same for every client (and every process
    |                              started with the same flags): requested metric prefixes, push
    |                              interval, accepted codecs, max bytes; subscription_id = their CRC-32
    `-- clients                    least recently heard from first; at most max_clients (a new one
        |                          evicts the least recent); gone 3 push intervals after the last
        |                          Get or push, at once after a terminating push
        `-- client_instance_id -> _Client
            |-- client_id          the request header's, of the last push (at most 256 characters)
            |-- last_get, last_push   monotonic ms: the throttle rule
            `-- series             the last push's data points, {(name, (node_id, topic, partition)):
                                   value}, at most max_series_per_client

Exported, one gauge family (the metric name is a label value, never part of a Prometheus name, so
no name a client sends can collide with another or with lowtide's own metrics)::

    lowtide_client_metric{client_id, client_instance_id, name, node_id, topic, partition}
        name: the client's metric name as it pushed it, e.g.
        org.apache.kafka.producer.request.latency.avg (Kafka's naming: KIP-714 "Metrics naming")
    lowtide_client_telemetry_clients               client instances known (subscribed or pushing)
    lowtide_client_telemetry_series                series exported
    lowtide_client_telemetry_dropped_series_total  data points over a client's series cap
    lowtide_client_telemetry_evicted_clients_total client instances evicted by the instance cap

What a push keeps (``ClientTelemetry.record``): the gauge and sum data points (a histogram's, an
exponential histogram's and a summary's count and sum, as ``<name>.count`` and ``<name>.sum``) of
the metrics whose name starts with a requested prefix. Attributes (the resource's, then the data
point's) other than ``node_id``, ``topic`` and ``partition`` are dropped (Kafka's clients send the
client id in the request header, not as an attribute); data points that then coincide keep the
last. A push replaces the client's series: Kafka's clients push every subscribed metric each time,
so a series no longer pushed (a topic the producer stopped writing) goes. Over the series cap, the
series with the fewest attributes are kept first (client-wide before per-node before per-topic and
per-partition), then by name, and the rest are counted as dropped.

Push rules (``ClientTelemetry.admit``, in Kafka's order, ``ClientMetricsManager``):
``THROTTLING_QUOTA_EXCEEDED`` when a push comes less than 80% of the push interval after the
client's previous accepted push (or its Get, unless a Get came after that push: the first push
after a subscription is jittered to 0.5-1.5 intervals by the client); the first push and a
terminating one are always accepted. Then ``UNKNOWN_SUBSCRIPTION_ID`` when the subscription id is
not the current one, ``UNSUPPORTED_COMPRESSION_TYPE`` for a codec not offered,
``TELEMETRY_TOO_LARGE`` above ``telemetry_max_bytes`` (as sent; inflated, at most 16 times that),
and ``INVALID_RECORD`` for data that does not decode.

Thread-safety: every method may be called from any thread (the Kafka listener's workers push, the
metrics HTTP thread collects); one lock guards the clients, and decoding runs outside it.
"""

from __future__ import annotations

import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lowtide.clock import Clock
from lowtide.errors import (
    InvalidConfig,
    InvalidRecord,
    TelemetryTooLarge,
    ThrottlingQuotaExceeded,
    UnknownSubscriptionId,
    UnsupportedCompressionType,
)

# What a client is asked for by default: the producer's and the consumer's metrics (the dashboards'
# request.latency and fetch.latency among them), by Kafka's metric name prefixes.
DEFAULT_REQUESTED_METRICS = ("org.apache.kafka.producer.", "org.apache.kafka.consumer.")
DEFAULT_PUSH_INTERVAL_MS = 30_000
# The push interval answered when telemetry is off (push interval 0): Kafka's clients' own default,
# so a client asks again only every 5 minutes.
OFF_PUSH_INTERVAL_MS = 300_000
DEFAULT_MAX_BYTES = 1 << 20  # Kafka's telemetry.max.bytes
DEFAULT_MAX_CLIENTS = 1000
DEFAULT_MAX_SERIES_PER_CLIENT = 300
# The data point attributes exported as labels (in this order); every other one is dropped.
EXPORTED_ATTRIBUTES = ("node_id", "topic", "partition")
LABELS = ("client_id", "client_instance_id", "name", *EXPORTED_ATTRIBUTES)
EXPIRY_INTERVALS = 3  # a client's series go after this many push intervals without a push
THROTTLE_FRACTION = 0.8  # a push sooner than this share of the interval is throttled
INFLATE_FACTOR = 16  # a push may inflate to this many times telemetry_max_bytes
MAX_LABEL_CHARS = 256  # longer client ids, names and attribute values are cut
ALL_METRICS = ("",)  # KIP-714: one empty prefix = every metric


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """The subscription and the caps (the ``--client-telemetry-*`` flags, kafka/server.py).

    ``requested_metrics``: metric name prefixes; ``()`` asks for nothing, ``("",)`` for everything.
    ``push_interval_ms`` 0 turns telemetry off: clients are asked for no metric."""

    push_interval_ms: int = DEFAULT_PUSH_INTERVAL_MS
    requested_metrics: tuple[str, ...] = DEFAULT_REQUESTED_METRICS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_clients: int = DEFAULT_MAX_CLIENTS
    max_series_per_client: int = DEFAULT_MAX_SERIES_PER_CLIENT

    def __post_init__(self) -> None:
        if self.push_interval_ms < 0:
            raise InvalidConfig(f"the client telemetry push interval must be >= 0 ms, got {self.push_interval_ms}")
        for name in ("max_bytes", "max_clients", "max_series_per_client"):
            if getattr(self, name) < 1:
                raise InvalidConfig(f"client telemetry {name} must be >= 1, got {getattr(self, name)}")

    @property
    def enabled(self) -> bool:
        return self.push_interval_ms > 0


def parse_requested_metrics(text: str) -> tuple[str, ...]:
    """The ``--client-telemetry-metrics`` flag: comma-separated prefixes; ``*`` = every metric
    (KIP-714's one empty prefix), empty = none."""
    items = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    return ALL_METRICS if "*" in items else items


@dataclass(frozen=True, slots=True)
class Subscription:
    """A GetTelemetrySubscriptions answer (Kafka's field names, in milliseconds and bytes)."""

    client_instance_id: uuid.UUID
    subscription_id: int
    accepted_compression_types: tuple[int, ...]
    push_interval_ms: int
    telemetry_max_bytes: int
    delta_temporality: bool
    requested_metrics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DataPoint:
    """One value of a pushed metric: its name, its attributes (the resource's, overridden by the
    data point's), the value."""

    name: str
    attributes: dict[str, str]
    value: float


# -- OTLP decoding ---------------------------------------------------------------------------------
def decode_metrics(payload: bytes) -> list[DataPoint]:
    """The data points of an OTLP ``MetricsData`` (uncompressed): gauges and sums as they are;
    histograms, exponential histograms and summaries as ``<name>.count`` and ``<name>.sum``.
    INVALID_RECORD when the bytes are not a ``MetricsData``. Pure; any thread."""
    data = MetricsData()
    try:
        data.ParseFromString(payload)
    except (DecodeError, ValueError) as exc:
        raise InvalidRecord(f"the pushed metrics are not an OTLP MetricsData: {exc}") from None
    out: list[DataPoint] = []
    for resource_metrics in data.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                out.extend(_points(metric, resource))
    return out


def _points(metric, resource: dict[str, str]) -> Iterator[DataPoint]:
    kind = metric.WhichOneof("data")
    name = metric.name
    if kind in ("gauge", "sum"):
        for point in getattr(metric, kind).data_points:
            which = point.WhichOneof("value")
            if which is not None:
                yield DataPoint(name, {**resource, **_attributes(point.attributes)}, float(getattr(point, which)))
    elif kind in ("histogram", "exponential_histogram", "summary"):
        for point in getattr(metric, kind).data_points:
            attributes = {**resource, **_attributes(point.attributes)}
            yield DataPoint(f"{name}.count", attributes, float(point.count))
            if kind == "summary" or point.HasField("sum"):
                yield DataPoint(f"{name}.sum", attributes, float(point.sum))


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        which = pair.value.WhichOneof("value")
        if which in ("string_value", "int_value", "double_value"):
            out[pair.key] = str(getattr(pair.value, which))
        elif which == "bool_value":
            out[pair.key] = "true" if pair.value.bool_value else "false"
    return out


# -- the store -------------------------------------------------------------------------------------
SeriesKey = tuple[str, tuple[str, ...]]  # (name, values of EXPORTED_ATTRIBUTES, "" when absent)


@dataclass(slots=True)
class _Client:
    last_get: int | None = None
    last_push: int | None = None
    client_id: str = ""
    series: dict[SeriesKey, float] = field(default_factory=dict)

    @property
    def last_seen(self) -> int:
        return max(t for t in (self.last_get, self.last_push, 0) if t is not None)


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _int32(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


class ClientTelemetry(Collector):
    """The subscription, the push rules and the pushed series of one process (module doc); a
    ``prometheus_client`` collector of them. Thread-safe.

    ``accepted_compression_types``: Kafka's codec ids the process can decompress, in order of
    preference (clients compress with the first). ``clock``: monotonic milliseconds."""

    def __init__(self, config: TelemetryConfig | None = None, *, accepted_compression_types: Sequence[int] = (),
                 clock: Clock = _monotonic_ms) -> None:
        self.config = config or TelemetryConfig()
        self.accepted_compression_types = tuple(int(c) for c in accepted_compression_types)
        self.requested_metrics = self.config.requested_metrics if self.config.enabled else ()
        self.push_interval_ms = self.config.push_interval_ms if self.config.enabled else OFF_PUSH_INTERVAL_MS
        self.subscription_id = _int32(zlib.crc32(repr((
            self.requested_metrics, self.push_interval_ms, self.accepted_compression_types,
            self.config.max_bytes)).encode()))
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: OrderedDict[uuid.UUID, _Client] = OrderedDict()
        self._dropped_series = 0
        self._evicted_clients = 0

    # -- the two requests ------------------------------------------------------------------------
    def subscribe(self, client_instance_id: uuid.UUID | None) -> Subscription:
        """GetTelemetrySubscriptions: the subscription, for ``client_instance_id`` (a new random
        one when None or zero, as Kafka's broker assigns it)."""
        if client_instance_id is None or client_instance_id.int == 0:
            client_instance_id = uuid.uuid4()
        with self._lock:
            self._client(client_instance_id).last_get = self._clock()
        return Subscription(
            client_instance_id=client_instance_id, subscription_id=self.subscription_id,
            accepted_compression_types=self.accepted_compression_types, push_interval_ms=self.push_interval_ms,
            telemetry_max_bytes=self.config.max_bytes, delta_temporality=False,
            requested_metrics=self.requested_metrics)

    def admit(self, client_instance_id: uuid.UUID, *, subscription_id: int, terminating: bool,
              compression_type: int, size: int) -> None:
        """PushTelemetry's checks before its data is read (module doc, in Kafka's order); raises
        THROTTLING_QUOTA_EXCEEDED, UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE or
        TELEMETRY_TOO_LARGE. Not throttled, the push counts as the client's last one."""
        now = self._clock()
        with self._lock:
            client = self._client(client_instance_id, touch=False)
            subscribed_since = client.last_get is not None and (
                client.last_push is None or client.last_get > client.last_push)
            previous = client.last_push if client.last_push is not None else client.last_get
            if not terminating and not subscribed_since and previous is not None and \
                    now - previous < self.push_interval_ms * THROTTLE_FRACTION:
                raise ThrottlingQuotaExceeded(
                    f"client instance {client_instance_id} pushed {now - previous} ms after its last push; "
                    f"the push interval is {self.push_interval_ms} ms")
            client.last_push = now
            self._clients.move_to_end(client_instance_id)
        if subscription_id != self.subscription_id:
            raise UnknownSubscriptionId(f"subscription {subscription_id} is not the current one "
                                        f"({self.subscription_id}): get the subscription again")
        if compression_type != 0 and compression_type not in self.accepted_compression_types:
            raise UnsupportedCompressionType(
                f"compression type {compression_type} is not one of the accepted "
                f"{list(self.accepted_compression_types)} (or 0, none)")
        if size > self.config.max_bytes:
            raise TelemetryTooLarge(f"{size} bytes of metrics; telemetry_max_bytes is {self.config.max_bytes}")

    @property
    def max_inflated_bytes(self) -> int:
        """The most a push's metrics may inflate to (beyond: TELEMETRY_TOO_LARGE)."""
        return self.config.max_bytes * INFLATE_FACTOR

    def record(self, client_instance_id: uuid.UUID, *, client_id: str, payload: bytes) -> int:
        """Keep an admitted push's metrics (``payload``: the uncompressed OTLP ``MetricsData``) as
        the client's series, replacing the previous push's; returns how many series it has now.
        INVALID_RECORD when the payload does not decode (the client's series are kept then)."""
        points = decode_metrics(payload) if self.requested_metrics else []
        series, dropped = self._select(points)
        with self._lock:
            client = self._client(client_instance_id, touch=False)
            if client.last_push is None:  # expired (or evicted) since it was admitted: anew
                client.last_push = self._clock()
            client.client_id = client_id[:MAX_LABEL_CHARS]
            client.series = series
            self._dropped_series += dropped
        return len(series)

    def forget(self, client_instance_id: uuid.UUID) -> None:
        """A terminating push: the client's series go now."""
        with self._lock:
            self._clients.pop(client_instance_id, None)

    # -- Prometheus --------------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        return list(self._families([], clients=0, dropped=0, evicted=0))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._expire(self._clock())
            rows = [(client.client_id, str(instance), name, attributes, value)
                    for instance, client in self._clients.items()
                    for (name, attributes), value in client.series.items()]
            clients, dropped, evicted = len(self._clients), self._dropped_series, self._evicted_clients
        yield from self._families(rows, clients=clients, dropped=dropped, evicted=evicted)

    @staticmethod
    def _families(rows: list, *, clients: int, dropped: int, evicted: int) -> Iterator[Metric]:
        metric = GaugeMetricFamily(
            "lowtide_client_metric", "A metric Kafka clients pushed (KIP-714 client telemetry), its name in the "
            "name label; the last value pushed", labels=LABELS)
        for client_id, instance, name, attributes, value in rows:
            metric.add_metric([client_id, instance, name, *attributes], value)
        yield metric
        yield GaugeMetricFamily("lowtide_client_telemetry_clients",
                                "Client instances that subscribed to or pushed telemetry, not yet expired",
                                value=clients)
        yield GaugeMetricFamily("lowtide_client_telemetry_series", "Series of lowtide_client_metric",
                                value=len(rows))
        yield CounterMetricFamily("lowtide_client_telemetry_dropped_series",
                                  "Pushed data points dropped by the per-client series cap", value=dropped)
        yield CounterMetricFamily("lowtide_client_telemetry_evicted_clients",
                                  "Client instances evicted by the cap on client instances", value=evicted)

    # -- under the lock ----------------------------------------------------------------------------
    def _client(self, client_instance_id: uuid.UUID, *, touch: bool = True) -> _Client:
        """The client's entry (a new one may evict the least recent), made most recent when
        ``touch`` (the caller sets its last Get or push to now: the order stays that of those
        times, which ``_expire`` relies on)."""
        self._expire(self._clock())
        client = self._clients.get(client_instance_id)
        if client is None:
            client = self._clients[client_instance_id] = _Client()
            while len(self._clients) > self.config.max_clients:
                self._clients.popitem(last=False)
                self._evicted_clients += 1
        elif touch:
            self._clients.move_to_end(client_instance_id)
        return client

    def _expire(self, now: int) -> None:
        """Drop the clients not heard from for EXPIRY_INTERVALS push intervals (the least recent
        first: they are in the order of their last Get or push)."""
        horizon = now - EXPIRY_INTERVALS * self.push_interval_ms
        while self._clients:
            instance, client = next(iter(self._clients.items()))
            if client.last_seen >= horizon:
                return
            del self._clients[instance]

    # -- outside the lock --------------------------------------------------------------------------
    def _select(self, points: list[DataPoint]) -> tuple[dict[SeriesKey, float], int]:
        """The series a push keeps (module doc), and how many the cap dropped."""
        prefixes = self.requested_metrics
        series: dict[SeriesKey, float] = {}
        for point in points:
            if not point.name.startswith(prefixes):
                continue
            attributes = tuple(point.attributes.get(a, "")[:MAX_LABEL_CHARS] for a in EXPORTED_ATTRIBUTES)
            series[(point.name[:MAX_LABEL_CHARS], attributes)] = point.value
        cap = self.config.max_series_per_client
        if len(series) <= cap:
            return dict(sorted(series.items())), 0
        kept = sorted(series, key=lambda key: (sum(1 for v in key[1] if v), key))[:cap]
        return {key: series[key] for key in sorted(kept)}, len(series) - cap
