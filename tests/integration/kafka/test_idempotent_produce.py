"""Idempotent produce on a real 3-replica cluster (docs/design/idempotence.md): the same idempotent
batch (producer id, epoch, sequences) produced twice, through the gRPC Produce and through the
Kafka listener, is answered with its original offset and stored once; a gap is
OUT_OF_ORDER_SEQUENCE_NUMBER; and after a kill -9 of the leader the new leader, which took the
state from the batches it replicated, answers a retry of the last batch with its original offset.

The Kafka requests are encoded by hand (Produce v3) so that no client library's own sequence
bookkeeping decides what is sent twice."""

from __future__ import annotations

import signal
import socket
import struct

import pytest

from lowtide.localcluster import ClusterConfig
from lowtide.record import encode_batch
from lowtide_pb import replica_pb2
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
NOT_LEADER_OR_FOLLOWER = 6


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("idempotence"), replicas=3,
                                                      replica_config=dict(DEFAULT_REPLICA_CONFIG),
                                                      session_timeout_ms=2000))


def idempotent_batch(producer_id: int, sequence: int, values: list[bytes], *, epoch: int = 0) -> bytes:
    return encode_batch(values, timestamp_ms=1_700_000_000_000, producer_id=producer_id, producer_epoch=epoch,
                        base_sequence=sequence)


def grpc_produce(cluster, topic: str, records: bytes, *, leader: int | None = None) -> tuple[int, int]:
    """(error code, base offset) of an acks=all gRPC Produce of ``records`` to the leader."""
    lid = s.leader_of(cluster, topic) if leader is None else leader
    answer = s.replica(cluster, lid).Produce(replica_pb2.ProduceRequest(acks=-1, timeout_ms=10000, partitions=[
        replica_pb2.ProducePartition(topic=topic, partition=0, records=records)]), timeout=20)
    return answer.partitions[0].error_code, answer.partitions[0].base_offset


def kafka_produce(cluster, topic: str, records: bytes, *, broker: int | None = None) -> tuple[int, int]:
    """(error code, base offset) of a raw acks=all Produce v3 of ``records`` to partition 0, sent to
    the Kafka listener of ``broker`` (default: the leader)."""
    lid = s.leader_of(cluster, topic) if broker is None else broker
    host, port = cluster.service(f"replica-{lid}").kafka.rsplit(":", 1)
    name = topic.encode()
    body = (struct.pack(">hhi", -1, -1, 10000)  # no transactional id, acks=all, timeout
            + struct.pack(">ih", 1, len(name)) + name
            + struct.pack(">iii", 1, 0, len(records)) + records)
    payload = struct.pack(">hhih", 0, 3, 77, 4) + b"test" + body
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        answer = sock.recv(size, socket.MSG_WAITALL)
    correlation, topics, name_len = struct.unpack_from(">iih", answer)
    assert (correlation, topics) == (77, 1)
    _partitions, partition, code, base_offset = struct.unpack_from(">iihq", answer, 10 + name_len)
    assert partition == 0
    return code, base_offset


def values_in(cluster, topic: str) -> list[bytes]:
    return [value for _, value in s.read_all(cluster, topic)]


def test_a_duplicate_idempotent_batch_via_grpc_gets_its_original_offset_and_is_stored_once(kcluster):
    s.create_topic(kcluster, "idem-grpc", rf=3)
    assert s.produce(kcluster, "idem-grpc", [b"other"]).error_code == 0  # offset 0
    batch = idempotent_batch(4242, 0, [b"a", b"b", b"c"])
    assert grpc_produce(kcluster, "idem-grpc", batch) == (0, 1)
    assert grpc_produce(kcluster, "idem-grpc", batch) == (0, 1)  # the retry: original offset, nothing appended
    assert grpc_produce(kcluster, "idem-grpc", idempotent_batch(4242, 3, [b"d"])) == (0, 4)
    assert grpc_produce(kcluster, "idem-grpc", idempotent_batch(4242, 5, [b"f"]))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert values_in(kcluster, "idem-grpc") == [b"other", b"a", b"b", b"c", b"d"]


def test_a_duplicate_idempotent_batch_via_the_kafka_listener_gets_its_original_offset_and_is_stored_once(kcluster):
    s.create_topic(kcluster, "idem-kafka", rf=3)
    first = idempotent_batch(4343, 0, [b"x", b"y"])
    second = idempotent_batch(4343, 2, [b"z"])
    assert kafka_produce(kcluster, "idem-kafka", first) == (0, 0)
    assert kafka_produce(kcluster, "idem-kafka", second) == (0, 2)
    assert kafka_produce(kcluster, "idem-kafka", first) == (0, 0)  # a retry of an older one of the last 5
    assert kafka_produce(kcluster, "idem-kafka", second) == (0, 2)
    assert grpc_produce(kcluster, "idem-kafka", second) == (0, 2)  # both doors share the one state
    assert kafka_produce(kcluster, "idem-kafka", idempotent_batch(4343, 4, [b"gap"]))[0] == \
        OUT_OF_ORDER_SEQUENCE_NUMBER
    assert values_in(kcluster, "idem-kafka") == [b"x", b"y", b"z"]


def test_after_a_kill_9_of_the_leader_the_new_leader_answers_a_retry_of_the_last_batch_with_its_original_offset(
        kcluster):
    s.create_topic(kcluster, "idem-failover", rf=3)
    sent: list[tuple[bytes, int]] = []
    for i in range(4):
        batch = idempotent_batch(4444, i * 2, [b"v%d" % (i * 2), b"v%d" % (i * 2 + 1)])
        code, offset = grpc_produce(kcluster, "idem-failover", batch)
        assert code == 0
        sent.append((batch, offset))
    old = s.leader_of(kcluster, "idem-failover")
    kcluster.kill(f"replica-{old}", signal.SIGKILL)
    try:
        s.wait_until(lambda: s.leader_of(kcluster, "idem-failover") not in (old, -1), timeout_s=30,
                     what="a new leader")
        last_batch, last_offset = sent[-1]
        answers: list[tuple[int, int]] = []

        def retried() -> bool:
            answers.append(grpc_produce(kcluster, "idem-failover", last_batch))
            return answers[-1][0] != NOT_LEADER_OR_FOLLOWER

        s.wait_until(retried, timeout_s=30, interval_s=0.2, what="the new leader answering")
        assert answers[-1] == (0, last_offset)
        assert kafka_produce(kcluster, "idem-failover", last_batch) == (0, last_offset)
        assert kafka_produce(kcluster, "idem-failover", sent[1][0]) == (0, sent[1][1])
        assert grpc_produce(kcluster, "idem-failover", idempotent_batch(4444, 8, [b"v8"])) == (0, 8)
        assert values_in(kcluster, "idem-failover") == [b"v%d" % i for i in range(9)]
    finally:
        kcluster.start_service(f"replica-{old}")
