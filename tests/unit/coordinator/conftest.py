from __future__ import annotations

import pytest

from tests.unit.coordinator.shard import Shard


@pytest.fixture
def shard(tmp_path):
    s = Shard(tmp_path / "shard-0")
    yield s
    s.close()
