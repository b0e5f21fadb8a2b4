"""DeleteRecords through a real in-process front door (gRPC + Redis) fanning out to in-test
replicas on real gRPC ports (the replica server is tested on its own; see ``harness``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from lowtide.auth.acl import AclBinding
from lowtide.auth.store import AclStore
from lowtide.auth.tokens import add_token
from lowtide.client import Admin
from lowtide.errors import InvalidRequest
from tests.unit.frontdoor.harness import register_broker

NOT_LEADER, TIMED_OUT, POLICY_VIOLATION = 6, 7, 44


@pytest.fixture
def two_leaders(front_door, stub_replicas, store):
    """Topic ``orders`` with partition 0 led by broker 0 and partition 1 by broker 1."""
    (r0, a0), (r1, a1) = stub_replicas(), stub_replicas()
    register_broker(store, 0, a0)
    register_broker(store, 1, a1)
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={}, assignment=[[0, 1], [1, 0]])
    return r0, r1


def test_each_leader_gets_one_call_with_its_partitions_and_results_keep_request_order(front_door, two_leaders):
    r0, r1 = two_leaders
    with Admin(front_door.address) as admin:
        results = admin.delete_records([("orders", 1, 20), ("orders", 0, 10)], timeout_ms=5000)
    assert {k: (r.low_watermark, r.error) for k, r in results.items()} == {
        ("orders", 1): (20, None), ("orders", 0): (10, None)}
    assert [[(p.topic, p.partition, p.offset) for p in c.partitions] for c in r0.called("DeleteRecords")] == [
        [("orders", 0, 10)]]
    assert [[p.partition for p in c.partitions] for c in r1.called("DeleteRecords")] == [[1]]
    assert 0 < r0.called("DeleteRecords")[0].timeout_ms <= 5000


def test_the_same_partition_twice_rejects_the_whole_request(front_door, two_leaders):
    r0, _ = two_leaders
    with Admin(front_door.address) as admin, pytest.raises(InvalidRequest, match="orders-0"):
        admin.delete_records([("orders", 0, 1), ("orders", 0, 2)])
    assert r0.called("DeleteRecords") == []


def test_unknown_topics_and_partitions_fail_alone(front_door, two_leaders):
    with Admin(front_door.address) as admin:
        results = admin.delete_records({("orders", 0): 5, ("orders", 9): 5, ("ghost", 0): 5})
    assert results[("orders", 0)].low_watermark == 5
    assert results[("orders", 9)].error.name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert results[("ghost", 0)].error.name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert results[("ghost", 0)].low_watermark == -1


def test_leader_errors_other_than_not_leader_are_reported_as_they_are(front_door, two_leaders):
    r0, r1 = two_leaders
    r0.delete_errors[("orders", 0)] = [POLICY_VIOLATION]
    r1.delete_errors[("orders", 1)] = [TIMED_OUT]
    with Admin(front_door.address) as admin:
        results = admin.delete_records({("orders", 0): 5, ("orders", 1): 5})
    assert results[("orders", 0)].error.name == "POLICY_VIOLATION"
    assert results[("orders", 1)].error.name == "REQUEST_TIMED_OUT"
    assert len(r0.called("DeleteRecords")) == 1


def test_not_leader_refreshes_metadata_and_retries_at_the_new_leader(front_door, two_leaders, store):
    r0, r1 = two_leaders
    r0.delete_errors[("orders", 0)] = [NOT_LEADER]

    def move_leadership(_request):  # what a controller would write while broker 0 steps down
        state = store.partition_state("orders", 0)
        store.compare_and_set_partition(state, replace(state, leader=1, leader_epoch=1))

    r0.on_delete_records = move_leadership
    r1.low_watermarks[("orders", 0)] = 42
    with Admin(front_door.address) as admin:
        result = admin.delete_records({("orders", 0): 42})[("orders", 0)]
    assert (result.low_watermark, result.error) == (42, None)
    assert len(r0.called("DeleteRecords")) == 1
    assert len(r1.called("DeleteRecords")) == 1


def test_not_leader_is_retried_until_the_leader_answers(front_door, two_leaders):
    r0, _ = two_leaders
    r0.delete_errors[("orders", 0)] = [NOT_LEADER, NOT_LEADER]
    with Admin(front_door.address) as admin:
        result = admin.delete_records({("orders", 0): 7})[("orders", 0)]
    assert result.low_watermark == 7
    assert len(r0.called("DeleteRecords")) == 3


def test_persistent_not_leader_is_reported_when_the_timeout_runs_out(front_door, two_leaders):
    r0, _ = two_leaders
    r0.delete_errors[("orders", 0)] = [NOT_LEADER] * 1000
    with Admin(front_door.address) as admin:
        result = admin.delete_records({("orders", 0): 7}, timeout_ms=300)[("orders", 0)]
    assert result.error.name == "NOT_LEADER_OR_FOLLOWER" and result.low_watermark == -1


def test_unreachable_leader_is_reported_after_the_timeout(front_door, store):
    register_broker(store, 0, "127.0.0.1:1")  # nothing listens there
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    with Admin(front_door.address) as admin:
        result = admin.delete_records({("orders", 0): 7}, timeout_ms=300)[("orders", 0)]
    assert result.error.name in ("NETWORK_EXCEPTION", "REQUEST_TIMED_OUT")


def test_unauthorized_partitions_fail_while_authorized_ones_proceed(front_door_factory, stub_replicas, store):
    front_door = front_door_factory(auth_enabled=True)
    replica, address = stub_replicas()
    register_broker(store, 0, address)
    for topic in ("allowed", "denied"):
        store.create_topic(name=topic, partitions=1, replication_factor=1, config={}, assignment=[[0]])
    add_token(store.redis, token="alice-token", principal="User:alice")
    AclStore(redis=store.redis).add([AclBinding("User:alice", "TOPIC", "allowed", "LITERAL", "DELETE", "ALLOW")])
    alice = [("authorization", "Bearer alice-token")]
    with Admin(front_door.address, metadata=alice) as admin:
        results = admin.delete_records({("allowed", 0): 3, ("denied", 0): 3})
    assert results[("allowed", 0)].low_watermark == 3
    assert results[("denied", 0)].error.name == "TOPIC_AUTHORIZATION_FAILED"
    assert results[("denied", 0)].low_watermark == -1
    assert [p.topic for c in replica.called("DeleteRecords") for p in c.partitions] == ["allowed"]
    with Admin(front_door.address) as anonymous:  # denied per partition: docs/design/kip-107-delete-records.md
        results = anonymous.delete_records({("allowed", 0): 3})
    assert results[("allowed", 0)].error.name == "TOPIC_AUTHORIZATION_FAILED"
    assert [p.topic for c in replica.called("DeleteRecords") for p in c.partitions] == ["allowed"]


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
