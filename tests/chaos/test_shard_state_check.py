"""The diskless chaos run's last check (``run._shard_state_violations``): a shard whose SQLite
tables are what its metadata log makes of them passes, and one whose tables were changed behind
the log's back is reported, naming the shard and the table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from lowtide.record import encode_batch
from tests.chaos.checker import encode_value
from tests.chaos.run import SHARD_STATE_DIVERGED, _shard_state_violations

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "state-check"


def test_a_shard_whose_tables_drift_from_its_metadata_log_is_reported(chaos_cluster, tmp_path):
    cluster, env = chaos_cluster()
    env.create_diskless_topic(TOPIC, partitions=4)
    snapshot = env.admin.describe_cluster([TOPIC])
    for p in range(4):
        batch = encode_batch([encode_value(f"p{p}-{n}") for n in range(3)])
        [answer] = env.replicas.produce(snapshot.leader_address(TOPIC, p), [(TOPIC, p, batch)], acks=-1,
                                        timeout_ms=10_000, deadline_s=15)
        assert answer.error is None, answer.error

    assert _shard_state_violations(cluster, tmp_path / "honest") == []

    # A shard stopped, one high watermark moved in its database, started again: it loads the
    # file as it is (the log holds nothing past its applied offset), so only the check can tell.
    shard = next(k for k in range(2) if _partition_rows(cluster, k))
    name = f"coordinator-{shard}"
    cluster.stop_service(name)
    with sqlite3.connect(_database(cluster, shard)) as conn:
        changed = conn.execute("UPDATE partitions SET high_watermark = high_watermark + 7 "
                               "WHERE partition_key = (SELECT min(partition_key) FROM partitions)").rowcount
    assert changed == 1
    cluster.start_service(name)

    found = _shard_state_violations(cluster, tmp_path / "tampered")
    assert [(v.kind, v.partition) for v in found] == [(SHARD_STATE_DIVERGED, shard)], found
    assert "partitions" in found[0].detail


def _database(cluster, shard: int) -> Path:
    return Path(cluster.service(f"coordinator-{shard}").data_dir) / "state.sqlite"


def _partition_rows(cluster, shard: int) -> int:
    conn = sqlite3.connect(f"file:{_database(cluster, shard)}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM partitions").fetchone()[0]
    finally:
        conn.close()
