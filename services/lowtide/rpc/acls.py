"""Conversion between the auth domain types and ``lowtide.v1`` protobuf messages.

Used by the front door's servicer and by ``client.Admin``; the enum numbers are identical on both sides
(see ``lowtide.auth.acl``), so enums convert by value. Proto ``*_UNSPECIFIED`` (0) and empty
strings mean "any" in filters and are invalid in bindings.
"""

from __future__ import annotations

from lowtide.auth.acl import AclBinding, AclFilter
from lowtide.errors import InvalidRequest
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
