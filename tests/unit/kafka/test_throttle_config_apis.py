"""Kafka's IncrementalAlterConfigs, AlterConfigs and DescribeConfigs on the KIP-73 throttle configs,
through the Kafka listener's handlers (lowtide.kafka.apis_configs) against a front door on a real
Redis (its own objects, and their remote twins over its gRPC server): what
``kafka-reassign-partitions --execute --throttle`` sets and ``--verify`` deletes on BROKER and
TOPIC resources, other broker keys still POLICY_VIOLATION, and the sources DescribeConfigs reports
(DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG). Every answer also encodes."""

from __future__ import annotations

import pytest
from kio.schema.alter_configs.v2 import request as legacy
from kio.schema.describe_configs.v4 import request as describe
from kio.schema.incremental_alter_configs.v1 import request as incremental

from lowtide.client.frontdoor import RemoteFrontDoor
from lowtide.kafka.apis_configs import alter_configs, describe_configs, incremental_alter_configs
from lowtide.kafka.broker import Call, KafkaServices, Node
from lowtide.kafka.listener import Connection
from lowtide.kafka.protocol import RequestHead, encode_response
from lowtide.metadata.model import BrokerInfo

TOPIC, BROKER = 2, 4
SET, DELETE = 0, 1
LEADER_RATE, FOLLOWER_RATE = "leader.replication.throttled.rate", "follower.replication.throttled.rate"
LOG_DIRS_RATE = "replica.alter.log.dirs.io.max.bytes.per.second"
LEADER_LIST, FOLLOWER_LIST = "leader.replication.throttled.replicas", "follower.replication.throttled.replicas"
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG = 2, 3, 5
POLICY_VIOLATION, INVALID_REQUEST = 44, 42
LONG_MAX = str(2**63 - 1)


@pytest.fixture(params=["in process", "over grpc"])
def kafka(request, front_door):
    """The handlers with a front door's own objects (its listener) or their remote twins (a replica's)."""
    store = front_door.store
    for broker in (0, 1, 2):
        store.register_broker(BrokerInfo(id=broker, host="127.0.0.1", port=9092 + broker, kafka_port=19092 + broker),
                              incarnation="x", session_timeout_ms=60000)
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={},
                       assignment=[[0, 1], [1, 2]])
    remote = RemoteFrontDoor(address=front_door.address)
    front = front_door.parts.front
    services = KafkaServices(node=Node(node_id=0, host="127.0.0.1", port=9092),
                             front_door=(lambda _metadata: front) if request.param == "in process" else remote.bound,
                             authenticate=front.principal_of)

    def run(handler, api_key: int, version: int, body):
        head = RequestHead(api_key=api_key, api_version=version, correlation_id=7)
        answer = handler(Call(conn=Connection(peer="test"), head=head, client_id="test", services=services), body)
        assert len(encode_response(head, answer)) > 4
        return answer

    yield run, store
    remote.close()


def incremental_request(*resources: tuple[int, str, list[tuple[str, int, str | None]]], validate_only=False):
    return incremental.IncrementalAlterConfigsRequest(validate_only=validate_only, resources=tuple(
        incremental.AlterConfigsResource(resource_type=t, resource_name=n, configs=tuple(
            incremental.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops))
        for t, n, ops in resources))


def codes(answer) -> list[tuple[int, str, int]]:
    return [(r.resource_type, r.resource_name, int(r.error_code)) for r in answer.responses]


def described(run, *resources: tuple[int, str], keys=None) -> dict[tuple[int, str], dict]:
    body = describe.DescribeConfigsRequest(include_synonyms=True, include_documentation=False, resources=tuple(
        describe.DescribeConfigsResource(resource_type=t, resource_name=n, configuration_keys=keys)
        for t, n in resources))
    answer = run(describe_configs, 32, 4, body)
    out = {}
    for r in answer.results:
        out[(r.resource_type, r.resource_name)] = {
            "error": int(r.error_code),
            "configs": {c.name: (c.value, int(c.config_source), c.read_only,
                                 [(s.name, s.value, int(s.source)) for s in c.synonyms]) for c in r.configs}}
    return out


def test_what_the_reassignment_tool_sets_with_throttle_is_accepted(kafka):
    run, store = kafka
    answer = run(incremental_alter_configs, 44, 1, incremental_request(
        (TOPIC, "orders", [(LEADER_LIST, SET, "0:0,0:1,1:1,1:2"), (FOLLOWER_LIST, SET, "1:0")]),
        (BROKER, "0", [(LEADER_RATE, SET, "1000000"), (FOLLOWER_RATE, SET, "1000000")]),
        (BROKER, "1", [(LEADER_RATE, SET, "1000000"), (FOLLOWER_RATE, SET, "1000000")])))
    assert codes(answer) == [(TOPIC, "orders", 0), (BROKER, "0", 0), (BROKER, "1", 0)]
    assert store.topic("orders").config == {LEADER_LIST: "0:0,0:1,1:1,1:2", FOLLOWER_LIST: "1:0"}
    assert store.broker_configs() == {"0": {LEADER_RATE: "1000000", FOLLOWER_RATE: "1000000"},
                                      "1": {LEADER_RATE: "1000000", FOLLOWER_RATE: "1000000"}}


def test_what_the_reassignment_tool_deletes_on_verify_clears_every_throttle(kafka):
    run, store = kafka
    run(incremental_alter_configs, 44, 1, incremental_request(
        (TOPIC, "orders", [(LEADER_LIST, SET, "*"), (FOLLOWER_LIST, SET, "*")]),
        (BROKER, "0", [(LEADER_RATE, SET, "10"), (FOLLOWER_RATE, SET, "10")])))
    brokers = [(BROKER, b, [(LEADER_RATE, DELETE, None), (FOLLOWER_RATE, DELETE, None), (LOG_DIRS_RATE, DELETE, None)])
               for b in ("0", "1", "2")]
    answer = run(incremental_alter_configs, 44, 1, incremental_request(
        *brokers, (TOPIC, "orders", [(LEADER_LIST, DELETE, None), (FOLLOWER_LIST, DELETE, None)])))
    assert {code for _, _, code in codes(answer)} == {0}
    assert store.broker_configs() == {} and store.topic("orders").config == {}


def test_other_broker_keys_stay_policy_violation_and_an_unknown_broker_is_invalid_request(kafka):
    run, store = kafka
    answer = run(incremental_alter_configs, 44, 1, incremental_request(
        (BROKER, "0", [("log.retention.ms", SET, "5")]), (BROKER, "0", [(LOG_DIRS_RATE, SET, "5")]),
        (BROKER, "9", [(LEADER_RATE, SET, "5")])))
    assert [c for _, _, c in codes(answer)] == [INVALID_REQUEST, INVALID_REQUEST, INVALID_REQUEST]
    # The same broker named twice in one request is refused for both (Kafka's duplicate resources);
    # one at a time each gets its own answer.
    one = run(incremental_alter_configs, 44, 1, incremental_request((BROKER, "0", [("log.retention.ms", SET, "5")])))
    assert codes(one) == [(BROKER, "0", POLICY_VIOLATION)]
    assert "static" in one.responses[0].error_message
    dirs = run(incremental_alter_configs, 44, 1, incremental_request((BROKER, "1", [(LOG_DIRS_RATE, SET, "5")])))
    assert codes(dirs) == [(BROKER, "1", POLICY_VIOLATION)]
    unknown = run(incremental_alter_configs, 44, 1, incremental_request((BROKER, "9", [(LEADER_RATE, SET, "5")])))
    assert codes(unknown) == [(BROKER, "9", INVALID_REQUEST)]
    assert store.broker_configs() == {}


def test_legacy_alter_configs_sets_a_brokers_whole_dynamic_set(kafka):
    run, store = kafka
    run(incremental_alter_configs, 44, 1, incremental_request((BROKER, "2", [(LEADER_RATE, SET, "10")])))
    body = legacy.AlterConfigsRequest(validate_only=False, resources=(legacy.AlterConfigsResource(
        resource_type=BROKER, resource_name="2", configs=(legacy.AlterableConfig(name=FOLLOWER_RATE, value="30"),)),))
    answer = run(alter_configs, 33, 2, body)
    assert [(r.resource_name, int(r.error_code)) for r in answer.responses] == [("2", 0)]
    assert store.broker_configs() == {"2": {FOLLOWER_RATE: "30"}}


def test_describe_reports_each_rate_with_the_source_it_comes_from(kafka):
    run, _ = kafka
    run(incremental_alter_configs, 44, 1, incremental_request(
        (BROKER, "", [(LEADER_RATE, SET, "500"), (FOLLOWER_RATE, SET, "600")]),
        (BROKER, "1", [(LEADER_RATE, SET, "100")])))
    out = described(run, (BROKER, "1"), (BROKER, "2"), (BROKER, ""), (TOPIC, "orders"))
    one, two, default = out[(BROKER, "1")], out[(BROKER, "2")], out[(BROKER, "")]
    assert one["error"] == two["error"] == default["error"] == 0
    assert one["configs"][LEADER_RATE] == ("100", DYNAMIC_BROKER_CONFIG, False, [
        (LEADER_RATE, "100", DYNAMIC_BROKER_CONFIG), (LEADER_RATE, "500", DYNAMIC_DEFAULT_BROKER_CONFIG),
        (LEADER_RATE, LONG_MAX, DEFAULT_CONFIG)])
    assert one["configs"][FOLLOWER_RATE][:2] == ("600", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert two["configs"][LEADER_RATE][:2] == ("500", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert two["configs"][LOG_DIRS_RATE][:2] == (LONG_MAX, DEFAULT_CONFIG)
    assert default["configs"][LEADER_RATE][:2] == ("500", DYNAMIC_DEFAULT_BROKER_CONFIG)
    # the static keys are still there, read-only defaults
    assert one["configs"]["min.insync.replicas"][:3] == ("1", DEFAULT_CONFIG, True)
    # a topic lists its throttled-replica keys with their (empty) defaults
    assert out[(TOPIC, "orders")]["configs"][LEADER_LIST][:2] == ("", DEFAULT_CONFIG)


def test_describe_with_keys_lists_only_those(kafka):
    run, _ = kafka
    out = described(run, (BROKER, "0"), keys=(LEADER_RATE,))
    assert set(out[(BROKER, "0")]["configs"]) == {LEADER_RATE}
    assert described(run, (BROKER, "7"))[(BROKER, "7")]["error"] == INVALID_REQUEST
