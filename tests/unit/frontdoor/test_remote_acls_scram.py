"""The front door's ACL and SCRAM administration reached over gRPC (``client.frontdoor``'s
RemoteAcls / RemoteScram, what a replica's Kafka listener calls) answers as the in-process objects
do (``FrontDoor.acls`` / ``FrontDoor.scram``, what the front door's own listener calls): the same
bindings, the same per-item errors, the same raised errors for a refused caller."""

from __future__ import annotations

import pytest

from lowtide.auth.scram import SCRAM_SHA_256
from lowtide.auth.tokens import add_token
from lowtide.client.frontdoor import RemoteFrontDoor
from lowtide.errors import ClusterAuthorizationFailed, ResourceNotFound
from lowtide.messages.acls import AclBinding, AclFilter
from lowtide.messages.admin import Deletion, ScramCredentialInfo, Upsertion

ADMIN = (("authorization", "Bearer admin-token"),)
BOB = (("authorization", "Bearer bob-token"),)
READS = AclBinding("User:alice", "TOPIC", "orders", "LITERAL", "READ", "ALLOW")
WRITES = AclBinding("User:alice", "TOPIC", "pay", "PREFIXED", "WRITE", "DENY")


@pytest.fixture
def doors(front_door_factory, store):
    add_token(store, token="admin-token", principal="User:admin")
    add_token(store, token="bob-token", principal="User:bob")
    front_door = front_door_factory(auth_enabled=True, super_users=frozenset({"User:admin"}))
    remote = RemoteFrontDoor(address=front_door.address)
    yield front_door.parts.front, remote
    remote.close()


def test_remote_acls_create_describe_and_delete_as_the_front_doors_own(doors):
    local, remote = doors
    acls = remote.bound(ADMIN).acls
    assert acls.create_acls(principal="ignored", bindings=[READS]) == [None]
    assert local.acls.create_acls(principal="User:admin", bindings=[WRITES]) == [None]
    everything = sorted(local.acls.describe_acls(principal="User:admin", acl_filter=AclFilter()), key=repr)
    assert sorted(acls.describe_acls(principal="ignored", acl_filter=AclFilter()), key=repr) == everything
    assert acls.describe_acls(principal="ignored", acl_filter=AclFilter(resource_name="pay")) == [WRITES]
    assert acls.delete_acls(principal="ignored", filters=[AclFilter(operation="READ")]) == [READS]
    assert local.acls.describe_acls(principal="User:admin", acl_filter=AclFilter()) == [WRITES]


def test_a_refused_caller_gets_the_same_answers_from_either(doors):
    local, remote = doors
    acls = remote.bound(BOB).acls
    [local_error] = local.acls.create_acls(principal="User:bob", bindings=[READS])
    [remote_error] = acls.create_acls(principal="ignored", bindings=[READS])
    assert type(local_error) is type(remote_error) is ClusterAuthorizationFailed
    for part, principal in ((local.acls, "User:bob"), (acls, "ignored")):
        with pytest.raises(ClusterAuthorizationFailed):
            part.describe_acls(principal=principal, acl_filter=AclFilter())
        with pytest.raises(ClusterAuthorizationFailed):
            part.delete_acls(principal=principal, filters=[AclFilter()])
    scram = remote.bound(BOB).scram
    with pytest.raises(ClusterAuthorizationFailed):
        scram.describe(principal="ignored", users=None)
    [(user, error)] = scram.alter(principal="ignored", deletions=[Deletion("bob", 1)], upsertions=[])
    assert user == "bob" and isinstance(error, ClusterAuthorizationFailed)


def test_remote_scram_alters_and_describes_as_the_front_doors_own(doors):
    local, remote = doors
    scram = remote.bound(ADMIN).scram
    salted = SCRAM_SHA_256.salted_password("pw", b"salt", 4096)
    altered = scram.alter(principal="ignored", deletions=[Deletion("ghost", 1)], upsertions=[
        Upsertion(user="alice", mechanism=1, iterations=4096, salt=b"salt", salted_password=salted)])
    assert [(user, type(error)) for user, error in altered] == [("ghost", ResourceNotFound), ("alice", type(None))]
    described = scram.describe(principal="ignored", users=["alice", "nobody"])
    assert [(d.user, type(d.error), d.credentials) for d in described] == [
        ("alice", type(None), (ScramCredentialInfo(mechanism=1, iterations=4096),)),
        ("nobody", ResourceNotFound, ())]
    mine = local.scram.describe(principal="User:admin", users=["alice", "nobody"])
    assert [(d.user, type(d.error), d.error and d.error.message, d.credentials) for d in mine] == [
        (d.user, type(d.error), d.error and d.error.message, d.credentials) for d in described]
