"""AclStore over a real Redis: add / list / remove with filters, and the version counter."""

from __future__ import annotations

import json

import redis as redis_lib

from lowtide.auth.acl import AclBinding, AclFilter, AclOperation, AclPermission, PatternType, ResourceType
from lowtide.auth.store import ACLS_KEY, VERSION_KEY, AclStore


def acl(principal="User:alice", rtype=ResourceType.TOPIC, name="orders", op=AclOperation.DELETE,
        perm=AclPermission.ALLOW, pattern=PatternType.LITERAL) -> AclBinding:
    return AclBinding(principal=principal, resource_type=rtype, resource_name=name,
                      pattern_type=pattern, operation=op, permission=perm)


def test_an_empty_store_lists_nothing_at_version_zero(store):
    assert store.list() == []
    assert store.version() == 0


def test_added_bindings_are_listed_and_adding_twice_changes_nothing(store):
    a, b = acl(), acl(principal="User:bob", op=AclOperation.READ)
    store.add([a, b])
    store.add([a])
    assert sorted(store.list(), key=repr) == sorted([a, b], key=repr)


def test_every_change_bumps_the_version(store):
    store.add([acl()])
    v1 = store.version()
    store.remove([AclFilter(principal="User:alice")])
    assert v1 >= 1 and store.version() > v1


def test_redis_holds_one_canonical_json_member_per_binding(store, redis_client):
    store.add([acl()])
    (member,) = redis_client.smembers(ACLS_KEY)
    assert json.loads(member) == {
        "principal": "User:alice", "resource_type": "TOPIC", "resource_name": "orders",
        "pattern_type": "LITERAL", "operation": "DELETE", "permission": "ALLOW",
    }
    assert int(redis_client.get(VERSION_KEY)) == 1


def test_list_filters_on_each_field_and_unset_fields_match_anything(store):
    alice_delete = acl()
    bob_read = acl(principal="User:bob", op=AclOperation.READ)
    prefixed_deny = acl(name="ord", perm=AclPermission.DENY, pattern=PatternType.PREFIXED)
    group_read = acl(rtype=ResourceType.GROUP, name="spark", op=AclOperation.READ)
    store.add([alice_delete, bob_read, prefixed_deny, group_read])

    assert len(store.list(AclFilter())) == 4
    assert set(store.list(AclFilter(principal="User:bob"))) == {bob_read}
    assert set(store.list(AclFilter(resource_type=ResourceType.GROUP))) == {group_read}
    assert set(store.list(AclFilter(resource_name="orders"))) == {alice_delete, bob_read}
    assert set(store.list(AclFilter(pattern_type=PatternType.PREFIXED))) == {prefixed_deny}
    assert set(store.list(AclFilter(operation=AclOperation.READ))) == {bob_read, group_read}
    assert set(store.list(AclFilter(permission=AclPermission.DENY))) == {prefixed_deny}


def test_remove_deletes_what_any_filter_matches_and_returns_it(store):
    keep = acl(principal="User:carol")
    gone_1 = acl()
    gone_2 = acl(rtype=ResourceType.GROUP, name="spark", op=AclOperation.READ)
    store.add([keep, gone_1, gone_2])
    removed = store.remove([AclFilter(principal="User:alice", resource_type=ResourceType.TOPIC),
                            AclFilter(resource_type=ResourceType.GROUP)])
    assert set(removed) == {gone_1, gone_2}
    assert store.list() == [keep]


def test_removing_nothing_returns_nothing_and_keeps_the_version(store):
    store.add([acl()])
    version = store.version()
    assert store.remove([AclFilter(principal="User:nobody")]) == []
    assert store.remove([]) == []
    assert store.version() == version


def test_stores_on_separate_connections_see_each_others_changes(store, redis_url):
    other_client = redis_lib.Redis.from_url(redis_url, decode_responses=True)  # either client style works
    try:
        other = AclStore(redis=other_client)
        store.add([acl()])
        assert other.list() == [acl()]
        assert other.remove([AclFilter()]) == [acl()]
        assert store.list() == []
    finally:
        other_client.close()


def test_snapshot_returns_the_version_with_its_bindings(store):
    store.add([acl()])
    version, bindings = store.snapshot()
    assert version == store.version() and bindings == [acl()]
