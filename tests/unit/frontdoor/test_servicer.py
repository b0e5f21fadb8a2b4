"""The Admin service end to end over gRPC (client ``Admin`` -> in-process front door -> Redis)."""

from __future__ import annotations

import grpc
import pytest

from lowtide.auth.acl import AclBinding, AclFilter
from lowtide.auth.tokens import add_token
from lowtide.client import Admin, OffsetSpec
from lowtide.errors import ClusterAuthorizationFailed, SaslAuthenticationFailed, TopicAlreadyExists
from lowtide.rpc.convert.acls import binding_to_proto, filter_to_proto
from lowtide_pb import admin_pb2, admin_pb2_grpc
from tests.unit.frontdoor.harness import register_broker

ADMIN_TOKEN = [("authorization", "Bearer admin-token")]


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()


def test_topics_are_created_described_listed_and_deleted(front_door, store):
    for b in (0, 1, 2):
        register_broker(store, b, f"127.0.0.1:{7000 + b}")
    with Admin(front_door.address) as admin:
        admin.create_topic("orders", partitions=3, replication_factor=3, config={"retention.ms": "1000"})
        with pytest.raises(TopicAlreadyExists):
            admin.create_topic("orders", partitions=3, replication_factor=3)
        meta = admin.describe_cluster(["orders"]).topic("orders")
        assert [p.partition for p in meta.partitions] == [0, 1, 2]
        assert all(sorted(p.replicas) == [0, 1, 2] and p.isr == p.replicas for p in meta.partitions)
        assert meta.config == {"retention.ms": "1000"} and meta.replication_factor == 3
        assert admin.list_topics() == ["orders"]
        admin.delete_topic("orders")
        assert admin.list_topics() == []


def test_list_offsets_fans_out_to_the_leaders(front_door, replica_set, store):
    store.create_topic(name="orders", partitions=2, replication_factor=1, config={}, assignment=[[0], [0]])
    replica_set.wait_for_leaders("orders")
    replica_set.produce("orders", 0, [b"v"] * 100)
    replica_set.produce("orders", 1, [b"v"] * 200)
    before = replica_set.calls(0, "ListOffsets")
    with Admin(front_door.address) as admin:
        got = admin.list_offsets({("orders", 0): OffsetSpec.LATEST, ("orders", 1): OffsetSpec.LATEST,
                                  ("orders", 5): OffsetSpec.LATEST})
    assert got[("orders", 0)].offset == 100 and got[("orders", 1)].offset == 200
    assert got[("orders", 5)].error.name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert replica_set.calls(0, "ListOffsets") == before + 1  # both partitions in one request to their leader


def test_group_offsets_round_trip_through_the_client(front_door_factory, store, replica_set):
    front_door = front_door_factory(offsets_topic_partitions=2)  # __consumer_offsets on the real replicas
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    with Admin(front_door.address) as admin:
        assert admin.commit_offsets("etl", {("orders", 0): 12}) == {("orders", 0): None}
        assert admin.fetch_offsets("etl")[("orders", 0)].offset == 12
        assert admin.list_groups() == ["etl"]
        assert admin.describe_groups(["etl"])["etl"].offsets[("orders", 0)].offset == 12
        assert admin.delete_groups(["etl", "etl"])["etl"].name == "GROUP_ID_NOT_FOUND"


def test_who_am_i_names_the_token_owner_and_refuses_a_wrong_token(front_door_factory, store):
    front_door = front_door_factory(auth_enabled=True)
    add_token(store, token="admin-token", principal="User:admin")
    with Admin(front_door.address, metadata=ADMIN_TOKEN) as admin:
        assert admin.who_am_i() == ("User:admin", True)
    with Admin(front_door.address) as admin:
        assert admin.who_am_i() == ("User:ANONYMOUS", True)
    with Admin(front_door.address, metadata=[("authorization", "Bearer wrong")]) as admin:
        with pytest.raises(SaslAuthenticationFailed):
            admin.who_am_i()


def test_acl_changes_need_alter_on_the_cluster(front_door_factory, store):
    front_door = front_door_factory(auth_enabled=True, super_users=frozenset({"User:admin"}))
    add_token(store, token="admin-token", principal="User:admin")
    add_token(store, token="bob-token", principal="User:bob")
    binding = AclBinding("User:alice", "TOPIC", "orders", "LITERAL", "DELETE", "ALLOW")
    channel = grpc.insecure_channel(front_door.address)
    stub = admin_pb2_grpc.AdminStub(channel)
    request = admin_pb2.CreateAclsRequest(acls=[binding_to_proto(binding)])
    bob = stub.CreateAcls(request, metadata=[("authorization", "Bearer bob-token")])
    assert list(bob.results) == [ClusterAuthorizationFailed.code]
    admin = stub.CreateAcls(request, metadata=ADMIN_TOKEN)
    assert list(admin.results) == [0]
    described = stub.DescribeAcls(admin_pb2.DescribeAclsRequest(filter=filter_to_proto(AclFilter())),
                                  metadata=ADMIN_TOKEN)
    assert [a.principal for a in described.acls] == ["User:alice"]
    with pytest.raises(grpc.RpcError) as refused:
        stub.DeleteAcls(admin_pb2.DeleteAclsRequest(filters=[filter_to_proto(AclFilter())]),
                        metadata=[("authorization", "Bearer bob-token")])
    assert refused.value.details().startswith("CLUSTER_AUTHORIZATION_FAILED")
    deleted = stub.DeleteAcls(admin_pb2.DeleteAclsRequest(filters=[filter_to_proto(AclFilter())]),
                              metadata=ADMIN_TOKEN)
    assert len(deleted.deleted) == 1
    channel.close()


def test_topic_creation_needs_alter_on_the_cluster_when_auth_is_on(front_door_factory, store):
    front_door = front_door_factory(auth_enabled=True)
    register_broker(store, 0)
    add_token(store, token="bob-token", principal="User:bob")
    with Admin(front_door.address, metadata=[("authorization", "Bearer bob-token")]) as bob, \
            pytest.raises(ClusterAuthorizationFailed):
        bob.create_topic("orders", partitions=1, replication_factor=1)
