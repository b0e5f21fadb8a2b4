"""Apache Kafka's own tools, fetched by ``make kafka-tools`` (scripts/kafka_tools.sh), are installed
and run: each CLI wrapper prints its version and usage (no broker needed), and Spark's Kafka connector
jars exist (that ``format("kafka")`` resolves with them is shown by tests/integration/kafka/
test_spark_kafka_connector.py, which reads and writes through it). CI installs them, so nothing
here skips there."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.kafka_tools import (
    KAFKA_TOOL_NAMES,
    KAFKA_USAGE_ON_STDOUT,
    kafka_tool,
    kafka_tools_manifest,
    spark_kafka_dir,
    spark_kafka_jars,
)

# The first words of each tool's usage, as Kafka prints them.
USAGE = {
    "kafka-topics": "This tool helps to create, delete, describe, or change a topic.",
    "kafka-console-producer": "This tool helps to read data from standard input and publish it to Kafka.",
    "kafka-console-consumer": "This tool helps to read data from Kafka topics and outputs it to standard output.",
    "kafka-consumer-groups": "This tool helps to list all consumer groups",
    "kafka-delete-records": "This tool helps to delete records of the given partitions",
    "kafka-configs": "This tool helps to manipulate and describe entity config for a topic, client, user, broker",
    "kafka-acls": "This tool helps to manage acls on kafka.",
    "kafka-verifiable-producer": "usage: verifiable-producer",
    "kafka-producer-perf-test": "usage: producer-performance",
    "kafka-transactions": "usage: kafka-transactions.sh",
    "kafka-leader-election": "This tool attempts to elect a new leader for a set of topic partitions.",
    "kafka-reassign-partitions": "This tool helps to move topic partitions between replicas.",
}
# An option each tool's usage must list (the ones lowtide's Kafka tests lean on).
OPTION = {
    "kafka-topics": "--bootstrap-server",
    "kafka-console-producer": "--bootstrap-server",
    "kafka-console-consumer": "--from-beginning",
    "kafka-consumer-groups": "--reset-offsets",
    "kafka-delete-records": "--offset-json-file",
    "kafka-configs": "--add-config",
    "kafka-acls": "--bootstrap-server",
    "kafka-verifiable-producer": "--producer.config",
    "kafka-producer-perf-test": "--producer-props",
    "kafka-transactions": "--bootstrap-server",
    "kafka-leader-election": "--election-type",
    "kafka-reassign-partitions": "--reassignment-json-file",
}
# Kafka's own CLI tools (CommandLineUtils): --version, usage on stderr
CLI_TOOLS = [name for name in KAFKA_TOOL_NAMES if name not in KAFKA_USAGE_ON_STDOUT]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", CLI_TOOLS)
def test_tool_prints_its_version(name: str) -> None:
    result = run(str(kafka_tool(name)), "--version")
    assert result.returncode == 0, result.stderr
    # stdout is the version alone: logging goes to stderr, and no SLF4J/log4j noise either
    assert result.stdout.strip() == kafka_tools_manifest()["kafka_version"]
    assert "SLF4J" not in result.stderr and "StatusLogger" not in result.stderr, result.stderr


@pytest.mark.parametrize("name", CLI_TOOLS)
def test_tool_prints_its_usage(name: str) -> None:
    result = run(str(kafka_tool(name)), "--help")
    # like Kafka's bin/*.sh: usage on stderr, exit code 1
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert result.stdout == ""
    assert USAGE[name] in result.stderr
    assert re.search(rf"^{re.escape(OPTION[name])}\b", result.stderr, re.MULTILINE), result.stderr


@pytest.mark.parametrize("name", KAFKA_USAGE_ON_STDOUT)
def test_argparse_tool_prints_its_usage_on_stdout(name: str) -> None:
    result = run(str(kafka_tool(name)), "--help")
    # like Kafka's bin/kafka-verifiable-producer.sh, kafka-producer-perf-test.sh and
    # kafka-transactions.sh (argparse4j)
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert result.stdout.startswith(USAGE[name]), result.stdout[:2000]
    assert re.search(rf"^\s+{re.escape(OPTION[name])}\b", result.stdout, re.MULTILINE), result.stdout
    assert "SLF4J" not in result.stderr and "StatusLogger" not in result.stderr, result.stderr


def test_manifest_names_every_tool() -> None:
    tools = kafka_tools_manifest()["tools"]
    assert sorted(tools) == sorted(KAFKA_TOOL_NAMES)
    # every tool is in kafka-tools except ConfigCommand, still in the Scala core jar (kafka_2.13)
    assert all(main.startswith("org.apache.kafka.tools.") for name, main in tools.items() if name != "kafka-configs")
    assert tools.get("kafka-configs") == "kafka.admin.ConfigCommand"


def test_spark_kafka_jars_exist() -> None:
    jars = spark_kafka_jars()
    listed = (spark_kafka_dir() / "jars.txt").read_text().strip().split(",")
    assert [str(j) for j in jars] == listed
    assert all(j.is_absolute() and j.is_file() and j.suffix == ".jar" for j in jars)
    names = " ".join(j.name for j in jars)
    for artifact in ("spark-sql-kafka-0-10_2.13-", "spark-token-provider-kafka-0-10_2.13-", "kafka-clients-",
                     "commons-pool2-"):
        assert artifact in names, (artifact, names)
    assert "scala-library" not in names and "spark-core" not in names  # PySpark ships those
