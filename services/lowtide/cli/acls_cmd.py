"""`lowtide acls add|list|remove`: KIP-11 ACL admin, shaped like kafka-acls.sh.

    lowtide acls add    --bootstrap-server B --principal User:alice --operation delete --topic orders
    lowtide acls list   --bootstrap-server B [--topic T | --group G | --cluster] [--principal P]
    lowtide acls remove --bootstrap-server B --principal User:alice --topic orders [--operation read]

Talks to the front door's Admin service (CreateAcls / DescribeAcls / DeleteAcls), sending the
bearer token from ``--command-config`` (``lowtide.auth.token=...``). JSON output is
``{"acls": [{principal, resource_type, resource_name, pattern_type, operation, permission}]}``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from lowtide.auth.acl import (
    CLUSTER_RESOURCE_NAME,
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
from lowtide.cli.client_args import build_admin
from lowtide.cli.main import add_output_flag
from lowtide.cli.output import CliError, emit
from lowtide.client.admin import Admin

_Acl = TypeVar("_Acl", AclBinding, AclFilter)

OPERATION_CHOICES = ["read", "write", "delete", "alter", "describe", "cluster-action", "describe-configs",
                     "alter-configs", "all"]
DEFAULT_TIMEOUT_MS = 30_000


def register(subparsers: argparse._SubParsersAction) -> None:
    acls = subparsers.add_parser("acls", help="add, list and remove ACLs (KIP-11)")
    actions = acls.add_subparsers(dest="acls_action", required=True)
    for name, help_text, func in (
        ("add", "add ALLOW (default) or DENY ACLs", run_add),
        ("list", "list ACLs matching the given flags (all when none)", run_list),
        ("remove", "remove ACLs matching the given flags", run_remove),
    ):
        parser = actions.add_parser(name, help=help_text)
        _add_flags(parser, adding=name == "add")
        parser.set_defaults(func=func)


def _add_flags(parser: argparse.ArgumentParser, *, adding: bool) -> None:
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT", help="front door address")
    parser.add_argument("--command-config", metavar="FILE", help="properties file, e.g. lowtide.auth.token=...")
    add_output_flag(parser)
    parser.add_argument("--principal", metavar="User:NAME", help="principal; User:* means everyone")
    parser.add_argument(
        "--operation", action="append", choices=OPERATION_CHOICES, help="operation (repeatable)"
    )
    resource = parser.add_mutually_exclusive_group()
    resource.add_argument("--topic", action="append", metavar="NAME", help="topic resource (repeatable)")
    resource.add_argument("--group", action="append", metavar="NAME", help="group resource (repeatable)")
    resource.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    resource.add_argument("--transactional-id", action="append", metavar="ID",
                          help="transactional id resource (repeatable)")
    patterns = ["literal", "prefixed"] if adding else ["literal", "prefixed", "any"]
    parser.add_argument(
        "--resource-pattern-type",
        choices=patterns,
        default=None,
        help="how --topic/--group names match (default literal"
        + ("" if adding else "; 'any' matches both") + ")",
    )
    permission = parser.add_mutually_exclusive_group()
    permission.add_argument(
        "--deny", dest="permission", action="store_const", const=AclPermission.DENY,
        help="DENY ACLs" + (" (default ALLOW)" if adding else " only"),
    )
    permission.add_argument(
        "--allow", dest="permission", action="store_const", const=AclPermission.ALLOW,
        help="ALLOW ACLs" + (" (the default)" if adding else " only"),
    )
    parser.add_argument("--timeout-ms", type=int, default=DEFAULT_TIMEOUT_MS, help="RPC deadline")


# --- flags -> domain -------------------------------------------------------------------------------


def resources_from_args(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    """The concrete resources named by --topic / --group / --cluster (empty when none)."""
    if args.cluster:
        return [(ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME)]
    if args.topic:
        return [(ResourceType.TOPIC, _non_empty(t, "--topic")) for t in args.topic]
    if args.group:
        return [(ResourceType.GROUP, _non_empty(g, "--group")) for g in args.group]
    if getattr(args, "transactional_id", None):
        return [(ResourceType.TRANSACTIONAL_ID, _non_empty(t, "--transactional-id")) for t in args.transactional_id]
    return []


def _non_empty(value: str, flag: str) -> str:
    if not value:
        raise CliError("INVALID_REQUEST", f"{flag} needs a non-empty name")
    return value


def _pattern_type(args: argparse.Namespace, resource_type: ResourceType | None) -> PatternType | None:
    # The cluster resource is always LITERAL; "any" (list/remove only) means no constraint.
    if resource_type is ResourceType.CLUSTER:
        return PatternType.LITERAL
    choice = args.resource_pattern_type
    if choice == "any":
        return None
    if choice is None:
        # kafka-acls.sh defaults to LITERAL for a named resource; with no resource, any pattern.
        return PatternType.LITERAL if resource_type is not None else None
    return parse_pattern_type(choice)


def bindings_from_args(args: argparse.Namespace) -> list[AclBinding]:
    """Every (resource x operation) binding `acls add` creates; incomplete flags -> CliError."""
    if not args.principal:
        raise CliError("INVALID_REQUEST", "--principal is required to add ACLs (e.g. User:alice)")
    if not args.operation:
        raise CliError("INVALID_REQUEST", "--operation is required to add ACLs (repeatable)")
    resources = resources_from_args(args)
    if not resources:
        raise CliError("INVALID_REQUEST", "name a resource: --topic NAME, --group NAME or --cluster")
    principal = parse_principal(args.principal)
    permission = args.permission or AclPermission.ALLOW
    return _per_resource_and_operation(AclBinding, args, principal=principal, resources=resources,
                                       operations=_unique_operations(args.operation), permission=permission)


def filters_from_args(args: argparse.Namespace) -> list[AclFilter]:
    """Filters for `acls list`/`acls remove`: one per (resource x operation); unset = any."""
    principal = parse_principal(args.principal) if args.principal else None
    resources: list[tuple[ResourceType | None, str | None]] = list(resources_from_args(args)) or [(None, None)]
    operations: list[AclOperation | None] = list(_unique_operations(args.operation or [])) or [None]
    return _per_resource_and_operation(AclFilter, args, principal=principal, resources=resources,
                                       operations=operations, permission=args.permission)


def _per_resource_and_operation(kind: type[_Acl], args: argparse.Namespace, *, principal: str | None,
                                resources: Sequence[tuple[ResourceType | None, str | None]],
                                operations: Sequence[AclOperation | None],
                                permission: AclPermission | None) -> list[_Acl]:
    """One ``kind`` (a binding to add, a filter to list or remove) per resource x operation, each
    with its resource's pattern type (``_pattern_type``): the shape kafka-acls.sh gives its flags."""
    return [
        kind(
            principal=principal,
            resource_type=rtype,
            resource_name=name,
            pattern_type=_pattern_type(args, rtype),
            operation=operation,
            permission=permission,
        )
        for rtype, name in resources
        for operation in operations
    ]


def _unique_operations(names: list[str]) -> list[AclOperation]:
    return list(dict.fromkeys(parse_operation(n) for n in names))


# --- rendering -----------------------------------------------------------------------------------


def render_text(bindings: list[AclBinding], *, verb: str) -> str:
    """kafka-acls.sh style: one block per resource pattern, one line per ACL."""
    if not bindings:
        return "No ACLs matched."
    by_pattern: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = {}
    for b in bindings:
        by_pattern.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
    blocks = []
    for (rtype, name, ptype), group in by_pattern.items():
        lines = [
            f"{verb} ACLs for resource `ResourcePattern(resourceType={rtype.name}, name={name}, "
            f"patternType={ptype.name})`:"
        ]
        lines.extend(
            f" \t(principal={b.principal}, host=*, operation={b.operation.name}, "
            f"permissionType={b.permission.name})"
            for b in group
        )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _emit(args: argparse.Namespace, bindings: list[AclBinding], *, verb: str) -> None:
    emit(args, {"acls": [b.as_dict() for b in bindings]}, render_text(bindings, verb=verb))


# --- commands ------------------------------------------------------------------------------------


@contextmanager
def _admin(args: argparse.Namespace) -> Iterator[Admin]:
    """An Admin client on the bootstrap server, with the token and the ``--timeout-ms`` deadline."""
    host, sep, port = args.bootstrap_server.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise CliError("INVALID_REQUEST", f"--bootstrap-server must be HOST:PORT, got {args.bootstrap_server!r}")
    with build_admin(args, timeout_s=args.timeout_ms / 1000.0) as admin:
        yield admin


def run_add(args: argparse.Namespace) -> int:
    bindings = bindings_from_args(args)
    with _admin(args) as admin:
        results = admin.create_acls(bindings)
    failed = [(b, error) for b, error in zip(bindings, results, strict=False) if error is not None]
    if failed:
        detail = "; ".join(
            f"{error.name} for {b.principal} {b.operation.name} {b.resource_type.name} {b.resource_name}"
            for b, error in failed
        )
        raise CliError(failed[0][1].name, f"{len(failed)} of {len(bindings)} ACLs not added: {detail}")
    _emit(args, bindings, verb="Adding")
    return 0


def run_list(args: argparse.Namespace) -> int:
    filters = filters_from_args(args)
    found: dict[AclBinding, None] = {}  # ordered set: several filters may select the same ACL
    with _admin(args) as admin:
        for acl_filter in filters:
            found.update((b, None) for b in admin.describe_acls(acl_filter))
    _emit(args, list(found), verb="Current")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    if not args.principal and not resources_from_args(args):
        # An empty filter matches every ACL; make wiping them all a deliberate act.
        raise CliError(
            "INVALID_REQUEST", "refusing to remove every ACL: name a resource (--topic/--group/--cluster) "
            "or a --principal"
        )
    filters = filters_from_args(args)
    with _admin(args) as admin:
        removed = admin.delete_acls(filters)
    _emit(args, removed, verb="Removed")
    return 0
