"""Replication on real processes: 3 replica servers, a front door and a real redis-server."""

from __future__ import annotations

import signal

from lowtide.record import encode_batch
from lowtide_pb import replica_pb2
from tests.integration import support as s


def test_every_acknowledged_record_survives_a_follower_kill_and_a_later_leader_kill(cluster):
    s.create_topic(cluster, "orders", partitions=1, rf=3)
    leader = s.leader_of(cluster, "orders")
    follower = next(r for r in (0, 1, 2) if r != leader)
    acked: list[bytes] = []
    seq = 0

    def produce_some(n_batches: int) -> None:
        nonlocal seq
        for _ in range(n_batches):
            values = [f"rec-{seq + i}".encode() for i in range(20)]
            seq += 20
            r = s.produce(cluster, "orders", values, acks=-1, timeout_ms=10000, leader=leader)
            if r.error_code == 0:
                acked.extend(values)

    produce_some(30)
    cluster.kill(f"replica-{follower}", signal.SIGKILL)
    produce_some(30)  # the leader drops the dead follower from the ISR and keeps acknowledging
    cluster.start_service(f"replica-{follower}")
    produce_some(10)
    s.wait_until(lambda: follower in s.store(cluster).partition_state("orders", 0).isr,
                 what="the restarted follower back in the ISR")
    leo = s.describe(cluster, leader, "orders").log_end_offset
    s.wait_until(lambda: s.describe(cluster, follower, "orders").log_end_offset == leo, what="follower caught up")

    values = [v for _, v in s.read_all(cluster, "orders")]
    assert len(acked) >= 1400
    assert len(values) == len(set(values)), "a record was read back twice"
    assert [v for v in values if v in set(acked)] == acked

    # Now lose the leader: the controller elects an in-sync replica, which must have them all.
    cluster.kill(f"replica-{leader}", signal.SIGKILL)
    s.wait_until(lambda: s.leader_of(cluster, "orders") not in (leader, -1), timeout_s=30, what="a new leader")
    s.wait_until(lambda: s.fetch(cluster, "orders", 0).error_code == 0, what="new leader serving")
    new_leader = s.leader_of(cluster, "orders")
    # Nothing was truncated: the new leader's log holds every acknowledged offset at once ...
    assert s.describe(cluster, new_leader, "orders").log_end_offset >= leo
    # ... but, as in Kafka, a new leader's HW may lag its LEO until the remaining ISR member has
    # fetched from it, so the last batch becomes visible to consumers a moment later.
    acked_set = set(acked)
    s.wait_until(lambda: [v for _, v in s.read_all(cluster, "orders") if v in acked_set] == acked,
                 timeout_s=15, what="every acknowledged record readable from the new leader")


# The tests below fault nothing and write only topics of their own (repl-): the worker's shared cluster.


def test_a_batch_with_a_bad_crc_is_rejected_as_corrupt_message_and_nothing_is_stored(shared_cluster):
    s.create_topic(shared_cluster, "repl-crc", partitions=1, rf=3)
    assert s.produce(shared_cluster, "repl-crc", [b"good"]).error_code == 0
    leader = s.leader_of(shared_cluster, "repl-crc")
    bad = bytearray(encode_batch([b"payload"] * 3))
    bad[-1] ^= 0xFF  # flip a bit inside the CRC-covered area
    resp = s.replica(shared_cluster, leader).Produce(replica_pb2.ProduceRequest(acks=-1, timeout_ms=5000, partitions=[
        replica_pb2.ProducePartition(topic="repl-crc", partition=0, records=bytes(bad))]))
    assert resp.partitions[0].error_code == 2  # CORRUPT_MESSAGE
    assert s.describe(shared_cluster, leader, "repl-crc").log_end_offset == 1
    truncated = encode_batch([b"payload"] * 3)[:-5]
    resp = s.replica(shared_cluster, leader).Produce(replica_pb2.ProduceRequest(acks=1, partitions=[
        replica_pb2.ProducePartition(topic="repl-crc", partition=0, records=truncated)]))
    assert resp.partitions[0].error_code == 2
    assert s.describe(shared_cluster, leader, "repl-crc").log_end_offset == 1


def test_unknown_topic_is_reported_as_unknown_topic_or_partition(shared_cluster):
    s.create_topic(shared_cluster, "repl-known", partitions=1, rf=1)
    leader = s.leader_of(shared_cluster, "repl-known")
    resp = s.replica(shared_cluster, leader).Produce(replica_pb2.ProduceRequest(acks=1, partitions=[
        replica_pb2.ProducePartition(topic="repl-nosuch", partition=0, records=encode_batch([b"x"]))]))
    assert resp.partitions[0].error_code == 3
    resp = s.replica(shared_cluster, leader).Fetch(replica_pb2.FetchRequest(replica_id=-1, partitions=[
        replica_pb2.FetchPartition(topic="repl-known", partition=7, fetch_offset=0)]))
    assert resp.partitions[0].error_code == 3


def test_fetch_above_the_high_watermark_is_offset_out_of_range(shared_cluster):
    s.create_topic(shared_cluster, "repl-range", partitions=1, rf=3)
    assert s.produce(shared_cluster, "repl-range", [b"a", b"b", b"c"]).error_code == 0
    assert s.fetch(shared_cluster, "repl-range", 3).error_code == 0  # at the HW: empty, not an error
    assert s.fetch(shared_cluster, "repl-range", 3).records == b""
    assert s.fetch(shared_cluster, "repl-range", 4).error_code == 1
    assert s.fetch(shared_cluster, "repl-range", -5).error_code == 1
