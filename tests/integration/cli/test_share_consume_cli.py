"""`lowtide consume --share-group G` (cli/share_consume.py) on the worker's shared cluster: the
real command reads a topic as a share group member, like kafka-console-share-consumer."""

from __future__ import annotations

import base64
import json

import pytest

from lowtide.client import Producer
from tests.integration import support as s

pytestmark = [pytest.mark.timeout(120)]


def consume(cluster, *extra: str, output: str = "json") -> list:
    """The records one run printed: json documents, or text lines (the values)."""
    proc = s.lowtide_cli("consume", "--bootstrap-server", cluster.bootstrap, "--topic", "share-cli",
                         "--share-group", "share-cli-g", "--from-beginning", "--timeout-ms", "1000",
                         "--output", output, *extra)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return [json.loads(line) if output == "json" else line for line in proc.stdout.splitlines()]


def test_consume_with_a_share_group_prints_each_record_once_across_runs_and_releases_what_it_did_not_print(
        shared_cluster):
    s.create_topic(shared_cluster, "share-cli", partitions=2, rf=3)
    with Producer(shared_cluster.bootstrap, batch_bytes=1024) as producer:
        for p in range(2):
            producer.produce_values("share-cli", [f"{p}-{i}".encode() for i in range(50)], partition=p)
    first = consume(shared_cluster, "--max-records", "30", output="text")
    assert len(first) == 30
    # The rest: the records the first run fetched past its 30th went back to the group (released),
    # those it printed were accepted and never come again.
    rest = consume(shared_cluster)
    values = first + [base64.b64decode(r["value"]).decode() for r in rest]
    assert sorted(values) == sorted(f"{p}-{i}" for p in range(2) for i in range(50))
    assert any(r["delivery_count"] == 2 for r in rest), "nothing the first run left was released to the second"
    assert consume(shared_cluster) == []


def test_consume_refuses_a_share_group_with_a_partition_or_a_consumer_group(shared_cluster):
    proc = s.lowtide_cli("consume", "--bootstrap-server", shared_cluster.bootstrap, "--topic", "share-cli",
                         "--share-group", "g", "--partition", "0", "--output", "json")
    assert proc.returncode != 0 and "INVALID_REQUEST" in proc.stdout + proc.stderr
    assert "--partition cannot be used with --share-group" in proc.stdout + proc.stderr
