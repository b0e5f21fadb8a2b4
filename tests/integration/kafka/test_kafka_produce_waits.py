"""A Kafka Produce's acks=all wait on the listener's event loop (rpc/steps.py,
docs/design/kip-107-delete-records.md#replication-and-the-low-watermark): answered once the
followers have the records, REQUEST_TIMED_OUT at its timeout when they cannot get them, and the
connection keeps serving, in request order, whatever its Produce requests waited for."""

from __future__ import annotations

import datetime

import pytest

from lowtide.localcluster import ClusterConfig
from lowtide.record import encode_batch
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.wire import KafkaConnection, request_module

REQUEST_TIMED_OUT = 7
produce_v3 = request_module(0, 3)


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    # A long replica.lag.time.max.ms: on a loaded machine a follower slow to start fetching could
    # otherwise leave the ISR, and an ISR of one acknowledges without waiting for anyone.
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("produce-waits"), replicas=3,
        replica_config={**DEFAULT_REPLICA_CONFIG, "replica.lag.time.max.ms": "60000"}))


def produce_request(topic: str, values: list[bytes], *, acks: int = -1, timeout_ms: int = 10_000):
    return produce_v3.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(produce_v3.TopicProduceData(name=topic, partition_data=(
            produce_v3.PartitionProduceData(index=0, records=encode_batch(values)),)),))


def outcome(answer) -> tuple[int, int]:
    [topic] = answer.responses
    [partition] = topic.partition_responses
    return int(partition.error_code), int(partition.base_offset)


def test_an_acks_all_produce_is_answered_once_replicated_and_times_out_while_no_follower_can_fetch(kcluster):
    s.create_topic(kcluster, "waits", rf=3)
    leader = s.leader_of(kcluster, "waits")
    followers = [f"replica-{r}" for r in range(3) if r != leader]
    with KafkaConnection(kcluster.service(f"replica-{leader}").kafka) as conn:
        assert outcome(conn.call(produce_request("waits", [b"a", b"b"]))) == (0, 0)
        for name in followers:
            kcluster.pause(name)
        try:
            # Both followers stopped: the ISR still names them for a while, so the HW cannot pass.
            assert outcome(conn.call(produce_request("waits", [b"c"], timeout_ms=300))) == (REQUEST_TIMED_OUT, -1)
            # acks=1 does not wait for them, on the same connection, right after the timed-out one.
            assert outcome(conn.call(produce_request("waits", [b"d"], acks=1))) == (0, 3)
        finally:
            for name in followers:
                kcluster.resume(name)
        # The followers are back: the next acks=all request is answered, and so were the records
        # of the timed-out one (Kafka's semantics: a timeout does not undo the append).
        assert outcome(conn.call(produce_request("waits", [b"e"]))) == (0, 4)
    assert [value for _, value in s.read_all(kcluster, "waits")] == [b"a", b"b", b"c", b"d", b"e"]
