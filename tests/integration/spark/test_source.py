"""The "lowtide" PySpark data source on real PySpark (local mode) against a real local cluster, and
on an auth-enabled one: credentials given as an option reach every call (front door and replicas,
driver and executors); without them nothing is read or written. Share group reads
(``lowtide.share.group``): two batch reads of one group split a topic, a stream takes each record
once in bounded micro-batches. Both share the module's one Spark
session (a JVM start is seconds of CPU)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from lowtide.client import Admin, Producer
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide.record import decode_batches
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


@pytest.fixture
def admin(spark_cluster):
    with Admin(spark_cluster.bootstrap) as a:
        yield a


def _create(admin: Admin, topic: str, partitions: int = 3) -> None:
    admin.create_topic(topic, partitions=partitions, replication_factor=3)
    s.wait_until(lambda: all(p.leader >= 0 for p in admin.describe_topics([topic])[topic].partitions),
                 what=f"leaders for {topic}")


def _produce(bootstrap: str, topic: str, n: int, *, partition: int | None = None, prefix: str = "v") -> None:
    with Producer(bootstrap, acks=-1) as producer:
        producer.produce_values(topic, [f"{prefix}{i}".encode() for i in range(n)],
                                keys=[f"k{i}".encode() for i in range(n)], partition=partition)


def _opts(cluster) -> dict[str, str]:
    return {"bootstrap.servers": cluster.bootstrap}


def test_a_batch_read_returns_every_produced_record_once_with_the_kafka_source_schema(spark, spark_cluster, admin):
    _create(admin, "src-batch-read")
    _produce(spark_cluster.bootstrap, "src-batch-read", 3000)
    df = spark.read.format("lowtide").options(**_opts(spark_cluster)).option("subscribe", "src-batch-read").load()
    assert df.columns == KAFKA_COLUMNS
    assert df.rdd.getNumPartitions() >= 3  # at least one Spark partition per topic partition
    rows = df.collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(f"v{i}".encode() for i in range(3000))
    assert {bytes(r.key) for r in rows} == {f"k{i}".encode() for i in range(3000)}
    per_partition: dict[int, list[int]] = {}
    for r in rows:
        assert r.topic == "src-batch-read" and r.timestampType == 0 and r.timestamp is not None
        per_partition.setdefault(r.partition, []).append(r.offset)
    for p, offsets in per_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {p} has gaps or repeats"


def test_starting_and_ending_offsets_as_json_select_exactly_that_range_and_min_partitions_splits_it(
        spark, spark_cluster, admin):
    _create(admin, "src-ranges", partitions=1)
    _produce(spark_cluster.bootstrap, "src-ranges", 500, partition=0)
    df = (spark.read.format("lowtide").options(**_opts(spark_cluster)).option("subscribe", "src-ranges")
          .option("startingOffsets", json.dumps({"src-ranges": {"0": 100}}))
          .option("endingOffsets", json.dumps({"src-ranges": {"0": 400}}))
          .option("minPartitions", "4").load())
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(100, 400))


def test_a_write_then_read_round_trip_keeps_keys_values_headers_and_explicit_partitions(spark, spark_cluster, admin):
    _create(admin, "src-round-trip")
    rows = [(f"key{i}".encode() if i % 5 else None, f"value{i}".encode(), i % 3,
             [("h", f"{i}".encode()), ("n", None)]) for i in range(1000)]
    df = spark.createDataFrame(rows, "key binary, value binary, partition int, "
                                     "headers array<struct<key: string, value: binary>>")
    df.write.format("lowtide").options(**_opts(spark_cluster)).option("topic", "src-round-trip").mode("append").save()
    back = (spark.read.format("lowtide").options(**_opts(spark_cluster)).option("subscribe", "src-round-trip")
            .option("includeHeaders", "true").load().collect())
    assert len(back) == 1000
    got = {bytes(r.value): r for r in back}
    for key, value, partition, headers in rows:
        r = got[value]
        assert (bytes(r.key) if r.key is not None else None) == key
        assert r.partition == partition
        assert [(h.key, bytes(h.value) if h.value is not None else None) for h in r.headers] == headers


def test_a_write_without_partitions_spreads_unkeyed_rows_and_hashes_keys_as_kafka_does(spark, spark_cluster, admin):
    from lowtide.client.partitioner import partition_for_key

    _create(admin, "src-routed")
    keyed = spark.createDataFrame([(f"user-{i}", f"event-{i}") for i in range(300)], "key string, value string")
    keyed.write.format("lowtide").options(**_opts(spark_cluster)).option("topic", "src-routed").mode("append").save()
    back = (spark.read.format("lowtide").options(**_opts(spark_cluster)).option("subscribe", "src-routed")
            .load().collect())
    assert len(back) == 300
    for r in back:
        assert r.partition == partition_for_key(bytes(r.key), 3)


def test_a_write_that_names_a_missing_topic_fails_the_task_with_the_kafka_error(spark, spark_cluster):
    df = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="UNKNOWN_TOPIC_OR_PARTITION|does not exist"):
        df.write.format("lowtide").options(**_opts(spark_cluster)).option("topic", "src-no-such-topic") \
            .mode("append").save()


def test_subscribe_pattern_reads_every_matching_topic_and_no_other(spark, spark_cluster, admin):
    for name in ("src-metrics-a", "src-metrics-b", "src-other"):
        _create(admin, name, partitions=2)
        _produce(spark_cluster.bootstrap, name, 100, prefix=name)
    df = (spark.read.format("lowtide").options(**_opts(spark_cluster))
          .option("subscribePattern", "src-metrics-.*").load())
    counts = {r.topic: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {"src-metrics-a": 100, "src-metrics-b": 100}


def test_a_streaming_read_with_available_now_and_max_offsets_per_trigger_delivers_everything_in_bounded_batches(
        spark, spark_cluster, admin, tmp_path):
    _create(admin, "src-stream", partitions=2)
    _produce(spark_cluster.bootstrap, "src-stream", 1000)
    seen: list[tuple[int, int]] = []
    sizes: list[int] = []

    def collect(batch_df, batch_id):
        got = [(r.partition, r.offset) for r in batch_df.select("partition", "offset").collect()]
        sizes.append(len(got))
        seen.extend(got)

    query = (spark.readStream.format("lowtide").options(**_opts(spark_cluster)).option("subscribe", "src-stream")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "300")
             .option("lowtide.group.id", "src-spark-stream").load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert len(seen) == 1000 and len(set(seen)) == 1000
    assert max(sizes) <= 300 and len([n for n in sizes if n]) >= 4
    # The group's committed offsets are where the query stopped: the end of what it read.
    committed = admin.fetch_offsets("src-spark-stream", [("src-stream", 0), ("src-stream", 1)])
    ends = {p: 1 + max(o for q, o in seen if q == p) for p in (0, 1)}
    assert {p: committed[("src-stream", p)].offset for p in (0, 1)} == ends


# Spark gives a streaming source's Python worker a fixed 10 s to start and connect back
# (PythonWorkerFactory.createSimpleWorker; no setting changes it). On 2 cores shared with the rest of
# the parallel suite the interpreter can take longer to import pyspark; the query then fails before it
# read anything, which is Spark's start-up, not the source under test: it is started once more.
SPARK_WORKER_START_FAILED = "Python worker failed to connect back"


def _stream_with_delete(spark, cluster, admin, topic: str, *, fail: bool, tmp_path) -> tuple[list[int], object]:
    _create(admin, topic, partitions=1)
    _produce(cluster.bootstrap, topic, 300, partition=0)
    for attempt in range(2):
        seen, error = _run_stream_with_delete(spark, cluster, admin, topic, fail=fail,
                                              checkpoint=tmp_path / f"{topic}-{attempt}")
        if not (error is not None and not seen and SPARK_WORKER_START_FAILED in _stack(error)):
            break
    return seen, error


def _stack(error: object) -> str:
    """The error's message and its Java stack trace with causes (PySpark's CapturedException)."""
    return f"{error} {getattr(error, '_stackTrace', '')}"


def _run_stream_with_delete(spark, cluster, admin, topic: str, *, fail: bool, checkpoint) -> tuple[list[int], object]:
    seen: list[int] = []

    def collect(batch_df, batch_id):
        seen.extend(r.offset for r in batch_df.select("offset").collect())
        if batch_id == 0:  # while the query runs, delete records it has not read yet
            result = admin.delete_records({(topic, 0): 200})[(topic, 0)]
            assert result.error is None and result.low_watermark == 200

    query = (spark.readStream.format("lowtide").options(**{"bootstrap.servers": cluster.bootstrap})
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "50").option("failOnDataLoss", str(fail).lower()).load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    except Exception as err:  # the query's failure is re-raised here
        return seen, err
    return seen, query.exception()


def test_records_deleted_under_a_streaming_read_fail_the_query_naming_partition_and_offsets(
        spark, spark_cluster, admin, tmp_path):
    seen, error = _stream_with_delete(spark, spark_cluster, admin, "src-loss-fails", fail=True, tmp_path=tmp_path)
    assert error is not None
    assert "src-loss-fails-0" in str(error) and "offsets 50..199" in str(error) and "failOnDataLoss" in str(error)
    assert seen == list(range(50))


def test_records_deleted_under_a_streaming_read_are_skipped_with_fail_on_data_loss_false(
        spark, spark_cluster, admin, tmp_path):
    seen, error = _stream_with_delete(spark, spark_cluster, admin, "src-loss-skips", fail=False, tmp_path=tmp_path)
    assert error is None
    assert seen == list(range(50)) + list(range(200, 300))


def test_a_batch_read_from_deleted_offsets_fails_or_starts_at_the_log_start_offset(spark, spark_cluster, admin):
    _create(admin, "src-deleted-start", partitions=1)
    _produce(spark_cluster.bootstrap, "src-deleted-start", 100, partition=0)
    assert admin.delete_records({("src-deleted-start", 0): 60})[("src-deleted-start", 0)].error is None
    reader = (spark.read.format("lowtide").options(**_opts(spark_cluster)).option("subscribe", "src-deleted-start")
              .option("startingOffsets", json.dumps({"src-deleted-start": {"0": 10}})))
    with pytest.raises(Exception, match=r"src-deleted-start-0 at offsets 10\.\.59"):
        reader.load().collect()
    offsets = [r.offset for r in reader.option("failOnDataLoss", "false").load().select("offset").collect()]
    assert sorted(offsets) == list(range(60, 100))


def test_what_the_writer_stores_is_ordinary_record_batches_any_client_decodes(spark, spark_cluster, admin):
    _create(admin, "src-plain", partitions=1)
    spark.createDataFrame([(f"v{i}",) for i in range(50)], "value string").write.format("lowtide") \
        .options(**_opts(spark_cluster)).option("topic", "src-plain").mode("append").save()
    leader = s.leader_of(spark_cluster, "src-plain")
    r = s.replica(spark_cluster, leader)
    from lowtide_pb import replica_pb2

    resp = r.Fetch(replica_pb2.FetchRequest(replica_id=-1, max_bytes=1 << 20, partitions=[
        replica_pb2.FetchPartition(topic="src-plain", partition=0, fetch_offset=0, partition_max_bytes=1 << 20)]))
    values = [rec.value for _, recs in decode_batches(resp.partitions[0].records) for rec in recs]
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(50))


def test_a_diskless_topic_is_written_and_read_through_the_source_unchanged_with_the_same_offsets(
        spark, spark_cluster, admin):
    # Nothing Spark-side knows the kind of topic: the source's metadata, ListOffsets, Fetch and
    # Produce reach the replicas, which serve diskless partitions from the coordinator shards.
    admin.create_topic("src-disk-spark", partitions=3, diskless=True)
    _produce(spark_cluster.bootstrap, "src-disk-spark", 900)
    rows = [(f"key{i}".encode(), f"written{i}".encode(), i % 3) for i in range(300)]
    spark.createDataFrame(rows, "key binary, value binary, partition int").write.format("lowtide") \
        .options(**_opts(spark_cluster)).option("topic", "src-disk-spark").mode("append").save()
    back = spark.read.format("lowtide").options(**_opts(spark_cluster)).option("subscribe", "src-disk-spark").load()
    got = back.collect()
    assert sorted(bytes(r.value) for r in got) == sorted(
        [f"v{i}".encode() for i in range(900)] + [f"written{i}".encode() for i in range(300)])
    per_partition: dict[int, list[int]] = {}
    for r in got:
        per_partition.setdefault(r.partition, []).append(r.offset)
    ends = admin.list_offsets({("src-disk-spark", p): -1 for p in range(3)})
    for p in range(3):
        assert sorted(per_partition.get(p, [])) == list(range(ends[("src-disk-spark", p)].offset))
    # A range read: what startingOffsets names, on diskless partitions too.
    ranged = (spark.read.format("lowtide").options(**_opts(spark_cluster)).option("subscribe", "src-disk-spark")
              .option("startingOffsets", json.dumps({"src-disk-spark": {"0": 10, "1": 0, "2": 0}}))
              .option("endingOffsets", json.dumps({"src-disk-spark": {"0": 20, "1": 0, "2": 0}})).load().collect())
    assert sorted(r.offset for r in ranged) == list(range(10, 20)) and {r.partition for r in ranged} == {0}


# ------------------------------------------------------------------ share group reads (spark/share.py)


def _produce_small_batches(bootstrap: str, topic: str, partitions: int, n: int, *, first: int = 0) -> set[bytes]:
    """Values ``first``.. ``first + n - 1`` over ``partitions`` in ~1 KiB batches: a share read
    acquires whole batches, so small ones let a bounded read take part of a partition."""
    values = [f"{topic}-{i}".encode() for i in range(first, first + n)]
    with Producer(bootstrap, batch_bytes=1024) as producer:
        for p in range(partitions):
            producer.produce_values(topic, values[p::partitions], partition=p)
    return set(values)


def _share_read(spark, cluster, topic: str, group: str, **extra: str) -> list[bytes]:
    reader = (spark.read.format("lowtide").options(**_opts(cluster)).option("subscribe", topic)
              .option("lowtide.share.group", group))
    for k, v in extra.items():
        reader = reader.option(k, v)
    return [bytes(r.value) for r in reader.load().select("value").collect()]


def test_two_batch_reads_with_one_share_group_get_disjoint_records_that_together_are_everything(
        spark, spark_cluster, admin):
    _create(admin, "src-share-batch")
    produced = _produce_small_batches(spark_cluster.bootstrap, "src-share-batch", 3, 900)
    first = _share_read(spark, spark_cluster, "src-share-batch", "src-share-g", **{"lowtide.share.max.records": "300"})
    second = _share_read(spark, spark_cluster, "src-share-batch", "src-share-g")
    # The first took about its bound (whole batches: a little more), the second the rest, none twice.
    assert 300 <= len(first) < 600 and second
    assert not set(first) & set(second) and len(set(first)) == len(first) and len(set(second)) == len(second)
    assert set(first) | set(second) == produced
    # Each task accepted what it read: the group is done with every record, a third read gets nothing.
    assert _share_read(spark, spark_cluster, "src-share-batch", "src-share-g") == []
    starts = {(o.topic, o.partition): o.start_offset for o in admin.share_group_start_offsets("src-share-g")}
    assert starts == {("src-share-batch", p): 300 for p in range(3)}


def test_a_streaming_share_read_takes_each_record_once_in_bounded_micro_batches_and_the_group_keeps_the_progress(
        spark, spark_cluster, admin, tmp_path):
    _create(admin, "src-share-stream", partitions=2)
    produced = _produce_small_batches(spark_cluster.bootstrap, "src-share-stream", 2, 600)

    def run(checkpoint: str) -> list[list[bytes]]:
        batches: list[list[bytes]] = []
        query = (spark.readStream.format("lowtide").options(**_opts(spark_cluster))
                 .option("subscribe", "src-share-stream").option("lowtide.share.group", "src-share-stream-g")
                 .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "200").load()
                 .writeStream.foreachBatch(lambda df, _id: batches.append([bytes(r.value) for r in df.collect()]))
                 .option("checkpointLocation", str(tmp_path / checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return [b for b in batches if b]

    batches = run("first")
    got = [v for b in batches for v in b]
    assert sorted(got) == sorted(produced)  # each record once
    # maxOffsetsPerTrigger bounds a micro-batch (batch-aligned: each of the 2 tasks may go over by
    # less than one ~1 KiB batch of these values).
    assert len(batches) >= 3 and max(len(b) for b in batches) < 200 + 2 * 120
    # No offsets in the checkpoint: a new query (a new checkpoint) of the group starts where the
    # group is, and takes only what was produced since.
    more = _produce_small_batches(spark_cluster.bootstrap, "src-share-stream", 2, 50, first=600)
    assert sorted(v for b in run("second") for v in b) == sorted(more)


# ------------------------------------------------------------------ an auth-enabled cluster


@pytest.fixture(scope="module")
def auth_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("spark-auth"), replicas=3,
                                         replica_config=dict(DEFAULT_REPLICA_CONFIG), auth_enabled=True))


def test_a_token_option_lets_a_spark_job_write_and_read_and_no_token_gets_nothing(spark, auth_cluster, tmp_path):
    metadata = s.auth_metadata(auth_cluster)
    token = dict(metadata)["authorization"].removeprefix("Bearer ")
    with Admin(auth_cluster.bootstrap, metadata=metadata) as admin:
        admin.create_topic("secured", partitions=2, replication_factor=3)
    config = tmp_path / "client.properties"
    config.write_text(f"lowtide.auth.token={token}\n")
    opts = {"bootstrap.servers": auth_cluster.bootstrap}

    spark.createDataFrame([(f"v{i}",) for i in range(200)], "value string").write.format("lowtide") \
        .options(**opts).option("lowtide.auth.token", token).option("topic", "secured").mode("append").save()
    rows = (spark.read.format("lowtide").options(**opts).option("lowtide.command.config", str(config))
            .option("subscribe", "secured").load().collect())
    assert sorted(bytes(r.value) for r in rows) == sorted(f"v{i}".encode() for i in range(200))

    with pytest.raises(Exception, match="TopicAuthorizationFailed|not authorized|does not exist"):
        spark.read.format("lowtide").options(**opts).option("subscribe", "secured").load().collect()
    with pytest.raises(Exception, match="TopicAuthorizationFailed|not authorized"):
        spark.createDataFrame([("x",)], "value string").write.format("lowtide").options(**opts) \
            .option("topic", "secured").mode("append").save()
