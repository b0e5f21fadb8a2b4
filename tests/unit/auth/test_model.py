"""The ACL domain model: enum numbers, parsing, validation, and proto conversion."""

from __future__ import annotations

import pytest

from lowtide.auth.acl import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
    parse_operation,
    parse_pattern_type,
    parse_principal,
)
from lowtide.errors import InvalidRequest
from lowtide.rpc.convert.acls import binding_from_proto, binding_to_proto, filter_from_proto, filter_to_proto
from lowtide_pb import admin_pb2


@pytest.mark.parametrize("enum_cls", [ResourceType, PatternType, AclOperation, AclPermission])
def test_domain_enums_have_the_proto_enum_numbers(enum_cls):
    for member in enum_cls:
        assert getattr(admin_pb2, member.name) == member.value


def test_operations_parse_from_cli_and_proto_spellings():
    assert parse_operation("delete") is AclOperation.DELETE
    assert parse_operation("DELETE") is AclOperation.DELETE
    assert parse_operation("cluster-action") is AclOperation.CLUSTER_ACTION
    assert parse_pattern_type("prefixed") is PatternType.PREFIXED


def test_an_unknown_operation_is_an_invalid_request_listing_the_choices():
    with pytest.raises(InvalidRequest, match="unknown operation 'purge'.*cluster-action"):
        parse_operation("purge")


@pytest.mark.parametrize("bad", ["alice", "user:alice", "User:", "Group:ops", ":alice", "User: alice"])
def test_a_principal_must_look_like_user_colon_name(bad):
    with pytest.raises(InvalidRequest, match="expected 'User:<name>'"):
        parse_principal(bad)


def test_wildcard_and_plain_principals_are_valid():
    assert parse_principal("User:*") == "User:*"
    assert parse_principal("User:spark-retention") == "User:spark-retention"


def test_bindings_coerce_numbers_and_names_to_enums():
    b = AclBinding(principal="User:a", resource_type=2, resource_name="t", pattern_type="LITERAL",
                   operation=6, permission=3)
    assert (b.resource_type, b.pattern_type, b.operation, b.permission) == (
        ResourceType.TOPIC, PatternType.LITERAL, AclOperation.DELETE, AclPermission.ALLOW)


@pytest.mark.parametrize("kwargs, message", [
    ({"resource_name": ""}, "must not be empty"),
    ({"resource_type": ResourceType.CLUSTER, "resource_name": "prod"}, "kafka-cluster"),
    ({"pattern_type": PatternType.PREFIXED, "resource_name": "*"}, "only valid with pattern type LITERAL"),
    ({"operation": 5}, "invalid operation 5"),
])
def test_invalid_bindings_are_rejected_with_the_reason(kwargs, message):
    fields = {"principal": "User:a", "resource_type": ResourceType.TOPIC, "resource_name": "t",
              "pattern_type": PatternType.LITERAL, "operation": AclOperation.READ,
              "permission": AclPermission.ALLOW} | kwargs
    with pytest.raises(InvalidRequest, match=message):
        AclBinding(**fields)


def test_a_binding_survives_a_round_trip_through_proto():
    b = AclBinding(principal="User:a", resource_type=ResourceType.GROUP, resource_name="g",
                   pattern_type=PatternType.PREFIXED, operation=AclOperation.READ,
                   permission=AclPermission.DENY)
    msg = binding_to_proto(b)
    assert msg.resource_type == admin_pb2.GROUP and msg.permission == admin_pb2.DENY
    assert binding_from_proto(msg) == b


def test_a_proto_binding_with_an_unspecified_enum_is_invalid():
    with pytest.raises(InvalidRequest, match="must specify operation"):
        binding_from_proto(admin_pb2.AclBinding(
            principal="User:a", resource_type=admin_pb2.TOPIC, resource_name="t",
            pattern_type=admin_pb2.LITERAL, permission=admin_pb2.ALLOW))


def test_unspecified_proto_filter_fields_match_anything():
    assert filter_from_proto(admin_pb2.AclFilter()) == AclFilter()
    assert filter_from_proto(None) == AclFilter()
    f = AclFilter(principal="User:a", operation=AclOperation.DELETE)
    assert filter_from_proto(filter_to_proto(f)) == f


def test_a_proto_filter_with_an_unknown_enum_number_is_invalid():
    with pytest.raises(InvalidRequest, match="invalid operation 99"):
        filter_from_proto(admin_pb2.AclFilter(operation=99))
