"""DeleteRecords through a real in-process front door (gRPC + Redis) fanning out to real replica
server processes (``replica_set``): what each leader was asked is read from its gRPC metrics, what
it did from its DescribeLogs; the faults are real (a compacted topic, a paused follower, a killed
leader)."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import REGISTRY

from lowtide.auth.acl import AclBinding
from lowtide.auth.store import AclStore
from lowtide.auth.tokens import add_token
from lowtide.client import Admin
from lowtide.errors import InvalidRequest
from tests.unit.frontdoor.harness import kill_broker, move_leader, register_broker


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()


def fill(replicas, topic: str, partition: int, count: int = 30) -> None:
    replicas.produce(topic, partition, [b"v%d" % i for i in range(count)])


@pytest.fixture
def two_leaders(front_door, replica_set, store):
    """Topic ``orders`` with partition 0 led by broker 0 and partition 1 by broker 1, 30 records each."""
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={}, assignment=[[0, 1], [1, 0]])
    replica_set.wait_for_leaders("orders")
    for p in (0, 1):
        fill(replica_set, "orders", p)
    return replica_set


def test_each_leader_gets_one_call_with_its_partitions_and_results_keep_request_order(front_door, two_leaders):
    replicas = two_leaders
    before = [replicas.calls(b, "DeleteRecords") for b in (0, 1)]
    with Admin(front_door.address) as admin:
        results = admin.delete_records([("orders", 1, 20), ("orders", 0, 10)], timeout_ms=5000)
    assert list(results) == [("orders", 1), ("orders", 0)]
    assert {k: (r.low_watermark, r.error) for k, r in results.items()} == {
        ("orders", 1): (20, None), ("orders", 0): (10, None)}
    assert [replicas.calls(b, "DeleteRecords") - before[b] for b in (0, 1)] == [1, 1]
    assert replicas.describe(0, "orders", 0).log_start_offset == 10
    assert replicas.describe(1, "orders", 1).log_start_offset == 20


def test_the_same_partition_twice_rejects_the_whole_request(front_door, two_leaders):
    replicas = two_leaders
    before = replicas.calls(0, "DeleteRecords")
    with Admin(front_door.address) as admin, pytest.raises(InvalidRequest, match="orders-0"):
        admin.delete_records([("orders", 0, 1), ("orders", 0, 2)])
    assert replicas.calls(0, "DeleteRecords") == before
    assert replicas.describe(0, "orders", 0).log_start_offset == 0


def test_unknown_topics_and_partitions_fail_alone(front_door, two_leaders):
    with Admin(front_door.address) as admin:
        results = admin.delete_records({("orders", 0): 5, ("orders", 9): 5, ("ghost", 0): 5})
    assert results[("orders", 0)].low_watermark == 5
    assert results[("orders", 9)].error.name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert results[("ghost", 0)].error.name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert results[("ghost", 0)].low_watermark == -1


def test_leader_errors_other_than_not_leader_are_reported_as_they_are(front_door, replica_set, store):
    store.create_topic(name="compacted", partitions=1, replication_factor=1, config={"cleanup.policy": "compact"},
                       assignment=[[0]])
    store.create_topic(name="slow", partitions=1, replication_factor=2, config={}, assignment=[[1, 0]])
    for topic in ("compacted", "slow"):
        replica_set.wait_for_leaders(topic)
    fill(replica_set, "slow", 0)
    before = replica_set.calls(0, "DeleteRecords")
    with Admin(front_door.address) as admin:
        compacted = admin.delete_records({("compacted", 0): 0})[("compacted", 0)]
        # The leader moves its log start offset but cannot acknowledge until its live follower
        # has too: a stopped (but still live) follower holds the low watermark back.
        with replica_set.paused(0):
            slow = admin.delete_records({("slow", 0): 5}, timeout_ms=500)[("slow", 0)]
    assert compacted.error.name == "POLICY_VIOLATION"
    assert slow.error.name == "REQUEST_TIMED_OUT"
    assert replica_set.calls(0, "DeleteRecords") == before + 1


def test_a_lost_leader_is_retried_at_the_new_leader_within_the_timeout(front_door, two_leaders, store):
    replicas = two_leaders
    before = replicas.calls(1, "DeleteRecords")
    with replicas.killed(0):
        answer: dict = {}
        admin = Admin(front_door.address)
        caller = threading.Thread(target=lambda: answer.update(admin.delete_records({("orders", 0): 12},
                                                                                    timeout_ms=20_000)))
        caller.start()
        kill_broker(store, 0)  # its session expiring, at once rather than REPLICA_SESSION_MS later
        move_leader(store, "orders", 0, to=1)
        caller.join(30)
        admin.close()
    result = answer[("orders", 0)]
    assert (result.low_watermark, result.error) == (12, None)
    # At least once: a call that reaches replica 1 before it learned it leads is refused
    # NOT_LEADER_OR_FOLLOWER and retried (seen once in CI's parallel suite: 2 calls).
    assert replicas.calls(1, "DeleteRecords") >= before + 1
    assert replicas.describe(1, "orders", 0).log_start_offset == 12


def test_unreachable_leader_is_reported_after_the_timeout(front_door, store):
    register_broker(store, 7, "127.0.0.1:1")  # a broker id no replica has; nothing listens there
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[7]])
    with Admin(front_door.address) as admin:
        result = admin.delete_records({("orders", 0): 7}, timeout_ms=300)[("orders", 0)]
    assert result.error.name in ("NETWORK_EXCEPTION", "REQUEST_TIMED_OUT")


def test_unauthorized_partitions_fail_while_authorized_ones_proceed(front_door_factory, replica_set, store):
    front_door = front_door_factory(auth_enabled=True)
    for topic in ("allowed", "denied"):
        store.create_topic(name=topic, partitions=1, replication_factor=1, config={}, assignment=[[0]])
        replica_set.wait_for_leaders(topic)
        fill(replica_set, topic, 0, count=5)
    before = replica_set.calls(0, "DeleteRecords")
    add_token(store, token="alice-token", principal="User:alice")
    AclStore(metadata=store).add([AclBinding("User:alice", "TOPIC", "allowed", "LITERAL", "DELETE", "ALLOW")])
    front_door.catch_up()
    alice = [("authorization", "Bearer alice-token")]
    with Admin(front_door.address, metadata=alice) as admin:
        results = admin.delete_records({("allowed", 0): 3, ("denied", 0): 3})
    assert results[("allowed", 0)].low_watermark == 3
    assert results[("denied", 0)].error.name == "TOPIC_AUTHORIZATION_FAILED"
    assert results[("denied", 0)].low_watermark == -1
    assert replica_set.calls(0, "DeleteRecords") == before + 1
    assert replica_set.describe(0, "denied", 0).log_start_offset == 0
    with Admin(front_door.address) as anonymous:  # denied per partition: docs/design/kip-107-delete-records.md
        results = anonymous.delete_records({("allowed", 0): 3})
    assert results[("allowed", 0)].error.name == "TOPIC_AUTHORIZATION_FAILED"
    assert replica_set.calls(0, "DeleteRecords") == before + 1


def test_results_are_counted_and_timed_in_metrics(front_door, two_leaders):
    def sample(name, labels=None):
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    before_ok = sample("lowtide_delete_records_total", {"result": "NONE"})
    before_unknown = sample("lowtide_delete_records_total", {"result": "UNKNOWN_TOPIC_OR_PARTITION"})
    before_count = sample("lowtide_delete_records_duration_seconds_count")
    with Admin(front_door.address) as admin:
        admin.delete_records({("orders", 0): 1, ("ghost", 0): 1})
    assert sample("lowtide_delete_records_total", {"result": "NONE"}) == before_ok + 1
    assert sample("lowtide_delete_records_total", {"result": "UNKNOWN_TOPIC_OR_PARTITION"}) == before_unknown + 1
    assert sample("lowtide_delete_records_duration_seconds_count") == before_count + 1
