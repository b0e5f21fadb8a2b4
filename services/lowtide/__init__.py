"""lowtide: replicated partitioned logs that delete data correctly and fast."""

__version__ = "0.1.0"
