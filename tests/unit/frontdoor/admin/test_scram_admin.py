"""SCRAM credential administration end to end over gRPC (client ``Admin`` and raw stubs -> an
in-process front door -> Redis): Kafka's KIP-554 rules, per user, and the CLUSTER permissions."""

from __future__ import annotations

import grpc
import pytest

from lowtide.auth.acl import CLUSTER_RESOURCE_NAME, AclBinding
from lowtide.auth.scram import SCRAM_SHA_256, ClientExchange
from lowtide.auth.scram_store import ScramStore, build_scram_login
from lowtide.auth.tokens import add_token
from lowtide.client import Admin
from lowtide.errors import ClusterAuthorizationFailed
from lowtide_pb import admin_pb2, admin_pb2_grpc

ADMIN = [("authorization", "Bearer admin-token")]
BOB = [("authorization", "Bearer bob-token")]
SALTED = SCRAM_SHA_256.salted_password("pw", b"salt", 4096)


@pytest.fixture
def secured(front_door_factory, store):
    # The tokens first: the front door's image loads them (one added later reaches it by its watch).
    add_token(store, token="admin-token", principal="User:admin")
    add_token(store, token="bob-token", principal="User:bob")
    front_door = front_door_factory(auth_enabled=True, super_users=frozenset({"User:admin"}))
    channel = grpc.insecure_channel(front_door.address)
    yield front_door, admin_pb2_grpc.AdminStub(channel)
    channel.close()


def upsertion(user: str, *, mechanism: int = 1, iterations: int = 4096, salt: bytes = b"salt",
              salted: bytes = SALTED) -> admin_pb2.ScramCredentialUpsertion:
    return admin_pb2.ScramCredentialUpsertion(user=user, mechanism=mechanism, iterations=iterations, salt=salt,
                                              salted_password=salted)


def alter(stub, metadata=ADMIN, **request) -> dict[str, tuple[int, str]]:
    answer = stub.AlterUserScramCredentials(admin_pb2.AlterUserScramCredentialsRequest(**request), metadata=metadata)
    return {r.user: (r.error_code, r.error_message) for r in answer.results}


def test_a_credential_set_through_the_client_logs_in_and_is_described_without_secrets(secured, store):
    front_door, _ = secured
    with Admin(front_door.address, metadata=ADMIN) as admin:
        assert admin.upsert_user_scram_credential("alice", "alice-pw", iterations=4096) is None
        described = admin.describe_user_scram_credentials()
    assert {u: (r.credentials, r.error) for u, r in described.items()} == {
        "alice": ((("SCRAM-SHA-256", 4096),), None)}
    client = ClientExchange(SCRAM_SHA_256, "alice", "alice-pw")
    scram = build_scram_login(store, auth_enabled=True)
    exchange = scram.start("SCRAM-SHA-256", client.first())
    assert scram.finish(exchange, client.final(exchange.server_first.encode())).principal == "User:alice"


def test_a_deleted_credential_is_gone_and_deleting_it_again_is_resource_not_found(secured, store):
    front_door, _ = secured
    with Admin(front_door.address, metadata=ADMIN) as admin:
        admin.upsert_user_scram_credential("alice", "alice-pw")
        assert admin.delete_user_scram_credential("alice") is None
        store.sync()  # the front door's own store wrote it; this one catches up with etcd
        assert ScramStore(metadata=store).get(SCRAM_SHA_256, "alice") is None
        assert admin.delete_user_scram_credential("alice").name == "RESOURCE_NOT_FOUND"


def test_without_alter_on_the_cluster_every_user_of_the_request_is_refused(secured, store):
    front_door, stub = secured
    assert alter(stub, BOB, upsertions=[upsertion("bob")])["bob"][0] == ClusterAuthorizationFailed.code
    assert ScramStore(metadata=store).describe() == {}
    with Admin(front_door.address, metadata=BOB) as bob, pytest.raises(ClusterAuthorizationFailed):
        bob.describe_user_scram_credentials()
    # granted ALTER on the CLUSTER (an ordinary ACL), bob may; ALTER implies DESCRIBE, as in Kafka
    with Admin(front_door.address, metadata=ADMIN) as admin:
        admin.create_acls([AclBinding("User:bob", "CLUSTER", CLUSTER_RESOURCE_NAME, "LITERAL", "ALTER", "ALLOW")])
    assert alter(stub, BOB, upsertions=[upsertion("bob")]) == {"bob": (0, "")}
    with Admin(front_door.address, metadata=BOB) as bob:
        assert list(bob.describe_user_scram_credentials()) == ["bob"]


def test_a_refused_alteration_answers_cluster_authorization_failed_for_each_user(secured):
    _, stub = secured
    answer = alter(stub, BOB, upsertions=[upsertion("bob"), upsertion("carol")])
    assert {u: code for u, (code, _) in answer.items()} == {"bob": 31, "carol": 31}


def test_describing_names_a_missing_user_not_found_and_a_repeated_user_a_duplicate(secured):
    _, stub = secured
    alter(stub, upsertions=[upsertion("alice")])
    answer = stub.DescribeUserScramCredentials(
        admin_pb2.DescribeUserScramCredentialsRequest(users=["alice", "ghost", "twice", "twice"]), metadata=ADMIN)
    assert [(r.user, r.error_code, [c.iterations for c in r.credentials]) for r in answer.results] == [
        ("alice", 0, [4096]), ("ghost", 91, []), ("twice", 92, [])]


@pytest.mark.parametrize(("bad", "code", "reason"), [
    (upsertion("u", iterations=4095), 93, "iterations"),
    (upsertion("u", iterations=16385), 93, "iterations"),
    (upsertion("u", salt=b""), 93, "salt"),
    (upsertion("u", salted=b"short"), 93, "salted password"),
    (upsertion("u", mechanism=7), 33, "unknown SCRAM mechanism"),
    (upsertion(""), 93, "must not be empty"),
    (upsertion("*"), 93, "wildcard"),
    (upsertion("broker-1"), 93, "service identity"),
], ids=["few-iterations", "many-iterations", "empty-salt", "short-salted-password", "unknown-mechanism",
        "empty-name", "wildcard", "service-identity"])
def test_an_unacceptable_upsertion_is_refused_and_stores_nothing(secured, bad, code, reason, store):
    _, stub = secured
    [(error_code, message)] = alter(stub, upsertions=[bad]).values()
    assert error_code == code and reason in message
    assert ScramStore(metadata=store).describe() == {}


def test_a_user_altered_twice_gets_duplicate_resource_and_none_of_its_changes_while_others_apply(secured, store):
    _, stub = secured
    answer = alter(stub, deletions=[admin_pb2.ScramCredentialDeletion(user="alice", mechanism=1)],
                   upsertions=[upsertion("alice"), upsertion("bob")])
    assert {u: code for u, (code, _) in answer.items()} == {"alice": 92, "bob": 0}
    store.sync()  # written through the front door's own store
    assert list(ScramStore(metadata=store).describe()) == ["bob"]


def test_with_authorization_off_anyone_may_set_and_describe_credentials(front_door):
    with Admin(front_door.address) as anyone:
        assert anyone.upsert_user_scram_credential("alice", "pw", mechanism="SCRAM-SHA-512", iterations=4096) is None
        assert anyone.describe_user_scram_credentials(["alice"])["alice"].credentials == (("SCRAM-SHA-512", 4096),)
