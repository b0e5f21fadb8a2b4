"""Apache Kafka's own ``kafka-transactions`` (KIP-664, 4.1.2) against a local 3-replica cluster's
Kafka listener, unchanged: ``list``, ``describe``, ``describe-producers`` and ``find-hanging`` see
the open transactions, and ``abort`` (WriteTxnMarkers to the partition's leader) ends them, after
which a read_committed consumer reads past them.

Topic ``hang``, two partitions, set up once for the module (auth off: the anonymous caller may
everything, including the CLUSTER_ACTION that WriteTxnMarkers needs):

* partition 0: 4 plain records, then lowtide's transactional producer ``stuck-1`` begins, writes 2
  records (offsets 4-5) and never ends, then 3 plain records: an open transaction its coordinator
  knows (Ongoing), holding the last stable offset at 4;
* partition 1: 2 plain records, then a transactional batch of a producer id no coordinator ever
  gave (offsets 2-4): a hanging transaction, as a lost coordinator state would leave one.

The tool's observations are taken (fixture ``seen``) before the aborts (fixture ``aborted``), so
the tests run in any order.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from lowtide.client import Admin, Consumer
from lowtide.client.admin import OffsetSpec
from lowtide.client.producer import Producer
from lowtide.localcluster import ClusterConfig
from lowtide.record import encode_batch
from lowtide_pb import replica_pb2
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.kafka_tools import kafka_tool

TOPIC, TXN_ID = "hang", "stuck-1"
TXN_TIMEOUT_MS = 300_000  # the coordinator must not abort it itself while the module runs
OPEN_START, HANGING_START = 4, 2  # first offsets of the two transactions
HANGING_PID, HANGING_EPOCH = 424242, 3
TOOL_TIMEOUT_S = 120
READ_COMMITTED = 1
BROKERS = (0, 1, 2)


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("kafka-txn-tool"), replicas=len(BROKERS),
                           replica_config=dict(DEFAULT_REPLICA_CONFIG))
    yield from running_cluster(request, config)


@dataclass(frozen=True)
class Opened:
    producer_id: int
    producer_epoch: int
    leaders: dict[int, int]  # partition -> leader broker id
    ends: dict[int, int]  # partition -> high watermark after the set-up


@pytest.fixture(scope="module")
def opened(kcluster):
    kafka_tool("kafka-transactions")  # skips (naming what to install) before any set-up
    s.create_topic(kcluster, TOPIC, partitions=2, rf=3)
    with Producer(kcluster.bootstrap) as plain:
        plain.produce_values(TOPIC, [b"p%d" % i for i in range(OPEN_START)], partition=0)
        plain.produce_values(TOPIC, [b"r%d" % i for i in range(HANGING_START)], partition=1)
    txn = Producer(kcluster.bootstrap, transactional_id=TXN_ID, transaction_timeout_ms=TXN_TIMEOUT_MS)
    try:
        txn.init_transactions()
        txn.begin_transaction()
        txn.produce_values(TOPIC, [b"t0", b"t1"], partition=0)
        pid, epoch = txn.transactions.producer_id, txn.transactions.producer_epoch
    finally:
        txn.close()  # the transaction stays open: nothing ends it
    with Producer(kcluster.bootstrap) as plain:
        plain.produce_values(TOPIC, [b"q0", b"q1", b"q2"], partition=0)
    leaders = {p: s.store(kcluster).partition_state(TOPIC, p).leader for p in (0, 1)}
    hanging = encode_batch([b"h0", b"h1", b"h2"], producer_id=HANGING_PID, producer_epoch=HANGING_EPOCH,
                           base_sequence=0, is_transactional=True)
    answer = s.replica(kcluster, leaders[1]).Produce(replica_pb2.ProduceRequest(
        acks=-1, timeout_ms=10_000, partitions=[replica_pb2.ProducePartition(topic=TOPIC, partition=1,
                                                                             records=hanging)]))
    assert answer.partitions[0].error_code == 0 and answer.partitions[0].base_offset == HANGING_START, answer
    with Admin(kcluster.bootstrap) as admin:
        ends = offsets(admin, isolation_level=0)
        assert offsets(admin, isolation_level=READ_COMMITTED) == {0: OPEN_START, 1: HANGING_START}, \
            "the open transactions hold the last stable offsets"
    return Opened(pid, epoch, leaders, ends)


def offsets(admin: Admin, *, isolation_level: int) -> dict[int, int]:
    """partition -> LATEST of ``hang`` (read_committed: the last stable offset)."""
    answers = admin.list_offsets({(TOPIC, p): OffsetSpec.LATEST for p in (0, 1)}, isolation_level=isolation_level)
    assert all(a.error is None for a in answers.values()), answers
    return {p: a.offset for (_, p), a in answers.items()}


def transactions(kcluster, *args: str) -> list[dict[str, str]]:
    """Run ``kafka-transactions --bootstrap-server <kafka> args``; its table as one dict a row
    (the tool prints tab-separated columns padded with spaces, a header line first)."""
    result = subprocess.run([str(kafka_tool("kafka-transactions")), "--bootstrap-server", kcluster.kafka_bootstrap,
                             *args], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert result.returncode == 0, f"kafka-transactions {' '.join(args)} exited {result.returncode}:\n" \
                                   f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if not lines:
        return []
    header = [h.strip() for h in lines[0].split("\t")]
    return [dict(zip(header, (v.strip() for v in line.split("\t")), strict=False)) for line in lines[1:]]


@dataclass(frozen=True)
class Seen:
    listed: list[dict[str, str]]
    described: list[dict[str, str]]
    producers: list[dict[str, str]]
    hanging: list[dict[str, str]]


def run_all(kcluster, *commands: tuple[str, ...]) -> list[list[dict[str, str]]]:
    """Independent tool runs two at a time (each is a JVM start: mostly CPU, on 2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda args: transactions(kcluster, *args), commands))


@pytest.fixture(scope="module")
def seen(kcluster, opened) -> Seen:
    """What the tool shows while both transactions are open."""
    listed, described, producers, hanging = run_all(
        kcluster, ("list",), ("describe", "--transactional-id", TXN_ID),
        ("describe-producers", "--topic", TOPIC, "--partition", "0"),
        ("find-hanging", "--broker-id", str(opened.leaders[1]), "--max-transaction-timeout", "0"))
    return Seen(listed=listed, described=described, producers=producers, hanging=hanging)


@pytest.fixture(scope="module")
def aborted(kcluster, opened, seen) -> dict[str, list[dict[str, str]]]:
    """Both transactions aborted with ``abort --start-offset``; what the tool shows after."""
    assert run_all(kcluster, ("abort", "--topic", TOPIC, "--partition", "0", "--start-offset", str(OPEN_START)),
                   ("abort", "--topic", TOPIC, "--partition", "1", "--start-offset", str(HANGING_START))) == [[], []]
    producers, hanging = run_all(
        kcluster, ("describe-producers", "--topic", TOPIC, "--partition", "0"),
        ("find-hanging", "--broker-id", str(opened.leaders[1]), "--max-transaction-timeout", "0"))
    return {"producers": producers, "hanging": hanging}


def test_list_shows_the_open_transaction_once_as_ongoing(seen, opened):
    rows = [r for r in seen.listed if r["TransactionalId"] == TXN_ID]
    # Kafka's Admin asks every broker and concatenates: each broker lists only what it coordinates
    assert len(rows) == 1, seen.listed
    assert rows[0]["TransactionState"] == "Ongoing"
    assert int(rows[0]["ProducerId"]) == opened.producer_id
    assert int(rows[0]["Coordinator"]) in BROKERS


def test_describe_shows_the_state_producer_and_partitions_of_the_transaction(seen, opened):
    [row] = seen.described
    assert row["TransactionalId"] == TXN_ID and row["TransactionState"] == "Ongoing"
    assert (int(row["ProducerId"]), int(row["ProducerEpoch"])) == (opened.producer_id, opened.producer_epoch)
    assert row["TopicPartitions"] == f"{TOPIC}-0"
    assert int(row["TransactionTimeoutMs"]) == TXN_TIMEOUT_MS
    assert int(row["CoordinatorId"]) == int(next(r for r in seen.listed if r["TransactionalId"] == TXN_ID)
                                            ["Coordinator"])


def test_describe_producers_shows_the_producer_and_its_transaction_start_offset(seen, opened):
    [row] = seen.producers  # the plain records have no producer id
    assert (int(row["ProducerId"]), int(row["ProducerEpoch"])) == (opened.producer_id, opened.producer_epoch)
    assert int(row["CurrentTransactionStartOffset"]) == OPEN_START
    assert int(row["LastSequence"]) == 1  # two records from sequence 0
    assert row["LatestCoordinatorEpoch"] == "-1"  # not tracked by the replicas


def test_find_hanging_lists_the_transaction_no_coordinator_knows_and_not_the_ongoing_one(seen):
    # asked of the leader of partition 1, which follows partition 0 or leads it: every replica
    # answers DescribeProducers from its own log, as Kafka's brokers do
    assert [(r["Topic"], r["Partition"], r["ProducerId"], r["ProducerEpoch"], r["StartOffset"])
            for r in seen.hanging] == [(TOPIC, "1", str(HANGING_PID), str(HANGING_EPOCH), str(HANGING_START))]


def test_abort_ends_both_transactions_and_read_committed_reads_past_them(kcluster, opened, aborted):
    [row] = aborted["producers"]
    assert row["CurrentTransactionStartOffset"] == "None"  # Kafka's tool prints an empty OptionalLong so
    assert aborted["hanging"] == []
    with Admin(kcluster.bootstrap) as admin:
        # each partition gained its ABORT marker; the last stable offset is the high watermark again
        stable = offsets(admin, isolation_level=READ_COMMITTED)
        assert stable == offsets(admin, isolation_level=0) == {p: end + 1 for p, end in opened.ends.items()}
    consumer = Consumer(kcluster.bootstrap, isolation_level="read_committed", max_wait_ms=200)
    try:
        consumer.assign([(TOPIC, 0), (TOPIC, 1)])
        consumer.seek_to(OffsetSpec.EARLIEST)
        values: dict[int, list[bytes]] = {0: [], 1: []}
        for _ in range(20):
            for record in consumer.poll(max_wait_ms=200):
                values[record.partition].append(record.value)
            if all(consumer.position((TOPIC, p)) >= stable[p] for p in (0, 1)):
                break
    finally:
        consumer.close()
    # the aborted records are never delivered; the plain ones before and after them are
    assert values == {0: [b"p0", b"p1", b"p2", b"p3", b"q0", b"q1", b"q2"], 1: [b"r0", b"r1"]}
