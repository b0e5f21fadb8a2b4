"""The front door's topic and cluster objects over gRPC (lowtide.client.frontdoor.topics) answer as
the front door's own objects do: each test asks a real front door the same thing in process
(``FrontDoor``, what its own Kafka listener calls) and through ``RemoteFrontDoor`` (what a
replica's listener calls), and compares the answers, errors by type and message."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from lowtide.auth.acl import ANONYMOUS_PRINCIPAL
from lowtide.auth.tokens import add_token
from lowtide.client.frontdoor import RemoteFrontDoor
from lowtide.errors import ClusterAuthorizationFailed, LowtideError
from lowtide.messages import TopicPartition
from lowtide.messages.admin import (
    NO_TOPIC,
    ConfigChange,
    ConfigOp,
    ConfigOpType,
    DeleteRequestItem,
    ElectionType,
    OffsetQuery,
    PartitionsRequest,
    TopicRequest,
)
from lowtide.metadata.model import BrokerInfo

ANON = ANONYMOUS_PRINCIPAL


def plain(value: Any) -> Any:
    """``value`` with every dataclass as a tuple and every error as (type, message): errors do not
    compare equal by value."""
    if isinstance(value, LowtideError):
        return type(value).__name__, value.message
    if dataclasses.is_dataclass(value):
        return type(value).__name__, tuple(plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):  # TopicPartition too: its type is part of the answer
        return type(value).__name__, tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def outcome(fn, **kwargs) -> Any:
    """What ``fn`` answers, or the error it raises."""
    try:
        return plain(fn(**kwargs))
    except LowtideError as err:
        return "raised", plain(err)


@pytest.fixture
def doors(front_door):
    """(in process, over gRPC) views of one front door with three brokers and topic ``orders``."""
    store = front_door.store
    for broker in (0, 1, 2):
        store.register_broker(BrokerInfo(id=broker, host="127.0.0.1", port=7000 + broker, rack=f"r{broker}",
                                         kafka_port=19092 + broker,
                                         kafka_listeners={"SSL": f"kafka-{broker}.example:9093"}),
                              incarnation="x", session_timeout_ms=60000)
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={"retention.ms": "60000"},
                       assignment=[[0, 1], [1, 2]])
    remote = RemoteFrontDoor(address=front_door.address)
    yield front_door.parts.front, remote.bound(())
    remote.close()


def test_metadata_of_brokers_topics_and_unknown_names_is_the_same_over_grpc(doors):
    local, remote = doors
    for topics in (["orders", "missing"], [], [NO_TOPIC]):
        here = local.topics.describe_cluster(principal=ANON, topics=topics)
        there = remote.topics.describe_cluster(principal=ANON, topics=topics)
        assert plain(there) == plain(here)
    assert [(b.id, b.kafka_listeners) for b in there.brokers][0] == (0, {"SSL": "kafka-0.example:9093"})
    assert here.revision > 0


def test_creating_listing_and_deleting_topics_answers_the_same_over_grpc(doors):
    local, remote = doors
    asked = [TopicRequest(name="orders", partitions=1, replication_factor=1),
             TopicRequest(name="bad name!", partitions=1, replication_factor=1),
             TopicRequest(name="placed", partitions=-1, replication_factor=-1, assignments=((0, (0, 1)),))]
    assert outcome(remote.topics.create_topics, principal=ANON, requests=asked, validate_only=True) == \
        outcome(local.topics.create_topics, principal=ANON, requests=asked, validate_only=True)
    for door, name in ((remote, "audit"), (local, "audit2")):
        created = door.topics.create_topics(principal=ANON, requests=[
            TopicRequest(name=name, partitions=1, replication_factor=2, config={"cleanup.policy": "compact"})])
        assert [(o.name, o.error) for o in created] == [(name, None)]
    views = remote.topics.describe_cluster(principal=ANON, topics=["audit", "audit2"]).topics
    assert [(t.replication_factor, t.config, len(t.partitions)) for t in views] == [
        (2, {"cleanup.policy": "compact"}, 1)] * 2
    assert remote.topics.list_topics(principal=ANON) == local.topics.list_topics(principal=ANON) == [
        "audit", "audit2", "orders"]
    assert remote.topics.list_topics(principal=ANON, include_internal=True) == \
        local.topics.list_topics(principal=ANON, include_internal=True)
    assert [o.error for o in remote.topics.delete_topics(principal=ANON, names=["audit"])] == [None]
    assert plain(remote.topics.delete_topics(principal=ANON, names=["audit", "missing"])) == \
        plain(local.topics.delete_topics(principal=ANON, names=["audit", "missing"]))


def test_configs_and_new_partitions_answer_the_same_over_grpc(doors):
    local, remote = doors
    changes = [ConfigChange(topic="orders", ops=(ConfigOp(key="retention.ms", op=ConfigOpType.DELETE),
                                                 ConfigOp(key="cleanup.policy", value="compact"))),
               ConfigChange(topic="missing", ops=(ConfigOp(key="cleanup.policy", value="compact"),)),
               ConfigChange(topic="broker:0", ops=(ConfigOp(key="leader.replication.throttled.rate", value="10"),)),
               ConfigChange(topic="broker:", ops=())]
    unknown_op = [ConfigChange(topic="orders", ops=(ConfigOp(key="x", op=9, value="1"),), replace=True)]
    for each in (changes, unknown_op):
        assert outcome(remote.configs.alter_configs, principal=ANON, changes=each, validate_only=True) == \
            outcome(local.configs.alter_configs, principal=ANON, changes=each, validate_only=True)
    [altered] = remote.configs.alter_configs(principal=ANON, changes=changes[:1])
    assert altered.config == {"cleanup.policy": "compact"}
    requests = [PartitionsRequest(name="orders", count=3), PartitionsRequest(name="orders", count=1),
                PartitionsRequest(name="missing", count=2), PartitionsRequest(name="orders", count=4,
                                                                           assignments=((2, 0), (9, 1)))]
    for each in requests:
        assert outcome(remote.partitions.create_partitions, principal=ANON, requests=[each], validate_only=True) == \
            outcome(local.partitions.create_partitions, principal=ANON, requests=[each], validate_only=True)


def test_elections_and_reassignments_answer_the_same_over_grpc(doors):
    local, remote = doors
    for partitions in ([TopicPartition("orders", 0), TopicPartition("nope", 0)], None, []):
        for kind in ElectionType:
            assert outcome(remote.elections.elect, principal=ANON, election_type=kind, partitions=partitions) == \
                outcome(local.elections.elect, principal=ANON, election_type=kind, partitions=partitions)
    targets = {TopicPartition("orders", 1): (9, 1), TopicPartition("nope", 0): (0, 1),
               TopicPartition("orders", 0): None}
    assert outcome(remote.reassigner.alter, principal=ANON, targets=targets) == \
        outcome(local.reassigner.alter, principal=ANON, targets=targets)
    moved = remote.reassigner.alter(principal=ANON, targets={TopicPartition("orders", 0): (2, 1)},
                                    allow_replication_factor_change=False)
    assert [o.error for o in moved] == [None]
    for partitions in (None, [TopicPartition("orders", 0), TopicPartition("orders", 1)], []):
        assert outcome(remote.reassigner.list, principal=ANON, partitions=partitions) == \
            outcome(local.reassigner.list, principal=ANON, partitions=partitions)
    [ongoing] = local.reassigner.list(principal=ANON)
    assert (ongoing.replicas, ongoing.adding_replicas, ongoing.removing_replicas) == ((2, 1, 0), (2,), (0,))


def test_list_offsets_and_delete_records_of_unknown_partitions_answer_the_same_over_grpc(doors):
    local, remote = doors
    queries = [OffsetQuery(topic="missing", partition=0, timestamp=-1),
               OffsetQuery(topic="orders", partition=7, timestamp=-2, current_leader_epoch=3)]
    assert outcome(remote.topics.list_offsets, principal=ANON, queries=queries, isolation_level=1) == \
        outcome(local.topics.list_offsets, principal=ANON, queries=queries, isolation_level=1)
    items = [DeleteRequestItem(topic="missing", partition=0, offset=5)]
    assert outcome(remote.deleter.delete_records, principal=ANON, items=items, timeout_ms=1000) == \
        outcome(local.deleter.delete_records, principal=ANON, items=items, timeout_ms=1000)
    twice = items * 2  # refused as a whole: INVALID_REQUEST
    assert outcome(remote.deleter.delete_records, principal=ANON, items=twice, timeout_ms=1000) == \
        outcome(local.deleter.delete_records, principal=ANON, items=twice, timeout_ms=1000)


def test_a_whole_call_refusal_is_raised_over_grpc_as_in_process(front_door_factory, store):
    front_door = front_door_factory(auth_enabled=True)
    add_token(store, token="bob-token", principal="User:bob")
    remote = RemoteFrontDoor(address=front_door.address)
    try:
        bob, local = remote.bound([("authorization", "Bearer bob-token")]), front_door.parts.front
        calls = [("elections", "elect", {"election_type": ElectionType.PREFERRED, "partitions": None}),
                 ("reassigner", "alter", {"targets": {TopicPartition("orders", 0): (1,)}}),
                 ("reassigner", "list", {})]
        for part, method, kwargs in calls:
            there = outcome(getattr(getattr(bob, part), method), principal="User:bob", **kwargs)
            assert there == outcome(getattr(getattr(local, part), method), principal="User:bob", **kwargs)
            assert there[0] == "raised" and there[1][0] == ClusterAuthorizationFailed.__name__
    finally:
        remote.close()
