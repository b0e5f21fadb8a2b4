"""`lowtide produce` fits its batches to the topic, and compresses them with Kafka's codecs, on real
processes: every record it reports sent reads back with `lowtide consume`, and the batches stored by
the leader have the size and codec the producer chose."""

from __future__ import annotations

import base64
import json

import pytest

from lowtide.record import iter_batches
from tests.integration import support as s


@pytest.fixture
def cluster(shared_cluster):
    """Every test here writes only topics named for itself and faults nothing: the worker's shared
    cluster serves them all (tests/integration/conftest.py)."""
    return shared_cluster


def consume_all(cluster, topic: str) -> list[dict]:
    proc = s.lowtide_cli("consume", "--bootstrap-server", cluster.bootstrap, "--topic", topic,
                         "--timeout-ms", "3000", "--output", "json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def stored_batches(cluster, topic: str, partition: int) -> list:
    """Headers of every batch the partition's leader holds (fetched as a consumer)."""
    headers, offset = [], 0
    while True:
        r = s.fetch(cluster, topic, offset, partition=partition)
        assert r.error_code == 0, r
        found = [h for h, _ in iter_batches(r.records) if h.next_offset > offset]
        if not found:
            return headers
        headers += found
        offset = found[-1].next_offset
        if offset >= r.high_watermark:
            return headers


def test_produce_with_defaults_on_a_256_kib_segment_topic_succeeds_and_every_record_reads_back(cluster):
    created = s.cli_json("topics", "create", "--bootstrap-server", cluster.bootstrap, "--topic", "small-segments",
                         "--partitions", "3", "--replication-factor", "3", "--config", "segment.bytes=262144")
    assert created
    sent = s.cli_json("produce", "--bootstrap-server", cluster.bootstrap, "--topic", "small-segments",
                      "--num-records", "3000", "--record-size", "1024")
    assert sent["records"] == 3000 and sent["bytes"] == 3000 * 1024

    records = consume_all(cluster, "small-segments")
    assert len(records) == 3000
    assert len({base64.b64decode(r["value"]) for r in records}) == 1  # generated records share one payload
    assert all(len(base64.b64decode(r["value"])) == 1024 for r in records)
    for p in range(3):
        offsets = sorted(r["offset"] for r in records if r["partition"] == p)
        assert offsets == list(range(len(offsets)))  # nothing missing, nothing twice
        # Half a segment at most, so no batch is RECORD_LIST_TOO_LARGE.
        assert all(h.size_in_bytes <= 131072 for h in stored_batches(cluster, "small-segments", p))


def test_a_batch_over_a_broker_default_the_metadata_does_not_show_is_split_and_retried(cluster):
    # The cluster's replicas default segment.bytes to 65536 (tests/integration/conftest.py); the
    # topic sets nothing, so the producer starts with 1 MiB batches and learns from the refusals.
    s.create_topic(cluster, "broker-default", partitions=1, rf=3)
    sent = s.cli_json("produce", "--bootstrap-server", cluster.bootstrap, "--topic", "broker-default",
                      "--num-records", "600", "--record-size", "1000")
    assert sent["records"] == 600
    assert [r["offset"] for r in consume_all(cluster, "broker-default")] == list(range(600))
    assert all(h.size_in_bytes <= 65536 for h in stored_batches(cluster, "broker-default", 0))


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_produce_with_lz4_and_zstd_reads_back(cluster, codec):
    topic = f"compressed-{codec}"
    s.create_topic(cluster, topic, partitions=1, rf=3, config={"segment.bytes": "262144"})
    # ~300 KB before compression: several batches only because the topic's half segment (128 KiB, counted
    # before compression) caps them below the producer's 1 MiB default
    lines = [f"{i:06d} {codec} line with some repeated text text text" for i in range(5_000)]
    proc = s.lowtide_cli("produce", "--bootstrap-server", cluster.bootstrap, "--topic", topic,
                         "--compression-type", codec, "--output", "json", stdin="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert json.loads(proc.stdout.splitlines()[-1])["records"] == len(lines)

    records = consume_all(cluster, topic)
    assert [base64.b64decode(r["value"]).decode() for r in records] == lines
    assert [r["offset"] for r in records] == list(range(len(lines)))
    batches = stored_batches(cluster, topic, 0)
    assert len(batches) > 1 and {h.compression for h in batches} == {3 if codec == "lz4" else 4}
    assert all(h.size_in_bytes <= 131072 for h in batches)
