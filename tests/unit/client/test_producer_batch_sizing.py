"""The producer fits its batches to the topic: sizes from the topic's config, compression.type, and
Kafka's split-and-retry of a batch the leader refuses as too large (MESSAGE_TOO_LARGE /
RECORD_LIST_TOO_LARGE). Pure functions first, then against a real in-process front door and the
real replica servers of ``replica_set`` (``tests.unit.frontdoor.harness``)."""

from __future__ import annotations

import random

import pytest

from lowtide.client import Producer
from lowtide.client.producer import (
    MIN_BATCH_BYTES,
    _Batch,
    _uncompressed_size,
    batch_bytes_for_topic,
    split_batch,
    split_refused,
)
from lowtide.errors import InvalidRequest, MessageTooLarge, RecordListTooLarge
from lowtide.record import BatchBuilder, Compression, decode_batch, read_header


def batch_of(values, *, compression=Compression.NONE, keys=None, headers=None, base_sequence=-1,
             producer_id=-1) -> _Batch:
    builder = BatchBuilder(compression=compression, base_sequence=base_sequence, producer_id=producer_id,
                           producer_epoch=0 if producer_id >= 0 else -1)
    for i, value in enumerate(values):
        builder.append(timestamp_ms=1_700_000_000_000 + i, key=keys[i] if keys else None, value=value,
                       headers=headers[i] if headers else ())
    return _Batch(builder.build(), builder.record_count)


def records(batches):
    return [(r.timestamp, r.key, r.value, r.headers) for b in batches for r in decode_batch(b.data)[1]]


# -- sizing from the topic's config -------------------------------------------------------------------


def test_batch_bytes_are_capped_by_max_message_bytes_and_half_the_segment():
    assert batch_bytes_for_topic({}, 1 << 20) == 1 << 20
    assert batch_bytes_for_topic({"segment.bytes": "262144"}, 1 << 20) == 131072
    assert batch_bytes_for_topic({"max.message.bytes": "100000"}, 1 << 20) == 100000
    assert batch_bytes_for_topic({"max.message.bytes": "100000", "segment.bytes": "150000"}, 1 << 20) == 75000
    assert batch_bytes_for_topic({"segment.bytes": "262144"}, 65536) == 65536
    assert batch_bytes_for_topic({"segment.bytes": "100"}, 65536) == MIN_BATCH_BYTES
    assert batch_bytes_for_topic({"segment.bytes": "not a number"}, 65536) == 65536


# -- splitting ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_split_batch_keeps_every_record_in_order_in_batches_under_the_limit(codec):
    values = [bytes([i % 251]) * (500 + i) for i in range(200)]
    keys = [None if i % 3 else b"k%d" % i for i in range(200)]
    headers = [[("h", b"%d" % i)] if i % 5 == 0 else [] for i in range(200)]
    batch = batch_of(values, compression=codec, keys=keys, headers=headers)
    pieces = split_batch(batch, 20_000)
    assert len(pieces) > 5
    assert records(pieces) == records([batch])
    assert sum(p.count for p in pieces) == 200
    for piece in pieces:
        header = read_header(piece.data)
        assert header.compression == codec and header.record_count == piece.count
        assert _uncompressed_size(piece) <= 20_000  # sizes count before compression, as batch_bytes does


def test_split_batch_cuts_a_batch_under_the_limit_at_least_in_half():
    batch = batch_of([b"x" * 100] * 10)
    pieces = split_batch(batch, 1 << 20)
    assert [p.count for p in pieces] == [5, 5]
    assert records(pieces) == records([batch])


def test_split_batch_keeps_producer_fields_and_sequences_follow_the_records():
    batch = batch_of([b"v" * 1000] * 6, producer_id=42, base_sequence=10)
    pieces = split_batch(batch, 2500)
    headers = [read_header(p.data) for p in pieces]
    assert [h.record_count for h in headers] == [2, 2, 2]
    assert [h.base_sequence for h in headers] == [10, 12, 14]
    assert {(h.producer_id, h.producer_epoch) for h in headers} == {(42, 0)}


def test_a_single_record_batch_is_not_split():
    batch = batch_of([b"v" * 5000])
    assert split_batch(batch, 1024) == [batch]


def test_split_refused_halves_the_largest_batch_and_leaves_smaller_ones_whole():
    small, large = batch_of([b"s" * 100] * 3), batch_of([b"L" * 1000] * 40)
    limit, out = split_refused([small, large, small], RecordListTooLarge("too big"))
    assert limit == len(large.data) // 2
    assert out[0] is small and out[-1] is small
    assert len(out) >= 4 and all(len(b.data) <= limit for b in out)
    assert records(out) == records([small, large, small])


def test_a_refused_compressed_batch_is_halved_by_its_records_not_its_compressed_bytes():
    rng = random.Random(7)
    batch = batch_of([rng.randbytes(100).hex().encode() for _ in range(400)], compression=Compression.ZSTD)
    assert len(batch.data) < 0.7 * 400 * 200  # hex text: about half its bytes
    limit, out = split_refused([batch], MessageTooLarge("too big"))
    assert 2 <= len(out) <= 3 and limit > 40_000
    assert all(read_header(b.data).compression == Compression.ZSTD for b in out)
    assert all(len(b.data) < len(batch.data) * 0.7 for b in out)
    assert records(out) == records([batch])


def test_split_refused_raises_when_the_largest_batch_is_a_single_record():
    with pytest.raises(MessageTooLarge, match=r"too big \(a batch of a single record, .* cannot be split"):
        split_refused([batch_of([b"a"] * 5), batch_of([b"x" * 5000])], MessageTooLarge("too big"))


# -- against a front door and the real replicas ------------------------------------------------------


@pytest.fixture
def redis_url(replica_set):
    """These tests talk to the real replicas, which share the replica set's Redis."""
    return replica_set.clean()


@pytest.fixture
def cluster(front_door, replica_set, store):
    """Topics ``small`` (segment.bytes=262144, 2 partitions) and ``plain`` (no config), led by replica 0."""
    store.create_topic(name="small", partitions=2, replication_factor=1, config={"segment.bytes": "262144"},
                       assignment=[[0]] * 2)
    store.create_topic(name="plain", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    for topic in ("small", "plain"):
        replica_set.wait_for_leaders(topic)
    return front_door, replica_set


def stored(replicas, topic, partition=0):
    return replicas.fetch_all(topic, partition)


def test_batches_fit_the_topics_segment_with_the_default_batch_size(cluster):
    front_door, replica = cluster
    values = [b"%06d" % i + b"x" * 1018 for i in range(1000)]
    with Producer(front_door.address) as producer:
        assert producer.batch_bytes_for("small") == 131072
        report = producer.produce_values("small", values, partition=1)
    batches = stored(replica, "small", 1)
    assert len(batches) == report.batches >= 8
    assert all(h.size_in_bytes <= 131072 for h, _ in batches)
    assert [r.value for _, rs in batches for r in rs] == values


def shrink_after_first_use(producer, replicas, store, key: str, value: str) -> None:
    """Produce one record (the producer now holds the topic's config), then lower ``key`` under it:
    the leader refuses what the producer still sizes by the old config (a real refusal)."""
    producer.produce_values("plain", [b"before"], partition=0)
    with replicas.config_adopted(0, "plain"):
        store.update_topic_config("plain", lambda info: {**info.config, key: value})


@pytest.mark.parametrize("key", ["max.message.bytes", "segment.bytes"])  # MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE
def test_a_batch_the_leader_refuses_as_too_large_is_split_and_retried(cluster, store, key):
    front_door, replicas = cluster
    values = [b"%05d" % i * 100 for i in range(400)]
    with Producer(front_door.address) as producer:
        shrink_after_first_use(producer, replicas, store, key, "30000")
        before = replicas.calls(0, "Produce")
        report = producer.produce_values("plain", values, partition=0)
        # Later batches of the topic are built no bigger than the last refused size.
        assert producer.batch_bytes_for("plain") < 1 << 20
        calls = replicas.calls(0, "Produce") - before
        again = producer.produce_values("plain", [b"after"] * 3, partition=0)
    # One 200 kB batch refused, its halves refused, its quarters refused, its eighths appended.
    assert calls >= 4
    assert replicas.calls(0, "Produce") - before == calls + 1  # the later batch fits at once
    batches = stored(replicas, "plain")
    assert all(h.size_in_bytes <= 30000 for h, _ in batches)
    assert [r.value for _, rs in batches for r in rs] == [b"before"] + values + [b"after"] * 3
    assert sum(a.record_count for a in report.appends) == 400
    assert report.appends[0].base_offset == 1 and again.appends[0].base_offset == 401


def test_a_refused_single_record_is_raised(cluster, store):
    front_door, replicas = cluster
    with Producer(front_door.address) as producer:
        shrink_after_first_use(producer, replicas, store, "max.message.bytes", "5000")
        with pytest.raises(MessageTooLarge, match="cannot be split"):
            producer.produce_values("plain", [b"x" * 10_000], partition=0)
    assert [r.value for _, rs in stored(replicas, "plain") for r in rs] == [b"before"]


@pytest.mark.parametrize(("name", "codec"), [("none", 0), ("gzip", 1), ("lz4", 3), ("zstd", 4)])
def test_compression_type_compresses_every_batch(cluster, name, codec):
    front_door, replica = cluster
    values = [b"value-%d " % i * 20 for i in range(500)]
    with Producer(front_door.address, compression_type=name, batch_bytes=16_384) as producer:
        producer.produce_values("plain", values, partition=0)
    batches = stored(replica, "plain")
    assert len(batches) > 1 and {h.compression for h, _ in batches} == {codec}
    assert [r.value for _, rs in batches for r in rs] == values


def test_an_unknown_compression_type_is_refused():
    with pytest.raises(InvalidRequest, match="compression.type must be one of none, gzip, lz4, zstd"):
        Producer("127.0.0.1:1", compression_type="snappy")
