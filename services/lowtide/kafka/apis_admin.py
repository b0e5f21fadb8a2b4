"""Cluster and topic APIs over the Kafka protocol, answered by the front door's TopicAdmin and
RecordsDeleter (``Call.front``: the objects themselves in a front door's process, their remote
twins over its Admin service in a replica's), called with lowtide.messages types.

Metadata lists the replica servers as Kafka brokers (node id = replica id, their Kafka listener
as endpoint) with each partition's real leader, epoch, replicas and ISR, so clients send Produce
and Fetch straight to the leader. The controller Kafka clients send CreateTopics/DeleteTopics to
is the lowest live broker id (any broker forwards to the front door). A front door's own listener
is only a bootstrap address: it is never listed as a broker.

Listeners: as in Kafka, Metadata, FindCoordinator and DescribeCluster answer with each broker's
endpoint of the listener the request arrived on (its name: PLAINTEXT, SSL, SASL_SSL...), so a
client that bootstrapped over SSL is sent to SSL ports only. A broker record without named
listeners (written before them) is reached at its one ``kafka_port``.

DeleteRecords sent to any broker (Kafka's AdminClient sends each partition to its leader) is the
front door's KIP-107 DeleteRecords: the same purgatory, low watermark and errors as gRPC.
Configs (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs) are in ``apis_configs``.
"""

from __future__ import annotations

import uuid
import zlib
from typing import Any

from lowtide.errors import CoordinatorNotAvailable, LowtideError
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, encode_body, error_code, millis
from lowtide.messages.admin import NO_TOPIC, BrokerView, ClusterView, DeleteRequestItem, TopicRequest
from lowtide.metadata.config_defaults import DISKLESS_ENABLE
from lowtide.metadata.model import INTERNAL_TOPIC_PREFIX

METADATA_KEY, FIND_COORDINATOR_KEY, CREATE_TOPICS_KEY, DELETE_TOPICS_KEY = 3, 10, 19, 20
DELETE_RECORDS_KEY, DESCRIBE_CLUSTER_KEY = 21, 60
# Kafka's "authorized operations not requested" marker.
_NO_OPERATIONS = -(2**31)


def _uuid(raw: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(raw) if raw else None
    except ValueError:
        return None


def kafka_brokers(meta: ClusterView) -> list[BrokerView]:
    """The live replica servers that have a Kafka listener, by id."""
    return sorted((b for b in meta.brokers if b.live and b.kafka_port > 0), key=lambda b: b.id)


def describe(call: Call, topics: list[str]) -> ClusterView:
    """The front door's Metadata: the brokers and ``topics`` (none named: every topic the caller
    may DESCRIBE; ``[NO_TOPIC]``: the brokers only)."""
    return call.front.topics.describe_cluster(principal=call.principal(), topics=topics)


def endpoint(call: Call, broker: BrokerView) -> tuple[str, int]:
    """(host, port) of ``broker``'s listener named as the one this request arrived on."""
    address = broker.kafka_listeners.get(call.conn.listener)
    if address:
        host, _, port = address.rpartition(":")
        return host.removeprefix("[").removesuffix("]"), int(port)
    return broker.host, broker.kafka_port


# -- Metadata --------------------------------------------------------------------------------
def metadata(call: Call, body: Any) -> Any:
    if body.topics is None:
        names: list[str] | None = None  # all topics
    else:
        names = [t.name for t in body.topics if t.name]
    kept = call.services.metadata_responses
    key = (call.version, None if names is None else tuple(names), call.conn.listener, call.conn.metadata)
    if kept is not None:
        answer = kept.get(key)
        if answer is not None:
            return answer
    if names == []:
        meta = describe(call, [NO_TOPIC])  # brokers only
        meta_topics: list = []
    else:
        meta = describe(call, names or [])
        meta_topics = list(meta.topics)
    brokers = kafka_brokers(meta)
    broker_ids = {b.id for b in brokers}
    topics = []
    for t in meta_topics:
        if t.error is not None:
            topics.append(call.make("MetadataResponseTopic", error_code=error_code(t.error.code), name=t.name,
                                    topic_id=None, is_internal=t.name.startswith(INTERNAL_TOPIC_PREFIX),
                                    partitions=(), topic_authorized_operations=_NO_OPERATIONS))
            continue
        parts = []
        for p in t.partitions:
            leader = p.leader if p.leader in broker_ids else -1
            parts.append(call.make(
                "MetadataResponsePartition", error_code=error_code(0 if leader >= 0 else 5),
                partition_index=p.partition,
                leader_id=leader, leader_epoch=p.leader_epoch, replica_nodes=tuple(p.replicas),
                isr_nodes=tuple(p.isr), offline_replicas=tuple(r for r in p.replicas if r not in broker_ids)))
        topics.append(call.make("MetadataResponseTopic", error_code=error_code(0), name=t.name,
                                topic_id=_uuid(t.topic_id), is_internal=t.name.startswith(INTERNAL_TOPIC_PREFIX),
                                partitions=tuple(parts), topic_authorized_operations=_NO_OPERATIONS))
    response = call.make(call.response, throttle_time=NO_THROTTLE, cluster_id=meta.cluster_id or None,
                         controller_id=brokers[0].id if brokers else -1,
                         brokers=tuple(call.make("MetadataResponseBroker", node_id=b.id, host=endpoint(call, b)[0],
                                                 port=endpoint(call, b)[1], rack=b.rack or None) for b in brokers),
                         topics=tuple(topics), cluster_authorized_operations=_NO_OPERATIONS)
    if kept is None or not meta.revision:
        return response
    encoded = encode_body(response)
    kept.put(key, revision=meta.revision, body=encoded)
    return encoded


def describe_cluster(call: Call, body: Any) -> Any:
    meta = describe(call, [NO_TOPIC])
    brokers = kafka_brokers(meta)
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), error_message=None,
                     endpoint_type=1, cluster_id=meta.cluster_id, controller_id=brokers[0].id if brokers else -1,
                     brokers=tuple(call.make("DescribeClusterBroker", broker_id=b.id, host=endpoint(call, b)[0],
                                             port=endpoint(call, b)[1], rack=b.rack or None) for b in brokers),
                     cluster_authorized_operations=_NO_OPERATIONS)


# -- FindCoordinator -------------------------------------------------------------------------
def coordinator_for(call: Call, key: str) -> BrokerView:
    """Any live broker can coordinate (each forwards group and transaction requests to the front
    door); a hash of the key spreads the coordinator connections over them."""
    return coordinator_among(live_kafka_brokers(call), key)


def live_kafka_brokers(call: Call) -> list[BrokerView]:
    """The live brokers with a Kafka listener, as Metadata lists them."""
    return kafka_brokers(describe(call, [NO_TOPIC]))


def coordinator_among(brokers: list[BrokerView], key: str) -> BrokerView:
    """The coordinator of ``key`` (a group or transactional id) among ``brokers``, as
    FindCoordinator answers it."""
    if not brokers:
        raise CoordinatorNotAvailable("no live broker has a Kafka listener")
    return brokers[zlib.crc32(key.encode()) % len(brokers)]


def find_coordinator(call: Call, body: Any) -> Any:
    keys = list(body.coordinator_keys) if hasattr(body, "coordinator_keys") else [body.key]
    found = []
    for key in keys:
        try:
            b = coordinator_for(call, key)
            found.append((key, b.id, *endpoint(call, b), 0, None))
        except LowtideError as err:
            # The front door unreachable (or any other failure) is, to the client, no coordinator
            # right now: a retriable per-key answer. A whole-call error instead would give v4+
            # clients an empty coordinator list, which the Java producer takes for node ":0".
            why = err if isinstance(err, CoordinatorNotAvailable) else CoordinatorNotAvailable(
                f"no coordinator for {key!r} now: {err.name}: {err.message}")
            found.append((key, -1, "", -1, why.code, why.message))
    if hasattr(body, "coordinator_keys"):
        return call.make(call.response, throttle_time=NO_THROTTLE, coordinators=tuple(
            call.make("Coordinator", key=k, node_id=n, host=h, port=p, error_code=error_code(c), error_message=m)
            for k, n, h, p, c, m in found))
    _, n, h, p, c, m = found[0]
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(c), error_message=m,
                     node_id=n, host=h, port=p)


# -- topics ----------------------------------------------------------------------------------
def create_topics(call: Call, body: Any) -> Any:
    validate_only = bool(getattr(body, "validate_only", False))
    requests = []
    for t in body.topics:
        config = {c.name: c.value for c in t.configs if c.value is not None}
        assignments = tuple((a.partition_index, tuple(a.broker_ids)) for a in (getattr(t, "assignments", None) or ()))
        if assignments:  # the counts as sent: with assignments Kafka wants -1 for both
            requests.append(TopicRequest(name=t.name, partitions=t.num_partitions,
                                         replication_factor=t.replication_factor, config=config,
                                         assignments=assignments))
            continue
        requests.append(TopicRequest(name=t.name, partitions=t.num_partitions if t.num_partitions > 0 else 1,
                                     replication_factor=t.replication_factor if t.replication_factor > 0 else 0,
                                     config=config))
    principal = call.principal()
    outcomes = call.front.topics.create_topics(principal=principal, requests=requests, validate_only=validate_only)
    results = {o.name: o for o in outcomes}
    created = [t.name for t in body.topics if t.name in results and results[t.name].error is None]
    described = {}
    if created and call.version >= 5 and not validate_only:
        described = {m.name: m for m in describe(call, created).topics}
    out = []
    for t in body.topics:
        r = results.get(t.name)
        code = -1 if r is None else 0 if r.error is None else r.error.code
        m = described.get(t.name)
        out.append(call.make(
            "CreatableTopicResult", name=t.name, topic_id=_uuid(m.topic_id) if m else None,
            error_code=error_code(code), error_message=r.error.message if r and r.error else None,
            topic_config_error_code=0,
            num_partitions=len(m.partitions) if m else (t.num_partitions if not code else -1),
            replication_factor=m.replication_factor if m else (t.replication_factor if not code else -1),
            configs=tuple(call.make("CreatableTopicConfigs", name=k, value=v, read_only=False, config_source=1,
                                    is_sensitive=False)
                          for k, v in sorted({**m.config, **({DISKLESS_ENABLE: "true"} if m.diskless else {})}.items()))
            if m else None))
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=tuple(out))


def delete_topics(call: Call, body: Any) -> Any:
    names = list(body.topic_names) if hasattr(body, "topic_names") else [t.name for t in body.topics if t.name]
    outcomes = call.front.topics.delete_topics(principal=call.principal(), names=names)
    results = {o.name: o for o in outcomes}
    return call.make(call.response, throttle_time=NO_THROTTLE, responses=tuple(
        call.make("DeletableTopicResult", name=n, topic_id=None,
                  error_code=error_code(_outcome_code(results.get(n))),
                  error_message=results[n].error.message if n in results and results[n].error else None)
        for n in names))


def _outcome_code(outcome: Any) -> int:
    """A per-topic outcome's error code: -1 (UNKNOWN_SERVER_ERROR) for a topic left unanswered."""
    if outcome is None:
        return -1
    return 0 if outcome.error is None else outcome.error.code


# -- DeleteRecords (KIP-107) -----------------------------------------------------------------
def delete_records(call: Call, body: Any) -> Any:
    timeout_ms = millis(body.timeout)
    # Kafka's KafkaApis.handleDeleteRecordsRequest folds the request into a map keyed by partition:
    # a partition named twice (in one topic entry or two) is deleted up to its last offset and
    # answered once, under one entry of its topic. The gRPC door refuses such a request instead
    # (INVALID_REQUEST), so the front door is sent each partition once.
    offsets: dict[tuple[str, int], int] = {}
    for t in body.topics:
        for p in t.partitions:
            offsets[(t.name, p.partition_index)] = p.offset
    items = [DeleteRequestItem(topic=topic, partition=partition, offset=offset)
             for (topic, partition), offset in offsets.items()]
    services = call.services
    if services.deleter is not None and services.deleter.serves_here(items):
        # Kafka's AdminClient sends each partition to its leader: this replica answers in
        # process, with no protobuf. Anything else goes through the front door, which finds the leaders.
        principal = call.principal()
        answers = services.deleter.delete_records(principal, items, timeout_ms=timeout_ms)
    else:
        answers = call.front.deleter.delete_records(principal=call.principal(), items=items, timeout_ms=timeout_ms)
    results = {(r.topic, r.partition): r for r in answers}
    by_topic: dict[str, list] = {}
    for topic, partition in offsets:
        r = results.get((topic, partition))
        code = -1 if r is None else 0 if r.error is None else r.error.code
        by_topic.setdefault(topic, []).append(call.make(
            "DeleteRecordsPartitionResult", partition_index=partition,
            low_watermark=r.low_watermark if r and not code else -1, error_code=error_code(code)))
    topics = tuple(call.make("DeleteRecordsTopicResult", name=topic, partitions=tuple(parts))
                   for topic, parts in by_topic.items())
    return call.make(call.response, throttle_time=NO_THROTTLE, topics=topics)


APIS = [
    Api(METADATA_KEY, "Metadata", 1, 12, metadata),
    Api(FIND_COORDINATOR_KEY, "FindCoordinator", 0, 6, find_coordinator),
    Api(CREATE_TOPICS_KEY, "CreateTopics", 2, 7, create_topics),
    Api(DELETE_TOPICS_KEY, "DeleteTopics", 1, 6, delete_topics),
    Api(DELETE_RECORDS_KEY, "DeleteRecords", 0, 2, delete_records),
    Api(DESCRIBE_CLUSTER_KEY, "DescribeCluster", 0, 1, describe_cluster),
]
