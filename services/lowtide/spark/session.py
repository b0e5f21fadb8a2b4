"""A local-mode SparkSession for lowtide's jobs and tests, with the data source registered.

Spark's executors run Python workers: ``PYSPARK_PYTHON`` is set to the running interpreter (the
one that has lowtide installed) unless the caller set it. Spark's JVM logs go through a log4j2
configuration written to a temporary file, at ERROR, so a job prints only its own progress.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from lowtide.errors import InvalidConfig

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
    """Register format ``"lowtide"`` on ``spark``."""
    from lowtide.spark.source import LowtideDataSource

    spark.dataSource.register(LowtideDataSource)


def _log4j_file() -> str:
    path = Path(tempfile.gettempdir()) / f"lowtide-spark-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(_LOG4J2)
        tmp.replace(path)
    return str(path)


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
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
