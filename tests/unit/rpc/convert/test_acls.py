"""rpc/convert/acls.py: ACL bindings, filters and CreateAcls results survive the trip to protobuf
and back (the servicer's direction and its remote twin's), and encode as the lowtide.v1 wire says."""

from __future__ import annotations

import pytest

from lowtide.errors import ClusterAuthorizationFailed, InvalidRequest
from lowtide.messages.acls import AclBinding, AclFilter, AclOperation, AclPermission, PatternType, ResourceType
from lowtide.rpc.convert import acls as convert
from lowtide_pb import admin_pb2

ALICE_READS = AclBinding(principal="User:alice", resource_type=ResourceType.TOPIC, resource_name="orders",
                         pattern_type=PatternType.PREFIXED, operation=AclOperation.READ,
                         permission=AclPermission.ALLOW)
CLUSTER_DENY = AclBinding(principal="User:*", resource_type=ResourceType.CLUSTER, resource_name="kafka-cluster",
                          pattern_type=PatternType.LITERAL, operation=AclOperation.ALTER,
                          permission=AclPermission.DENY)


@pytest.mark.parametrize("binding", [ALICE_READS, CLUSTER_DENY])
def test_a_binding_comes_back_from_protobuf_equal(binding):
    assert convert.binding_from_proto(convert.binding_to_proto(binding)) == binding


@pytest.mark.parametrize("acl_filter", [
    AclFilter(),
    AclFilter(principal="User:alice"),
    AclFilter(resource_type=ResourceType.GROUP, resource_name="etl", pattern_type=PatternType.LITERAL),
    AclFilter(principal="User:bob", resource_type=ResourceType.TOPIC, resource_name="x",
              pattern_type=PatternType.PREFIXED, operation=AclOperation.WRITE, permission=AclPermission.DENY),
])
def test_a_filter_comes_back_from_protobuf_equal_with_its_any_fields_still_any(acl_filter):
    assert convert.filter_from_proto(convert.filter_to_proto(acl_filter)) == acl_filter
    assert convert.describe_filter(convert.describe_request(acl_filter)) == acl_filter
    assert [convert.filter_from_proto(f) for f in convert.delete_request([acl_filter, AclFilter()]).filters] == [
        acl_filter, AclFilter()]


def test_a_describe_request_without_a_filter_selects_every_binding():
    assert convert.describe_filter(admin_pb2.DescribeAclsRequest()) == AclFilter()


def test_described_and_deleted_bindings_come_back_in_order():
    bindings = [ALICE_READS, CLUSTER_DENY]
    assert [convert.binding_from_proto(b) for b in convert.describe_response(bindings).acls] == bindings
    assert [convert.binding_from_proto(b) for b in convert.delete_response(bindings).deleted] == bindings


def test_create_results_come_back_as_the_same_errors_by_code():
    results = convert.create_results(convert.create_response([None, ClusterAuthorizationFailed("no")]))
    assert results[0] is None and isinstance(results[1], ClusterAuthorizationFailed)
    assert [convert.binding_from_proto(b) for b in convert.create_request([ALICE_READS]).acls] == [ALICE_READS]


def test_a_binding_with_an_unspecified_enum_is_invalid_request():
    with pytest.raises(InvalidRequest, match="operation"):
        convert.binding_from_proto(admin_pb2.AclBinding(principal="User:a", resource_type=2, resource_name="t",
                                                        pattern_type=3, permission=3))


def test_a_create_request_encodes_byte_for_byte_as_lowtide_v1_says():
    assert convert.create_request([ALICE_READS]).SerializeToString(deterministic=True) == \
        b"\n\x1c\n\nUser:alice\x10\x02\x1a\x06orders \x04(\x030\x03"
