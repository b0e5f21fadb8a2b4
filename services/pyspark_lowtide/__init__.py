"""``spark.read.format("lowtide")`` without ``register(spark)``: Spark 4's automatic registration.

When a session first looks up a data source, Spark 4 runs ``pyspark.sql.worker.lookup_data_sources``
in a Python worker (the interpreter ``PYSPARK_PYTHON`` names): it imports every top-level module whose
name starts with ``pyspark_`` and registers its ``DefaultSource`` (a ``DataSource`` subclass) under
``DefaultSource.name()``. This package is installed with lowtide, so once lowtide is installed in
the workers' interpreter, format ``"lowtide"`` is there in every session. ``lowtide.spark.register``
still registers it explicitly (what ``build_session`` does).
"""

from lowtide.spark.source import LowtideDataSource as DefaultSource

__all__ = ["DefaultSource"]
