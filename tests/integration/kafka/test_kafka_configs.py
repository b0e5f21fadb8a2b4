"""Topic configs changed after creation, through Kafka's own clients and tools against a local
cluster's Kafka listener, unchanged: confluent-kafka's IncrementalAlterConfigs and DescribeConfigs,
kafka-python's legacy AlterConfigs, Apache Kafka 4.1.2's kafka-configs (topics and brokers) and
kafka-topics --under-min-isr-partitions; and the change taking effect on the running replicas
(time retention deletes old segments, a switch to compact makes the cleaner run) with no restart.

One 3-replica cluster for the module: retention passes every 300 ms, the cleaner's idle back-off
500 ms, a follower leaves the ISR after lagging 3 s.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType

from lowtide.client import Admin
from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.kafka_tools import kafka_tool

TOOL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("kafka-configs"), replicas=3,
                           replica_config={**DEFAULT_REPLICA_CONFIG, "log.retention.check.interval.ms": "300",
                                           "log.cleaner.backoff.ms": "500"})
    yield from running_cluster(request, config)


@pytest.fixture(scope="module")
def confluent(kcluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": kcluster.kafka_bootstrap})


def topic_config(cluster: LocalCluster, topic: str) -> dict[str, str]:
    """The topic's config as lowtide itself stores it (Admin.Metadata)."""
    with Admin(cluster.bootstrap) as admin:
        return admin.describe_topics([topic])[topic].config


def tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kafka_tool(name)), *args], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args[0]} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result.stdout


def incremental(confluent: AdminClient, topic: str, *entries: ConfigEntry) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=list(entries))
    for future in confluent.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def described(confluent: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    [future] = confluent.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    return future.result(timeout=30)


def set_entry(key: str, value: str, op: AlterConfigOpType = AlterConfigOpType.SET) -> ConfigEntry:
    return ConfigEntry(key, value, incremental_operation=op)


# -- confluent-kafka: IncrementalAlterConfigs and DescribeConfigs -------------------------------------
def test_incremental_alter_configs_sets_retention_and_appends_compact_and_describe_reads_them_back(
        kcluster, confluent):
    s.create_topic(kcluster, "inc", config={"segment.bytes": "65536"})
    incremental(confluent, "inc", set_entry("retention.ms", "3600000"),
                set_entry("cleanup.policy", "compact", AlterConfigOpType.APPEND))
    assert topic_config(kcluster, "inc") == {"segment.bytes": "65536", "retention.ms": "3600000",
                                             "cleanup.policy": "delete,compact"}
    entries = described(confluent, "inc")
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == (
        "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert entries["cleanup.policy"].value == "delete,compact"
    # keys the topic does not set are reported with lowtide's defaults, as a Kafka broker does
    assert (entries["delete.retention.ms"].value, entries["delete.retention.ms"].source) == (
        "86400000", ConfigSource.DEFAULT_CONFIG.value)
    assert entries["min.insync.replicas"].is_default and entries["min.insync.replicas"].value == "1"


def test_incremental_delete_returns_a_key_to_its_default(kcluster, confluent):
    s.create_topic(kcluster, "inc-del", config={"retention.ms": "5000", "retention.bytes": "100000"})
    incremental(confluent, "inc-del", set_entry("retention.ms", "", AlterConfigOpType.DELETE))
    assert topic_config(kcluster, "inc-del") == {"retention.bytes": "100000"}
    entries = described(confluent, "inc-del")
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == (
        "604800000", ConfigSource.DEFAULT_CONFIG.value)


def test_an_invalid_value_is_invalid_config_and_nothing_of_the_topic_changes(kcluster, confluent):
    s.create_topic(kcluster, "inc-bad", config={"retention.ms": "5000"})
    with pytest.raises(KafkaException) as caught:
        incremental(confluent, "inc-bad", set_entry("segment.bytes", "131072"), set_entry("retention.ms", "soon"))
    error = caught.value.args[0]
    assert error.code() == KafkaError.INVALID_CONFIG and "retention.ms" in error.str()
    assert topic_config(kcluster, "inc-bad") == {"retention.ms": "5000"}


def test_an_unknown_topic_is_unknown_topic_or_partition(confluent):
    with pytest.raises(KafkaException) as caught:
        incremental(confluent, "no-such-topic", set_entry("retention.ms", "5"))
    assert caught.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_altering_a_broker_config_is_policy_violation(confluent):
    resource = ConfigResource(ConfigResource.Type.BROKER, "0",
                              incremental_configs=[set_entry("log.retention.ms", "5")])
    with pytest.raises(KafkaException) as caught:
        for future in confluent.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
    assert caught.value.args[0].code() == KafkaError.POLICY_VIOLATION
    assert "static" in caught.value.args[0].str()


def test_describe_configs_of_a_broker_lists_lowtides_defaults(confluent):
    [future] = confluent.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")]).values()
    entries = future.result(timeout=30)
    values = {k: e.value for k, e in entries.items()}
    assert values["min.insync.replicas"] == "1" and values["auto.create.topics.enable"] == "false"
    assert values["default.replication.factor"] == "3" and values["num.partitions"] == "1"
    assert values["log.retention.ms"] == "604800000" and values["log.cleanup.policy"] == "delete"
    assert all(e.source == ConfigSource.DEFAULT_CONFIG.value for e in entries.values())
    # Static but for the KIP-73 throttle rates (dynamic, unset here: unlimited).
    dynamic = {"leader.replication.throttled.rate", "follower.replication.throttled.rate",
               "replica.alter.log.dirs.io.max.bytes.per.second"}
    assert {k for k, e in entries.items() if not e.is_read_only} == dynamic
    assert values["leader.replication.throttled.rate"] == str(2**63 - 1)


# -- kafka-python: the legacy AlterConfigs ----------------------------------------------------------
def test_kafka_python_alter_configs_changes_the_given_key(kcluster):
    s.create_topic(kcluster, "legacy", config={"retention.bytes": "100000"})
    client = KafkaAdminClient(bootstrap_servers=kcluster.kafka_bootstrap, request_timeout_ms=15000)
    try:
        # incremental=False: AlterConfigs (API 33); kafka-python first reads the topic's modified
        # keys (DescribeConfigs) and sends them too, since AlterConfigs replaces the whole set.
        result = client.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, "legacy",
                                                        configs={"retention.ms": "7200000"})], incremental=False)
        assert result == {"topic": {"legacy": "OK"}}
        assert topic_config(kcluster, "legacy") == {"retention.bytes": "100000", "retention.ms": "7200000"}
        described_configs = client.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, "legacy")])
        assert set(described_configs["topic"]["legacy"]) == {"retention.bytes", "retention.ms"}  # modified only
        # The request itself, as Kafka defines it: keys it leaves out return to their defaults.
        whole_set = KpConfigResource(ConfigResourceType.TOPIC, "legacy", configs={"segment.ms": "60000"})
        raw = client._manager.run(client._send_alter_configs_requests, [whole_set], False, False)
        assert raw == {"topic": {"legacy": "OK"}}
        assert topic_config(kcluster, "legacy") == {"segment.ms": "60000"}
        bad = client.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, "legacy",
                                                     configs={"segment.ms": "-5"})], incremental=False)
        assert bad["topic"]["legacy"].startswith("[Error 40] InvalidConfigurationError")
        assert topic_config(kcluster, "legacy") == {"segment.ms": "60000"}
    finally:
        client.close()


# -- Apache Kafka's kafka-configs and kafka-topics ----------------------------------------------------
def test_kafka_configs_alters_a_topic_and_describes_it(kcluster):
    bootstrap = kcluster.kafka_bootstrap
    s.create_topic(kcluster, "kc")
    ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "topics",
            "--entity-name", "kc", "--add-config", "retention.ms=123456,cleanup.policy=[compact,delete]"))
    assert topic_config(kcluster, "kc") == {"retention.ms": "123456", "cleanup.policy": "compact,delete"}
    out = ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--describe", "--entity-type", "topics",
                  "--entity-name", "kc"))
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0] == "Dynamic configs for topic kc are:"
    assert any(line.startswith("retention.ms=123456 ") and "DYNAMIC_TOPIC_CONFIG:retention.ms=123456" in line
               for line in lines), out
    assert any(line.startswith("cleanup.policy=compact,delete ") for line in lines), out
    assert len(lines) == 3, out  # only the topic's own keys: defaults are not "dynamic"

    ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "topics",
            "--entity-name", "kc", "--delete-config", "retention.ms"))
    assert topic_config(kcluster, "kc") == {"cleanup.policy": "compact,delete"}
    refused = tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "topics",
                   "--entity-name", "kc", "--add-config", "retention.ms=soon")
    assert refused.returncode != 0 and "retention.ms" in refused.stderr + refused.stdout
    assert topic_config(kcluster, "kc") == {"cleanup.policy": "compact,delete"}


def test_kafka_configs_describes_a_broker(kcluster):
    bootstrap = kcluster.kafka_bootstrap
    out = ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--describe", "--entity-type", "brokers",
                  "--entity-name", "0"))
    assert out.strip() == "Dynamic configs for broker 0 are:"  # lowtide has no dynamic broker configs
    out = ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--describe", "--entity-type", "brokers",
                  "--entity-name", "0", "--all"))
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0] == "All configs for broker 0 are:"
    assert "min.insync.replicas=1 sensitive=false synonyms={DEFAULT_CONFIG:min.insync.replicas=1}" in lines, out
    assert any(line.startswith("auto.create.topics.enable=false ") for line in lines), out


def test_kafka_configs_sets_and_deletes_a_brokers_throttle_rate(kcluster):
    """KIP-73: the throttle rates are lowtide's dynamic broker configs (per broker and cluster-wide)."""
    bootstrap = kcluster.kafka_bootstrap
    ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "brokers",
            "--entity-name", "1", "--add-config", "leader.replication.throttled.rate=1000000"))
    ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "brokers",
            "--entity-default", "--add-config", "follower.replication.throttled.rate=2000000"))
    assert s.store(kcluster).effective_broker_config(1) == {"leader.replication.throttled.rate": "1000000",
                                                            "follower.replication.throttled.rate": "2000000"}
    out = ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--describe", "--entity-type", "brokers",
                  "--entity-name", "1"))
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0] == "Dynamic configs for broker 1 are:"
    assert any(line.startswith("leader.replication.throttled.rate=1000000 ")
               and "DYNAMIC_BROKER_CONFIG:leader.replication.throttled.rate=1000000" in line for line in lines), out
    ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "brokers",
            "--entity-name", "1", "--delete-config", "leader.replication.throttled.rate"))
    ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "brokers",
            "--entity-default", "--delete-config", "follower.replication.throttled.rate"))
    assert s.store(kcluster).broker_configs() == {}


def test_kafka_topics_reports_partitions_under_min_isr_from_the_altered_topic_config(kcluster):
    bootstrap = kcluster.kafka_bootstrap
    s.create_topic(kcluster, "minisr", partitions=1, rf=3)

    def under_min_isr() -> list[str]:
        out = ok(tool("kafka-topics", "--bootstrap-server", bootstrap, "--describe", "--topic", "minisr",
                      "--under-min-isr-partitions"))
        return [line for line in out.splitlines() if line.strip()]

    assert under_min_isr() == []  # full ISR of 3 >= the default min.insync.replicas 1
    ok(tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "topics",
            "--entity-name", "minisr", "--add-config", "min.insync.replicas=3"))
    leader = s.leader_of(kcluster, "minisr")
    follower = f"replica-{next(r for r in (0, 1, 2) if r != leader)}"
    # Stopped, not paused: Kafka's tools must not pick a broker that cannot answer. The leader drops
    # it from the ISR once it lags (3 s here); min.insync.replicas=3 then puts the partition under.
    assert kcluster.stop_service(follower) == "stopped"
    try:
        s.wait_until(lambda: len(s.store(kcluster).partition_state("minisr", 0).isr) == 2,
                     what=f"{follower} out of the ISR")
        [line] = under_min_isr()
        assert "Topic: minisr" in line and "Partition: 0" in line, line
    finally:
        kcluster.start_service(follower)
    s.wait_until(lambda: len(s.store(kcluster).partition_state("minisr", 0).isr) == 3, timeout_s=60,
                 what=f"{follower} back in the ISR")
    assert under_min_isr() == []


# -- the change takes effect on the running replicas ------------------------------------------------
def test_a_shorter_retention_deletes_old_segments_on_every_running_replica(kcluster):
    s.create_topic(kcluster, "shrink")  # the cluster's segments are 64 KiB; retention 7 days by default
    for _ in range(20):
        assert s.produce(kcluster, "shrink", [b"x" * 1024] * 20).error_code == 0
    for r in (0, 1, 2):
        s.wait_until(lambda r=r: s.describe(kcluster, r, "shrink").high_watermark == 400, what=f"replica {r} caught up")
        assert len(s.segment_files(kcluster, r, "shrink")) >= 4
    time.sleep(1.0)  # a few retention passes: nothing is old enough yet
    assert s.describe(kcluster, s.leader_of(kcluster, "shrink"), "shrink").log_start_offset == 0

    result = s.lowtide_cli("topics", "alter", "--bootstrap-server", kcluster.bootstrap, "--topic", "shrink",
                           "--add-config", "retention.ms=500", "--output", "json")
    assert result.returncode == 0, result.stderr
    for r in (0, 1, 2):
        s.wait_until(lambda r=r: s.describe(kcluster, r, "shrink").log_start_offset == 400,
                     what=f"replica {r}: everything older than 500 ms deleted")
        s.wait_until(lambda r=r: len(s.segment_files(kcluster, r, "shrink")) == 1,
                     what=f"replica {r}: old segment files removed")


def test_switching_cleanup_policy_to_compact_makes_the_cleaner_run_without_a_restart(kcluster, confluent):
    s.create_topic(kcluster, "to-compact", config={"segment.bytes": "2048"})
    latest: dict[bytes, tuple[int, bytes]] = {}
    for round_ in range(12):
        keys = [b"key-%d" % k for k in range(10)]
        values = [b"v%d-%d" % (k, round_) for k in range(10)]
        result = s.produce(kcluster, "to-compact", values, keys=keys)
        assert result.error_code == 0, result
        latest.update({k: (result.base_offset + i, v) for i, (k, v) in enumerate(zip(keys, values, strict=True))})
    time.sleep(1.5)  # cleaner back-off passes: a delete-policy topic is never compacted
    assert len(s.read_all(kcluster, "to-compact")) == 120

    incremental(confluent, "to-compact", set_entry("cleanup.policy", "compact"),
                set_entry("min.cleanable.dirty.ratio", "0.01"), set_entry("segment.ms", "1000"))

    def compacted() -> bool:
        records = s.read_all(kcluster, "to-compact")
        assert set(latest.values()) <= set(records)  # every key's latest value stays, at its offset
        return len(records) < 60
    s.wait_until(compacted, timeout_s=60, what="the cleaner compacted the topic")


# -- diskless.enable (KIP-1150's and Inkless's name) through Kafka's admin API ------------------------
# Apache's kafka-topics checks --config names against its own LogConfig before it sends anything
# ("Unknown topic config name: diskless.enable"), so the topic is made with an admin client, as
# Terraform providers and operators make topics; kafka-configs sends names as given.
def create_with_config(confluent: AdminClient, topic: str, config: dict[str, str], partitions: int = 1) -> None:
    [future] = confluent.create_topics([NewTopic(topic, num_partitions=partitions, config=config)]).values()
    future.result(timeout=30)


def test_an_admin_client_makes_a_diskless_topic_with_diskless_enable_and_kafka_configs_shows_it(kcluster, confluent):
    create_with_config(confluent, "kd", {"diskless.enable": "true", "retention.ms": "600000"}, partitions=2)
    with Admin(kcluster.bootstrap) as admin:
        info = admin.describe_topics(["kd"])["kd"]
    # The flag is the topic's record; the key is not kept among its configs.
    assert info.diskless and info.config == {"retention.ms": "600000"} and len(info.partitions) == 2
    out = ok(tool("kafka-configs", "--bootstrap-server", kcluster.kafka_bootstrap, "--describe", "--entity-type",
                  "topics", "--entity-name", "kd"))
    assert any(line.strip().startswith("diskless.enable=true ") for line in out.splitlines()), out
    # Each partition's coordinator shard, read-only, in kafka-topics --describe's Configs.
    shards = ",".join(f"{p}:{shard}" for p, shard in enumerate(s.store(kcluster).topic("kd").diskless_shards))
    described_topic = ok(tool("kafka-topics", "--bootstrap-server", kcluster.kafka_bootstrap, "--describe",
                              "--topic", "kd"))
    assert f"diskless.coordinator.shards={shards}" in described_topic, described_topic
    refused = tool("kafka-configs", "--bootstrap-server", kcluster.kafka_bootstrap, "--alter", "--entity-type",
                   "topics", "--entity-name", "kd", "--add-config", "diskless.coordinator.shards=[0:9,1:9]")
    assert refused.returncode != 0 and "diskless.coordinator.shards is read-only" in refused.stderr + refused.stdout


def test_diskless_enable_never_changes_on_an_existing_topic_and_takes_only_true_or_false(kcluster, confluent):
    bootstrap = kcluster.kafka_bootstrap
    create_with_config(confluent, "kd-fixed", {"diskless.enable": "true"})
    s.create_topic(kcluster, "kd-classic")
    assert described(confluent, "kd-classic")["diskless.enable"].value == "false"
    for topic, value in (("kd-fixed", "false"), ("kd-classic", "true")):
        refused = tool("kafka-configs", "--bootstrap-server", bootstrap, "--alter", "--entity-type", "topics",
                       "--entity-name", topic, "--add-config", f"diskless.enable={value}")
        assert refused.returncode != 0, refused.stdout
        assert "diskless.enable cannot be changed on an existing topic" in refused.stderr + refused.stdout
    # Setting it to what it is changes nothing and is no error (a tool sending back what it described).
    incremental(confluent, "kd-fixed", set_entry("diskless.enable", "true"), set_entry("retention.ms", "700000"))
    assert topic_config(kcluster, "kd-fixed") == {"retention.ms": "700000"}
    with pytest.raises(KafkaException) as refused_create:
        create_with_config(confluent, "kd-bad", {"diskless.enable": "yes"})
    assert refused_create.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "diskless.enable" in refused_create.value.args[0].str()
    with Admin(kcluster.bootstrap) as admin:
        assert "kd-bad" not in admin.list_topics()


def test_kafka_verifiable_producer_writes_to_a_diskless_enable_topic_and_a_read_committed_consumer_reads_it_all(
        kcluster, confluent):
    create_with_config(confluent, "kd-verified", {"diskless.enable": "true"}, partitions=2)
    produced = tool("kafka-verifiable-producer", "--topic", "kd-verified", "--bootstrap-server",
                    kcluster.kafka_bootstrap, "--max-messages", "400", "--acks", "-1")
    assert produced.returncode == 0, produced.stderr[-3000:]
    events = [json.loads(line) for line in produced.stdout.splitlines() if line.startswith("{")]
    acked = [e["value"] for e in events if e.get("name") == "producer_send_success"]
    assert len(acked) == 400 and not [e for e in events if e.get("name") == "producer_send_error"], events[-3:]
    consumer = Consumer({"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "kd-verified-reader",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    read: list[str] = []
    try:
        consumer.subscribe(["kd-verified"])
        deadline = time.monotonic() + 60
        while len(read) < len(acked) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read.append(message.value().decode())
    finally:
        consumer.close()
    assert sorted(read, key=int) == sorted(acked, key=int)  # each acknowledged value once, nothing else
    assert s.store(kcluster).topic("kd-verified").diskless
