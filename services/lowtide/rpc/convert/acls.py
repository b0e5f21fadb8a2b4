"""ACLs (Admin.CreateAcls / DescribeAcls / DeleteAcls): protobuf <-> ``lowtide.messages.acls``.

Used by the front door's servicer, by its remote twin (``lowtide.client.frontdoor.acls``) and by
``client.Admin``. The enum numbers are identical on both sides, so enums convert by value. Proto
``*_UNSPECIFIED`` (0) and empty strings mean "any" in filters and are invalid in bindings.
"""

from __future__ import annotations

from collections.abc import Iterable

from lowtide.errors import InvalidRequest, LowtideError, error_or_none
from lowtide.messages.acls import AclBinding, AclFilter
from lowtide_pb import admin_pb2


def binding_to_proto(binding: AclBinding) -> admin_pb2.AclBinding:
    return admin_pb2.AclBinding(
        principal=binding.principal,
        resource_type=int(binding.resource_type),
        resource_name=binding.resource_name,
        pattern_type=int(binding.pattern_type),
        operation=int(binding.operation),
        permission=int(binding.permission),
    )


def binding_from_proto(msg: admin_pb2.AclBinding) -> AclBinding:
    """Validate and convert; unspecified enums or bad names raise InvalidRequest."""
    for field in ("resource_type", "pattern_type", "operation", "permission"):
        if getattr(msg, field) == 0:
            raise InvalidRequest(f"ACL binding must specify {field}")
    return AclBinding(
        principal=msg.principal,
        resource_type=msg.resource_type,
        resource_name=msg.resource_name,
        pattern_type=msg.pattern_type,
        operation=msg.operation,
        permission=msg.permission,
    )


def filter_to_proto(acl_filter: AclFilter) -> admin_pb2.AclFilter:
    def num(value: int | None) -> int:
        return int(value) if value is not None else 0

    return admin_pb2.AclFilter(
        principal=acl_filter.principal or "",
        resource_type=num(acl_filter.resource_type),
        resource_name=acl_filter.resource_name or "",
        pattern_type=num(acl_filter.pattern_type),
        operation=num(acl_filter.operation),
        permission=num(acl_filter.permission),
    )


def filter_from_proto(msg: admin_pb2.AclFilter | None) -> AclFilter:
    """Empty / unspecified fields become None (= match anything); unknown enum numbers fail."""
    if msg is None:
        return AclFilter()
    # AclFilter coerces the numbers to the domain enums and raises InvalidRequest on unknown ones.
    return AclFilter(
        principal=msg.principal or None,
        resource_type=msg.resource_type or None,
        resource_name=msg.resource_name or None,
        pattern_type=msg.pattern_type or None,
        operation=msg.operation or None,
        permission=msg.permission or None,
    )


# -- CreateAcls: one result per binding, an error code only (the proto carries no message) ------
def create_request(bindings: Iterable[AclBinding]) -> admin_pb2.CreateAclsRequest:
    return admin_pb2.CreateAclsRequest(acls=[binding_to_proto(b) for b in bindings])


def create_response(results: Iterable[LowtideError | None]) -> admin_pb2.CreateAclsResponse:
    return admin_pb2.CreateAclsResponse(results=[0 if e is None else e.code for e in results])


def create_results(response: admin_pb2.CreateAclsResponse) -> list[LowtideError | None]:
    return [error_or_none(code) for code in response.results]


# -- DescribeAcls / DeleteAcls -------------------------------------------------------------------
def describe_request(acl_filter: AclFilter) -> admin_pb2.DescribeAclsRequest:
    return admin_pb2.DescribeAclsRequest(filter=filter_to_proto(acl_filter))


def describe_filter(request: admin_pb2.DescribeAclsRequest) -> AclFilter:
    """The request's filter; a request without one selects every binding."""
    return filter_from_proto(request.filter if request.HasField("filter") else None)


def describe_response(bindings: Iterable[AclBinding]) -> admin_pb2.DescribeAclsResponse:
    return admin_pb2.DescribeAclsResponse(acls=[binding_to_proto(b) for b in bindings])


def delete_request(filters: Iterable[AclFilter]) -> admin_pb2.DeleteAclsRequest:
    return admin_pb2.DeleteAclsRequest(filters=[filter_to_proto(f) for f in filters])


def delete_response(deleted: Iterable[AclBinding]) -> admin_pb2.DeleteAclsResponse:
    return admin_pb2.DeleteAclsResponse(deleted=[binding_to_proto(b) for b in deleted])
