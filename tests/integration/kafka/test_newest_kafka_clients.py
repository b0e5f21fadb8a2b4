"""Kafka's Java clients and tools at the newest Kafka 4.x release Maven Central serves (issue 50),
next to the pinned 4.1 ones the other modules run: ``scripts/kafka_tools.sh --newest`` fetches
them (``make kafka-tools`` and ``make setup`` do) into ``.tools/kafka-tools-newest.json``.

The newest clients ask for the newest protocol versions lowtide advertises, and fall back silently
where it stops, so each test checks the outcome, not the versions: what the newest
VerifiableProducer acknowledged is consumed by the newest VerifiableConsumers joined with the
KIP-848 protocol, and the newest TransactionalMessageCopier copies exactly once under faults in
transactions version 2 (KIP-890: the cluster finalizes ``transaction.version`` 2, its default), which
the front doors' own count of the transactions they completed shows.
"""

from __future__ import annotations

import random

import pytest

from lowtide.localcluster import ClusterConfig
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka import test_consumer_group_protocol as kip848
from tests.integration.kafka.test_exactly_once_copier import PARTITIONS as COPY_PARTITIONS
from tests.integration.kafka.test_exactly_once_copier import TRANSACTION_SIZE, copy_under_faults
from tests.kafka_tools import kafka_tools_manifest

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    # The copier test's session (2 s: a paused leader is deposed) and the KIP-848 test's group
    # timeouts (a killed member is noticed quickly).
    yield from running_cluster(request, ClusterConfig(
        data_dir=tmp_path_factory.mktemp("newest-clients"), replicas=3, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        session_timeout_ms=2000,
        extra_env={"LOWTIDE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(kip848.HEARTBEAT_MS),
                   "LOWTIDE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(kip848.SESSION_MS)}))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_the_newest_kafka_clients_are_a_newer_kafka_4_than_the_pinned_ones():
    pinned, newest = kafka_tools_manifest()["kafka_version"], kafka_tools_manifest(newest=True)["kafka_version"]
    assert _version(newest) > _version(pinned) and _version(newest)[0] == 4, (pinned, newest)


def test_the_newest_verifiable_consumers_read_with_the_consumer_group_protocol_what_its_producer_wrote(
        kcluster, tmp_path):
    topic, group = "newest-kip848", "newest-kip848-group"
    s.create_topic(kcluster, topic, partitions=kip848.PARTITIONS, rf=3)
    poller = kip848.Poller(kcluster, topic=topic, group=group)
    prod = kip848.producer(kcluster, topic=topic, records=4000, rate=800, log=tmp_path / "producer.log", newest=True)
    started = []
    try:
        started += [kip848.consumer(kcluster, topic=topic, group=group, log=tmp_path / f"c{i}.log", newest=True)
                    for i in range(2)]
        epoch = poller.stable_with(2)
        started.append(kip848.consumer(kcluster, topic=topic, group=group, log=tmp_path / "c2.log", newest=True))
        poller.stable_with(3, after=epoch)
        kip848.finish(kcluster, topic=topic, poller=poller, prod=prod, consumers=started, live=started)
    finally:
        poller.stop()
        prod.stop()
        for c in started:
            c.stop()


def test_the_newest_transactional_message_copier_copies_exactly_once_under_faults(kcluster, tmp_path):
    lib = kafka_tools_manifest(newest=True)["lib"]
    records = 5000
    got = copy_under_faults(kcluster, lib=lib, records_per_partition=records, deadline_s=150,
                            seed=random.randrange(1 << 30), logs=tmp_path)
    print(got.summary())
    assert not got.stuck, f"a copier did not finish: {got.summary()}\n{got.stuck}"
    assert sum(got.faults.values()) >= 3, f"too few faults to prove anything: {got.summary()}"
    assert (got.duplicated, got.missing, got.unexpected) == ([], [], []), (
        f"{len(got.duplicated)} copied twice, {len(got.missing)} missing, {len(got.unexpected)} never produced; "
        f"{got.summary()}")
    assert got.committed == {p: records for p in range(COPY_PARTITIONS)}
    # The broker's side: the coordinator completed the copier's transactions in version 2 (EndTxn
    # v5, each bumping the epoch), and none in version 1.
    assert got.ended.get(("2", "commit"), 0) >= records // TRANSACTION_SIZE // 2, got.summary()
    assert got.ended_in_version("1") == 0, got.summary()
