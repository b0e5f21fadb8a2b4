"""Kafka's ACL bindings and filters mapped onto lowtide's ACL store (lowtide.kafka.apis_cluster):
Kafka's numbers are the store's, host must be ``*``, what the store has not is refused (a binding)
or matches nothing (a filter), Kafka's UNKNOWN is INVALID_REQUEST, and MATCH selects the bindings
whose pattern covers the named resource, as Kafka's ``ResourcePatternFilter.matches`` does."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidRequest
from lowtide.kafka.apis_cluster import binding_from_kafka, selection_from_kafka
from lowtide.messages.acls import AclBinding, AclFilter

ANY, MATCH, LITERAL, PREFIXED = 1, 2, 3, 4
TOPIC, GROUP, CLUSTER, USER = 2, 3, 4, 7
ALL, READ, WRITE, CREATE, DESCRIBE, IDEMPOTENT_WRITE = 2, 3, 4, 5, 8, 12
DENY, ALLOW = 2, 3


def creation(**overrides) -> dict:
    values = {"resource_type": TOPIC, "resource_name": "orders", "pattern_type": LITERAL,
              "principal": "User:alice", "host": "*", "operation": READ, "permission": ALLOW}
    return {**values, **overrides}


def kafka_filter(**overrides) -> dict:
    values = {"resource_type": ANY, "resource_name": None, "pattern_type": ANY, "principal": None, "host": None,
              "operation": ANY, "permission": ANY}
    return {**values, **overrides}


def binding(name: str, pattern: int = LITERAL, **overrides) -> AclBinding:
    values = {"principal": "User:alice", "resource_type": TOPIC, "resource_name": name, "pattern_type": pattern,
              "operation": READ, "permission": ALLOW}
    return AclBinding(**{**values, **overrides})


def test_a_kafka_binding_maps_field_for_field_onto_the_stores():
    assert binding_from_kafka(**creation(pattern_type=PREFIXED, operation=WRITE, permission=DENY)) == \
        AclBinding(principal="User:alice", resource_type=TOPIC, resource_name="orders",
                   pattern_type=PREFIXED, operation=WRITE, permission=DENY)
    cluster = binding_from_kafka(**creation(resource_type=CLUSTER, resource_name="kafka-cluster", operation=ALL))
    assert (cluster.resource_type, cluster.resource_name, cluster.operation) == (CLUSTER, "kafka-cluster", ALL)


@pytest.mark.parametrize(("overrides", "says"), [
    ({"host": "10.0.0.1"}, "host must be '*'"),
    ({"pattern_type": MATCH}, "pattern type MATCH"),
    ({"pattern_type": ANY}, "pattern type ANY"),
    ({"operation": CREATE}, "operation CREATE"),
    ({"operation": IDEMPOTENT_WRITE}, "operation IDEMPOTENT_WRITE"),
    ({"operation": ANY}, "operation ANY"),
    ({"resource_type": USER}, "resource type USER"),
    ({"resource_type": 99}, "resource type UNKNOWN"),
    ({"permission": ANY}, "permission type ANY"),
])
def test_a_binding_the_store_cannot_hold_is_invalid_request(overrides, says):
    with pytest.raises(InvalidRequest, match=says):
        binding_from_kafka(**creation(**overrides))


def test_any_selects_everything_and_exact_values_select_exactly():
    everything = selection_from_kafka(**kafka_filter())
    assert everything.store == AclFilter() and everything.covering is None
    exact = selection_from_kafka(**kafka_filter(resource_type=TOPIC, resource_name="orders", pattern_type=LITERAL,
                                                principal="User:alice", host="*", operation=READ, permission=ALLOW))
    assert exact.store == AclFilter(principal="User:alice", resource_type=TOPIC, resource_name="orders",
                                    pattern_type=LITERAL, operation=READ, permission=ALLOW)
    # pattern type ANY with a name: that exact name, whatever its pattern type
    named = selection_from_kafka(**kafka_filter(resource_name="orders"))
    assert named.store == AclFilter(resource_name="orders") and named.covering is None


@pytest.mark.parametrize("overrides", [
    {"host": "10.0.0.1"}, {"operation": CREATE}, {"resource_type": USER}, {"principal": "Group:ops"},
    {"principal": "User:"}, {"resource_name": ""},
])
def test_a_filter_no_stored_binding_can_match_selects_nothing(overrides):
    assert selection_from_kafka(**kafka_filter(**overrides)) is None


@pytest.mark.parametrize("field", ["resource_type", "pattern_type", "operation", "permission"])
@pytest.mark.parametrize("code", [0, 42])
def test_kafkas_unknown_values_in_a_filter_are_invalid_request(field, code):
    with pytest.raises(InvalidRequest, match="UNKNOWN"):
        selection_from_kafka(**kafka_filter(**{field: code}))


def test_match_keeps_the_bindings_whose_pattern_covers_the_named_resource():
    match = selection_from_kafka(**kafka_filter(resource_type=TOPIC, resource_name="payroll", pattern_type=MATCH))
    assert match.store == AclFilter(resource_type=TOPIC)  # the name is matched here, not in the store
    assert match.covering == "payroll"
    assert match.selects(binding("payroll"))
    assert match.selects(binding("*"))
    assert match.selects(binding("pay", PREFIXED))
    assert match.selects(binding("payroll", PREFIXED))
    assert not match.selects(binding("pay"))
    assert not match.selects(binding("payrolls", PREFIXED))
    assert not match.selects(binding("orders"))
    # MATCH without a name is ANY
    assert selection_from_kafka(**kafka_filter(pattern_type=MATCH)).selects(binding("anything", PREFIXED))
