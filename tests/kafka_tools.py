"""Where Apache Kafka's own client software is, for tests that check lowtide against it.

``scripts/kafka_tools.sh`` (``make kafka-tools``; ``make setup`` and so CI run it) fetches from Maven
Central and caches in ``$LOWTIDE_KAFKA_TOOLS_CACHE`` (default ``~/.cache/lowtide-kafka-tools``):

* Kafka's command-line tools, as wrappers in ``.tools/bin`` (``kafka_tool("kafka-topics")``). They
  behave like Kafka's ``bin/kafka-*.sh``: ``--version`` prints the version and exits 0, ``--help``
  prints the usage on stderr and exits 1 (``KAFKA_USAGE_ON_STDOUT``: Kafka's argparse4j tools, no
  ``--version``, usage on stdout); logs go to stderr at WARN, so stdout is the tool's output.
* Spark's Kafka connector for the installed PySpark (``spark_kafka_jars()``; ``",".join(map(str, ...))``
  is a ``spark.jars`` value).

When something is missing these call ``pytest.skip`` naming it and the command that installs it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS_BIN = ROOT / ".tools" / "bin"
MANIFEST = ROOT / ".tools" / "kafka-tools.json"  # written by scripts/kafka_tools.sh
# The same tools at the newest Kafka 4.x Maven Central serves (scripts/kafka_tools.sh --newest).
MANIFEST_NEWEST = ROOT / ".tools" / "kafka-tools-newest.json"
INSTALL_HINT = "run 'make kafka-tools' (scripts/kafka_tools.sh; needs java 17+ and mvn)"

KAFKA_TOOL_NAMES = ("kafka-topics", "kafka-console-producer", "kafka-console-consumer",
                    "kafka-consumer-groups", "kafka-delete-records", "kafka-configs", "kafka-acls",
                    "kafka-verifiable-producer", "kafka-producer-perf-test", "kafka-transactions",
                    "kafka-leader-election", "kafka-reassign-partitions")
# Of those, the argparse4j tools: --help prints the usage on stdout (exit 1), and no --version
# (kafka-transactions has one, printing "<version> (Commit:<id>)": checked by its usage too).
KAFKA_USAGE_ON_STDOUT = ("kafka-verifiable-producer", "kafka-producer-perf-test", "kafka-transactions")


def cache_dir() -> Path:
    env = os.environ.get("LOWTIDE_KAFKA_TOOLS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lowtide-kafka-tools"


def kafka_tools_manifest(*, newest: bool = False) -> dict:
    """``{"kafka_version": ..., "lib": ..., "tools": {name: main class}}``; skips when not installed.
    ``newest``: the tools of the newest Kafka 4.x release instead of the pinned 4.1 ones."""
    path = MANIFEST_NEWEST if newest else MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        pytest.skip(f"Kafka's command-line tools are not installed ({path} missing): {INSTALL_HINT}")
    if not Path(manifest["lib"]).is_dir():
        pytest.skip(f"Kafka's command-line tools' jars are missing ({manifest['lib']}): {INSTALL_HINT}")
    require_java()
    return manifest


def require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if not (shutil.which("java") or (java_home and os.access(Path(java_home, "bin", "java"), os.X_OK))):
        pytest.skip("java is not installed (Kafka's tools and Spark need Java 17+: "
                    "apt-get install openjdk-17-jre-headless; make setup does it)")


def java_command(*, newest: bool = False, lib: str | None = None, heap: str = "192M") -> list[str]:
    """The start of a command line running a class of Kafka's jars (``newest``: the newest 4.x
    release's) in a small JVM: the main class and its arguments follow. Uses the jars' class archive
    when ``make kafka-tools`` made one (``build_class_archive`` in scripts/kafka_tools.sh: about
    half of a short tool's CPU), as the wrappers do; JVM warnings go to stderr. ``lib``: that
    directory of jars instead of the manifest's."""
    lib = lib if lib is not None else kafka_tools_manifest(newest=newest)["lib"]
    archive = Path(f"{lib}.jsa")
    cds = [f"-XX:SharedArchiveFile={archive}", "-Xlog:disable", "-Xlog:all=warning:stderr"] if archive.is_file() else []
    return ["java", f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *cds, "-cp", f"{lib}/*"]


def kafka_version() -> str:
    """The Apache Kafka version of the installed command-line tools (e.g. "4.1.2")."""
    return kafka_tools_manifest()["kafka_version"]


def kafka_tool(name: str) -> Path:
    """Path of the wrapper running Apache Kafka's command-line tool ``name`` (e.g. "kafka-topics")."""
    if name not in KAFKA_TOOL_NAMES:
        raise ValueError(f"unknown Kafka tool {name!r} (known: {', '.join(KAFKA_TOOL_NAMES)})")
    manifest = kafka_tools_manifest()
    path = TOOLS_BIN / name
    if name not in manifest["tools"] or not os.access(path, os.X_OK):
        pytest.skip(f"Kafka tool {name} is not installed ({path} missing): {INSTALL_HINT}")
    return path


def spark_kafka_dir() -> Path:
    """The cache directory of Spark's Kafka connector for the installed PySpark (may not exist)."""
    try:
        import pyspark
    except ImportError:
        pytest.skip("pyspark is not installed (make setup installs it, extra [spark])")
    return cache_dir() / f"spark-kafka-{pyspark.__version__}"


def spark_kafka_jars() -> list[Path]:
    """The jars Spark needs for ``format("kafka")`` beyond its own (the connector, kafka-clients, ...)."""
    directory = spark_kafka_dir()
    jars_txt = directory / "jars.txt"
    if not (directory / ".complete").exists() or not jars_txt.exists():
        pytest.skip(f"Spark's Kafka connector is not installed ({jars_txt} missing): {INSTALL_HINT}")
    jars = [Path(p) for p in jars_txt.read_text().strip().split(",") if p]
    missing = [str(j) for j in jars if not j.is_file()]
    if not jars or missing:
        pytest.skip(f"Spark's Kafka connector jars are missing ({', '.join(missing) or 'none listed'}): "
                    f"{INSTALL_HINT}")
    return jars
