"""Low-watermark change events over Redis pub/sub.

The leader of a partition publishes an event whenever the partition's low watermark (min LSO over
the leader and its live replicas) moves, so that other processes (front door, tools, tests,
dashboards) can react without polling::

    channel  lowtide:events:low-watermark
    payload  {"topic": "orders", "partition": 0, "low_watermark": 10000,
              "replica_id": "replica-0", "ts_ms": 1732200000123}

Pub/sub is fire-and-forget: an event published while a subscriber is disconnected is lost. Events
are wake-up hints; a subscriber that must not miss a value re-reads the state after (re)connecting.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import redis as redis_lib

logger = logging.getLogger(__name__)

LOW_WATERMARK_CHANNEL = "lowtide:events:low-watermark"

LowWatermarkCallback = Callable[[str, int, int], None]

_REDIS_ERRORS = (redis_lib.exceptions.RedisError, OSError)


def format_low_watermark_event(*, topic: str, partition: int, low_watermark: int, replica_id: str) -> str:
    """The JSON payload of one low-watermark change event."""
    return json.dumps({
        "topic": topic,
        "partition": int(partition),
        "low_watermark": int(low_watermark),
        "replica_id": replica_id,
        "ts_ms": time.time_ns() // 1_000_000,
    }, separators=(",", ":"))


def publish_low_watermarks(redis: redis_lib.Redis, changes: list[tuple[tuple[str, int], int]], *,
                           replica_id: str) -> None:
    """Publish a batch of low-watermark changes ((topic, partition), lw) in one pipeline; raises
    the Redis client's error as ``publish_low_watermark``."""
    pipe = redis.pipeline(transaction=False)
    for (topic, partition), lw in changes:
        pipe.publish(LOW_WATERMARK_CHANNEL, format_low_watermark_event(
            topic=topic, partition=partition, low_watermark=lw, replica_id=replica_id))
    pipe.execute()


def publish_low_watermark(redis: redis_lib.Redis, *, topic: str, partition: int, low_watermark: int,
                          replica_id: str) -> int:
    """Publish a low-watermark change; returns how many subscribers received it.

    Raises the Redis client's error if Redis is unreachable: the caller decides whether a lost hint
    matters (on the replica it does not; log and go on).
    """
    payload = format_low_watermark_event(topic=topic, partition=partition, low_watermark=low_watermark,
                                         replica_id=replica_id)
    return int(redis.publish(LOW_WATERMARK_CHANNEL, payload))


class LowWatermarkSubscriber:
    """Calls ``callback(topic, partition, low_watermark)`` for every low-watermark event.

    Contract: ``start()`` returns once the subscription is active (events published after it are
    delivered) or raises ``TimeoutError``; ``close()`` stops the thread. A lost connection is
    re-established with capped exponential backoff; events published meanwhile are lost (see the
    module docstring). Malformed payloads and callback exceptions are logged and skipped.

    Thread-safety: the callback runs on the subscriber's own thread, one event at a time, in publish
    order; it must not block for long. ``start``/``close`` may be called from any thread.
    """

    def __init__(self, *, redis: redis_lib.Redis, callback: LowWatermarkCallback,
                 channel: str = LOW_WATERMARK_CHANNEL, max_backoff_s: float = 2.0) -> None:
        self._redis = redis
        self._callback = callback
        self._channel = channel
        self._max_backoff_s = max_backoff_s
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread: threading.Thread | None = None
        self.reconnects = 0

    @property
    def is_subscribed(self) -> bool:
        return self._subscribed.is_set()

    def start(self, *, timeout_s: float = 5.0) -> None:
        """Start the thread and wait until the subscription is active."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="lowtide-lw-subscriber", daemon=True)
        self._thread.start()
        if not self._subscribed.wait(timeout_s):
            raise TimeoutError(f"could not subscribe to {self._channel} within {timeout_s}s")

    def close(self, *, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_until_subscribed(self, timeout_s: float) -> bool:
        """True once the (re)subscription is active; useful after an outage."""
        return self._subscribed.wait(timeout_s)

    def _run(self) -> None:
        backoff_s = 0.05
        while not self._stop.is_set():
            pubsub = self._redis.pubsub()
            try:
                pubsub.subscribe(self._channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self._subscribed.set()
                        backoff_s = 0.05
                    elif message["type"] == "message":
                        self._dispatch(message["data"])
            except _REDIS_ERRORS as exc:
                self._subscribed.clear()
                self.reconnects += 1
                logger.warning("low-watermark subscription lost, reconnecting in %.2fs: %s", backoff_s, exc,
                               extra={"channel": self._channel})
                self._stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, self._max_backoff_s)
            finally:
                try:
                    pubsub.close()
                except _REDIS_ERRORS:
                    pass
        self._subscribed.clear()

    def _dispatch(self, data: bytes | str) -> None:
        try:
            event = json.loads(data)
            topic, partition, low_watermark = event["topic"], int(event["partition"]), int(event["low_watermark"])
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring malformed low-watermark event: %s", exc, extra={"payload": repr(data)[:200]})
            return
        try:
            self._callback(topic, partition, low_watermark)
        except Exception:
            logger.exception("low-watermark callback failed",
                             extra={"topic": topic, "partition": partition, "low_watermark": low_watermark})
