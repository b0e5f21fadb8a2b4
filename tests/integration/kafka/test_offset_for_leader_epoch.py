"""OffsetForLeaderEpoch on the Kafka listener (KIP-320) on a real 3-replica cluster.

First at the protocol level, with requests encoded from Kafka's own schemas (kio) and sent raw: the
leader answers where each asked epoch ends (the current one at the log end, an older one where
the next began after a leader change), fences a stale ``current_leader_epoch``
(FENCED_LEADER_EPOCH) and a future one (UNKNOWN_LEADER_EPOCH), as Fetch and ListOffsets do, and a
follower or the front door
answers NOT_LEADER_OR_FOLLOWER. Then as clients use it: a librdkafka consumer whose position lies
past the end of its epoch on the leader reports log truncation, one at that end reads on; and a
consumer that sees a new leader epoch asks the new leader for its position's epoch before it
fetches on (with ``auto.offset.reset=error`` an answer that looked like truncation would surface as
an error)."""

from __future__ import annotations

import datetime
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.wire import kafka_call, request_module

API_KEY = 23
NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER = 0, 3, 6
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 74, 75


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("ofle"), replicas=3,
                                                      replica_config=dict(DEFAULT_REPLICA_CONFIG),
                                                      session_timeout_ms=2000))


def epoch_ends(address: str, topic: str, queries: list[tuple[int, int, int]], *, version: int = 4
               ) -> dict[int, tuple[int, int, int]]:
    """OffsetForLeaderEpoch of ``(partition, leader_epoch, current_leader_epoch)`` queries:
    {partition: (error code, leader epoch, end offset)}."""
    module = request_module(API_KEY, version)
    request = module.OffsetForLeaderEpochRequest
    values = {"topics": (module.OffsetForLeaderTopic(topic=topic, partitions=tuple(
        module.OffsetForLeaderPartition(partition=p, leader_epoch=e, current_leader_epoch=c)
        for p, e, c in queries)),)}
    if version >= 3:
        values["replica_id"] = -1  # a consumer
    answer = kafka_call(address, request(**values))
    (result,) = answer.topics
    assert result.topic == topic
    return {p.partition: (int(p.error_code), p.leader_epoch, p.end_offset) for p in result.partitions}


def fetch_error(address: str, topic: str, *, current_leader_epoch: int) -> int:
    """The error code of a consumer's Fetch v12 of ``topic``-0 from offset 0."""
    m = request_module(1, 12)
    answer = kafka_call(address, m.FetchRequest(
        max_wait=datetime.timedelta(0), min_bytes=1, forgotten_topics_data=(), topics=(m.FetchTopic(
            topic=topic, partitions=(m.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 16,
                                                      current_leader_epoch=current_leader_epoch),)),)))
    return int(answer.responses[0].partitions[0].error_code)


def latest_offset_and_epoch(address: str, topic: str, *, current_leader_epoch: int = -1) -> tuple[int, int, int]:
    """(error code, offset, leader epoch) of ListOffsets v9 LATEST of ``topic``-0."""
    m = request_module(2, 9)
    answer = kafka_call(address, m.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(m.ListOffsetsTopic(
        name=topic, partitions=(m.ListOffsetsPartition(partition_index=0, timestamp=-1,
                                                       current_leader_epoch=current_leader_epoch),)),)))
    p = answer.topics[0].partitions[0]
    return int(p.error_code), p.offset, p.leader_epoch


def listener(cluster: LocalCluster, broker: int) -> str:
    return cluster.service(f"replica-{broker}").kafka


def leader_and_epoch(cluster: LocalCluster, topic: str) -> tuple[int, int]:
    st = s.store(cluster).partition_state(topic, 0)
    return st.leader, st.leader_epoch


def test_the_leader_answers_where_each_epoch_ends_and_fences_stale_and_future_epochs(kcluster):
    topic = "ofle-raw"
    s.create_topic(kcluster, topic, rf=3)
    assert s.produce(kcluster, topic, [b"a", b"b", b"c", b"d", b"e"]).error_code == 0
    leader, epoch = leader_and_epoch(kcluster, topic)
    followers = [r for r in s.store(kcluster).partition_state(topic, 0).replicas if r != leader]
    at = listener(kcluster, leader)
    assert epoch_ends(at, topic, [(0, epoch, epoch)]) == {0: (NONE, epoch, 5)}
    assert epoch_ends(at, topic, [(0, epoch, -1)]) == {0: (NONE, epoch, 5)}  # unfenced
    assert epoch_ends(at, topic, [(0, epoch, epoch + 1)]) == {0: (UNKNOWN_LEADER_EPOCH, -1, -1)}
    assert epoch_ends(at, topic, [(0, epoch + 3, epoch)]) == {0: (NONE, -1, -1)}  # newer than any known
    assert epoch_ends(at, topic, [(0, epoch, epoch)], version=2) == {0: (NONE, epoch, 5)}
    assert epoch_ends(at, "ofle-missing", [(0, 0, -1)]) == {0: (UNKNOWN_TOPIC_OR_PARTITION, -1, -1)}
    for elsewhere in (listener(kcluster, followers[0]), kcluster.kafka_bootstrap):
        assert epoch_ends(elsewhere, topic, [(0, epoch, epoch)]) == {0: (NOT_LEADER_OR_FOLLOWER, -1, -1)}

    # a leader change: the new leader's epoch starts at offset 5, so the old epoch ends there
    kcluster.stop_service(f"replica-{leader}")
    try:
        s.wait_until(lambda: leader_and_epoch(kcluster, topic)[0] not in (leader, -1), timeout_s=30,
                     what="a new leader")
        new_leader, new_epoch = leader_and_epoch(kcluster, topic)
        assert new_epoch > epoch
        s.wait_until(lambda: s.produce(kcluster, topic, [b"f", b"g", b"h"]).error_code == 0, timeout_s=30,
                     what="the new leader appending")
        at = listener(kcluster, new_leader)
        answers: list = []
        s.wait_until(lambda: answers.append(epoch_ends(at, topic, [(0, epoch, new_epoch)])) or
                     answers[-1][0][0] == NONE, what="the new leader answering")
        assert answers[-1] == {0: (NONE, epoch, 5)}
        assert epoch_ends(at, topic, [(0, new_epoch, new_epoch)]) == {0: (NONE, new_epoch, 8)}
        assert epoch_ends(at, topic, [(0, epoch, epoch)]) == {0: (FENCED_LEADER_EPOCH, -1, -1)}
        # Fetch fences a stale epoch the same way; ListOffsets gives the epoch its offset belongs to
        assert fetch_error(at, topic, current_leader_epoch=epoch) == FENCED_LEADER_EPOCH
        assert fetch_error(at, topic, current_leader_epoch=new_epoch + 1) == UNKNOWN_LEADER_EPOCH
        assert fetch_error(at, topic, current_leader_epoch=new_epoch) == NONE
        assert latest_offset_and_epoch(at, topic) == (NONE, 8, new_epoch)
        # ListOffsets too, as Kafka does (a deposed leader that has not learnt it yet would answer
        # from its old high watermark to a client that knows the new epoch), at the leader and
        # through the front door, which asks the leader
        for door in (at, kcluster.kafka_bootstrap):
            assert latest_offset_and_epoch(door, topic, current_leader_epoch=epoch)[0] == FENCED_LEADER_EPOCH
            assert latest_offset_and_epoch(door, topic, current_leader_epoch=new_epoch + 1)[0] == UNKNOWN_LEADER_EPOCH
            assert latest_offset_and_epoch(door, topic, current_leader_epoch=new_epoch) == (NONE, 8, new_epoch)
        # A consumer claiming offset 7 was read in epoch ``epoch`` (which ended at 5 here) finds its
        # position truncated: librdkafka asks OffsetForLeaderEpoch and reports it.
        assert truncation_seen(kcluster, topic, offset=7, epoch=epoch)
        assert not truncation_seen(kcluster, topic, offset=5, epoch=epoch)  # where it ends: fine
    finally:
        kcluster.start_service(f"replica-{leader}")


def truncation_seen(cluster: LocalCluster, topic: str, *, offset: int, epoch: int) -> bool:
    """Whether a librdkafka consumer positioned at ``offset`` read in leader epoch ``epoch`` reports
    log truncation (auto.offset.reset=error: no reset, an error) before it receives a record;
    False once it reads one."""
    consumer = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": f"ofle-{offset}",
                         "auto.offset.reset": "error", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, offset, leader_epoch=epoch)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                # librdkafka: _AUTO_OFFSET_RESET "Partition log truncation detected at offset 7
                # (leader epoch 0): broker end offset is 5 ... Reset to INVALID"
                assert msg.error().code() == KafkaError._AUTO_OFFSET_RESET, msg.error()
                assert "truncation detected" in msg.error().str(), msg.error()
                return True
            return False
        raise AssertionError("the consumer neither read nor reported anything")
    finally:
        consumer.close()


def _served(cluster: LocalCluster, broker: int) -> float:
    return s.metric(cluster, f"replica-{broker}", "lowtide_kafka_requests_total", api="OffsetForLeaderEpoch",
                    outcome="ok")


def _poll(consumer: Consumer, count: int, timeout_s: float = 30.0) -> list[tuple[int, bytes]]:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append((msg.offset(), msg.value()))
    return got


def test_a_consumer_validates_its_position_with_the_new_leader_after_a_leader_change(kcluster):
    topic = "ofle-consumer"
    s.create_topic(kcluster, topic, rf=3)
    producer = Producer({"bootstrap.servers": kcluster.kafka_bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(20):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "ofle-group",
                         "enable.auto.commit": False, "auto.offset.reset": "error",
                         "topic.metadata.refresh.interval.ms": 500, "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, 0, 0)])
    leader, epoch = leader_and_epoch(kcluster, topic)
    try:
        got = _poll(consumer, 20)
        assert [v for _, v in got] == [b"v%d" % i for i in range(20)]
        # Counted before the leader stops: the consumer may validate with the new leader as soon as
        # its metadata names it, before this test knows which replica that is.
        served_before = {b: _served(kcluster, b) for b in range(3) if b != leader}
        kcluster.stop_service(f"replica-{leader}")
        try:
            s.wait_until(lambda: leader_and_epoch(kcluster, topic)[0] not in (leader, -1), timeout_s=30,
                         what="a new leader")
            new_leader = leader_and_epoch(kcluster, topic)[0]
            before = served_before[new_leader]
            for i in range(20, 30):
                producer.produce(topic, value=b"v%d" % i, partition=0)
            assert producer.flush(30) == 0
            got += _poll(consumer, 10)
            # the consumer's position (offset 20, epoch ``epoch``) was checked with the new leader
            s.wait_until(lambda: _served(kcluster, new_leader) > before, what="OffsetForLeaderEpoch served")
        finally:
            kcluster.start_service(f"replica-{leader}")
        assert got == [(i, b"v%d" % i) for i in range(30)]  # every value once, none skipped, none reset
    finally:
        consumer.close()
