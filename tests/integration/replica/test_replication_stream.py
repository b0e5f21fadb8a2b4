"""Replication's long-lived connections on real processes: followers replicate over one
connection per leader, to its replication listener (issue 32; lowtide.rpc.framed.listener)
or on a gRPC Replicate stream (issue 11, ``--replication-transport stream``); a follower that dies
mid-stream reconnects on a new connection, a leader change moves them to the new leader, and a
stopped follower costs the leader no memory (a round carries only what the follower asked for, so
nothing queues on the leader for it). The listener refuses what the Replicate stream refuses.

Which transport carried the rounds is read from the leader's /metrics
(``lowtide_replication_streams`` counts both kinds of connection, ``lowtide_replication_rounds_total``
has the transport).
"""

from __future__ import annotations

import signal
import socket

import grpc
import pytest

from lowtide.common.procs import find_free_port
from lowtide.errors import InvalidRequest, OutOfOrderSequenceNumber
from lowtide.messages.replica import FetchPosition
from lowtide.record import encode_batch
from lowtide.rpc.framed.callers import ListenerProducer, ListenerUnreachable, SocketReplicationStream
from lowtide.rpc.framed.codec import ERROR, HELLO, PRODUCE, REQUEST, encode_frame, encode_hello
from lowtide.rpc.framed.connection import FramedConnection
from lowtide_pb import replica_pb2
from tests.bench.common import rss_bytes
from tests.integration import support as s

MiB = 1 << 20


def streams(cluster, leader: int, follower: int) -> float:
    return s.metric(cluster, f"replica-{leader}", "lowtide_replication_streams", follower=str(follower))


def rounds(cluster, leader: int, follower: int, transport: str) -> float:
    return s.metric(cluster, f"replica-{leader}", "lowtide_replication_rounds_total", follower=str(follower),
                    transport=transport)


def produce_batches(cluster, topic: str, n: int, *, leader: int, acks: int = -1, tag: str = "v") -> list[bytes]:
    acked = []
    for i in range(n):
        values = [f"{tag}-{i}-{j}".encode() for j in range(10)]
        r = s.produce(cluster, topic, values, acks=acks, timeout_ms=10000, leader=leader)
        assert r.error_code == 0, r
        acked.extend(values)
    return acked


def test_followers_replicate_over_one_listener_connection_per_leader_and_no_grpc_round(shared_cluster):
    cluster = shared_cluster  # faults nothing; its topic is its own
    s.create_topic(cluster, "rs-streamed", partitions=1, rf=3)
    leader = s.leader_of(cluster, "rs-streamed")
    assert s.store(cluster).brokers()[leader].replication_port > 0, "the leader advertises its listener"
    acked = produce_batches(cluster, "rs-streamed", 20, leader=leader)
    for follower in (b for b in (0, 1, 2) if b != leader):
        s.wait_until(lambda f=follower: streams(cluster, leader, f) == 1,
                     what=f"one connection from follower {follower}")
        assert rounds(cluster, leader, follower, "socket") > 0
        assert rounds(cluster, leader, follower, "stream") == 0
        assert rounds(cluster, leader, follower, "fetch") == 0
        s.wait_until(lambda f=follower: s.describe(cluster, f, "rs-streamed").log_end_offset == len(acked),
                     what=f"follower {follower} has every record")


def test_the_replication_listener_refuses_a_consumer_request_and_a_malformed_frame(shared_cluster):
    cluster = shared_cluster  # faults nothing; its topic is its own
    s.create_topic(cluster, "rs-listener-refusals", partitions=1, rf=3)
    leader = s.leader_of(cluster, "rs-listener-refusals")
    address = f"127.0.0.1:{s.store(cluster).brokers()[leader].replication_port}"
    consumer = SocketReplicationStream(address, tls=None, metadata=(), connect_timeout_s=5)
    with pytest.raises(InvalidRequest, match="replica_id must be >= 0"):
        consumer.fetch([FetchPosition(topic="rs-listener-refusals", partition=0, fetch_offset=0)], replica_id=-1,
                       max_wait_ms=0)
    assert consumer.finished
    consumer.close()

    with socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=10) as raw:
        raw.sendall(b"\x00\x00\x00\x05\x09junk")  # kind 9: no such frame
        reply = raw.recv(4096)
    assert reply[4] == ERROR and b"unknown frame kind 9" in reply, reply


@pytest.mark.parametrize(("transport", "open_streams"), [("stream", 1), ("fetch", 0)])
def test_the_grpc_transports_still_replicate_when_chosen(cluster_factory, transport, open_streams):
    cluster = cluster_factory(coordinators=0, extra_env={"LOWTIDE_REPLICATION_TRANSPORT": transport})
    s.create_topic(cluster, "grpc-transport", partitions=1, rf=3)
    leader = s.leader_of(cluster, "grpc-transport")
    acked = produce_batches(cluster, "grpc-transport", 10, leader=leader)
    for follower in (b for b in (0, 1, 2) if b != leader):
        s.wait_until(lambda f=follower: rounds(cluster, leader, f, transport) > 0,
                     what=f"follower {follower} fetching by {transport}")
        assert streams(cluster, leader, follower) == open_streams
        assert rounds(cluster, leader, follower, "socket") == 0
    assert [v for _, v in s.read_all(cluster, "grpc-transport")] == acked


def test_a_follower_killed_mid_stream_comes_back_on_a_new_stream_and_catches_up(cluster):
    s.create_topic(cluster, "reconnect", partitions=1, rf=3)
    leader = s.leader_of(cluster, "reconnect")
    follower = next(b for b in (0, 1, 2) if b != leader)
    acked = produce_batches(cluster, "reconnect", 20, leader=leader, tag="before")
    s.wait_until(lambda: streams(cluster, leader, follower) == 1, what="the follower's stream open")

    cluster.kill(f"replica-{follower}", signal.SIGKILL)
    # The leader notices the dead peer: its handler ends and the stream is no longer counted.
    s.wait_until(lambda: streams(cluster, leader, follower) == 0, timeout_s=30, what="the dead stream closed")
    acked += produce_batches(cluster, "reconnect", 20, leader=leader, tag="while-dead")

    cluster.start_service(f"replica-{follower}")
    acked += produce_batches(cluster, "reconnect", 5, leader=leader, tag="after")
    leo = s.describe(cluster, leader, "reconnect").log_end_offset
    s.wait_until(lambda: s.describe(cluster, follower, "reconnect").log_end_offset == leo,
                 what="the restarted follower caught up")
    s.wait_until(lambda: follower in s.store(cluster).partition_state("reconnect", 0).isr,
                 what="the restarted follower back in the ISR")
    assert streams(cluster, leader, follower) == 1, "exactly one stream: the old one must be gone"
    assert [v for _, v in s.read_all(cluster, "reconnect")] == acked


def test_a_leader_change_moves_the_streams_to_the_new_leader_and_nothing_acknowledged_is_lost(cluster):
    s.create_topic(cluster, "moving", partitions=1, rf=3)
    old = s.leader_of(cluster, "moving")
    acked = produce_batches(cluster, "moving", 30, leader=old, tag="old")
    # A graceful stop: the draining leader ends its streams instead of holding them for its grace.
    assert cluster.stop_service(f"replica-{old}") == "stopped"
    s.wait_until(lambda: s.leader_of(cluster, "moving") not in (old, -1), timeout_s=30, what="a new leader")
    new = s.leader_of(cluster, "moving")
    other = next(b for b in (0, 1, 2) if b not in (old, new))
    # acks=all on the new leader needs the remaining follower to replicate from it: over a stream.
    s.wait_until(lambda: s.produce(cluster, "moving", [b"probe"], acks=-1, timeout_ms=5000,
                                   leader=new).error_code == 0, timeout_s=30, what="acks=all on the new leader")
    acked.append(b"probe")
    acked += produce_batches(cluster, "moving", 10, leader=new, tag="new")
    assert streams(cluster, new, other) == 1

    cluster.start_service(f"replica-{old}")  # comes back as a follower of the new leader
    s.wait_until(lambda: streams(cluster, new, old) == 1, timeout_s=30, what="the old leader streams as follower")
    leo = s.describe(cluster, new, "moving").log_end_offset
    s.wait_until(lambda: s.describe(cluster, old, "moving").log_end_offset == leo, what="old leader caught up")
    assert [v for _, v in s.read_all(cluster, "moving")] == acked


def test_a_stopped_follower_costs_the_leader_no_memory_and_catches_up_when_resumed(cluster):
    s.create_topic(cluster, "slow", partitions=1, rf=3, config={"segment.bytes": str(16 * MiB)})
    leader = s.leader_of(cluster, "slow")
    slow = next(b for b in (0, 1, 2) if b != leader)
    leader_pid = cluster.service(f"replica-{leader}").pid
    batch = encode_batch([b"x" * 1024] * 900)  # just under max.message.bytes
    stub = s.replica(cluster, leader)

    def produce_mib(n: int) -> None:
        for _ in range(n):
            resp = stub.Produce(replica_pb2.ProduceRequest(acks=1, timeout_ms=10000, partitions=[
                replica_pb2.ProducePartition(topic="slow", partition=0, records=batch)]), timeout=30)
            assert resp.partitions[0].error_code == 0

    produce_mib(64)  # with every follower up: the leader's heap reaches its working size first
    before = rss_bytes(leader_pid)
    cluster.pause(f"replica-{slow}")
    try:
        peak = before
        for _ in range(4):
            produce_mib(48)
            peak = max(peak, rss_bytes(leader_pid))
        # 192 MiB went by the stopped follower. The leader keeps none of it for that follower (it
        # reads the log when asked; one answer of at most replica.fetch.max.bytes can sit in the
        # stream), so RSS stays within the heap's swing (±20 MiB on a quiet machine, 50 once on a
        # loaded CI run), far below the backlog: a leader holding it would grow by 192 MiB.
        assert peak - before < 96 * MiB, f"leader RSS grew {(peak - before) / MiB:.1f} MiB over a stopped follower"
    finally:
        cluster.resume(f"replica-{slow}")
    leo = s.describe(cluster, leader, "slow").log_end_offset
    s.wait_until(lambda: s.describe(cluster, slow, "slow").log_end_offset == leo, timeout_s=60,
                 what="the resumed follower caught up")
    assert s.produce(cluster, "slow", [b"after"], acks=-1, timeout_ms=10000, leader=leader).error_code == 0


def test_a_parked_follower_round_ends_when_its_connection_closes_not_after_its_long_poll(shared_cluster):
    cluster = shared_cluster  # faults nothing; its topic is its own
    s.create_topic(cluster, "rs-departed", partitions=1, rf=3)
    leader = s.leader_of(cluster, "rs-departed")
    follower = next(b for b in (0, 1, 2) if b != leader)
    acked = produce_batches(cluster, "rs-departed", 3, leader=leader)
    s.wait_until(lambda: streams(cluster, leader, follower) == 1, what="the follower's own connection")
    port = s.store(cluster).brokers()[leader].replication_port
    # A round at the log end with a 30 s long poll: it parks (nothing is produced meanwhile).
    fetch = replica_pb2.FetchRequest(replica_id=follower, max_wait_ms=30_000, min_bytes=1, max_bytes=1 << 20,
                                     partitions=[replica_pb2.FetchPartition(topic="rs-departed", partition=0,
                                                                            fetch_offset=len(acked))])
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        raw.sendall(encode_frame(HELLO, encode_hello([])) + encode_frame(REQUEST, fetch.SerializeToString()))
        s.wait_until(lambda: streams(cluster, leader, follower) == 2, what="the parked round's connection counted")
        raw.settimeout(1.0)
        with pytest.raises(TimeoutError):
            raw.recv(1)  # still parked: no answer yet
    finally:
        raw.close()
    # Released by the close, not by its long poll: the connection's count goes within seconds.
    s.wait_until(lambda: streams(cluster, leader, follower) == 1, timeout_s=8,
                 what="the parked round released when its follower went away")


def test_a_replicate_stream_refuses_a_consumer_request(shared_cluster):
    cluster = shared_cluster  # faults nothing; its topic is its own
    s.create_topic(cluster, "rs-notforconsumers", partitions=1, rf=3)
    leader = s.leader_of(cluster, "rs-notforconsumers")
    request = replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, partitions=[
        replica_pb2.FetchPartition(topic="rs-notforconsumers", partition=0, fetch_offset=0)])
    with pytest.raises(grpc.RpcError) as err:
        next(iter(s.replica(cluster, leader).Replicate(iter([request]), timeout=10)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("INVALID_REQUEST"), err.value.details()


def test_a_produce_on_the_replication_listener_is_answered_and_refused_as_the_grpc_produce(shared_cluster):
    cluster = shared_cluster  # faults nothing; its topic is its own
    s.create_topic(cluster, "rs-listener-produce", partitions=1, rf=3)
    leader = s.leader_of(cluster, "rs-listener-produce")
    address = f"127.0.0.1:{s.store(cluster).brokers()[leader].replication_port}"
    producer = ListenerProducer(tls=None, metadata=[])
    try:
        batch = encode_batch([b"a", b"b", b"c"])
        [first] = producer.produce(address, [("rs-listener-produce", 0, batch)], acks=-1, timeout_ms=10000,
                                   deadline_s=15)
        [second] = producer.produce(address, [("rs-listener-produce", 0, batch)], acks=-1, timeout_ms=10000,
                                    deadline_s=15, expected_end_offsets={("rs-listener-produce", 0): 3})
        assert (first.error, first.base_offset, second.error, second.base_offset) == (None, 0, None, 3)
        # Conditional on a log end it does not have: refused, nothing appended (as over gRPC).
        [stale] = producer.produce(address, [("rs-listener-produce", 0, batch)], acks=-1, timeout_ms=10000,
                                   deadline_s=15, expected_end_offsets={("rs-listener-produce", 0): 3})
        assert isinstance(stale.error, OutOfOrderSequenceNumber), stale
        # An internal topic is written by its coordinators only: a plain Produce is refused.
        [internal] = producer.produce(address, [("__consumer_offsets", 0, batch)], acks=-1, timeout_ms=10000,
                                      deadline_s=15)
        assert internal.error is not None and internal.error.name == "INVALID_TOPIC_EXCEPTION", internal
        assert [v for _, v in s.read_all(cluster, "rs-listener-produce")] == [b"a", b"b", b"c"] * 2
        connection = FramedConnection(address, tls=None, metadata=[], connect_timeout_s=5)
        with pytest.raises(InvalidRequest, match="malformed ProduceRequest"):
            connection.call(PRODUCE, b"\xff\xff\xff")
        assert connection.finished
    finally:
        producer.close()
    with pytest.raises(ListenerUnreachable):  # nothing listens there: nothing was sent
        ListenerProducer(tls=None, metadata=[]).produce(f"127.0.0.1:{find_free_port()}",
                                                        [("rs-listener-produce", 0, batch)], acks=-1,
                                                        timeout_ms=1000, deadline_s=5)
