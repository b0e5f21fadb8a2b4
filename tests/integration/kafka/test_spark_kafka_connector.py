"""Spark's own Kafka connector (spark-sql-kafka-0-10, ``format("kafka")``, with the kafka-clients
it ships) against a local cluster's Kafka listener, unchanged: a DataFrame written to a topic and
read back in a batch, compared with what lowtide itself says (ListOffsets), also after a lowtide
DeleteRecords.

The Spark side is plain PySpark in local mode with ``spark.jars`` = the connector: no lowtide code,
no lowtide data source. It runs in a child Python process (``SPARK_SIDE`` below), because
``spark.jars`` only counts when a JVM starts and a pytest process may already have started its Spark
JVM without them (tests/integration/spark/ does, in-process). One child, one JVM (a JVM start is
seconds of CPU) serves the module: it writes and reads, then reads again each time this side asks
(a line on its stdin), after this side has deleted records. It prints the rows of each read as one
JSON line; this side checks them.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from tests.integration import support as s
from tests.kafka_tools import require_java, spark_kafka_jars

TOPIC, PARTITIONS, ROWS = "spark-kafka", 3, 600
SPARK_TIMEOUT_S = 300

# The Spark side: argv[1] is a JSON job {"jars", "bootstrap", "topic", "write": [[key, value], ...],
# "read": {option: value}}; it writes, reads, and prints "ROWS <json>" with the rows read as
# [key, value, topic, partition, offset]; then reads again (a new batch query, planned anew) and
# prints its rows for every line "read" on its stdin, until stdin closes.
SPARK_SIDE = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession

    job = json.loads(sys.argv[1])
    spark = (SparkSession.builder.master("local[2]").appName("lowtide-spark-kafka")
             .config("spark.jars", job["jars"]).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def read():
        reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", job["bootstrap"])
                  .option("subscribe", job["topic"]))
        for key, value in job["read"].items():
            reader = reader.option(key, value)
        rows = [[bytes(r.key).decode() if r.key is not None else None, bytes(r.value).decode(), r.topic,
                 r.partition, r.offset] for r in reader.load().collect()]
        print("ROWS " + json.dumps(rows), flush=True)

    try:
        df = spark.createDataFrame([(k.encode(), v.encode()) for k, v in job["write"]], "key binary, value binary")
        (df.write.format("kafka").option("kafka.bootstrap.servers", job["bootstrap"])
         .option("topic", job["topic"]).save())
        read()
        for line in sys.stdin:
            if line.strip() == "read":
                read()
    finally:
        spark.stop()
""")

Row = tuple[str | None, str, str, int, int]


class SparkSide:
    """The child process running SPARK_SIDE; ``rows()`` is the next read's rows."""

    def __init__(self, cluster, *, write: list[tuple[str, str]], read: dict[str, str], log_dir) -> None:
        require_java()
        job = {"jars": ",".join(str(j) for j in spark_kafka_jars()), "bootstrap": cluster.kafka_bootstrap,
               "topic": TOPIC, "write": write, "read": read}
        self.stderr_path = log_dir / "spark-side.stderr"
        self._stderr = self.stderr_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-c", SPARK_SIDE, json.dumps(job)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     env={**os.environ, "PYSPARK_PYTHON": sys.executable})
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, name="spark-side-stdout", daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _failure(self, what: str) -> str:
        self._stderr.flush()
        return f"{what}; Spark side stderr:\n{self.stderr_path.read_text()[-6000:]}"

    def rows(self) -> list[Row]:
        deadline = time.monotonic() + SPARK_TIMEOUT_S
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(self._failure(f"no rows within {SPARK_TIMEOUT_S} s")) from None
            if line is None:
                raise AssertionError(self._failure(f"Spark side exited {self.proc.wait()} before its rows"))
            if line.startswith("ROWS "):
                return [tuple(r) for r in json.loads(line.removeprefix("ROWS "))]

    def read_again(self) -> list[Row]:
        self.proc.stdin.write("read\n")
        self.proc.stdin.flush()
        return self.rows()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            code = self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            code = self.proc.wait()
        finally:
            self._stderr.close()
        assert code == 0, self._failure(f"Spark side exited {code}")


@pytest.fixture(scope="module")
def kcluster(shared_cluster):
    """The worker's shared cluster: these tests fault nothing and write only their own topic."""
    return shared_cluster


@pytest.fixture(scope="module")
def lowtide_admin(kcluster):
    with Admin(kcluster.bootstrap) as admin:
        yield admin


def offsets(admin: Admin, spec: int) -> dict[int, int]:
    answers = admin.list_offsets({(TOPIC, p): spec for p in range(PARTITIONS)})
    assert all(a.error is None for a in answers.values()), answers
    return {p: a.offset for (_, p), a in answers.items()}


# failOnDataLoss stays at its default, true: a batch read resolves "earliest" with ListOffsets
# EARLIEST (lowtide's low watermark) when it plans the job, so after a DeleteRecords it never asks
# for a deleted offset. Were the low watermark misreported (an offset below it fetched, answered
# OFFSET_OUT_OF_RANGE), Spark would fail the read instead of quietly skipping records.
EVERYTHING = {"startingOffsets": "earliest", "endingOffsets": "latest"}
WRITTEN = [(f"key-{i % 50}", f"value-{i}") for i in range(ROWS)]


@pytest.fixture(scope="module")
def spark_side(kcluster, lowtide_admin, tmp_path_factory) -> Iterator[SparkSide]:
    """The Spark side, once it wrote WRITTEN and read everything back in the same session."""
    lowtide_admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
    s.wait_until(lambda: all(p.leader >= 0 for p in lowtide_admin.describe_topics([TOPIC])[TOPIC].partitions),
                 what=f"leaders for {TOPIC}")
    side = SparkSide(kcluster, write=WRITTEN, read=EVERYTHING, log_dir=tmp_path_factory.mktemp("spark-kafka"))
    try:
        side.written_and_read = side.rows()
        yield side
    finally:
        side.close()


@pytest.fixture(scope="module")
def written_and_read(spark_side) -> list[Row]:
    """The rows of the Spark side's read of everything after its write of WRITTEN."""
    return spark_side.written_and_read


def test_a_spark_kafka_write_is_read_back_by_a_spark_kafka_batch_read_with_the_same_rows(written_and_read):
    assert sorted((k, v) for k, v, _, _, _ in written_and_read) == sorted(WRITTEN)
    assert {t for _, _, t, _, _ in written_and_read} == {TOPIC}


def test_the_rows_partitions_and_offsets_are_those_lowtides_list_offsets_gives(written_and_read, lowtide_admin):
    per_partition: dict[int, list[int]] = {}
    for _, _, _, partition, offset in written_and_read:
        per_partition.setdefault(partition, []).append(offset)
    assert set(per_partition) <= set(range(PARTITIONS))
    earliest, latest = offsets(lowtide_admin, OffsetSpec.EARLIEST), offsets(lowtide_admin, OffsetSpec.LATEST)
    assert earliest == dict.fromkeys(range(PARTITIONS), 0)
    for p in range(PARTITIONS):
        assert sorted(per_partition.get(p, [])) == list(range(earliest[p], latest[p])), p
    assert sum(latest.values()) == ROWS


def test_spark_kafka_writes_put_every_record_of_a_key_in_one_partition(written_and_read):
    partitions_of: dict[str, set[int]] = {}
    for key, _, _, partition, _ in written_and_read:
        partitions_of.setdefault(key, set()).add(partition)
    assert all(len(ps) == 1 for ps in partitions_of.values()), partitions_of
    assert len({p for ps in partitions_of.values() for p in ps}) == PARTITIONS  # 50 keys spread over all 3


def test_after_lowtide_delete_records_a_spark_batch_read_from_earliest_starts_at_the_low_watermark(
        spark_side, written_and_read, lowtide_admin):
    latest = offsets(lowtide_admin, OffsetSpec.LATEST)
    low = {p: end // 3 for p, end in latest.items()}
    assert all(k > 0 for k in low.values()), latest
    results = lowtide_admin.delete_records({(TOPIC, p): k for p, k in low.items()})
    assert {tp[1]: r.low_watermark for tp, r in results.items()} == low
    assert offsets(lowtide_admin, OffsetSpec.EARLIEST) == low
    rows = spark_side.read_again()  # a new batch query: it resolves "earliest" anew
    per_partition: dict[int, list[int]] = {}
    for _, _, _, partition, offset in rows:
        per_partition.setdefault(partition, []).append(offset)
    for p in range(PARTITIONS):
        assert sorted(per_partition.get(p, [])) == list(range(low[p], latest[p])), p
    expected = {(k, v, p, o) for k, v, _, p, o in written_and_read if o >= low[p]}
    assert {(k, v, p, o) for k, v, _, p, o in rows} == expected
