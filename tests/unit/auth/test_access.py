"""AccessControl: authentication and the per-partition / follower checks the servers run, with
tokens and ACLs in a real etcd."""

from __future__ import annotations

import pytest

from lowtide.auth.access import AccessControl, Screened, build_access_control, parse_super_users
from lowtide.auth.acl import AclBinding, AclOperation, ResourceType
from lowtide.auth.identity import broker_principal, cluster_action_binding
from lowtide.auth.tokens import add_token
from lowtide.errors import (
    ClusterAuthorizationFailed,
    InvalidRequest,
    SaslAuthenticationFailed,
    TopicAuthorizationFailed,
)
from tests.waiting import wait_until

ALICE = "User:alice"
WRITE, READ, DELETE, DESCRIBE = AclOperation.WRITE, AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@pytest.fixture
def access(metadata_store, store) -> AccessControl:
    add_token(metadata_store, token="alice-token", principal=ALICE)
    add_token(metadata_store, token="broker-1-token", principal=broker_principal(1))
    add_token(metadata_store, token="broker-2-token", principal=broker_principal(2))
    store.add([AclBinding(ALICE, "TOPIC", "orders", "LITERAL", "WRITE", "ALLOW"),
               cluster_action_binding(broker_principal(1)), cluster_action_binding(broker_principal(2))])
    return build_access_control(metadata=metadata_store, enabled=True, super_users=frozenset({"User:admin"}))


def topic_of(item: tuple[str, int]) -> str:
    return item[0]


def test_with_auth_on_a_call_without_a_token_or_with_an_unknown_one_is_refused(access):
    for metadata in (None, [], [("user-agent", "x")], bearer("forged"), [("authorization", "Basic abc")]):
        with pytest.raises(SaslAuthenticationFailed):
            access.authenticate(metadata)
    assert access.authenticate(bearer("alice-token")) == ALICE


def test_with_auth_off_every_caller_is_anonymous_and_everything_is_allowed(metadata_store):
    access = build_access_control(metadata=metadata_store, enabled=False)
    assert access.authenticate(bearer("whatever")) == "User:ANONYMOUS"
    assert access.authenticate(None) == "User:ANONYMOUS"
    screened = access.screen("User:ANONYMOUS", [("orders", 0)], operation=DELETE, topic=topic_of)
    assert screened.allowed == [("orders", 0)] and not screened.refused
    access.require_follower("User:ANONYMOUS", 7)
    access.require_cluster("User:ANONYMOUS", DESCRIBE)


def test_screening_refuses_only_the_partitions_of_topics_without_the_operation(access):
    items = [("secret", 0), ("orders", 0), ("secret", 1), ("orders", 1)]
    screened = access.screen(ALICE, items, operation=WRITE, topic=topic_of)
    assert screened.allowed == [("orders", 0), ("orders", 1)]
    assert sorted(screened.refused) == [0, 2]
    assert all(isinstance(e, TopicAuthorizationFailed) and e.code == 29 for e in screened.refused.values())
    assert "WRITE" in screened.refused[0].message and "'secret'" in screened.refused[0].message
    # WRITE implies DESCRIBE but not READ
    assert access.screen(ALICE, items, operation=DESCRIBE, topic=topic_of).refused.keys() == {0, 2}
    assert access.screen(ALICE, items, operation=READ, topic=topic_of).allowed == []


def test_merge_puts_answers_and_refusals_back_in_request_order(access):
    items = [("secret", 0), ("orders", 0), ("secret", 1), ("orders", 1)]
    screened = access.screen(ALICE, items, operation=WRITE, topic=topic_of)
    merged = screened.merge([f"ok {t}-{p}" for t, p in screened.allowed],
                            refuse=lambda item, err: f"{err.name} {item[0]}-{item[1]}")
    assert merged == ["TOPIC_AUTHORIZATION_FAILED secret-0", "ok orders-0",
                      "TOPIC_AUTHORIZATION_FAILED secret-1", "ok orders-1"]


def test_a_request_where_everything_was_refused_skips_the_domain_call_but_an_empty_one_does_not(access):
    assert not access.screen(ALICE, [("secret", 0)], operation=WRITE, topic=topic_of).any_allowed
    assert access.screen(ALICE, [], operation=WRITE, topic=topic_of).any_allowed
    assert Screened.everything([]).merge([], refuse=lambda i, e: None) == []


def test_cluster_action_stands_in_for_the_topic_operation_only_where_asked(access):
    items = [("secret", 0)]
    broker = broker_principal(1)
    assert access.screen(broker, items, operation=DELETE, topic=topic_of).allowed == []
    assert access.screen(broker, items, operation=DELETE, topic=topic_of, or_cluster_action=True).allowed == items
    assert access.screen(ALICE, items, operation=DELETE, topic=topic_of, or_cluster_action=True).allowed == []


def test_a_follower_fetch_must_come_from_the_broker_whose_replica_id_it_names(access):
    access.require_follower(broker_principal(1), 1)
    with pytest.raises(ClusterAuthorizationFailed, match="only User:broker-1"):
        access.require_follower(broker_principal(2), 1)  # CLUSTER_ACTION, but another broker
    with pytest.raises(ClusterAuthorizationFailed, match="CLUSTER_ACTION"):
        access.require_follower(ALICE, 1)  # a client, whatever id it claims
    with pytest.raises(ClusterAuthorizationFailed):
        access.require_follower("User:admin", 1)  # even a super user is not broker 1


def test_cluster_operations_need_an_acl_on_the_cluster_or_a_super_user(access):
    with pytest.raises(ClusterAuthorizationFailed):
        access.require_cluster(ALICE, DESCRIBE)
    access.require_cluster("User:admin", DESCRIBE)
    access.require_cluster(broker_principal(1), AclOperation.CLUSTER_ACTION)


def test_an_acl_granted_later_is_seen_without_a_restart(access, store):
    with pytest.raises(ClusterAuthorizationFailed):
        access.require_cluster(ALICE, DESCRIBE)
    store.add([AclBinding(ALICE, "CLUSTER", "kafka-cluster", "LITERAL", "DESCRIBE", "ALLOW")])
    # the cached ACLs are refreshed from Redis at most every 0.2 s, never per call
    wait_until(lambda: access.allows(ALICE, DESCRIBE, ResourceType.CLUSTER, "kafka-cluster"), timeout_s=2,
               what="the new ACL")
    access.require_cluster(ALICE, DESCRIBE)


def test_super_users_are_parsed_and_validated():
    assert parse_super_users(" User:admin, User:ops ,") == frozenset({"User:admin", "User:ops"})
    assert parse_super_users(None) == frozenset()
    with pytest.raises(InvalidRequest):
        parse_super_users("admin")
