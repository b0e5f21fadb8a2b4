"""A local-mode SparkSession for lowtide's jobs and tests, with the data source registered.

Spark's executors run Python workers: ``PYSPARK_PYTHON`` is set to the running interpreter (the
one that has lowtide installed) unless the caller set it. Spark's JVM logs go through a log4j2
configuration written to a temporary file, at ERROR, so a job prints only its own progress.

Format ``"lowtide"`` needs no ``register(spark)`` in a session lowtide did not build: Spark 4
registers the ``DefaultSource`` of every installed ``pyspark_*`` package (``pyspark_lowtide``, shipped
with lowtide) when a session first looks up a data source, in a Python worker. Workers run
``spark.pyspark.python`` / ``PYSPARK_PYTHON`` (default ``python3``): an interpreter without lowtide
finds no such source (Spark: DATA_SOURCE_NOT_FOUND) or cannot unpickle it. ``register`` (and so
``build_session``) checks that interpreter first and says so, and how to fix it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from lowtide.errors import InvalidConfig

log = logging.getLogger(__name__)
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
"""


def register(spark) -> None:
    """Register format ``"lowtide"`` on ``spark``, once its Python workers are known to import lowtide."""
    from lowtide.spark.source import LowtideDataSource

    check_python_workers(spark)
    spark.dataSource.register(LowtideDataSource)


_WORKERS_OK: set[str] = set()  # interpreters found able to import lowtide's data source


def check_python_workers(spark) -> None:
    """Raise ``InvalidConfig`` naming the interpreter and the fix when Spark's Python workers cannot
    import lowtide's data source. The check imports it in that interpreter with the ``PYTHONPATH``
    Spark gives its workers (pyspark's and py4j's zips); the driver's own interpreter passes as is."""
    sc = spark.sparkContext
    configured = sc.getConf().get("spark.pyspark.python")
    python = configured or sc.pythonExec
    if python in _WORKERS_OK or python == sys.executable:
        return
    import pyspark

    zips = sorted(str(z) for z in (Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(zips + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    try:
        proc = subprocess.run([python, "-c", "import pyspark_lowtide"], env=env, capture_output=True, text=True,
                              timeout=120)
        failure = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    except (OSError, subprocess.SubprocessError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    if failure:
        source = "spark.pyspark.python" if configured else ("PYSPARK_PYTHON" if os.environ.get("PYSPARK_PYTHON")
                                                            else "the default, as PYSPARK_PYTHON is not set")
        raise InvalidConfig(
            f"Spark's Python workers run {python} ({source}), which cannot import lowtide ({failure}), so "
            f'format "lowtide" cannot work there. Set PYSPARK_PYTHON (or spark.pyspark.python) to an interpreter '
            f"that has lowtide installed, e.g. PYSPARK_PYTHON={sys.executable}, or install lowtide[spark] "
            f"for {python}")
    _WORKERS_OK.add(python)


def _log4j_file() -> str:
    path = Path(tempfile.gettempdir()) / f"lowtide-spark-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(_LOG4J2)
        tmp.replace(path)
    return str(path)


# The one line the JVM itself prints at start-up whatever log4j says (Spark 4 opens the module
# jdk.incubator.vector); it says nothing to a user of a job.
_JVM_NOTICES = (b"WARNING: Using incubator modules: jdk.incubator.vector",)


@contextlib.contextmanager
def _jvm_stderr_filtered() -> Iterator[None]:
    """While the JVM is spawned, fd 2 is a pipe: the JVM inherits it for its whole life and a daemon
    thread forwards its lines to the real stderr, minus ``_JVM_NOTICES``. Errors still show."""
    try:
        real = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:
        yield
        return

    def forward() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe, os.fdopen(os.dup(real), "wb", buffering=0) as out:
            for line in iter(pipe.readline, b""):
                if not line.rstrip().startswith(_JVM_NOTICES):
                    out.write(line)

    threading.Thread(target=forward, name="spark-jvm-stderr", daemon=True).start()
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)
        os.close(real)


def build_session(app_name: str, *, master: str | None = None, conf: dict[str, str] | None = None):
    """A SparkSession (``local[*]`` unless ``master`` or spark-submit says otherwise), lowtide registered."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise InvalidConfig("Spark needs Java 17+: install it (Debian: apt-get install openjdk-17-jre-headless) "
                            "or set JAVA_HOME")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    log4j = f"-Dlog4j.configurationFile=file:{_log4j_file()}"
    builder = (SparkSession.builder.appName(app_name)
               .config("spark.driver.extraJavaOptions", log4j)
               .config("spark.executor.extraJavaOptions", log4j)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.python.worker.reuse", "true"))
    # Under spark-submit (its PythonRunner sets PYSPARK_GATEWAY_PORT) the master comes from --master.
    if master is not None or not os.environ.get("PYSPARK_GATEWAY_PORT"):
        builder = builder.master(master or os.environ.get("LOWTIDE_SPARK_MASTER", "local[*]"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = _start_with_retry(builder)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        register(spark)
    except InvalidConfig:
        spark.stop()
        raise
    return spark


# How often a JVM that died before handing over its port is started again. Seen once in a full
# test run on a loaded 2-core machine: the child forked from a process with live gRPC threads
# (pyspark's Popen uses a preexec_fn, so it forks rather than spawns) exited at once; the next
# launch worked. A JVM that cannot start at all fails every attempt and raises as before.
GATEWAY_ATTEMPTS = 3


def _start_with_retry(builder):
    from pyspark.errors import PySparkRuntimeError

    for attempt in range(1, GATEWAY_ATTEMPTS + 1):
        try:
            with _jvm_stderr_filtered():
                return builder.getOrCreate()
        except PySparkRuntimeError as exc:
            if exc.getCondition() != "JAVA_GATEWAY_EXITED" or attempt == GATEWAY_ATTEMPTS:
                raise
            log.warning("the Spark JVM exited before it started (attempt %d of %d); starting it again",
                        attempt, GATEWAY_ATTEMPTS)
    raise AssertionError("unreachable")
