"""KIP-584/KIP-890 on the Kafka listener's dispatcher: ApiVersions v3+ advertises the feature
``transaction.version`` (supported 0-2, finalized at the listener's level with an epoch >= 0, what
a Kafka 4 producer needs to speak transactions version 2), with the versions version 2 uses (EndTxn
v5, Produce v12, TxnOffsetCommit v5, AddPartitionsToTxn v5). Each request encoded with Kafka's own
schemas as a client sends it, through the real KafkaBroker."""

from __future__ import annotations

import argparse

import pytest
from kio.schema.api_versions.v2.request import ApiVersionsRequest as ApiVersionsRequestV2
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from lowtide.kafka.broker import KafkaBroker, KafkaServices, Node
from lowtide.kafka.server import KafkaEndpoint, add_kafka_flags, all_apis
from tests.unit.kafka.test_client_telemetry_apis import send

API_VERSIONS, PRODUCE, ADD_PARTITIONS, END_TXN, TXN_OFFSET_COMMIT = 18, 0, 24, 26, 28


def versions(level: int | None = None, *, version: int = 3):
    services = KafkaServices(node=Node(1, "127.0.0.1", 9092))
    if level is not None:
        services.transaction_version = level
    body = (ApiVersionsRequest(client_software_name="t", client_software_version="1") if version >= 3
            else ApiVersionsRequestV2())
    return send(KafkaBroker(apis=all_apis(), services=services), API_VERSIONS, version, body)


@pytest.mark.parametrize("version", [3, 4])
def test_api_versions_finalizes_transaction_version_2_by_default(version):
    answer = versions(version=version)
    assert [(f.name, f.min_version, f.max_version) for f in answer.supported_features] == [
        ("transaction.version", 0, 2)]
    assert [(f.name, f.min_version_level, f.max_version_level) for f in answer.finalized_features] == [
        ("transaction.version", 2, 2)]
    assert answer.finalized_features_epoch >= 0  # the producer only takes an epoch newer than -1
    ranges = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert ranges[END_TXN][1] == 5 and ranges[PRODUCE][1] >= 12
    assert ranges[TXN_OFFSET_COMMIT][1] == 5 and ranges[ADD_PARTITIONS][1] == 5


def test_a_listener_at_level_1_finalizes_1_so_kafka_producers_stay_on_version_1():
    answer = versions(1)
    assert [(f.name, f.max_version_level) for f in answer.finalized_features] == [("transaction.version", 1)]
    assert answer.supported_features[0].max_version == 2


def test_api_versions_v2_has_no_features_to_carry():
    assert {k.api_key for k in versions(version=2).api_keys} >= {END_TXN, PRODUCE}


@pytest.mark.parametrize("level", ["-1", "3"])
def test_a_transaction_version_outside_0_to_2_does_not_start(level):
    parser = argparse.ArgumentParser()
    add_kafka_flags(parser, needs_frontdoor=False)
    args = parser.parse_args(["--kafka-listener", "127.0.0.1:0", "--kafka-transaction-version", level])
    with pytest.raises(SystemExit, match="kafka-transaction-version"):
        KafkaEndpoint.from_args(args, name="replica-1")
