"""lowtide for Spark: the ``"lowtide"`` PySpark data source and a quiet local session.

``spark.read.format("lowtide")`` (and readStream / write / writeStream) works in any Spark 4 session
whose Python workers have lowtide installed: Spark registers ``pyspark_lowtide.DefaultSource`` by
itself. ``register(spark)`` registers it explicitly, after checking that the workers' interpreter
(``PYSPARK_PYTHON``) can import lowtide; ``build_session`` makes a local-mode session with lowtide
registered and Spark's own logs down to errors. Needs the ``spark`` extra (pyspark 4.2+, pyarrow)
and Java 17+.
"""

from __future__ import annotations

from lowtide.spark.session import build_session, register

__all__ = ["build_session", "register"]
