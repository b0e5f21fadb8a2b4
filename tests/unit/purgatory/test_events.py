"""Low-watermark events over real Redis pub/sub."""

from __future__ import annotations

import json
import queue

import redis as redis_lib

from lowtide.common.procs import start_redis
from lowtide.purgatory import LOW_WATERMARK_CHANNEL, LowWatermarkSubscriber, publish_low_watermark


def subscribe(client: redis_lib.Redis) -> tuple[LowWatermarkSubscriber, queue.Queue]:
    received: queue.Queue = queue.Queue()
    subscriber = LowWatermarkSubscriber(redis=client, callback=lambda *event: received.put(event))
    subscriber.start(timeout_s=5)
    return subscriber, received


def test_published_low_watermark_reaches_a_subscriber(redis_client):
    subscriber, received = subscribe(redis_client)
    try:
        assert publish_low_watermark(redis_client, topic="orders", partition=3, low_watermark=10_000,
                                     replica_id="replica-0") == 1
        assert received.get(timeout=2) == ("orders", 3, 10_000)
    finally:
        subscriber.close()


def test_event_payload_is_json_with_the_replica_and_a_timestamp(redis_client):
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(LOW_WATERMARK_CHANNEL)
    pubsub.get_message(timeout=1)  # the subscribe confirmation
    publish_low_watermark(redis_client, topic="t", partition=0, low_watermark=5, replica_id="replica-1")
    message = pubsub.get_message(timeout=2)
    pubsub.close()

    event = json.loads(message["data"])
    assert event["topic"] == "t" and event["partition"] == 0 and event["low_watermark"] == 5
    assert event["replica_id"] == "replica-1" and event["ts_ms"] > 0


def test_malformed_events_and_failing_callbacks_do_not_stop_the_subscriber(redis_client):
    received: queue.Queue = queue.Queue()

    def callback(topic: str, partition: int, low_watermark: int) -> None:
        if topic == "boom":
            raise RuntimeError("callback bug")
        received.put((topic, partition, low_watermark))

    subscriber = LowWatermarkSubscriber(redis=redis_client, callback=callback)
    subscriber.start()
    try:
        redis_client.publish(LOW_WATERMARK_CHANNEL, "not json")
        redis_client.publish(LOW_WATERMARK_CHANNEL, json.dumps({"topic": "x"}))
        publish_low_watermark(redis_client, topic="boom", partition=0, low_watermark=1, replica_id="r")
        publish_low_watermark(redis_client, topic="ok", partition=1, low_watermark=2, replica_id="r")
        assert received.get(timeout=2) == ("ok", 1, 2)
        assert received.empty()
    finally:
        subscriber.close()


def test_subscriber_reconnects_after_redis_restarts(tmp_path):
    server = start_redis(tmp_path / "redis", appendonly=False)
    client = redis_lib.Redis.from_url(server.url, socket_connect_timeout=1)
    subscriber, received = subscribe(client)
    try:
        server.stop()
        server = start_redis(tmp_path / "redis", port=server.port, appendonly=False)

        assert subscriber.wait_until_subscribed(5)
        # The subscription flag may still be the one from before the restart until the thread notices
        # the lost connection; publish until an event arrives (bounded), as a hint-only consumer would.
        for _ in range(50):
            publish_low_watermark(client, topic="orders", partition=0, low_watermark=42, replica_id="r")
            try:
                assert received.get(timeout=0.1) == ("orders", 0, 42)
                break
            except queue.Empty:
                continue
        else:
            raise AssertionError("no event received after the restart")
        assert subscriber.reconnects >= 1
    finally:
        subscriber.close()
        client.close()
        server.stop()
