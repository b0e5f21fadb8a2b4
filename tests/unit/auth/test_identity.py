"""Service identities: token files (0600), provisioning digests and CLUSTER_ACTION into a real Redis."""

from __future__ import annotations

import stat

import pytest

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
from lowtide.auth.tokens import TOKENS_KEY, Authenticator
from lowtide.errors import InvalidConfig


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_provisioning_writes_a_private_token_per_identity_and_stores_only_its_digest(tmp_path, redis_client, store):
    identities = [ServiceIdentity(principal=broker_principal(0), token_file=tmp_path / "s" / "replica-0.token"),
                  ServiceIdentity(principal="User:frontdoor", token_file=tmp_path / "s" / "frontdoor-0.token")]
    provision_identities(redis_client, identities)
    tokens = [read_token_file(i.token_file) for i in identities]
    assert all(mode(i.token_file) == 0o600 for i in identities)
    assert len(set(tokens)) == 2 and all(len(t) >= 43 for t in tokens)  # 32 random bytes, base64
    stored = redis_client.hgetall(TOKENS_KEY)
    assert not any(t.encode() in field for t in tokens for field in stored)
    auth = Authenticator(redis=redis_client, required=True)
    assert [auth.authenticate(token_file_metadata(i.token_file)) for i in identities] == [
        "User:broker-0", "User:frontdoor"]
    granted = store.list(AclFilter(resource_type=ResourceType.CLUSTER, operation=AclOperation.CLUSTER_ACTION))
    assert sorted(b.principal for b in granted) == ["User:broker-0", "User:frontdoor"]


def test_provisioning_again_keeps_the_existing_tokens(tmp_path, redis_client):
    identity = ServiceIdentity(principal=broker_principal(3), token_file=tmp_path / "replica-3.token")
    provision_identities(redis_client, [identity])
    first = read_token_file(identity.token_file)
    redis_client.delete(TOKENS_KEY)  # e.g. a Redis that lost its data
    provision_identities(redis_client, [identity])
    assert read_token_file(identity.token_file) == first
    assert Authenticator(redis=redis_client, required=True).lookup(first) == "User:broker-3"


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
