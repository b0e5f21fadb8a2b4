"""KIP-714 client telemetry over the Kafka protocol: GetTelemetrySubscriptions (71) and
PushTelemetry (72), on every listener (replicas and front doors), as Kafka's brokers serve them.

A Kafka 3.7+ client that sees both keys in ApiVersions asks for its subscription, then pushes its
metrics (an OTLP ``MetricsData`` protobuf, compressed with the first codec offered) every push
interval, and a last time (``terminating``) when it closes. The process's ``ClientTelemetry``
(``KafkaServices.telemetry``, lowtide/observability/client_telemetry.py) decides the subscription
and the push rules, decodes the metrics and exports them on the process's ``/metrics``; this module
only translates, and inflates the payload with lowtide's record codecs (record/compression.py).

* GetTelemetrySubscriptions: a zero ``client_instance_id`` gets a new random one; the answer
  carries the subscription (its id, the codecs this process reads, zstd first, the push interval,
  ``telemetry_max_bytes``, cumulative temporality, the requested metric prefixes).
* PushTelemetry: a request without a client instance id is INVALID_REQUEST; then, as Kafka checks
  them, THROTTLING_QUOTA_EXCEEDED, UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE,
  TELEMETRY_TOO_LARGE (also for data that inflates past 16 x ``telemetry_max_bytes``) and
  INVALID_RECORD (data that does not decompress or decode). A terminating push is accepted and its
  client's series go at once.

A listener built without telemetry (``KafkaServices.telemetry`` None: unit tests, tools that
build a broker for its API list) answers as one with telemetry off: no metric requested, no codec
offered, and an uncompressed push accepted and dropped.

Thread-safety: the handlers run on the listener's worker threads; ``ClientTelemetry`` is
thread-safe.
"""

from __future__ import annotations

import datetime
from typing import Any

from lowtide.errors import CorruptMessage, InvalidRecord, InvalidRequest, MessageTooLarge, TelemetryTooLarge
from lowtide.kafka.broker import Api, Call, TelemetryHandler
from lowtide.kafka.protocol import NO_THROTTLE, error_code
from lowtide.observability.client_telemetry import ClientTelemetry, TelemetryConfig
from lowtide.record.compression import Compression, decompress

GET_TELEMETRY_SUBSCRIPTIONS_KEY, PUSH_TELEMETRY_KEY = 71, 72
# What a listener without a ClientTelemetry answers: telemetry off.
TELEMETRY_OFF = ClientTelemetry(TelemetryConfig(push_interval_ms=0))


def _telemetry(call: Call) -> TelemetryHandler:
    return call.services.telemetry or TELEMETRY_OFF


def get_telemetry_subscriptions(call: Call, body: Any) -> Any:
    sub = _telemetry(call).subscribe(body.client_instance_id)
    return call.make(
        call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), client_instance_id=sub.client_instance_id,
        subscription_id=sub.subscription_id, accepted_compression_types=sub.accepted_compression_types,
        push_interval=datetime.timedelta(milliseconds=sub.push_interval_ms),
        telemetry_max_bytes=sub.telemetry_max_bytes, delta_temporality=sub.delta_temporality,
        requested_metrics=sub.requested_metrics)


def push_telemetry(call: Call, body: Any) -> Any:
    instance = body.client_instance_id
    if instance is None or instance.int == 0:
        raise InvalidRequest("PushTelemetry without a client instance id: get a subscription first")
    telemetry = _telemetry(call)
    metrics = body.metrics or b""
    telemetry.admit(instance, subscription_id=body.subscription_id, terminating=body.terminating,
                    compression_type=body.compression_type, size=len(metrics))
    if body.terminating:
        telemetry.forget(instance)
    else:
        payload = inflate(body.compression_type, metrics, max_size=telemetry.max_inflated_bytes)
        telemetry.record(instance, client_id=call.client_id or "", payload=payload)
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0))


def inflate(compression_type: int, data: bytes, *, max_size: int) -> bytes:
    """A push's metrics uncompressed (codec ids as in record batches, 0 = none); INVALID_RECORD
    when they do not decompress, TELEMETRY_TOO_LARGE when they inflate past ``max_size``."""
    if compression_type == Compression.NONE or not data:
        return bytes(data)
    try:
        return decompress(compression_type, data, max_size=max_size)
    except MessageTooLarge:
        raise TelemetryTooLarge(f"the pushed metrics inflate to more than {max_size} bytes") from None
    except CorruptMessage as exc:
        raise InvalidRecord(f"the pushed metrics do not decompress: {exc.message}") from None


APIS: list[Api] = [
    Api(GET_TELEMETRY_SUBSCRIPTIONS_KEY, "GetTelemetrySubscriptions", 0, 0, get_telemetry_subscriptions),
    Api(PUSH_TELEMETRY_KEY, "PushTelemetry", 0, 0, push_telemetry),
]
