"""``ShareConsumer`` on a real cluster: membership through the front door's ShareGroupHeartbeat,
records through the leaders' gRPC ShareFetch/ShareAcknowledge (the same share handler as the Kafka
listener's). Every test uses its own topic and group on the worker's shared cluster (lock duration
30 s: nothing here waits for a lock to run out)."""

from __future__ import annotations

import time

import pytest

from lowtide.client import Admin, Producer
from lowtide.client.share_consumer import EXPLICIT, ShareConsumer, ShareRecord
from lowtide.errors import InvalidRequest
from lowtide.messages.share import ACCEPT, REJECT, RELEASE
from tests.integration import support as s

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def produce(cluster, topic: str, n: int, *, partitions: int) -> set[bytes]:
    """``n`` values over ``partitions``, in small batches (so acquisitions are batch-sized pieces)."""
    values = [f"{topic}-{i}".encode() for i in range(n)]
    with Producer(cluster.bootstrap, batch_bytes=1024) as producer:
        for p in range(partitions):
            producer.produce_values(topic, values[p::partitions], partition=p)
    return set(values)


def drain(consumer: ShareConsumer, *, quiet_polls: int = 3) -> list[ShareRecord]:
    """Poll until ``quiet_polls`` polls in a row return nothing."""
    got: list[ShareRecord] = []
    quiet = 0
    while quiet < quiet_polls:
        records = consumer.poll(max_wait_ms=300)
        got += records
        quiet = 0 if records else quiet + 1
    return got


def test_two_share_consumers_on_one_topic_get_disjoint_records_that_together_are_everything_produced(cluster):
    s.create_topic(cluster, "share-two", partitions=2, rf=3)
    produced = produce(cluster, "share-two", 600, partitions=2)
    first = ShareConsumer(cluster.bootstrap, group_id="share-two-g", auto_offset_reset="earliest", max_records=50)
    second = ShareConsumer(cluster.bootstrap, group_id="share-two-g", auto_offset_reset="earliest", max_records=50)
    got: dict[str, list[bytes]] = {"first": [], "second": []}
    with first, second:
        first.subscribe(["share-two"])
        second.subscribe(["share-two"])
        deadline = time.monotonic() + 60
        while len(got["first"]) + len(got["second"]) < len(produced) and time.monotonic() < deadline:
            got["first"] += [r.value for r in first.poll(max_wait_ms=200)]
            got["second"] += [r.value for r in second.poll(max_wait_ms=200)]
        # Nothing more for either: what they took was accepted (implicit mode), nothing comes back.
        assert first.poll(max_wait_ms=300) == [] and second.poll(max_wait_ms=300) == []
        with Admin(cluster.bootstrap) as admin:
            [described] = admin.describe_share_groups(["share-two-g"])
        assert sorted(m.member_id for m in described.members) == sorted([first.member_id, second.member_id])
    assert got["first"] and got["second"], "one member took everything: the share-partitions were not shared"
    assert not set(got["first"]) & set(got["second"])
    assert sorted(got["first"] + got["second"]) == sorted(produced)


def test_acknowledged_records_are_not_delivered_again_and_released_ones_are(cluster):
    s.create_topic(cluster, "share-acks", partitions=1, rf=3)
    produce(cluster, "share-acks", 30, partitions=1)
    with ShareConsumer(cluster.bootstrap, group_id="share-acks-g", auto_offset_reset="earliest",
                       acknowledgement_mode=EXPLICIT) as consumer:
        consumer.subscribe(["share-acks"])
        first = drain(consumer)
        assert sorted(r.offset for r in first) == list(range(30))
        assert {r.delivery_count for r in first} == {1}
        kinds = {0: ACCEPT, 1: RELEASE, 2: REJECT}
        for r in first:
            consumer.acknowledge(r, kinds[r.offset % 3])
        assert set(consumer.commit().values()) == {None}
        assert consumer.held() == 0
        again = drain(consumer)
        # Only the released ones come back, counted; accepted and rejected ones never.
        assert sorted(r.offset for r in again) == [o for o in range(30) if o % 3 == 1]
        assert {r.delivery_count for r in again} == {2}
        consumer.acknowledge_all(ACCEPT)
        assert set(consumer.commit().values()) == {None}
        assert drain(consumer, quiet_polls=2) == []
        with Admin(cluster.bootstrap) as admin:
            [start] = admin.share_group_start_offsets("share-acks-g")
        assert start.start_offset == 30  # every record done at the leader


def test_closing_a_consumer_releases_what_it_holds_to_the_next_member(cluster):
    s.create_topic(cluster, "share-close", partitions=1, rf=3)
    produce(cluster, "share-close", 20, partitions=1)
    with ShareConsumer(cluster.bootstrap, group_id="share-close-g", auto_offset_reset="earliest",
                       acknowledgement_mode=EXPLICIT) as holder:
        holder.subscribe(["share-close"])
        held = drain(holder, quiet_polls=1)
        assert len(held) == 20
    # Not acknowledged, the records went back when the holder closed its share session: no lock
    # had to run out (30 s) for the next member to get them.
    with ShareConsumer(cluster.bootstrap, group_id="share-close-g") as taker:
        taker.subscribe(["share-close"])
        again = drain(taker, quiet_polls=2)
    assert sorted(r.value for r in again) == sorted(r.value for r in held)
    assert {r.delivery_count for r in again} == {2}


def test_an_acknowledgement_of_a_record_not_held_is_refused_before_it_is_sent(cluster):
    s.create_topic(cluster, "share-refused", partitions=1, rf=3)
    with ShareConsumer(cluster.bootstrap, group_id="share-refused-g", acknowledgement_mode=EXPLICIT) as consumer:
        consumer.subscribe(["share-refused"])
        with pytest.raises(InvalidRequest, match="not held"):
            consumer.acknowledge(("share-refused", 0, 5), ACCEPT)
