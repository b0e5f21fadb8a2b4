"""Fixtures of the log's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lowtide.log.partition_log import LogConfig, PartitionLog


@pytest.fixture
def log(tmp_path) -> Iterator[PartitionLog]:
    """An empty partition log ("meta-0", default config) in the test's directory; a module may
    define its own ``log`` instead."""
    partition_log = PartitionLog.open(tmp_path / "meta-0", topic="meta", partition=0, config=LogConfig())
    yield partition_log
    partition_log.close()
