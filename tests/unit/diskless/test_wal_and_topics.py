"""WAL file layout, base offset rewriting, shard assignment, produce gateways and the range cache."""

from __future__ import annotations

import uuid

from lowtide.diskless.fetch import RangeCache
from lowtide.diskless.topics import assign_shards, gateway_for, produce_gateways
from lowtide.diskless.wal import WalFileBuilder, new_object_key, rewrite_base_offsets
from lowtide.metadata.model import BrokerInfo
from lowtide.record import decode_batches, encode_batch, validate_batches


def test_a_wal_file_is_the_batches_back_to_back_and_each_reads_back_with_its_assigned_offset():
    batches = [encode_batch([b"a%d" % i for i in range(n)]) for n in (1, 3, 2)]
    builder = WalFileBuilder()
    positions = [builder.add(b) for b in batches]
    data = builder.build()
    assert data == b"".join(batches) and positions == [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    copy = bytearray(data)
    rewrite_base_offsets(copy, [(positions[0], 100), (positions[1], 7), (positions[2], 50)])
    headers = validate_batches(bytes(copy))  # the CRC still holds: the base offset is outside it
    assert [h.base_offset for h in headers] == [100, 7, 50]
    assert [[r.offset for r in recs] for _, recs in decode_batches(bytes(copy))] == [[100], [7, 8, 9], [50, 51]]
    assert new_object_key().startswith("wal/") and new_object_key() != new_object_key()


def test_shard_assignment_is_a_pure_function_of_topic_id_and_partition_and_spreads_partitions():
    topic = uuid.uuid4().bytes
    shards = assign_shards(topic_id=topic, partitions=64, shards=4)
    assert shards == assign_shards(topic_id=topic, partitions=64, shards=4)
    assert assign_shards(topic_id=topic, partitions=10, shards=4) == shards[:10]
    assert set(shards) == {0, 1, 2, 3}


def test_each_shard_gets_max_1_brokers_per_shard_per_rack_as_produce_gateways():
    brokers = [BrokerInfo(id=i, host="h", port=i, rack="ab"[i % 2]) for i in range(8)]
    gateways = produce_gateways(brokers, shards=2)  # 8 brokers / 2 shards / 2 racks = 2 per rack
    assert all(len(ids) == 4 for ids in gateways.values())
    assert all({b % 2 for b in ids} == {0, 1} for ids in gateways.values())  # both racks
    assert set(gateways[0]).isdisjoint(gateways[1])
    one = produce_gateways(brokers[:3], shards=4)  # fewer brokers than shards: still one each
    assert all(len(ids) == 2 for ids in one.values())  # two racks among the three brokers
    assert gateway_for(gateways, shard=1, partition=5) in gateways[1]
    assert gateway_for({}, shard=0, partition=0) == -1


def test_the_range_cache_evicts_the_least_recently_used_ranges_beyond_its_byte_budget():
    cache = RangeCache(max_bytes=10)
    cache.put("k", 0, b"aaaa")
    cache.put("k", 4, b"bbbb")
    assert cache.get("k", 0, 4) == b"aaaa"  # now the most recent
    cache.put("k", 8, b"cccc")
    assert cache.get("k", 4, 4) is None and cache.get("k", 0, 4) == b"aaaa" and cache.get("k", 8, 4) == b"cccc"
    assert cache.get("k", 8, 3) is None  # a different size is a different range
    cache.put("big", 0, b"x" * 11)
    assert cache.get("big", 0, 11) is None
