"""Format "lowtide" in a SparkSession lowtide did not build, with no ``register(spark)``: Spark 4
finds lowtide's ``pyspark_lowtide.DefaultSource`` by itself (real PySpark, real cluster). And a
session whose Python workers cannot import lowtide is refused with the interpreter named and the
fix (``PYSPARK_PYTHON``), instead of Spark's DATA_SOURCE_NOT_FOUND or an unpickling error deep in a
worker's stack trace. Both run in one child process with one Spark JVM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lowtide.client import Admin, Producer
from tests.integration import support as s
from tests.integration.spark.conftest import require_java

# One child process, one Spark JVM (a JVM start is seconds of CPU): first a plain PySpark program,
# nothing of lowtide imported on the driver; then, when argv[3] names an interpreter without lowtide,
# build_session with that interpreter as PYSPARK_PYTHON (a new SparkContext reads PYSPARK_PYTHON when
# it starts, so the stopped plain session leaves nothing of its own behind).
PLAIN_SPARK_THEN_BUILD_SESSION = """
import os, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
df = spark.read.format("lowtide").option("bootstrap.servers", sys.argv[1]).option("subscribe", sys.argv[2]).load()
print("values", sorted(bytes(r.value).decode() for r in df.collect()))
print("lowtide imported on the driver:", any(m == "lowtide" or m.startswith("lowtide.") for m in sys.modules))
spark.stop()
if len(sys.argv) > 3:
    os.environ["PYSPARK_PYTHON"] = sys.argv[3]
    from lowtide.errors import InvalidConfig
    from lowtide.spark import build_session
    try:
        build_session("workers-without-lowtide", master="local[1]")
    except InvalidConfig as exc:
        print("refused:", exc.message)
    else:
        print("accepted")
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(extra)
    return env


def _bare_interpreter() -> tuple[Path | None, str]:
    """The interpreter this virtual environment was made from (the same Python, without lowtide),
    or None and why not."""
    bare = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if sys.prefix == sys.base_prefix or not bare.exists():
        return None, "needs a virtual environment whose base interpreter lacks lowtide"
    probe = subprocess.run([str(bare), "-c", "import lowtide, grpc, pyarrow"], env=_env(), capture_output=True)
    if probe.returncode == 0:
        return None, f"{bare} can import lowtide"
    return bare, ""


@pytest.fixture(scope="module")
def child(spark_cluster, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path | None, str]:
    """The child's run: (its process, the bare interpreter or None, why None)."""
    require_java()
    with Admin(spark_cluster.bootstrap) as admin:
        admin.create_topic("auto-registered", partitions=1, replication_factor=3)
        s.wait_until(lambda: all(p.leader >= 0 for p in admin.describe_topics(["auto-registered"])[
            "auto-registered"].partitions), what="a leader")
    with Producer(spark_cluster.bootstrap, acks=-1) as producer:
        producer.produce_values("auto-registered", [b"a", b"b", b"c"], partition=0)
    bare, why = _bare_interpreter()
    proc = subprocess.run([sys.executable, "-c", PLAIN_SPARK_THEN_BUILD_SESSION, spark_cluster.bootstrap,
                           "auto-registered", *([str(bare)] if bare else [])],
                          env=_env(PYSPARK_PYTHON=sys.executable), cwd=tmp_path_factory.mktemp("auto-register"),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, bare, why


def test_format_lowtide_works_in_a_plain_session_without_register(child):
    proc, _, _ = child
    assert "values ['a', 'b', 'c']" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "lowtide imported on the driver: False" in proc.stdout


def test_a_session_whose_python_workers_cannot_import_lowtide_is_refused_naming_pyspark_python(child):
    proc, bare, why = child
    if bare is None:
        pytest.skip(why)
    assert "refused:" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    message = proc.stdout[proc.stdout.index("refused:"):]
    assert str(bare) in message and "cannot import lowtide" in message
    assert f"PYSPARK_PYTHON={sys.executable}" in message
