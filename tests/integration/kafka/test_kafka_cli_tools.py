"""Apache Kafka's own command-line tools (4.1.2: kafka-topics, kafka-console-producer,
kafka-console-consumer, kafka-consumer-groups, kafka-delete-records) against a local cluster's Kafka
listener, unchanged: each is run as a user would, and what it prints is checked against what
lowtide itself says (Admin metadata, ListOffsets, committed offsets).

One 3-replica cluster for the module. The topic ``cli`` goes through a chain of module fixtures:
created by kafka-topics, fed by the console producer (lines without and with keys), read by a
console consumer in group ``cli-group``, two more lines produced (so the group lags), then trimmed
by kafka-delete-records. Tests ask for the step they check, so they run in any order.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass

import pytest

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from lowtide.localcluster import ClusterConfig
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.kafka_tools import kafka_tool

TOPIC, GROUP, PARTITIONS = "cli", "cli-group", 3
# Keyless lines (the console producer's sticky partitioner puts them where it likes) and keyed
# lines "key<TAB>value" (murmur2 of 30 distinct keys spreads them over all three partitions).
PLAIN = [f"plain-{i}" for i in range(20)]
KEYED = [(f"key-{i}", f"keyed-{i}") for i in range(30)]
LATE = ["late-0", "late-1"]  # produced after the group consumed: its lag
TOOL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("kafka-cli"), replicas=3,
                                                      replica_config=dict(DEFAULT_REPLICA_CONFIG)))


@pytest.fixture(scope="module")
def lowtide_admin(kcluster):
    with Admin(kcluster.bootstrap) as admin:
        yield admin


def tool(name: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one Kafka tool; stdout is its output, stderr its logs (WARN and up) and errors."""
    return subprocess.run([str(kafka_tool(name)), *args], input=stdin, capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args[0]} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result.stdout


def fields(line: str) -> dict[str, str]:
    """'Topic: t<TAB>Partition: 0<TAB>Leader: 1...' (kafka-topics --describe) as a dict."""
    return dict(part.split(": ", 1) if ": " in part else (part.rstrip(":"), "")
                for part in line.strip().split("\t"))


def wait_for_full_isr(admin: Admin, topic: str) -> None:
    s.wait_until(lambda: all(p.leader >= 0 and len(p.isr) == len(p.replicas)
                             for p in admin.describe_topics([topic])[topic].partitions),
                 what=f"leaders and full ISRs for {topic}")


def latest(admin: Admin, topic: str, spec: int = OffsetSpec.LATEST) -> dict[int, int]:
    answers = admin.list_offsets({(topic, p): spec for p in range(PARTITIONS)})
    assert all(a.error is None for a in answers.values()), answers
    return {p: a.offset for (_, p), a in answers.items()}


# -- the chain of steps on topic "cli" ------------------------------------------------------------
@pytest.fixture(scope="module")
def created(kcluster, lowtide_admin) -> subprocess.CompletedProcess[str]:
    result = tool("kafka-topics", "--bootstrap-server", kcluster.kafka_bootstrap, "--create", "--topic", TOPIC,
                  "--partitions", str(PARTITIONS), "--replication-factor", "3")
    ok(result)
    wait_for_full_isr(lowtide_admin, TOPIC)
    return result


@pytest.fixture(scope="module")
def produced(kcluster, created) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    bootstrap = kcluster.kafka_bootstrap
    plain = tool("kafka-console-producer", "--bootstrap-server", bootstrap, "--topic", TOPIC,
                 stdin="".join(f"{line}\n" for line in PLAIN))
    keyed = tool("kafka-console-producer", "--bootstrap-server", bootstrap, "--topic", TOPIC,
                 "--property", "parse.key=true",  # key.separator defaults to a tab
                 stdin="".join(f"{k}\t{v}\n" for k, v in KEYED))
    return plain, keyed


@dataclass(frozen=True)
class Consumed:
    result: subprocess.CompletedProcess[str]
    records: list[tuple[int, int, str, str]]  # (partition, offset, key or "null", value)
    ends: dict[int, int]  # lowtide's log end offsets right after (before the late lines)


@pytest.fixture(scope="module")
def consumed(kcluster, produced, lowtide_admin) -> Consumed:
    ok(produced[0])
    ok(produced[1])
    result = tool("kafka-console-consumer", "--bootstrap-server", kcluster.kafka_bootstrap, "--topic", TOPIC,
                  "--from-beginning", "--max-messages", str(len(PLAIN) + len(KEYED)), "--group", GROUP,
                  "--property", "print.key=true", "--property", "print.partition=true",
                  "--property", "print.offset=true")
    records = []
    for line in ok(result).splitlines():
        partition, offset, key, value = line.split("\t", 3)  # "Partition:0<TAB>Offset:5<TAB>key<TAB>value"
        records.append((int(partition.removeprefix("Partition:")), int(offset.removeprefix("Offset:")), key, value))
    return Consumed(result, records, latest(lowtide_admin, TOPIC))


@pytest.fixture(scope="module")
def lagging(kcluster, consumed, lowtide_admin) -> dict[int, int]:
    """Two more lines after the group's commit; the log end offsets (lowtide's ListOffsets) then."""
    ok(tool("kafka-console-producer", "--bootstrap-server", kcluster.kafka_bootstrap, "--topic", TOPIC,
            stdin="".join(f"{line}\n" for line in LATE)))
    return latest(lowtide_admin, TOPIC)


@dataclass(frozen=True)
class Deleted:
    result: subprocess.CompletedProcess[str]
    before: dict[int, int]  # partition -> the offset asked (records below it are deleted)


@pytest.fixture(scope="module")
def deleted(kcluster, lagging, tmp_path_factory) -> Deleted:
    assert all(end >= 2 for end in lagging.values()), f"every partition needs records to delete: {lagging}"
    before = {p: end // 2 for p, end in lagging.items()}
    offsets = tmp_path_factory.mktemp("delete-records") / "offsets.json"
    offsets.write_text(json.dumps({"partitions": [{"topic": TOPIC, "partition": p, "offset": k}
                                                  for p, k in sorted(before.items())], "version": 1}))
    result = tool("kafka-delete-records", "--bootstrap-server", kcluster.kafka_bootstrap,
                  "--offset-json-file", str(offsets))
    return Deleted(result, before)


# -- kafka-topics ------------------------------------------------------------------------------
def test_kafka_topics_create_makes_the_topic_with_the_partitions_and_replication_factor_asked(
        created, lowtide_admin):
    assert created.stdout.strip() == f"Created topic {TOPIC}."
    topic = lowtide_admin.describe_topics([TOPIC])[TOPIC]
    assert topic.error is None
    assert [p.partition for p in topic.partitions] == list(range(PARTITIONS))
    assert topic.replication_factor == 3 and all(len(p.replicas) == 3 for p in topic.partitions)


def test_kafka_topics_create_of_an_existing_topic_fails_saying_it_exists(kcluster, created):
    result = tool("kafka-topics", "--bootstrap-server", kcluster.kafka_bootstrap, "--create", "--topic", TOPIC,
                  "--partitions", "1", "--replication-factor", "1")
    assert result.returncode == 1, result.stdout
    assert result.stdout.startswith("Error while executing topic command"), result.stdout
    assert "org.apache.kafka.common.errors.TopicExistsException" in result.stderr, result.stderr[-3000:]


def test_kafka_topics_list_names_every_topic(kcluster, created, lowtide_admin):
    lowtide_admin.create_topic("cli-listed", partitions=1, replication_factor=1)
    listed = ok(tool("kafka-topics", "--bootstrap-server", kcluster.kafka_bootstrap, "--list")).split()
    assert {TOPIC, "cli-listed"} <= set(listed)
    assert set(listed) == set(lowtide_admin.list_topics())


def test_kafka_topics_describe_shows_lowtides_own_leaders_replicas_and_isr(kcluster, created, lowtide_admin):
    out = ok(tool("kafka-topics", "--bootstrap-server", kcluster.kafka_bootstrap, "--describe", "--topic", TOPIC))
    lines = [fields(line) for line in out.splitlines() if line.strip()]
    truth = lowtide_admin.describe_topics([TOPIC])[TOPIC]
    head, partitions = lines[0], lines[1:]
    assert head["Topic"] == TOPIC and head["PartitionCount"] == str(PARTITIONS)
    assert head["ReplicationFactor"] == "3" and head["Configs"] == ""
    assert head["TopicId"] != ""  # Kafka's base64 form of lowtide's topic id
    shown = {int(p["Partition"]): (int(p["Leader"]), p["Replicas"], p["Isr"]) for p in partitions}
    assert shown == {p.partition: (p.leader, ",".join(map(str, p.replicas)), ",".join(map(str, p.isr)))
                     for p in truth.partitions}


def test_kafka_topics_describe_prints_the_configs_a_topic_was_created_with(kcluster, lowtide_admin):
    # kafka-topics --describe asks DescribeConfigs for the topic; without that API it fails outright
    # ("The node does not support DESCRIBE_CONFIGS").
    bootstrap = kcluster.kafka_bootstrap
    ok(tool("kafka-topics", "--bootstrap-server", bootstrap, "--create", "--topic", "cli-configured",
            "--partitions", "1", "--replication-factor", "3", "--config", "retention.ms=86400000",
            "--config", "cleanup.policy=compact"))
    assert lowtide_admin.describe_topics(["cli-configured"])["cli-configured"].config == {
        "retention.ms": "86400000", "cleanup.policy": "compact"}
    out = ok(tool("kafka-topics", "--bootstrap-server", bootstrap, "--describe", "--topic", "cli-configured"))
    head = fields(out.splitlines()[0])
    assert sorted(head["Configs"].split(",")) == ["cleanup.policy=compact", "retention.ms=86400000"]


def test_kafka_topics_alter_partitions_grows_a_topic_and_refuses_to_shrink_it(kcluster, lowtide_admin):
    bootstrap = kcluster.kafka_bootstrap
    lowtide_admin.create_topic("cli-grown", partitions=1, replication_factor=3)
    ok(tool("kafka-topics", "--bootstrap-server", bootstrap, "--alter", "--topic", "cli-grown", "--partitions", "3"))
    # kafka-topics takes the whole topic's assignment and sends the new partitions' part of it
    existing = ",".join(":".join(map(str, p.replicas))
                        for p in lowtide_admin.describe_topics(["cli-grown"])["cli-grown"].partitions)
    ok(tool("kafka-topics", "--bootstrap-server", bootstrap, "--alter", "--topic", "cli-grown", "--partitions", "4",
            "--replica-assignment", f"{existing},2:1:0"))
    topic = lowtide_admin.describe_topics(["cli-grown"])["cli-grown"]
    assert [p.partition for p in topic.partitions] == [0, 1, 2, 3]
    assert list(topic.partitions[3].replicas) == [2, 1, 0]
    shrink = tool("kafka-topics", "--bootstrap-server", bootstrap, "--alter", "--topic", "cli-grown",
                  "--partitions", "2")
    assert shrink.returncode == 1, shrink.stdout
    assert "InvalidPartitionsException: Topic currently has 4 partitions, which is higher than the requested 2." \
        in shrink.stderr + shrink.stdout, shrink.stderr[-3000:]


def test_kafka_topics_delete_removes_the_topic(kcluster, lowtide_admin):
    bootstrap = kcluster.kafka_bootstrap
    ok(tool("kafka-topics", "--bootstrap-server", bootstrap, "--create", "--topic", "cli-doomed",
            "--partitions", "2", "--replication-factor", "3"))
    result = tool("kafka-topics", "--bootstrap-server", bootstrap, "--delete", "--topic", "cli-doomed")
    ok(result)
    s.wait_until(lambda: "cli-doomed" not in lowtide_admin.list_topics(), what="cli-doomed gone")
    assert lowtide_admin.describe_topics(["cli-doomed"])["cli-doomed"].error is not None
    assert "cli-doomed" not in ok(tool("kafka-topics", "--bootstrap-server", bootstrap, "--list")).split()
    again = tool("kafka-topics", "--bootstrap-server", bootstrap, "--delete", "--topic", "cli-doomed")
    assert again.returncode == 1
    assert "Topic 'cli-doomed' does not exist as expected" in again.stdout, again.stdout


# -- console producer and consumer -----------------------------------------------------------
def test_console_producer_writes_one_record_per_stdin_line_with_and_without_keys(produced, consumed):
    plain, keyed = produced
    assert ok(plain) == "" and ok(keyed) == ""
    got = {(key, value) for _, _, key, value in consumed.records}
    assert got == {("null", line) for line in PLAIN} | set(KEYED)


def test_console_producer_sends_records_of_one_key_to_one_partition(consumed):
    partitions_of: dict[str, set[int]] = {}
    for partition, _, key, _ in consumed.records:
        partitions_of.setdefault(key, set()).add(partition)
    assert all(len(ps) == 1 for k, ps in partitions_of.items() if k != "null")
    keyed_partitions = {p for k, ps in partitions_of.items() if k != "null" for p in ps}
    assert keyed_partitions == set(range(PARTITIONS))  # 30 keys by murmur2: every partition


def test_console_consumer_in_a_group_reads_every_record_from_the_beginning_once(consumed):
    total = len(PLAIN) + len(KEYED)
    assert len(consumed.records) == total
    assert f"Processed a total of {total} messages" in consumed.result.stderr
    by_partition: dict[int, list[int]] = {}
    for partition, offset, _, _ in consumed.records:
        by_partition.setdefault(partition, []).append(offset)
    for partition, offsets in by_partition.items():
        assert offsets == list(range(len(offsets))), f"partition {partition}: {offsets}"
    # the plain lines, written by one producer, keep their stdin order within each partition
    for partition in by_partition:
        plain = [int(v.removeprefix("plain-")) for p, _, k, v in sorted(consumed.records) if p == partition
                 and k == "null"]
        assert plain == sorted(plain), (partition, plain)
    # and it read every record there was: lowtide's log end offsets then
    assert {p: len(by_partition.get(p, [])) for p in range(PARTITIONS)} == consumed.ends


# -- kafka-consumer-groups ---------------------------------------------------------------------
def _group_table(out: str) -> list[dict[str, str]]:
    lines = [line.split() for line in out.splitlines() if line.strip()]
    header_at = next(i for i, line in enumerate(lines) if line[:2] == ["GROUP", "TOPIC"])
    header = lines[header_at]
    return [dict(zip(header, row, strict=True)) for row in lines[header_at + 1:]]


def test_consumer_groups_describe_shows_the_committed_offsets_log_end_offsets_and_lag(
        kcluster, consumed, lagging, lowtide_admin):
    result = tool("kafka-consumer-groups", "--bootstrap-server", kcluster.kafka_bootstrap, "--describe",
                  "--group", GROUP)
    rows = {int(r["PARTITION"]): r for r in _group_table(ok(result))}
    assert set(rows) == set(range(PARTITIONS))
    assert all(r["GROUP"] == GROUP and r["TOPIC"] == TOPIC for r in rows.values())
    read = {p: 1 + max((o for q, o, _, _ in consumed.records if q == p), default=-1) for p in range(PARTITIONS)}
    committed = lowtide_admin.fetch_offsets(GROUP, [(TOPIC, p) for p in range(PARTITIONS)])
    for p, row in rows.items():
        assert int(row["CURRENT-OFFSET"]) == read[p] == committed[(TOPIC, p)].offset, (p, row)
        assert int(row["LOG-END-OFFSET"]) == lagging[p], (p, row)
        assert int(row["LAG"]) == lagging[p] - read[p], (p, row)
        assert row["CONSUMER-ID"] == "-"  # the console consumer left the group
    assert sum(int(r["LAG"]) for r in rows.values()) == len(LATE)
    assert f"Consumer group '{GROUP}' has no active members." in result.stderr  # Kafka prints it there


def test_consumer_groups_list_names_the_group(kcluster, consumed):
    listed = ok(tool("kafka-consumer-groups", "--bootstrap-server", kcluster.kafka_bootstrap, "--list")).split()
    assert GROUP in listed


# -- kafka-delete-records ----------------------------------------------------------------------
def test_delete_records_prints_each_partitions_low_watermark_and_listoffsets_earliest_is_there(
        deleted, lowtide_admin):
    out = ok(deleted.result)
    printed = {int(m.group(1)): int(m.group(2))
               for m in re.finditer(rf"^partition: {TOPIC}-(\d+)\tlow_watermark: (-?\d+)$", out, re.MULTILINE)}
    assert printed == deleted.before, out
    assert "Records delete operation completed:" in out
    assert latest(lowtide_admin, TOPIC, OffsetSpec.EARLIEST) == deleted.before


def test_a_console_consumer_from_the_beginning_after_delete_records_starts_at_the_low_watermark(
        kcluster, deleted, lagging):
    ok(deleted.result)
    for partition, low in deleted.before.items():
        result = tool("kafka-console-consumer", "--bootstrap-server", kcluster.kafka_bootstrap, "--topic", TOPIC,
                      "--partition", str(partition), "--offset", "earliest",
                      "--max-messages", str(lagging[partition] - low), "--property", "print.offset=true")
        offsets = [int(line.split("\t", 1)[0].removeprefix("Offset:")) for line in ok(result).splitlines()]
        assert offsets == list(range(low, lagging[partition])), (partition, offsets)

