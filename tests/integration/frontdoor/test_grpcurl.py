"""The services speak to grpcurl with no .proto files at hand (server reflection)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration import support as s

ROOT = Path(__file__).resolve().parents[3]

@pytest.fixture
def cluster(shared_cluster):
    """Every test here writes only topics named for itself and faults nothing: the worker's shared
    cluster serves them all (tests/integration/conftest.py)."""
    return shared_cluster


def find_grpcurl() -> str:
    path = shutil.which("grpcurl") or (str(ROOT / ".tools/bin/grpcurl")
                                       if (ROOT / ".tools/bin/grpcurl").exists() else None)
    if path is None:
        pytest.skip("grpcurl is not installed (make tools builds it with 'go install'; CI does)")
    return path


def test_grpcurl_lists_services_and_calls_delete_records_through_reflection(cluster):
    grpcurl = find_grpcurl()
    s.create_topic(cluster, "g", partitions=1, rf=3)
    assert s.produce(cluster, "g", [b"x"] * 10).error_code == 0
    listed = subprocess.run([grpcurl, "-plaintext", cluster.bootstrap, "list"], capture_output=True, text=True,
                            timeout=30, check=True).stdout.split()
    assert {"lowtide.v1.Admin", "grpc.health.v1.Health"} <= set(listed)
    replica_listed = subprocess.run([grpcurl, "-plaintext", cluster.service("replica-0").grpc, "list"],
                                    capture_output=True, text=True, timeout=30, check=True).stdout.split()
    assert "lowtide.v1.Replica" in replica_listed
    out = subprocess.run([grpcurl, "-plaintext", "-d", '{"partitions":[{"topic":"g","partition":0,"offset":7}]}',
                          cluster.bootstrap, "lowtide.v1.Admin/DeleteRecords"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    result = json.loads(out)["partitions"][0]
    # grpcurl prints the proto field names (snake_case); int64 travels as a JSON string
    assert "error_code" not in result, out
    assert result["topic"] == "g" and int(result["low_watermark"]) == 7
