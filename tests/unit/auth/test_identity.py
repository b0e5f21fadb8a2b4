"""Service identities: token files (0600), provisioning digests and CLUSTER_ACTION into a real etcd."""

from __future__ import annotations

import stat

import pytest

from lowtide.auth.access import build_access_control
from lowtide.auth.acl import AclFilter, AclOperation, ResourceType
from lowtide.auth.client_config import call_metadata, load_command_config
from lowtide.auth.identity import (
    ServiceIdentity,
    broker_principal,
    provision_identities,
    read_token_file,
    token_file_metadata,
    write_command_config,
)
from lowtide.auth.tokens import Authenticator, token_name
from lowtide.errors import InvalidConfig
from lowtide.metadata.sections import section


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_provisioning_writes_a_private_token_per_identity_and_stores_only_its_digest(
        tmp_path, metadata_store, store):
    identities = [ServiceIdentity(principal=broker_principal(0), token_file=tmp_path / "s" / "replica-0.token"),
                  ServiceIdentity(principal="User:frontdoor", token_file=tmp_path / "s" / "frontdoor-0.token")]
    provision_identities(metadata_store, identities)
    tokens = [read_token_file(i.token_file) for i in identities]
    assert all(mode(i.token_file) == 0o600 for i in identities)
    assert len(set(tokens)) == 2 and all(len(t) >= 43 for t in tokens)  # 32 random bytes, base64
    stored = section(metadata_store, "tokens").items()
    assert set(stored) == {token_name(t) for t in tokens}
    assert not any(t in name or t.encode() in e.value for t in tokens for name, e in stored.items())
    auth = Authenticator(metadata=metadata_store, required=True)
    assert [auth.authenticate(token_file_metadata(i.token_file)) for i in identities] == [
        "User:broker-0", "User:frontdoor"]
    granted = store.list(AclFilter(resource_type=ResourceType.CLUSTER, operation=AclOperation.CLUSTER_ACTION))
    assert sorted(b.principal for b in granted) == ["User:broker-0", "User:frontdoor"]


def test_provisioning_again_keeps_the_existing_tokens(tmp_path, metadata_store):
    identity = ServiceIdentity(principal=broker_principal(3), token_file=tmp_path / "replica-3.token")
    provision_identities(metadata_store, [identity])
    first = read_token_file(identity.token_file)
    section(metadata_store, "tokens").delete([token_name(first)])  # e.g. a store restored from an old backup
    provision_identities(metadata_store, [identity])
    assert read_token_file(identity.token_file) == first
    assert Authenticator(metadata=metadata_store, required=True).lookup(first) == "User:broker-3"


def test_provisioned_identities_survive_a_redis_flushall(tmp_path, metadata_store, reopen, redis_client):
    # Issue 51: Redis keeps only the purgatory timers; the services' identities are not in it.
    identity = ServiceIdentity(principal=broker_principal(1), token_file=tmp_path / "replica-1.token")
    provision_identities(metadata_store, [identity])
    redis_client.set("lowtide:unrelated", "1")
    assert redis_client.flushall() and redis_client.dbsize() == 0
    restarted = reopen()
    access = build_access_control(metadata=restarted, enabled=True)
    principal = access.authenticate(token_file_metadata(identity.token_file))
    assert principal == "User:broker-1"
    access.require_follower(principal, 1)  # its CLUSTER_ACTION ACL is there too


def test_a_generated_command_config_is_private_and_carries_the_token(tmp_path):
    path = tmp_path / "admin.properties"
    write_command_config(path, "s3cr3t")
    assert mode(path) == 0o600
    assert call_metadata(load_command_config(path)) == [("authorization", "Bearer s3cr3t")]


@pytest.mark.parametrize("content", ["", "  \n", "two tokens\n"])
def test_a_token_file_must_hold_exactly_one_token(tmp_path, content):
    path = tmp_path / "t.token"
    path.write_text(content)
    with pytest.raises(InvalidConfig, match=str(path)):
        read_token_file(path)
    with pytest.raises(InvalidConfig, match="cannot read"):
        read_token_file(tmp_path / "missing.token")
    assert token_file_metadata(None) == []
