"""AclStore over a real etcd: add / list / remove with filters, the version, the listeners, and
that the ACLs are not in Redis (a FLUSHALL keeps them)."""

from __future__ import annotations

import hashlib
import json

from lowtide.auth.acl import AclBinding, AclFilter, AclOperation, AclPermission, PatternType, ResourceType
from lowtide.auth.store import AclStore
from lowtide.metadata.sections import section
from tests.waiting import wait_until


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


def test_the_store_holds_one_canonical_json_record_per_binding_named_by_its_digest(store, metadata_store):
    store.add([acl()])
    records = section(metadata_store, "acls").items()
    assert set(records) - {"version"} and records["version"].revision == store.version()
    [(name, entry)] = [(n, e) for n, e in records.items() if n != "version"]
    assert json.loads(entry.value) == {
        "principal": "User:alice", "resource_type": "TOPIC", "resource_name": "orders",
        "pattern_type": "LITERAL", "operation": "DELETE", "permission": "ALLOW",
    }
    assert name == hashlib.sha256(entry.value).hexdigest()


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


def test_stores_on_separate_connections_see_each_others_changes(store, reopen):
    other = AclStore(metadata=reopen())
    store.add([acl()])
    assert other.list() == [acl()]
    assert other.remove([AclFilter()]) == [acl()]
    wait_until(lambda: store.list() == [], what="the removal to reach the first store's image")
    assert store.version() == other.version()


def test_a_binding_added_elsewhere_a_moment_ago_is_removed_too(store, reopen):
    other = AclStore(metadata=reopen())
    assert other.list() == []  # its image is loaded
    store.add([acl()])
    assert other.remove([AclFilter(principal="User:alice")]) == [acl()]  # caught up with etcd first


def test_listeners_hear_every_change_and_a_change_of_this_process_before_it_returns(store, reopen):
    heard, elsewhere = [], []
    store.listen(lambda: heard.append(1))
    other = AclStore(metadata=reopen())
    other.listen(lambda: elsewhere.append(1))
    assert other.list() == []  # loads its image, which then follows the store
    store.add([acl()])
    assert heard, "a change through this metadata store calls its listeners before it returns"
    wait_until(lambda: elsewhere, what="the watch of the other store to report the change")
    heard.clear()
    other.remove([AclFilter()])
    wait_until(lambda: heard, what="the watch to report a change made elsewhere")


def test_the_acls_survive_a_redis_flushall(store, reopen, redis_client):
    # Issue 51: Redis keeps only the purgatory timers. Emptying it loses no ACL.
    store.add([acl(), acl(principal="User:bob", op=AclOperation.READ)])
    version = store.version()
    redis_client.set("lowtide:unrelated", "1")
    assert redis_client.flushall() and redis_client.dbsize() == 0
    restarted = AclStore(metadata=reopen())  # an image loaded from the store after the flush
    assert restarted.list() == store.list() and len(restarted.list()) == 2
    assert restarted.version() == version


def test_snapshot_returns_the_version_with_its_bindings(store):
    store.add([acl()])
    version, bindings = store.snapshot()
    assert version == store.version() and bindings == [acl()]
