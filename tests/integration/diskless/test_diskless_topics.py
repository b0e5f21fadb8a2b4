"""Diskless topics end to end (issue 13, third part) on real processes: replicas as the brokers of
diskless partitions (WAL files in the cluster's object store, commits to the coordinator shards),
the front door routing ListOffsets/DeleteRecords/topic admin to the shards, and the real CLI."""

from __future__ import annotations

import datetime
import json
import threading
import time
from pathlib import Path

import pytest

from lowtide.client import Admin, Consumer, OffsetSpec, Producer
from lowtide.client.replica import ReplicaClient
from lowtide.localcluster import ClusterConfig
from lowtide.metadata.store import MetadataStore
from lowtide.objectstore import open_object_store
from lowtide.record import encode_batch
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.kafka.wire import KafkaConnection, request_module

GRACE_MS = 2000
# The brokers' diskless.commit.interval.ms, far above any test's produce timeout: a WAL file closes
# as soon as one of the broker's upload/commit slots is free (lowtide.diskless.produce), so no test
# here waits for it, and a file that did would show as a timed-out produce.
COMMIT_INTERVAL_MS = 60_000


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("diskless"), replicas=3,
                           replica_config={**DEFAULT_REPLICA_CONFIG,
                                           "diskless.commit.interval.ms": str(COMMIT_INTERVAL_MS)},
                           extra_env={"LOWTIDE_FILE_DELETE_GRACE_MS": str(GRACE_MS),
                                      "LOWTIDE_FILE_LIFETIME_INTERVAL_MS": "200",
                                      "LOWTIDE_RETENTION_CHECK_INTERVAL_MS": "300"})
    yield from running_cluster(request, config)


def cli(cluster, *args: str, stdin: str | None = None) -> list[dict]:
    proc = s.lowtide_cli(*args, "--bootstrap-server", cluster.bootstrap, "--output", "json", stdin=stdin)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def shape(doc):
    """The JSON shape: keys and value types, recursively (values themselves left out)."""
    if isinstance(doc, dict):
        return {k: shape(v) for k, v in sorted(doc.items())}
    if isinstance(doc, list):
        return [shape(doc[0])] if doc else []
    return type(doc).__name__


def wal_keys(cluster) -> set[str]:
    store = open_object_store(cluster.object_store_url)
    try:
        return {o.key for o in store.list(prefix="wal/")}
    finally:
        store.close()


def test_a_diskless_topic_answers_every_cli_command_with_the_same_json_as_a_classic_topic(cluster):
    cli(cluster, "topics", "create", "--topic", "classic", "--partitions", "2")
    cli(cluster, "topics", "create", "--topic", "disk", "--partitions", "2", "--diskless")
    [described] = cli(cluster, "topics", "describe", "--topic", "disk")
    assert described["topics"][0]["diskless"] is True and len(described["topics"][0]["partitions"]) == 2
    outputs = {}
    for topic in ("classic", "disk"):
        produced = cli(cluster, "produce", "--topic", topic, stdin="".join(f"{topic}-{i}\n" for i in range(300)))
        latest = cli(cluster, "offsets", "--topic", topic, "--time", "latest")[0]
        records = cli(cluster, "consume", "--topic", topic, "--partition", "0", "--offset", "0", "--max-records",
                      str(next(p["offset"] for p in latest["partitions"] if p["partition"] == 0)))
        cut = {"partitions": [{"topic": topic, "partition": 0, "offset": 5},
                              {"topic": topic, "partition": 1, "offset": -1}]}
        path = Path(cluster.data_dir) / f"delete-{topic}.json"
        path.write_text(json.dumps(cut))
        deleted = cli(cluster, "delete-records", "--offset-json-file", str(path))[0]
        earliest = cli(cluster, "offsets", "--topic", topic, "--time", "earliest")[0]
        outputs[topic] = (produced, latest, records, deleted, earliest)
    classic, disk = outputs["classic"], outputs["disk"]
    assert [shape(d) for d in disk[:2] + disk[3:]] == [shape(c) for c in classic[:2] + classic[3:]]
    assert shape(disk[2]) == shape(classic[2])
    assert disk[0][0]["records"] == 300
    assert sum(p["offset"] for p in disk[1]["partitions"]) == 300
    values = [r["value"] for r in disk[2]]
    assert [r["offset"] for r in disk[2]] == list(range(len(values)))
    assert len(values) == len(set(values)) > 0  # every record once, in offset order
    low = {p["partition"]: p["low_watermark"] for p in disk[3]["partitions"]}
    latest = {p["partition"]: p["offset"] for p in disk[1]["partitions"]}
    assert low == {0: 5, 1: latest[1]}
    assert {p["partition"]: p["offset"] for p in disk[4]["partitions"]} == low
    # Nothing below the low watermark is served: reading from 0 is OFFSET_OUT_OF_RANGE, as on classic.
    below = s.lowtide_cli("consume", "--bootstrap-server", cluster.bootstrap, "--topic", "disk", "--partition", "0",
                          "--offset", "0", "--max-records", "1", "--output", "json")
    assert below.returncode != 0 and "OFFSET_OUT_OF_RANGE" in below.stdout
    for topic in ("classic", "disk"):
        assert cli(cluster, "topics", "delete", "--topic", topic) == [{"topic": topic, "deleted": True}]
    assert cli(cluster, "topics", "list")[0]["topics"] == []


def test_the_client_consumer_reads_a_diskless_topic_from_the_earliest_offset_unchanged(cluster):
    cli(cluster, "topics", "create", "--topic", "disk-consumer", "--partitions", "3", "--diskless")
    cli(cluster, "produce", "--topic", "disk-consumer", "--num-records", "2000", "--record-size", "200")
    consumer = Consumer(cluster.bootstrap)
    try:
        consumer.assign([("disk-consumer", p) for p in range(3)])
        got: dict[int, list[int]] = {0: [], 1: [], 2: []}
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < 2000 and time.monotonic() < deadline:
            for r in consumer.poll(max_wait_ms=500):
                got[r.partition].append(r.offset)
    finally:
        consumer.close()
    assert sum(map(len, got.values())) == 2000
    for offsets in got.values():
        assert offsets == list(range(len(offsets)))


def test_any_replica_answers_list_offsets_and_delete_records_of_a_diskless_partition_as_the_front_door(cluster):
    # A Kafka client sends these to the partition's "leader" (a produce gateway), not to an
    # admin endpoint: every replica must answer them, through the same shard calls.
    cli(cluster, "topics", "create", "--topic", "disk-direct", "--partitions", "2", "--diskless")
    cli(cluster, "topics", "create", "--topic", "classic-direct", "--partitions", "1")
    cli(cluster, "produce", "--topic", "disk-direct", "--partition", "1", "--num-records", "300", "--record-size", "50")
    replicas = ReplicaClient()
    try:
        addresses = [cluster.service(f"replica-{r}").grpc for r in range(3)]
        for address in addresses:
            answers = replicas.list_offsets(address, [("disk-direct", 1, -1), ("disk-direct", 1, -2),
                                                      ("disk-direct", 0, -1), ("disk-direct", 9, -1)], timeout_s=10)
            assert [(a.offset, a.error) for a in answers[:3]] == [(300, None), (0, None), (0, None)]
            assert answers[3].error is not None and answers[3].error.name == "UNKNOWN_TOPIC_OR_PARTITION"
        # Mixed with a classic partition this replica may not lead: each answered on its own.
        [deleted, classic] = replicas.delete_records(addresses[1], [("disk-direct", 1, 120), ("classic-direct", 0, 0)],
                                                    timeout_ms=5000, deadline_s=15)
        assert (deleted.low_watermark, deleted.error) == (120, None)
        assert classic.error is None or classic.error.name == "NOT_LEADER_OR_FOLLOWER"
        earliest = replicas.list_offsets(addresses[2], [("disk-direct", 1, -2)], timeout_s=10)[0]
        assert (earliest.offset, earliest.error) == (120, None)
        [front] = cli(cluster, "offsets", "--topic", "disk-direct", "--partition", "1", "--time", "earliest")
        assert front["partitions"][0]["offset"] == 120
    finally:
        replicas.close()


def test_an_idempotent_producer_is_deduplicated_fenced_and_kept_in_sequence_over_the_wire(cluster):
    cli(cluster, "topics", "create", "--topic", "disk-idem", "--partitions", "1", "--diskless")
    address = cluster.service("replica-2").grpc
    client = ReplicaClient()

    def send(epoch: int, sequence: int, n: int = 3):
        batch = encode_batch([b"v%d" % i for i in range(n)], producer_id=4242, producer_epoch=epoch,
                             base_sequence=sequence)
        [answer] = client.produce(address, [("disk-idem", 0, batch)], acks=-1, timeout_ms=10000, deadline_s=15)
        return answer

    try:
        first = send(0, 0)
        assert first.error is None and first.base_offset == 0
        again = send(0, 0)  # the retry of the same batch: the original offsets, nothing appended
        assert again.error is None and again.base_offset == 0
        gap = send(0, 7)
        assert gap.error is not None and gap.error.name == "OUT_OF_ORDER_SEQUENCE_NUMBER"
        assert send(0, 3).base_offset == 3
        assert send(1, 0).base_offset == 6  # a new epoch starts at sequence 0 and fences the old one
        fenced = send(0, 6)
        assert fenced.error is not None and fenced.error.name == "INVALID_PRODUCER_EPOCH"
        latest = cli(cluster, "offsets", "--topic", "disk-idem", "--time", "latest")[0]
        assert latest["partitions"][0]["offset"] == 9  # 3 + 3 + 3: nothing else was appended
    finally:
        client.close()


def test_a_lone_producer_is_answered_after_one_upload_and_commit_not_after_the_commit_interval(cluster):
    cli(cluster, "topics", "create", "--topic", "disk-lone", "--partitions", "1", "--diskless")
    client = ReplicaClient()
    try:
        began = time.monotonic()
        for i, address in enumerate(cluster.service(f"replica-{r}").grpc for r in (0, 1, 2, 0, 1, 2)):
            [answer] = client.produce(address, [("disk-lone", 0, encode_batch([b"x" * 100]))], acks=-1,
                                      timeout_ms=20_000, deadline_s=25)
            assert (answer.error, answer.base_offset) == (None, i)
        took = time.monotonic() - began
    finally:
        client.close()
    # Six requests one after the other, each its broker's only one: six intervals would be 6 min.
    assert took < 15, took


def test_a_conditional_append_lands_only_at_the_expected_log_end_and_is_refused_on_a_diskless_topic(cluster):
    cli(cluster, "topics", "create", "--topic", "cond-classic", "--partitions", "1", "--replication-factor", "3")
    cli(cluster, "topics", "create", "--topic", "cond-disk", "--partitions", "1", "--diskless")
    store = MetadataStore.from_url(cluster.metadata_url)
    address = store.brokers()[store.partition_state("cond-classic", 0).leader].address
    store.close()
    client = ReplicaClient()

    def send(topic: str, address: str, expected: int, pid: int = 5150):
        batch = encode_batch([b"a", b"b"], producer_id=pid, producer_epoch=0)
        [answer] = client.produce(address, [(topic, 0, batch)], acks=-1, timeout_ms=10000, deadline_s=15,
                                  expected_end_offsets={(topic, 0): expected})
        return answer

    try:
        assert send("cond-classic", address, 0).base_offset == 0
        assert send("cond-classic", address, 2).base_offset == 2
        stale = send("cond-classic", address, 2)
        assert stale.error is not None and stale.error.name == "OUT_OF_ORDER_SEQUENCE_NUMBER"
        latest = cli(cluster, "offsets", "--topic", "cond-classic", "--time", "latest")[0]
        assert latest["partitions"][0]["offset"] == 4  # the refused append stored nothing

        refused = send("cond-disk", cluster.service("replica-0").grpc, 0)
        assert refused.error is not None and refused.error.name == "INVALID_REQUEST"
        latest = cli(cluster, "offsets", "--topic", "cond-disk", "--time", "latest")[0]
        assert latest["partitions"][0]["offset"] == 0
    finally:
        client.close()


def test_a_wal_file_whose_batches_are_all_deleted_is_removed_after_the_grace_period_and_not_before(cluster):
    cli(cluster, "topics", "create", "--topic", "disk-gc", "--partitions", "2", "--diskless")
    before = wal_keys(cluster)
    cli(cluster, "produce", "--topic", "disk-gc", "--num-records", "200", "--record-size", "100")
    ours = wal_keys(cluster) - before
    assert ours, "the produce wrote no WAL file"
    # The delete goes through the in-process client, so its start bounds the moment the shard
    # deleted the batches to within a round trip (a CLI call's interpreter start-up and exit would
    # blur it by seconds on a busy machine). Files may go no earlier than GRACE_MS after it.
    with Admin(cluster.bootstrap) as admin:
        deleted_at = time.monotonic()
        results = admin.delete_records([("disk-gc", 0, -1), ("disk-gc", 1, -1)])
    assert all(r.error is None for r in results.values()), results
    while ours & wal_keys(cluster) and time.monotonic() < deleted_at + 30:
        time.sleep(0.1)
    gone_after = time.monotonic() - deleted_at
    assert not ours & wal_keys(cluster), "the WAL files outlived their grace period by far"
    assert gone_after >= GRACE_MS / 1000, f"a WAL file went {gone_after:.2f}s after the delete, before its grace"


def wait_for_earliest(cluster, topic: str, want, timeout_s: float = 20.0) -> dict[int, int]:
    """partition -> earliest offset once ``want`` holds (or at the timeout). Asked in process: a CLI
    start-up per poll costs a second of CPU, and this polls for seconds."""
    deadline = time.monotonic() + timeout_s
    with Admin(cluster.bootstrap) as admin:
        partitions = [p.partition for p in admin.describe_topics([topic])[topic].partitions]
        while True:
            answers = admin.list_offsets({(topic, p): OffsetSpec.EARLIEST for p in partitions})
            assert all(a.error is None for a in answers.values()), answers
            got = {p: a.offset for (_, p), a in answers.items()}
            if want(got) or time.monotonic() > deadline:
                return got
            time.sleep(0.3)


def test_the_shard_applies_time_and_size_retention_to_diskless_partitions(cluster):
    cli(cluster, "topics", "create", "--topic", "disk-ret-time", "--diskless", "--config", "retention.ms=6000")
    cli(cluster, "topics", "create", "--topic", "disk-ret-size", "--diskless", "--config", "retention.bytes=3000")
    # Time first, through the in-process clients, and checked at once: the records are within their
    # 6 s when the check runs however busy the machine is (two CLI start-ups could take longer).
    with Producer(cluster.bootstrap) as producer, Admin(cluster.bootstrap) as admin:
        producer.produce_values("disk-ret-time", [b"x" * 100] * 50, partition=0)
        earliest = admin.list_offsets({("disk-ret-time", 0): OffsetSpec.EARLIEST})[("disk-ret-time", 0)]
    assert earliest.error is None and earliest.offset == 0
    with Producer(cluster.bootstrap) as producer:  # in process: ten CLI start-ups cost ten seconds of CPU
        for _ in range(10):  # ten separate batches of ~1 KiB
            producer.produce_values("disk-ret-size", [b"y" * 100] * 10, partition=0)
    assert wait_for_earliest(cluster, "disk-ret-time", lambda got: got[0] == 50) == {0: 50}  # all expired
    # Size: the newest batches within 3,000 bytes stay (two ~1.2 KiB batches), the older go.
    size = wait_for_earliest(cluster, "disk-ret-size", lambda got: got[0] > 0)
    assert 70 <= size[0] <= 90 and size[0] % 10 == 0, size
    records = cli(cluster, "consume", "--topic", "disk-ret-size", "--partition", "0", "--offset", str(size[0]),
                  "--max-records", str(100 - size[0]))
    assert [r["offset"] for r in records] == list(range(size[0], 100))


def test_kill_9_of_a_replica_mid_produce_loses_no_acknowledged_record(cluster):
    cli(cluster, "topics", "create", "--topic", "disk-kill", "--partitions", "2", "--diskless")
    acked: list[tuple[int, int, list[bytes]]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def produce_through(replica: str, tag: bytes) -> None:
        client = ReplicaClient()
        address = cluster.service(replica).grpc
        n = 0
        try:
            while not stop.is_set():
                partition = n % 2
                values = [tag + b"-%d-%d" % (n, i) for i in range(5)]
                n += 1
                try:
                    [answer] = client.produce(address, [("disk-kill", partition, encode_batch(values))], acks=-1,
                                              timeout_ms=5000, deadline_s=6)
                except Exception:  # noqa: BLE001 - the killed replica's calls fail: not acknowledged
                    time.sleep(0.05)
                    continue
                if answer.error is None:
                    with lock:
                        acked.append((partition, answer.base_offset, values))
        finally:
            client.close()

    threads = [threading.Thread(target=produce_through, args=(r, r.encode())) for r in ("replica-0", "replica-1")]
    for t in threads:
        t.start()
    time.sleep(2.0)
    cluster.kill("replica-1")
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert sum(1 for a in acked if a[2][0].startswith(b"replica-1")) > 3, "too few acknowledged before the kill"
    try:
        consumer = Consumer(cluster.bootstrap)
        consumer.assign([("disk-kill", 0), ("disk-kill", 1)])
        stored: dict[tuple[int, int], bytes] = {}
        expected = {(p, base + i): v for p, base, values in acked for i, v in enumerate(values)}
        deadline = time.monotonic() + 60
        while not expected.keys() <= stored.keys() and time.monotonic() < deadline:
            for r in consumer.poll(max_wait_ms=500):
                stored[(r.partition, r.offset)] = r.value
        consumer.close()
        missing = {k: v for k, v in expected.items() if stored.get(k) != v}
        assert not missing, f"{len(missing)} acknowledged records lost or changed, e.g. {list(missing.items())[:3]}"
    finally:
        cluster.start_service("replica-1")


def test_a_kafka_produce_to_a_diskless_topic_is_committed_before_it_is_answered(cluster):
    # Over the Kafka listener a Produce runs on the listener's loop; a diskless partition's commit
    # waits for the shard, so it runs as a blocking step on a worker (rpc/steps.py) and the
    # classic partition of the same request is appended on the loop.
    cli(cluster, "topics", "create", "--topic", "kdisk", "--partitions", "1", "--diskless")
    cli(cluster, "topics", "create", "--topic", "kclassic", "--partitions", "1", "--replication-factor", "3")
    v3 = request_module(0, 3)

    def partition_data(topic: str, values: list[bytes]):
        return v3.TopicProduceData(name=topic, partition_data=(
            v3.PartitionProduceData(index=0, records=encode_batch(values)),))

    leader = s.leader_of(cluster, "kclassic")
    with KafkaConnection(cluster.service(f"replica-{leader}").kafka) as conn:
        for round_ in range(2):
            answer = conn.call(v3.ProduceRequest(
                transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=20),
                topic_data=(partition_data("kdisk", [b"d%d" % round_, b"e%d" % round_]),
                            partition_data("kclassic", [b"c%d" % round_]))))
            got = {t.name: [(int(p.error_code), int(p.base_offset)) for p in t.partition_responses]
                   for t in answer.responses}
            assert got == {"kdisk": [(0, 2 * round_)], "kclassic": [(0, round_)]}
    latest = cli(cluster, "offsets", "--topic", "kdisk", "--time", "latest")[0]
    assert latest["partitions"][0]["offset"] == 4
    assert [value for _, value in s.read_all(cluster, "kclassic")] == [b"c0", b"c1"]
