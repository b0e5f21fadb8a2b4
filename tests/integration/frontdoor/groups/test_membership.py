"""Kafka's classic group membership over real gRPC against a real front door process (in a local
cluster of real processes): members join concurrently, the leader's SyncGroup hands out the
assignments, commits are checked against the generation, and the group shows up in ListGroups,
DescribeGroups, DeleteGroups and OffsetDelete as Kafka's coordinator answers them."""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

from lowtide.client.admin import Admin
from lowtide.errors import (
    GroupSubscribedToTopic,
    IllegalGeneration,
    NonEmptyGroup,
    RebalanceInProgress,
    UnknownMemberId,
)
from tests.integration.support import create_topic


def subscription(*topics: str) -> bytes:
    """Consumer protocol subscription v0 as Kafka's consumer writes it: version, topics, user data."""
    body = struct.pack(">hi", 0, len(topics))
    for t in topics:
        body += struct.pack(">h", len(t)) + t.encode()
    return body + struct.pack(">i", -1)


def test_two_consumers_join_sync_commit_and_leave_through_a_real_front_door(cluster_factory):
    cluster = cluster_factory(replicas=1, extra_env={"LOWTIDE_GROUP_INITIAL_REBALANCE_DELAY_MS": "500"})
    create_topic(cluster, "orders", partitions=2, rf=1)
    create_topic(cluster, "audit", partitions=1, rf=1)
    with Admin(cluster.bootstrap) as admin, ThreadPoolExecutor(max_workers=4) as pool:
        assert admin.commit_offsets("etl", {("audit", 0): 3}) == {("audit", 0): None}  # before any member

        def join(client_id: str, member_id: str = ""):
            return admin.join_group("etl", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                                    client_id=client_id, member_id=member_id, require_known_member_id=True,
                                    protocols=[("range", subscription("orders"))])

        def join_with_required_id(client_id: str):
            first = join(client_id)
            assert first.error is not None and first.error.name == "MEMBER_ID_REQUIRED"
            return join(client_id, member_id=first.member_id)

        a, b = [f.result(timeout=30) for f in [pool.submit(join_with_required_id, c) for c in ("c1", "c2")]]
        assert a.error is None and b.error is None and a.generation_id == b.generation_id
        leader, follower = (a, b) if a.is_leader else (b, a)
        assert sorted(m[0] for m in leader.members) == sorted([a.member_id, b.member_id]) and follower.members == ()

        waiting = pool.submit(admin.sync_group, "etl", generation_id=follower.generation_id,
                              member_id=follower.member_id)
        mine = admin.sync_group("etl", generation_id=leader.generation_id, member_id=leader.member_id,
                                protocol_type="consumer", protocol_name="range",
                                assignments={leader.member_id: b"orders-0", follower.member_id: b"orders-1"})
        assert (mine.error, mine.assignment) == (None, b"orders-0")
        assert waiting.result(timeout=10).assignment == b"orders-1"
        assert admin.heartbeat("etl", generation_id=a.generation_id, member_id=a.member_id) is None
        assert isinstance(admin.heartbeat("etl", generation_id=a.generation_id + 5, member_id=a.member_id),
                          IllegalGeneration)

        generation = a.generation_id
        assert isinstance(admin.commit_offsets("etl", {("orders", 0): 10})[("orders", 0)], UnknownMemberId)
        assert isinstance(admin.commit_offsets("etl", {("orders", 0): 10}, generation_id=generation + 1,
                                               member_id=a.member_id)[("orders", 0)], IllegalGeneration)
        assert admin.commit_offsets("etl", {("orders", 0): 10}, generation_id=generation,
                                    member_id=a.member_id) == {("orders", 0): None}

        listings = {g.group_id: (g.protocol_type, g.state) for g in admin.list_group_listings()}
        assert listings["etl"] == ("consumer", "Stable")
        described = admin.describe_groups(["etl"])["etl"]
        assert (described.state, described.protocol, described.offsets[("orders", 0)].offset) == (
            "Stable", "range", 10)
        assert {m.member_id: m.assignment for m in described.members} == {
            leader.member_id: b"orders-0", follower.member_id: b"orders-1"}
        assert all(m.client_host.startswith("/127.0.0.1") for m in described.members)

        deleted = admin.offset_delete("etl", [("orders", 0), ("audit", 0)])
        assert isinstance(deleted[("orders", 0)], GroupSubscribedToTopic) and deleted[("audit", 0)] is None
        assert isinstance(admin.delete_groups(["etl"])["etl"], NonEmptyGroup)

        # a leaves: b's heartbeat says rebalance, b rejoins alone into the next generation
        assert admin.leave_group("etl", member_id=a.member_id, reason="done") == {(a.member_id, ""): None}
        assert isinstance(admin.heartbeat("etl", generation_id=generation, member_id=b.member_id),
                          RebalanceInProgress)
        again = join("c2", member_id=b.member_id)
        assert (again.generation_id, again.leader) == (generation + 1, b.member_id)
        admin.leave_group("etl", member_id=b.member_id)
        assert admin.describe_groups(["etl"])["etl"].state == "Empty"
        assert admin.delete_groups(["etl"]) == {"etl": None}
        assert "etl" not in admin.list_groups()
