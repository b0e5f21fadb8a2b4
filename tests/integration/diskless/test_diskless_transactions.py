"""Transactions on diskless topics (issue 50) on real processes: transactional batches committed
through the coordinator shards, markers written by the front door's transaction coordinator through
a replica's diskless broker, and read_committed fetches and ListOffsets stopping at the shard's
last stable offset and dropping aborted data: with lowtide's client, and with Kafka's own
``TransactionalMessageCopier`` copying a classic topic into a diskless one exactly once."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import time

import pytest

from lowtide.client import Admin, Consumer, OffsetSpec, Producer
from lowtide.localcluster import ClusterConfig
from lowtide.messages import TopicPartition
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.test_exactly_once_copier import copier_command, finished
from tests.kafka_tools import kafka_tools_manifest

pytestmark = [pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("diskless-txn"), replicas=3,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG))
    yield from running_cluster(request, config)


def create_diskless(cluster, topic: str, partitions: int) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=1, diskless=True)


def values_of(cluster, topic: str, *, isolation_level: str, partitions: int, until: int) -> list[bytes]:
    """What a consumer with ``isolation_level`` reads from offset 0 until the LATEST it was told
    (read_committed: the last stable offset) of every partition; at least ``until`` values."""
    with Admin(cluster.bootstrap) as admin:
        ends = {p: a.offset for (_, p), a in admin.list_offsets(
            {(topic, p): OffsetSpec.LATEST for p in range(partitions)},
            isolation_level=1 if isolation_level == "read_committed" else 0).items()}
    got: list[bytes] = []
    with Consumer(cluster.bootstrap, isolation_level=isolation_level, max_wait_ms=200) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while len(got) < until or any(consumer.position(TopicPartition(topic, p)) < ends[p]
                                      for p in range(partitions)):
            assert time.monotonic() < deadline, f"read {len(got)} values of {topic}, positions short of {ends}"
            got += [r.value for r in consumer.poll(max_wait_ms=200)]
    return got


def test_read_committed_drops_an_aborted_transaction_and_waits_for_an_open_one_on_a_diskless_topic(cluster):
    create_diskless(cluster, "dl-orders", 2)
    with Producer(cluster.bootstrap, transactional_id="dl-tx") as producer, Producer(cluster.bootstrap) as plain:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce_values("dl-orders", [b"c1", b"c2"], partition=0)
        producer.produce_values("dl-orders", [b"c3"], partition=1)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.produce_values("dl-orders", [b"a1", b"a2"], partition=0)
        producer.produce_values("dl-orders", [b"a3"], partition=1)
        producer.abort_transaction()
        plain.produce_values("dl-orders", [b"after"], partition=0)
        assert sorted(values_of(cluster, "dl-orders", isolation_level="read_committed", partitions=2, until=4)) == [
            b"after", b"c1", b"c2", b"c3"]
        assert sorted(values_of(cluster, "dl-orders", isolation_level="read_uncommitted", partitions=2,
                                until=7)) == [b"a1", b"a2", b"a3", b"after", b"c1", b"c2", b"c3"]

        # An open transaction holds the last stable offset at its first offset.
        producer.begin_transaction()
        producer.produce_values("dl-orders", [b"open"], partition=1)
        plain.produce_values("dl-orders", [b"behind"], partition=1)
        with Admin(cluster.bootstrap) as admin:
            key = ("dl-orders", 1)
            committed = admin.list_offsets({key: OffsetSpec.LATEST}, isolation_level=1)[key].offset
            latest = admin.list_offsets({key: OffsetSpec.LATEST})[key].offset
        assert committed == latest - 2  # c3 and a3 (markers at +1 each), then "open" at the LSO
        with Consumer(cluster.bootstrap, isolation_level="read_committed", max_wait_ms=200) as consumer:
            consumer.assign([TopicPartition("dl-orders", 1)])
            seen = [r.value for _ in range(4) for r in consumer.poll(max_wait_ms=200)]
        assert seen == [b"c3"]
        producer.commit_transaction()
    assert sorted(values_of(cluster, "dl-orders", isolation_level="read_committed", partitions=2, until=6)) == [
        b"after", b"behind", b"c1", b"c2", b"c3", b"open"]


def test_kafka_python_transactions_version_1_commit_and_abort_on_a_diskless_topic(cluster):
    """kafka-python speaks transactions version 1 (AddPartitionsToTxn before the data, EndTxn v<5,
    one epoch for the producer): its aborted transaction is dropped by its own read_committed
    consumer, from the aborted list the shard answers, and its committed one is read."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition
    create_diskless(cluster, "dl-kp", 1)
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, transactional_id="dl-kp-tx")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(5):
            producer.send("dl-kp", f"aborted-{i}".encode(), partition=0)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(3):
            producer.send("dl-kp", f"kept-{i}".encode(), partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    got = {}
    for level in ("read_committed", "read_uncommitted"):
        consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, isolation_level=level,
                                 auto_offset_reset="earliest", consumer_timeout_ms=3000)
        try:
            consumer.assign([KTopicPartition("dl-kp", 0)])
            got[level] = [r.value for r in consumer]
        finally:
            consumer.close()
    assert got["read_committed"] == [b"kept-0", b"kept-1", b"kept-2"]
    assert sorted(got["read_uncommitted"]) == sorted([f"aborted-{i}".encode() for i in range(5)]
                                                     + [f"kept-{i}".encode() for i in range(3)])


def test_kafkas_transactional_message_copier_copies_a_classic_topic_into_a_diskless_one_exactly_once(
        cluster, tmp_path):
    """Kafka 4's copier (transactions version 2: Produce v12 adds the diskless partition
    implicitly, EndTxn v5 bumps the epoch its markers carry) copying under three kill -9s, each once
    the copy has moved on since the last: the copier itself in the middle of a transaction (started
    again, its InitProducerId aborts what the dead one left open, on the diskless partition too),
    the front door (the transaction coordinator), and the replica leading the diskless partition's
    shard metadata log (where its transactions are recorded). Then read_committed holds every input
    value exactly once, and read_uncommitted shows the aborted copies."""
    lib = kafka_tools_manifest()["lib"]
    source, sink, records = "dl-copy-in", "dl-copy-out", 3000
    s.create_topic(cluster, source, partitions=1, rf=3)
    create_diskless(cluster, sink, 1)
    with Producer(cluster.bootstrap) as producer:
        for i in range(records):
            producer.send(source, f"v-{i}".encode(), partition=0)
        producer.flush()
    command = copier_command(lib, partition=0, bootstrap=cluster.kafka_bootstrap)
    command[command.index("--input-topic") + 1] = source
    command[command.index("--output-topic") + 1] = sink
    command[command.index("--consumer-group") + 1] = "dl-copy-group"
    command[command.index("--transactional-id") + 1] = "dl-copier"
    shard = s.store(cluster).topic(sink).diskless_shards[0]
    faults = ["copier", "frontdoor", "metadata-leader"]
    deadline = time.monotonic() + 120
    runs, mark = 0, records
    while True:
        runs += 1
        log = tmp_path / f"copier-{runs}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
            while faults and proc.poll() is None and time.monotonic() < deadline:
                left = _remaining(log)
                if left is None or left > mark - 300:
                    time.sleep(0.1)
                    continue
                mark, fault = left, faults.pop(0)
                if fault == "copier":
                    _kill_mid_transaction(proc, cluster, sink)
                    break
                name = "frontdoor-0" if fault == "frontdoor" else \
                    f"replica-{s.leader_of(cluster, '__diskless_metadata', shard)}"
                cluster.kill(name, signal.SIGKILL)
                time.sleep(1.0)
                cluster.start_service(name)
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        if code == 0 and finished(log):
            break
        assert time.monotonic() < deadline and runs < 6, log.read_text(errors="replace")[-3000:]
    assert faults == [], f"the copy ended before faults {faults}"
    got = collections.Counter(values_of(cluster, sink, isolation_level="read_committed", partitions=1,
                                        until=records))
    assert [v for v, n in got.items() if n > 1] == []
    assert set(got) == {f"v-{i}".encode() for i in range(records)}
    uncommitted = values_of(cluster, sink, isolation_level="read_uncommitted", partitions=1, until=records)
    assert len(uncommitted) > records  # the killed copier's open transaction is in the log, aborted


def _kill_mid_transaction(proc: subprocess.Popen, cluster, topic: str) -> None:
    """kill -9 the copier in the middle of a transaction holding data in ``topic``: stopped while
    one is open (the LSO below the HW), killed if it still is once anything in flight had time to
    land (else resumed, and tried again)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if _open_transaction(cluster, topic):
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.5)
            if _open_transaction(cluster, topic):
                proc.kill()
                return
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"never saw the copier's transaction open in {topic}")


def _open_transaction(cluster, topic: str) -> bool:
    """Partition 0 of ``topic`` holds data of an open transaction (its LSO is below its HW)."""
    key = (topic, 0)
    with Admin(cluster.bootstrap) as admin:
        stable = admin.list_offsets({key: OffsetSpec.LATEST}, isolation_level=1)[key].offset
        latest = admin.list_offsets({key: OffsetSpec.LATEST})[key].offset
    return stable < latest


def _remaining(log) -> int | None:
    """What the copier says it still has to copy (its last JSON status line), None before one."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{") and '"remaining"' in line:
            try:
                return int(json.loads(line)["remaining"])
            except (ValueError, KeyError):
                continue
    return None
