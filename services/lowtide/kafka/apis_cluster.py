"""OffsetForLeaderEpoch, DescribeTopicPartitions and the ACL APIs over the Kafka protocol.

* OffsetForLeaderEpoch (KIP-320: a consumer that sees a new leader epoch in Metadata asks the new
  leader where the epoch of its position ends, and detects truncation): the replica's handler
  (``KafkaServices.epochs``), the one its gRPC OffsetForLeaderEpoch (its followers') calls too.
  ``current_leader_epoch`` fences as in Fetch:
  older than the leader's is FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH; a replica that is not
  the leader (or a front door, which hosts nothing) answers NOT_LEADER_OR_FOLLOWER.
* DescribeTopicPartitions (what Kafka 4's ``kafka-topics --describe`` asks first): the front
  door's Metadata, paged as Kafka's ``DescribeTopicPartitionsRequestHandler`` pages it: topics in
  name order from the cursor's, at most ``response_partition_limit`` partitions (capped at
  Kafka's default ``max.request.partition.size.limit``, 2000), ``next_cursor`` where it stopped.
* CreateAcls, DescribeAcls, DeleteAcls: the front door's ACL administration (``Call.front.acls``:
  ``frontdoor.admin.acls.AclAdmin``, or its gRPC twin from a replica), so the same rules hold as
  for ``lowtide acls``: ALTER on the CLUSTER to create or delete, DESCRIBE to
  list, else CLUSTER_AUTHORIZATION_FAILED. Kafka's numbers for resource types, pattern types,
  operations and permissions are the store's, so a binding maps field for field. lowtide ACLs
  carry no host: they hold for every host, so a binding must name host ``*``. What Kafka has and
  the store does not (operations CREATE, IDEMPOTENT_WRITE, the token operations; resource types
  USER, DELEGATION_TOKEN) cannot be created (INVALID_REQUEST) and a filter naming one matches
  nothing. Filters follow Kafka's ``AclBindingFilter``: ANY matches every value, pattern type
  MATCH selects the bindings whose pattern covers the named resource (that literal name, the
  literal ``*``, every prefix of it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lowtide.errors import InvalidRequest, LowtideError, NotLeaderOrFollower, TopicAuthorizationFailed
from lowtide.kafka.apis_admin import describe, kafka_brokers
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code
from lowtide.messages.acls import AclBinding, AclFilter, AclOperation, AclPermission, ResourceType
from lowtide.messages.admin import PartitionView
from lowtide.messages.replica import EpochEndOffset, EpochQuery
from lowtide.metadata.model import INTERNAL_TOPIC_PREFIX

OFFSET_FOR_LEADER_EPOCH_KEY, DESCRIBE_ACLS_KEY, CREATE_ACLS_KEY, DELETE_ACLS_KEY = 23, 29, 30, 31
DESCRIBE_TOPIC_PARTITIONS_KEY = 75
# Kafka's "authorized operations not computed" marker (the AdminClient reads it as null).
_NO_OPERATIONS = -(2**31)
# Kafka's max.request.partition.size.limit default: the most partitions one answer carries.
MAX_PARTITIONS_PER_RESPONSE = 2000


# -- OffsetForLeaderEpoch (KIP-320) ------------------------------------------------------------
def offset_for_leader_epoch(call: Call, body: Any) -> Any:
    asked = [(t.topic, p) for t in body.topics for p in t.partitions]
    results: dict[tuple[str, int], EpochEndOffset] = {}
    epochs = call.services.epochs
    if asked and epochs is not None:  # else a front door: it hosts nothing (NOT_LEADER_OR_FOLLOWER)
        answers = epochs.offset_for_leader_epoch(call.principal(), [EpochQuery(
            topic=topic, partition=p.partition, leader_epoch=p.leader_epoch,
            current_leader_epoch=p.current_leader_epoch if p.current_leader_epoch >= 0 else -1)
            for topic, p in asked])
        results = {(a.topic, a.partition): a for a in answers}
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            r = results.get((t.topic, p.partition))
            code = NotLeaderOrFollower.code if r is None else r.error.code if r.error is not None else 0
            parts.append(call.make("EpochEndOffset", error_code=error_code(code), partition=p.partition,
                                   leader_epoch=r.leader_epoch if r is not None and not code else -1,
                                   end_offset=r.end_offset if r is not None and not code else -1))
        topics.append(call.make("OffsetForLeaderTopicResult", topic=t.topic, partitions=tuple(parts)))
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(topics))


# -- DescribeTopicPartitions -------------------------------------------------------------------
def describe_topic_partitions(call: Call, body: Any) -> Any:
    cursor = body.cursor
    after = cursor.topic_name if cursor is not None else ""
    requested = sorted({t.name for t in body.topics})
    fetch_all = not requested
    if cursor is not None and ((not fetch_all and cursor.topic_name not in requested) or cursor.partition_index < 0):
        # Kafka's answer to a cursor outside the topic list, or a negative partition: every named
        # topic INVALID_REQUEST (DescribeTopicPartitionsRequest.getErrorResponse).
        return call.make(call.response, throttle_time=NO_THROTTLE, next_cursor=None, topics=tuple(
            _topic(call, t.name, InvalidRequest.code, (), topic_id=None) for t in body.topics))
    names = [n for n in requested if n >= after]
    meta = describe(call, names)  # none named: every topic
    by_name = {t.name: t for t in meta.topics}
    if fetch_all:
        names = sorted(n for n, t in by_name.items() if n >= after and t.error is None)
    live = {b.id for b in kafka_brokers(meta)}
    remaining = max(min(MAX_PARTITIONS_PER_RESPONSE, int(body.response_partition_limit)), 1)
    topics, refused, next_cursor = [], [], None
    for name in names:
        t = by_name.get(name)
        code = -1 if t is None else 0 if t.error is None else t.error.code
        if code == TopicAuthorizationFailed.code:
            refused.append(_topic(call, name, code, (), topic_id=None))  # answered last, as Kafka does
            continue
        if remaining == 0:
            next_cursor = call.make("Cursor", topic_name=name, partition_index=0)
            break
        if code:
            if not fetch_all:
                topics.append(_topic(call, name, code, (), topic_id=None))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        states = {p.partition: p for p in t.partitions}
        upper = min(len(states), start + remaining)
        parts = tuple(_partition(call, states[i], live) for i in range(start, upper) if i in states)
        topics.append(_topic(call, name, 0, parts, topic_id=_uuid(t.topic_id)))
        if upper < len(states):
            next_cursor = call.make("Cursor", topic_name=name, partition_index=upper)
            break
        remaining -= len(parts)
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=(*topics, *refused), next_cursor=next_cursor)


def _topic(call: Call, name: str, code: int, partitions: tuple, *, topic_id: uuid.UUID | None) -> Any:
    return call.make("DescribeTopicPartitionsResponseTopic", error_code=error_code(code), name=name,
                     topic_id=topic_id or uuid.UUID(int=0), is_internal=name.startswith(INTERNAL_TOPIC_PREFIX),
                     partitions=partitions, topic_authorized_operations=_NO_OPERATIONS)


def _partition(call: Call, p: PartitionView, live: set[int]) -> Any:
    # Kafka answers a leaderless partition with leader -1 and no error here (Metadata says
    # LEADER_NOT_AVAILABLE); lowtide keeps no eligible leader replicas (KIP-966): both lists empty.
    return call.make("DescribeTopicPartitionsResponsePartition", error_code=error_code(0),
                     partition_index=p.partition, leader_id=p.leader if p.leader in live else -1,
                     leader_epoch=p.leader_epoch, replica_nodes=tuple(p.replicas), isr_nodes=tuple(p.isr),
                     eligible_leader_replicas=(), last_known_elr=(),
                     offline_replicas=tuple(r for r in p.replicas if r not in live))


def _uuid(raw: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(raw) if raw else None
    except ValueError:
        return None


# -- ACLs: Kafka's enums and filters against the store's ----------------------------------------
# Kafka's codes (org.apache.kafka.common.resource.ResourceType, PatternType, acl.AclOperation,
# acl.AclPermissionType); a code Kafka does not know is its UNKNOWN.
RESOURCE_TYPES = ("UNKNOWN", "ANY", "TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID", "DELEGATION_TOKEN", "USER")
PATTERN_TYPES = ("UNKNOWN", "ANY", "MATCH", "LITERAL", "PREFIXED")
OPERATIONS = ("UNKNOWN", "ANY", "ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "CLUSTER_ACTION",
              "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "CREATE_TOKENS", "DESCRIBE_TOKENS",
              "TWO_PHASE_COMMIT")
PERMISSIONS = ("UNKNOWN", "ANY", "DENY", "ALLOW")
ANY, MATCH, LITERAL, PREFIXED = 1, 2, 3, 4
WILDCARD_HOST, WILDCARD_RESOURCE, PRINCIPAL_PREFIX = "*", "*", "User:"
# What the store holds (its enums carry Kafka's numbers).
STORE_RESOURCE_TYPES = frozenset(int(v) for v in ResourceType)
STORE_OPERATIONS = frozenset(int(v) for v in AclOperation)
STORE_PERMISSIONS = frozenset(int(v) for v in AclPermission)


def _kafka_name(names: tuple[str, ...], code: int) -> str:
    return names[code] if 0 <= code < len(names) else "UNKNOWN"


def binding_from_kafka(*, resource_type: int, resource_name: str, pattern_type: int, principal: str, host: str,
                       operation: int, permission: int) -> AclBinding:
    """The store's binding of one Kafka AclCreation; InvalidRequest when the store cannot hold it
    (here, or by the binding's own checks: principal form, the CLUSTER's name, a PREFIXED ``*``)."""
    if host != WILDCARD_HOST:
        raise InvalidRequest(f"lowtide ACLs apply to every host: host must be '*', not {host!r}")
    if pattern_type not in (LITERAL, PREFIXED):
        raise InvalidRequest(f"pattern type {_kafka_name(PATTERN_TYPES, pattern_type)} is not valid for an ACL "
                             "(LITERAL or PREFIXED)")
    for what, names, code, held in (("resource type", RESOURCE_TYPES, resource_type, STORE_RESOURCE_TYPES),
                                    ("operation", OPERATIONS, operation, STORE_OPERATIONS),
                                    ("permission type", PERMISSIONS, permission, STORE_PERMISSIONS)):
        if code not in held:
            raise InvalidRequest(f"lowtide ACLs have no {what} {_kafka_name(names, code)}")
    return AclBinding(principal=principal, resource_type=resource_type, resource_name=resource_name,
                      pattern_type=pattern_type, operation=operation, permission=permission)


@dataclass(frozen=True)
class AclSelection:
    """A Kafka AclBindingFilter as the store can select it (``store``: exact fields, None = any),
    plus, for pattern type MATCH with a name, the resource whose covering patterns it keeps."""

    store: AclFilter
    covering: str | None = None

    def selects(self, binding: AclBinding) -> bool:
        if self.covering is None:
            return True
        if binding.pattern_type == PREFIXED:
            return self.covering.startswith(binding.resource_name)
        return binding.resource_name in (self.covering, WILDCARD_RESOURCE)


def selection_from_kafka(*, resource_type: int, resource_name: str | None, pattern_type: int,
                         principal: str | None, host: str | None, operation: int,
                         permission: int) -> AclSelection | None:
    """The store's selection of one Kafka ACL filter; None when no binding of the store can match it
    (a host other than ``*``, a type or operation the store has not). InvalidRequest for Kafka's
    UNKNOWN values, as Kafka answers them."""
    for what, names, code in (("resource type", RESOURCE_TYPES, resource_type),
                              ("pattern type", PATTERN_TYPES, pattern_type),
                              ("operation", OPERATIONS, operation), ("permission type", PERMISSIONS, permission)):
        if _kafka_name(names, code) == "UNKNOWN":
            raise InvalidRequest(f"the ACL filter's {what} ({code}) is UNKNOWN")
    if host is not None and host != WILDCARD_HOST:
        return None
    if principal is not None and not _store_principal(principal):
        return None
    fields = {}
    for field, code, held in (("resource_type", resource_type, STORE_RESOURCE_TYPES),
                              ("operation", operation, STORE_OPERATIONS),
                              ("permission", permission, STORE_PERMISSIONS)):
        if code != ANY:
            if code not in held:
                return None
            fields[field] = code
    covering = None
    if pattern_type == MATCH:
        covering = resource_name
    else:
        if pattern_type != ANY:
            fields["pattern_type"] = pattern_type
        if resource_name is not None:
            if not resource_name:
                return None  # no binding has an empty name
            fields["resource_name"] = resource_name
    return AclSelection(store=AclFilter(principal=principal or None, **fields), covering=covering)


def _store_principal(principal: str) -> bool:
    name = principal.removeprefix(PRINCIPAL_PREFIX)
    return principal.startswith(PRINCIPAL_PREFIX) and bool(name) and name == name.strip()


def _exactly(b: AclBinding) -> AclFilter:
    return AclFilter(principal=b.principal, resource_type=b.resource_type, resource_name=b.resource_name,
                     pattern_type=b.pattern_type, operation=b.operation, permission=b.permission)


def _selection(f: Any) -> AclSelection | None:
    return selection_from_kafka(resource_type=f.resource_type_filter, resource_name=f.resource_name_filter,
                                pattern_type=f.pattern_type_filter, principal=f.principal_filter,
                                host=f.host_filter, operation=f.operation, permission=f.permission_type)


def _described(call: Call, selection: AclSelection | None) -> list[AclBinding]:
    if selection is None:
        return []
    bindings = call.front.acls.describe_acls(principal=call.principal(), acl_filter=selection.store)
    return [b for b in bindings if selection.selects(b)]


# -- CreateAcls / DescribeAcls / DeleteAcls -----------------------------------------------------
def create_acls(call: Call, body: Any) -> Any:
    results: list[tuple[int, str | None]] = []
    valid: list[tuple[int, AclBinding]] = []
    for i, c in enumerate(body.creations):
        try:
            valid.append((i, binding_from_kafka(
                resource_type=c.resource_type, resource_name=c.resource_name, pattern_type=c.resource_pattern_type,
                principal=c.principal, host=c.host, operation=c.operation, permission=c.permission_type)))
            results.append((0, None))
        except LowtideError as err:
            results.append((err.code, err.message))
    if valid:
        try:
            errors = call.front.acls.create_acls(principal=call.principal(), bindings=[b for _, b in valid])
            # Code only: the Admin service's CreateAcls answers carry no message, so a replica's
            # listener (which asks over it) and the front door's answer alike.
            answered = [(0 if e is None else e.code, None) for e in errors]
        except LowtideError as err:  # the whole call failed: each creation sent answers its error
            answered = [(err.code, err.message)] * len(valid)
        for (i, _), result in zip(valid, answered, strict=True):
            results[i] = result
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(
        call.make("AclCreationResult", error_code=error_code(code), error_message=message)
        for code, message in results))


def describe_acls(call: Call, body: Any) -> Any:
    try:
        bindings = _described(call, _selection(body))
    except LowtideError as err:
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(err.code),
                         error_message=err.message, resources=())
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), error_message=None,
                     resources=tuple(_by_resource(call, bindings)))


def _by_resource(call: Call, bindings: Iterable[AclBinding]) -> list[Any]:
    grouped: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in bindings:
        grouped.setdefault((int(b.resource_type), b.resource_name, int(b.pattern_type)), []).append(b)
    return [call.make("DescribeAclsResource", resource_type=rtype, resource_name=name, pattern_type=ptype,
                      acls=tuple(call.make("AclDescription", principal=b.principal, host=WILDCARD_HOST,
                                           operation=int(b.operation), permission_type=int(b.permission))
                                 for b in sorted(acls, key=lambda b: (b.principal, b.operation, b.permission))))
            for (rtype, name, ptype), acls in sorted(grouped.items())]


def delete_acls(call: Call, body: Any) -> Any:
    # One store call per filter, in order: a binding two filters match is deleted (and answered)
    # once, under the first, as Kafka answers it.
    results = []
    for f in body.filters:
        try:
            selection = _selection(f)
            if selection is None:
                deleted: list[AclBinding] = []
            elif selection.covering is None:
                deleted = call.front.acls.delete_acls(principal=call.principal(), filters=[selection.store])
            else:  # MATCH: the store selects exactly, so the covering bindings are named one by one
                covering = _described(call, selection)
                deleted = call.front.acls.delete_acls(principal=call.principal(), filters=[
                    _exactly(b) for b in covering]) if covering else []
        except LowtideError as err:
            results.append(call.make("DeleteAclsFilterResult", error_code=error_code(err.code),
                                     error_message=err.message, matching_acls=()))
            continue
        results.append(call.make("DeleteAclsFilterResult", error_code=error_code(0), error_message=None,
                                 matching_acls=tuple(call.make(
                                     "DeleteAclsMatchingAcl", error_code=error_code(0), error_message=None,
                                     resource_type=int(b.resource_type), resource_name=b.resource_name,
                                     pattern_type=int(b.pattern_type), principal=b.principal, host=WILDCARD_HOST,
                                     operation=int(b.operation), permission_type=int(b.permission))
                                     for b in deleted)))
    return call.make(call.response, throttle_time=NO_THROTTLE, filter_results=tuple(results))


APIS: list[Api] = [
    Api(OFFSET_FOR_LEADER_EPOCH_KEY, "OffsetForLeaderEpoch", 2, 4, offset_for_leader_epoch),
    Api(DESCRIBE_ACLS_KEY, "DescribeAcls", 1, 3, describe_acls),
    Api(CREATE_ACLS_KEY, "CreateAcls", 1, 3, create_acls),
    Api(DELETE_ACLS_KEY, "DeleteAcls", 1, 3, delete_acls),
    Api(DESCRIBE_TOPIC_PARTITIONS_KEY, "DescribeTopicPartitions", 0, 0, describe_topic_partitions),
]
