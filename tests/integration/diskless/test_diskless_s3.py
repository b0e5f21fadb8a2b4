"""Diskless topics on S3: ``lowtide cluster up --object-store s3://bucket/prefix?endpoint=...``
against a real S3-compatible server (moto's server mode, ``python -m moto.server``, started here),
then produce / consume / offsets / delete-records / topics delete through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lowtide.objectstore.s3 import S3Config, S3ObjectStore
from tests import s3server
from tests.integration.conftest import require_redis_server

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3_endpoint(tmp_path):
    if not s3server.is_available():
        pytest.skip(s3server.MISSING)
    with s3server.moto_server(tmp_path) as endpoint:
        yield endpoint


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lowtide")
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True, timeout=180,
                          env={**os.environ, **CREDENTIALS})


def test_cluster_up_with_an_s3_object_store_serves_diskless_topics_through_the_cli(s3_endpoint, tmp_path):
    require_redis_server()
    S3ObjectStore(S3Config(bucket="lowtide-wal", endpoint_url=s3_endpoint, access_key_id="testing",
                           secret_access_key="testing")).create_bucket()
    url = f"s3://lowtide-wal/cluster-a?endpoint={s3_endpoint}"
    data_dir = tmp_path / "cluster"
    up = run("cluster", "up", "--data-dir", str(data_dir), "--detach", "--object-store", url, "--output", "json")
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        doc = json.loads((data_dir / "cluster.json").read_text())
        assert doc["object_store"] == url
        b = doc["bootstrap"]

        def cli(*args: str, stdin: str | None = None) -> list[dict]:
            proc = run(*args, "--bootstrap-server", b, "--output", "json", stdin=stdin)
            assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
            return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]

        cli("topics", "create", "--topic", "s3t", "--partitions", "2", "--diskless")
        assert cli("produce", "--topic", "s3t", stdin="".join(f"r{i}\n" for i in range(100)))[0]["records"] == 100
        latest = {p["partition"]: p["offset"] for p in cli("offsets", "--topic", "s3t", "--time", "latest")[0]
                  ["partitions"]}
        assert sum(latest.values()) == 100
        full = max(latest, key=latest.get)  # the lines' partitioner may fill one partition only
        records = cli("consume", "--topic", "s3t", "--partition", str(full), "--offset", "0", "--max-records",
                      str(latest[full]))
        assert [r["offset"] for r in records] == list(range(latest[full]))
        store = S3ObjectStore(S3Config(bucket="lowtide-wal", prefix="cluster-a", endpoint_url=s3_endpoint,
                                       access_key_id="testing", secret_access_key="testing"))
        assert any(o.key.startswith("wal/") for o in store.list()), "no WAL file in the bucket"
        (tmp_path / "cut.json").write_text(json.dumps({"partitions": [{"topic": "s3t", "partition": full,
                                                                       "offset": 3}]}))
        deleted = cli("delete-records", "--offset-json-file", str(tmp_path / "cut.json"))[0]
        assert deleted == {"partitions": [{"topic": "s3t", "partition": full, "low_watermark": 3}]}
        earliest = cli("offsets", "--topic", "s3t", "--time", "earliest")[0]["partitions"]
        assert {p["partition"]: p["offset"] for p in earliest} == {full: 3, 1 - full: 0}
        assert cli("topics", "delete", "--topic", "s3t") == [{"topic": "s3t", "deleted": True}]
    finally:
        run("cluster", "down", "--data-dir", str(data_dir))
