"""Authorizer semantics (Kafka AclAuthorizer), against ACLs stored in a real Redis."""

from __future__ import annotations

import threading

import pytest
import redis as redis_lib

from lowtide.auth.acl import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    Authorizer,
    PatternType,
    ResourceType,
)
from lowtide.auth.store import AclStore
from lowtide.common.procs import start_redis
from lowtide.errors import ClusterAuthorizationFailed, TopicAuthorizationFailed

ALICE, BOB = "User:alice", "User:bob"
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermission.ALLOW, AclPermission.DENY
Op = AclOperation


def acl(principal, rtype, name, op, perm=ALLOW, pattern=LITERAL) -> AclBinding:
    return AclBinding(
        principal=principal, resource_type=rtype, resource_name=name,
        pattern_type=pattern, operation=op, permission=perm,
    )


def can(authorizer: Authorizer, principal: str, op: AclOperation, rtype: ResourceType, name: str) -> bool:
    return authorizer.authorize(principal=principal, operation=op, resource_type=rtype, resource_name=name)


def test_nothing_is_allowed_when_no_acl_matches(authorizer):
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")


def test_a_literal_allow_grants_exactly_that_operation_on_that_resource(store, authorizer):
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    assert not can(authorizer, ALICE, Op.WRITE, TOPIC, "orders")
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders2")
    assert not can(authorizer, BOB, Op.DELETE, TOPIC, "orders")
    assert not can(authorizer, ALICE, Op.DELETE, GROUP, "orders")


def test_deny_overrides_allow(store, authorizer):
    store.add([
        acl(ALICE, TOPIC, "orders", Op.ALL),
        acl("User:*", TOPIC, "*", Op.DELETE),
        acl(ALICE, TOPIC, "ord", Op.DELETE, DENY, PREFIXED),
    ])
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    assert can(authorizer, ALICE, Op.READ, TOPIC, "orders")
    assert can(authorizer, BOB, Op.DELETE, TOPIC, "orders")


def test_deny_all_denies_every_operation_including_describe(store, authorizer):
    store.add([acl(ALICE, TOPIC, "orders", Op.READ), acl(ALICE, TOPIC, "orders", Op.ALL, DENY)])
    for op in (Op.READ, Op.DESCRIBE, Op.DELETE):
        assert not can(authorizer, ALICE, op, TOPIC, "orders")


def test_a_denied_read_does_not_deny_describe(store, authorizer):
    store.add([acl(ALICE, TOPIC, "orders", Op.DESCRIBE), acl(ALICE, TOPIC, "orders", Op.READ, DENY)])
    assert can(authorizer, ALICE, Op.DESCRIBE, TOPIC, "orders")
    assert not can(authorizer, ALICE, Op.READ, TOPIC, "orders")


def test_prefixed_acls_match_names_that_start_with_the_prefix(store, authorizer):
    store.add([acl(ALICE, TOPIC, "orders.", Op.DELETE, pattern=PREFIXED)])
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders.eu")
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders.")
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "payments.orders.eu")


def test_a_literal_acl_is_not_a_prefix(store, authorizer):
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders.eu")


def test_wildcard_principal_matches_every_user_including_anonymous(store, authorizer):
    store.add([acl("User:*", TOPIC, "orders", Op.READ)])
    for who in (ALICE, BOB, "User:ANONYMOUS"):
        assert can(authorizer, who, Op.READ, TOPIC, "orders")


def test_wildcard_resource_matches_every_resource_of_its_type_only(store, authorizer):
    store.add([acl(ALICE, GROUP, "*", Op.READ)])
    assert can(authorizer, ALICE, Op.READ, GROUP, "spark-job")
    assert can(authorizer, ALICE, Op.READ, GROUP, "*")
    assert not can(authorizer, ALICE, Op.READ, TOPIC, "spark-job")


@pytest.mark.parametrize("granted", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER])
def test_describe_is_implied_by_read_write_delete_and_alter(store, authorizer, granted):
    store.add([acl(ALICE, TOPIC, "orders", granted)])
    assert can(authorizer, ALICE, Op.DESCRIBE, TOPIC, "orders")


def test_describe_implies_nothing_else(store, authorizer):
    store.add([acl(ALICE, TOPIC, "orders", Op.DESCRIBE)])
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert not can(authorizer, ALICE, op, TOPIC, "orders")


def test_all_matches_every_operation(store, authorizer):
    store.add([acl(ALICE, CLUSTER, "kafka-cluster", Op.ALL)])
    for op in Op:
        assert can(authorizer, ALICE, op, CLUSTER, "kafka-cluster")


def test_cluster_action_on_the_cluster_resource(store, authorizer):
    store.add([acl("User:coordinator", CLUSTER, "kafka-cluster", Op.CLUSTER_ACTION)])
    assert can(authorizer, "User:coordinator", Op.CLUSTER_ACTION, CLUSTER, "kafka-cluster")
    assert not can(authorizer, ALICE, Op.CLUSTER_ACTION, CLUSTER, "kafka-cluster")


def test_a_disabled_authorizer_allows_everything_without_touching_redis():
    class NoStore:
        def version(self):
            raise AssertionError("a disabled authorizer must not read ACLs")

        snapshot = version

    authorizer = Authorizer(store=NoStore(), enabled=False)  # type: ignore[arg-type]
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    assert not authorizer.enabled


def test_super_users_are_allowed_even_against_a_deny(store, clock):
    store.add([acl("User:admin", TOPIC, "*", Op.ALL, DENY)])
    authorizer = Authorizer(store=store, enabled=True, super_users=frozenset({"User:admin"}), clock=clock)
    assert can(authorizer, "User:admin", Op.DELETE, TOPIC, "orders")
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")


def test_require_raises_the_kafka_error_of_the_resource_type(store, authorizer):
    with pytest.raises(TopicAuthorizationFailed, match="User:alice is not authorized to DELETE on TOPIC 'orders'"):
        authorizer.require(principal=ALICE, operation=Op.DELETE, resource_type=TOPIC, resource_name="orders")
    with pytest.raises(ClusterAuthorizationFailed):
        authorizer.require(
            principal=ALICE, operation=Op.CLUSTER_ACTION, resource_type=CLUSTER, resource_name="kafka-cluster"
        )
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    authorizer.invalidate()
    authorizer.require(principal=ALICE, operation=Op.DELETE, resource_type=TOPIC, resource_name="orders")


def test_the_cache_serves_decisions_until_the_refresh_interval_passes(store, authorizer, clock):
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")  # within 200 ms: cached answer
    clock.now += 0.25
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")


def test_a_request_denied_while_another_thread_reloads_waits_for_the_reload(store, authorizer, clock):
    # A slow reload (Redis under load) must not let a request racing it be refused from the
    # previous snapshot an ACL granted since then: the denial waits for the reload.
    assert not can(authorizer, ALICE, Op.WRITE, TOPIC, "orders")
    store.add([acl(ALICE, TOPIC, "orders", Op.WRITE)])
    clock.now += 0.25
    reloading, finish = threading.Event(), threading.Event()
    original = store.snapshot

    def slow_snapshot():
        reloading.set()
        assert finish.wait(10)
        return original()

    store.snapshot = slow_snapshot  # type: ignore[method-assign]
    answers: dict[str, bool] = {}
    reloader = threading.Thread(target=lambda: answers.update(reloader=can(authorizer, ALICE, Op.WRITE, TOPIC,
                                                                           "orders")))
    reloader.start()
    assert reloading.wait(10)
    racer = threading.Thread(target=lambda: answers.update(racer=can(authorizer, ALICE, Op.WRITE, TOPIC, "orders")))
    racer.start()
    racer.join(0.3)
    assert "racer" not in answers, "the racing request was answered from the snapshot being replaced"
    finish.set()
    reloader.join(10)
    racer.join(10)
    assert answers == {"reloader": True, "racer": True}


def test_a_version_bump_invalidates_the_cache_in_every_authorizer(store, redis_client, clock):
    first = Authorizer(store=store, enabled=True, clock=clock)
    second = Authorizer(store=AclStore(redis=redis_client), enabled=True, clock=clock)
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert can(first, ALICE, Op.DELETE, TOPIC, "orders") and can(second, ALICE, Op.DELETE, TOPIC, "orders")
    version = store.version()
    store.remove([AclFilter(principal=ALICE)])
    assert store.version() > version
    clock.now += 0.25
    assert not can(first, ALICE, Op.DELETE, TOPIC, "orders")
    assert not can(second, ALICE, Op.DELETE, TOPIC, "orders")


def test_an_unchanged_version_does_not_reload_the_acl_list(store, authorizer, clock):
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    reloads = []
    original = store.snapshot
    store.snapshot = lambda: reloads.append(1) or original()  # type: ignore[method-assign]
    for _ in range(5):
        clock.now += 0.25
        assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    assert reloads == []


def test_the_last_loaded_acls_keep_serving_when_redis_goes_away(tmp_path, clock):
    own_redis = start_redis(tmp_path, appendonly=False)  # this test kills it, so not the shared one
    client = redis_lib.Redis.from_url(own_redis.url, socket_timeout=1)
    try:
        store = AclStore(redis=client)
        store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
        authorizer = Authorizer(store=store, enabled=True, clock=clock)
        assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
        own_redis.stop()
        clock.now += 0.25
        assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
        assert not can(authorizer, BOB, Op.DELETE, TOPIC, "orders")
    finally:
        client.close()
        own_redis.stop()


def test_an_authorizer_that_never_loaded_acls_fails_closed_when_redis_is_down(tmp_path, clock):
    own_redis = start_redis(tmp_path, appendonly=False)
    client = redis_lib.Redis.from_url(own_redis.url, socket_timeout=1)
    own_redis.stop()
    try:
        authorizer = Authorizer(store=AclStore(redis=client), enabled=True, clock=clock)
        with pytest.raises(redis_lib.ConnectionError):
            can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    finally:
        client.close()


def test_authorize_is_consistent_under_concurrent_callers(store, redis_client):
    store.add([acl(ALICE, TOPIC, "t", Op.READ, pattern=PREFIXED)])
    authorizer = Authorizer(store=store, enabled=True, refresh_interval_s=0.0)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for i in range(300):
                assert can(authorizer, ALICE, Op.READ, TOPIC, f"t{i}")
                assert not can(authorizer, BOB, Op.READ, TOPIC, f"t{i}")
        except BaseException as exc:  # noqa: BLE001 - surfaced to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
