"""Authorizer semantics (Kafka AclAuthorizer), against ACLs stored in a real etcd: changes reach it
through the store's listener (no polling), and it keeps its ACLs while etcd is away."""

from __future__ import annotations

import socket
import threading

import pytest

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
from lowtide.errors import ClusterAuthorizationFailed, MetadataStoreUnavailable, TopicAuthorizationFailed
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore
from tests.conftest import start_ready_etcd
from tests.waiting import wait_until

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


def test_a_disabled_authorizer_allows_everything_without_touching_the_store():
    class NoStore:
        def version(self):
            raise AssertionError("a disabled authorizer must not read ACLs")

        snapshot = version

    authorizer = Authorizer(store=NoStore(), enabled=False)  # type: ignore[arg-type]
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    assert not authorizer.enabled


def test_super_users_are_allowed_even_against_a_deny(store):
    store.add([acl("User:admin", TOPIC, "*", Op.ALL, DENY)])
    authorizer = Authorizer(store=store, enabled=True, super_users=frozenset({"User:admin"}))
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


def test_authorized_operations_sets_the_bit_of_each_allowed_operation_asked_about(store, authorizer):
    store.add([acl(ALICE, GROUP, "g", Op.READ), acl(ALICE, GROUP, "g", Op.ALTER_CONFIGS)])
    authorizer.invalidate()
    asked = (Op.READ, Op.DELETE, Op.DESCRIBE)  # DESCRIBE is implied by READ; ALTER_CONFIGS is not asked
    bits = authorizer.authorized_operations(principal=ALICE, resource_type=GROUP, resource_name="g",
                                            operations=asked)
    assert bits == (1 << int(Op.READ)) | (1 << int(Op.DESCRIBE))
    assert authorizer.authorized_operations(principal=BOB, resource_type=GROUP, resource_name="g",
                                            operations=asked) == 0


def test_a_change_made_in_this_process_is_decided_on_at_once(store, authorizer):
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")  # no interval to wait
    store.remove([AclFilter(principal=ALICE)])
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")


def test_a_change_made_elsewhere_arrives_through_the_watch(store, authorizer, reopen):
    elsewhere = AclStore(metadata=reopen())
    assert not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    elsewhere.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    wait_until(lambda: can(authorizer, ALICE, Op.DELETE, TOPIC, "orders"), what="the grant to arrive")
    elsewhere.remove([AclFilter(principal=ALICE)])
    wait_until(lambda: not can(authorizer, ALICE, Op.DELETE, TOPIC, "orders"), what="the revocation to arrive")


def test_deciding_reads_nothing_from_the_store_while_the_acls_do_not_change(store, authorizer):
    # No polling and no round trip on the request path: between changes, decisions come from memory.
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    reads = []
    original_version, original_snapshot = store.version, store.snapshot
    store.version = lambda: reads.append("version") or original_version()  # type: ignore[method-assign]
    store.snapshot = lambda: reads.append("snapshot") or original_snapshot()  # type: ignore[method-assign]
    for i in range(200):
        assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
        assert not can(authorizer, BOB, Op.DELETE, TOPIC, f"t{i}")
    assert reads == []


def test_a_request_denied_while_another_thread_reloads_waits_for_the_reload(store, authorizer):
    # A slow reload must not let a request racing it be refused from the previous snapshot an ACL
    # granted since then: the denial waits for the reload.
    assert not can(authorizer, ALICE, Op.WRITE, TOPIC, "orders")
    store.add([acl(ALICE, TOPIC, "orders", Op.WRITE)])
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


def test_a_version_bump_invalidates_the_cache_in_every_authorizer(store, reopen):
    first = Authorizer(store=store, enabled=True)
    second = Authorizer(store=AclStore(metadata=reopen()), enabled=True)
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert can(first, ALICE, Op.DELETE, TOPIC, "orders")
    wait_until(lambda: can(second, ALICE, Op.DELETE, TOPIC, "orders"), what="the other process's grant")
    version = store.version()
    store.remove([AclFilter(principal=ALICE)])
    assert store.version() > version
    assert not can(first, ALICE, Op.DELETE, TOPIC, "orders")
    wait_until(lambda: not can(second, ALICE, Op.DELETE, TOPIC, "orders"), what="the other process's revocation")


def test_an_unchanged_version_does_not_reload_the_acl_list(store, authorizer, metadata_store):
    store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    reloads = []
    original = store.snapshot
    store.snapshot = lambda: reloads.append(1) or original()  # type: ignore[method-assign]
    for _ in range(5):
        authorizer.invalidate()  # as a listener would, for nothing
        assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    section(metadata_store, "tokens").put("other", b"User:other")  # another section's change
    assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    assert reloads == []


@pytest.fixture
def own_etcd(tmp_path):
    """An etcd of this test's own (it stops it)."""
    [member] = start_ready_etcd(tmp_path / "etcd")
    yield member
    member.stop()


def test_the_last_loaded_acls_keep_serving_when_etcd_goes_away(own_etcd):
    metadata = MetadataStore.from_url(f"etcd://{own_etcd.endpoint}")
    try:
        store = AclStore(metadata=metadata)
        store.add([acl(ALICE, TOPIC, "orders", Op.DELETE)])
        authorizer = Authorizer(store=store, enabled=True)
        assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
        own_etcd.stop()
        authorizer.invalidate()
        assert can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
        assert not can(authorizer, BOB, Op.DELETE, TOPIC, "orders")
        assert store.list() == [acl(ALICE, TOPIC, "orders", Op.DELETE)]  # reads answer from the image
        with pytest.raises(MetadataStoreUnavailable):  # changes wait for the store
            store.add([acl(BOB, TOPIC, "orders", Op.DELETE)])
    finally:
        metadata.close()


def test_an_authorizer_that_never_loaded_acls_fails_closed_when_etcd_is_down():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metadata = MetadataStore(client=EtcdClient([f"127.0.0.1:{port}"], timeout_s=0.5))
    try:
        authorizer = Authorizer(store=AclStore(metadata=metadata), enabled=True)
        with pytest.raises(MetadataStoreUnavailable):  # after the image's first-load wait (10 s)
            can(authorizer, ALICE, Op.DELETE, TOPIC, "orders")
    finally:
        # Let the image's loading thread see the stop before its client's channels close.
        metadata.image.stop()
        loading = metadata.image._load_thread  # this store's own (other tests' stores may be loading)
        wait_until(lambda: loading is None or not loading.is_alive(), what="the image's loading thread to stop")
        metadata.close()


def test_authorize_is_consistent_under_concurrent_callers(store):
    store.add([acl(ALICE, TOPIC, "t", Op.READ, pattern=PREFIXED)])
    authorizer = Authorizer(store=store, enabled=True)
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
