"""`lowtide acls`: flag parsing into bindings/filters, output, and calls over real gRPC.

The front door's Admin server is built elsewhere; here a small in-test Admin servicer serves the
three ACL RPCs from a real AclStore on the real Redis, so the command runs end to end over a real
gRPC channel, credentials included.
"""

from __future__ import annotations

import argparse
import json
from concurrent import futures

import grpc
import pytest

from lowtide.auth.acl import AclBinding, AclFilter, AclOperation, AclPermission, PatternType, ResourceType
from lowtide.auth.store import AclStore
from lowtide.auth.tokens import Authenticator
from lowtide.cli import acls_cmd
from lowtide.cli.output import CliError
from lowtide.errors import LowtideError, SaslAuthenticationFailed
from lowtide.rpc.convert.acls import binding_from_proto, binding_to_proto, filter_from_proto
from lowtide.rpc.status import details_for, status_for
from lowtide_pb import admin_pb2, admin_pb2_grpc


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lowtide")
    acls_cmd.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["acls", *argv])


B = ("--bootstrap-server", "127.0.0.1:1")


def test_add_makes_one_allow_binding_per_resource_and_operation():
    args = parse("add", *B, "--principal", "User:alice", "--operation", "delete", "--operation", "read",
                 "--topic", "orders", "--topic", "payments")
    bindings = acls_cmd.bindings_from_args(args)
    assert {(b.resource_name, b.operation) for b in bindings} == {
        ("orders", AclOperation.DELETE), ("orders", AclOperation.READ),
        ("payments", AclOperation.DELETE), ("payments", AclOperation.READ)}
    assert all(b.permission is AclPermission.ALLOW and b.pattern_type is PatternType.LITERAL for b in bindings)


def test_add_with_deny_and_prefixed_pattern_on_a_group():
    args = parse("add", *B, "--principal", "User:*", "--operation", "all", "--group", "spark-",
                 "--resource-pattern-type", "prefixed", "--deny")
    assert acls_cmd.bindings_from_args(args) == [AclBinding(
        principal="User:*", resource_type=ResourceType.GROUP, resource_name="spark-",
        pattern_type=PatternType.PREFIXED, operation=AclOperation.ALL, permission=AclPermission.DENY)]


def test_cluster_flag_names_the_kafka_cluster_resource():
    args = parse("add", *B, "--principal", "User:dc", "--operation", "cluster-action", "--cluster")
    (binding,) = acls_cmd.bindings_from_args(args)
    assert (binding.resource_type, binding.resource_name) == (ResourceType.CLUSTER, "kafka-cluster")


@pytest.mark.parametrize("argv, message", [
    (("--operation", "read", "--topic", "t"), "--principal is required"),
    (("--principal", "User:a", "--topic", "t"), "--operation is required"),
    (("--principal", "User:a", "--operation", "read"), "name a resource"),
])
def test_add_without_principal_operation_or_resource_is_an_invalid_request(argv, message):
    with pytest.raises(CliError, match=message) as info:
        acls_cmd.bindings_from_args(parse("add", *B, *argv))
    assert info.value.code == "INVALID_REQUEST"


def test_add_with_a_malformed_principal_is_an_invalid_request():
    with pytest.raises(LowtideError, match="expected 'User:<name>'"):
        acls_cmd.bindings_from_args(parse("add", *B, "--principal", "alice", "--operation", "read",
                                          "--topic", "t"))


def test_topic_group_and_cluster_are_mutually_exclusive(capsys):
    with pytest.raises(SystemExit):
        parse("add", *B, "--topic", "t", "--cluster")
    assert "not allowed with argument" in capsys.readouterr().err


def test_list_without_flags_is_one_match_everything_filter():
    assert acls_cmd.filters_from_args(parse("list", *B)) == [AclFilter()]


def test_list_of_a_topic_defaults_to_literal_and_any_drops_the_pattern():
    literal = acls_cmd.filters_from_args(parse("list", *B, "--topic", "orders"))
    assert literal == [AclFilter(resource_type=ResourceType.TOPIC, resource_name="orders",
                                 pattern_type=PatternType.LITERAL)]
    anyp = acls_cmd.filters_from_args(parse("list", *B, "--topic", "orders", "--resource-pattern-type", "any"))
    assert anyp == [AclFilter(resource_type=ResourceType.TOPIC, resource_name="orders")]


def test_remove_filters_carry_principal_operations_and_permission():
    filters = acls_cmd.filters_from_args(parse("remove", *B, "--principal", "User:a", "--operation", "read",
                                               "--operation", "write", "--deny"))
    assert filters == [AclFilter(principal="User:a", operation=op, permission=AclPermission.DENY)
                       for op in (AclOperation.READ, AclOperation.WRITE)]


def test_remove_refuses_to_wipe_every_acl():
    args = parse("remove", *B, "--operation", "read")
    with pytest.raises(CliError, match="refusing to remove every ACL"):
        args.func(args)


def test_a_malformed_bootstrap_server_is_an_invalid_request():
    args = parse("list", "--bootstrap-server", "localhost")
    with pytest.raises(CliError, match="must be HOST:PORT"):
        args.func(args)


def test_text_output_looks_like_kafka_acls():
    b = AclBinding(principal="User:alice", resource_type=ResourceType.TOPIC, resource_name="orders",
                   pattern_type=PatternType.LITERAL, operation=AclOperation.DELETE,
                   permission=AclPermission.ALLOW)
    assert acls_cmd.render_text([b], verb="Current") == (
        "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)`:\n"
        " \t(principal=User:alice, host=*, operation=DELETE, permissionType=ALLOW)")
    assert acls_cmd.render_text([], verb="Current") == "No ACLs matched."


# --- end to end over gRPC ---------------------------------------------------------------------------


class AclAdmin(admin_pb2_grpc.AdminServicer):
    """The three ACL RPCs over a real AclStore; every call must carry a known bearer token."""

    def __init__(self, store: AclStore, authenticator: Authenticator) -> None:
        self.store, self.authenticator = store, authenticator
        self.principals: list[str] = []

    def _authenticate(self, context: grpc.ServicerContext) -> None:
        try:
            self.principals.append(self.authenticator.authenticate(context.invocation_metadata()))
        except LowtideError as err:
            context.abort(status_for(err), details_for(err))

    def CreateAcls(self, request, context):  # noqa: N802 - gRPC method name
        self._authenticate(context)
        self.store.add([binding_from_proto(m) for m in request.acls])
        return admin_pb2.CreateAclsResponse(results=[0] * len(request.acls))

    def DescribeAcls(self, request, context):  # noqa: N802
        self._authenticate(context)
        found = self.store.list(filter_from_proto(request.filter))
        return admin_pb2.DescribeAclsResponse(acls=[binding_to_proto(b) for b in found])

    def DeleteAcls(self, request, context):  # noqa: N802
        self._authenticate(context)
        deleted = self.store.remove([filter_from_proto(f) for f in request.filters])
        return admin_pb2.DeleteAclsResponse(deleted=[binding_to_proto(b) for b in deleted])


@pytest.fixture
def admin_server(store, metadata_store):
    authenticator = Authenticator(metadata=metadata_store, required=True)
    authenticator.add_token("admin-token", "User:admin")
    servicer = AclAdmin(store, authenticator)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    admin_pb2_grpc.add_AdminServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)


@pytest.fixture
def command_config(tmp_path):
    path = tmp_path / "admin.properties"
    path.write_text("lowtide.auth.token=admin-token\n")
    return str(path)


def run(capsys, *argv: str) -> tuple[int, dict]:
    args = parse(*argv)
    rc = args.func(args)
    return rc, json.loads(capsys.readouterr().out)


def test_add_list_and_remove_round_trip_through_the_admin_service(admin_server, command_config, store, capsys):
    address, servicer = admin_server
    common = ("--bootstrap-server", address, "--command-config", command_config, "--output", "json")

    rc, added = run(capsys, "add", *common, "--principal", "User:alice", "--operation", "delete",
                    "--topic", "orders")
    assert rc == 0 and added == {"acls": [{
        "principal": "User:alice", "resource_type": "TOPIC", "resource_name": "orders",
        "pattern_type": "LITERAL", "operation": "DELETE", "permission": "ALLOW"}]}
    assert len(store.list()) == 1

    rc, listed = run(capsys, "list", *common)
    assert rc == 0 and listed == added

    rc, listed = run(capsys, "list", *common, "--topic", "payments")
    assert rc == 0 and listed == {"acls": []}

    rc, removed = run(capsys, "remove", *common, "--topic", "orders")
    assert rc == 0 and removed == added
    assert store.list() == []
    assert servicer.principals == ["User:admin"] * 4


def test_text_output_of_list_over_grpc(admin_server, command_config, store, capsys):
    address, _ = admin_server
    store.add([AclBinding(principal="User:bob", resource_type=ResourceType.GROUP, resource_name="g",
                          pattern_type=PatternType.LITERAL, operation=AclOperation.READ,
                          permission=AclPermission.ALLOW)])
    args = parse("list", "--bootstrap-server", address, "--command-config", command_config)
    assert args.func(args) == 0
    assert "(principal=User:bob, host=*, operation=READ, permissionType=ALLOW)" in capsys.readouterr().out


def test_without_credentials_the_server_refuses_with_sasl_authentication_failed(admin_server):
    address, _ = admin_server
    args = parse("list", "--bootstrap-server", address)
    # The CLI's Admin client turns the refused call back into the error the server raised
    # (status UNAUTHENTICATED, details "SASL_AUTHENTICATION_FAILED: ..."; see rpc.status).
    with pytest.raises(SaslAuthenticationFailed) as info:
        args.func(args)
    assert status_for(info.value) is grpc.StatusCode.UNAUTHENTICATED
    assert info.value.message.startswith("authentication required")
